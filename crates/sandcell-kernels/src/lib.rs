//! Language kernels: one long-lived interpreter per context, holding its state.
//!
//! The kernel programs live in `kernels/` and are compiled into the binary; the guest agent
//! starts them with [`command`] and speaks the protocol in `PROTOCOL.md` with them over two
//! pipes whose descriptor numbers it passes in [`CTL_FD_VAR`] and [`EVENT_FD_VAR`].

#![forbid(unsafe_code)]

use sandcell_protocol::Language;

/// Names the inherited descriptor the kernel reads requests from.
pub const CTL_FD_VAR: &str = "SANDCELL_KERNEL_CTL_FD";
/// Names the inherited descriptor the kernel writes events to.
pub const EVENT_FD_VAR: &str = "SANDCELL_KERNEL_EVENT_FD";
/// The protocol version, in `SANDCELL_KERNEL_PROTOCOL`.
pub const PROTOCOL_VAR: &str = "SANDCELL_KERNEL_PROTOCOL";
/// The version of `PROTOCOL.md` these kernels speak (2: host calls).
pub const PROTOCOL_VERSION: u32 = 2;
/// Where artifacts are collected, in `SANDCELL_OUTPUTS_DIR`.
pub const OUTPUTS_DIR_VAR: &str = "SANDCELL_OUTPUTS_DIR";
/// Bytes of stream text forwarded per stream and execution, in `SANDCELL_STREAM_LIMIT`.
pub const STREAM_LIMIT_VAR: &str = "SANDCELL_STREAM_LIMIT";
/// The default outputs folder inside a sandbox.
pub const DEFAULT_OUTPUTS_DIR: &str = "/workspace/outputs";
/// The default per-stream, per-execution limit of forwarded text.
pub const DEFAULT_STREAM_LIMIT: u64 = 1024 * 1024;

const PYTHON: &str = include_str!("../kernels/python/kernel.py");
/// The Node kernel, one function body kept as a file per concern (head.js opens it,
/// requests.js closes it), joined in this order.
const NODE: &str = concat!(
    include_str!("../kernels/node/head.js"),
    include_str!("../kernels/node/context.js"),
    include_str!("../kernels/node/rewriter.js"),
    include_str!("../kernels/node/tracebacks.js"),
    include_str!("../kernels/node/execution.js"),
    include_str!("../kernels/node/variables.js"),
    include_str!("../kernels/node/state.js"),
    include_str!("../kernels/node/requests.js"),
);
const BASH: &str = include_str!("../kernels/bash/kernel.sh");
const R: &str = include_str!("../kernels/r/kernel.R");

/// The kernel program of `language`.
pub fn source(language: Language) -> &'static str {
    match language {
        Language::Python => PYTHON,
        Language::Node => NODE,
        Language::Bash => BASH,
        Language::R => R,
    }
}

/// Holds the R kernel's program (see [`command`]); the kernel removes it from its environment.
pub const R_SOURCE_VAR: &str = "SANDCELL_KERNEL_SOURCE";

/// The command line that starts `language`'s kernel. The program rides on it (R's in
/// [`extra_env`]), so nothing is written to disk.
pub fn command(language: Language) -> Vec<String> {
    let argv: &[&str] = match language {
        // -S: the kernel does `site`'s work itself, most of it on first need (kernel.py).
        Language::Python => &["/usr/bin/python3", "-S", "-c", PYTHON],
        Language::Node => &["/usr/bin/node", "-e", NODE],
        // The last word is the shell's $0.
        Language::Bash => &[
            "/bin/bash",
            "--noprofile",
            "--norc",
            "-c",
            BASH,
            "sandcell-kernel",
        ],
        // Rscript silently drops `-e` programs over ~10 KB (it re-encodes them for R's own
        // command line, three bytes per space and newline), so `-e` only evaluates the program
        // held in the environment.
        Language::R => &[
            "/usr/bin/Rscript",
            "-e",
            "eval(parse(text = Sys.getenv('SANDCELL_KERNEL_SOURCE'), keep.source = FALSE))",
        ],
    };
    argv.iter().map(|a| a.to_string()).collect()
}

/// Extra environment a kernel of `language` needs besides the protocol variables.
pub fn extra_env(language: Language) -> Vec<(&'static str, &'static str)> {
    match language {
        // Figures are rendered off-screen and captured as PNG.
        Language::Python => vec![("MPLBACKEND", "Agg"), ("PYTHONUNBUFFERED", "1")],
        Language::R => vec![(R_SOURCE_VAR, R)],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_kernel_parts_join_into_one_program() {
        assert!(NODE.starts_with("// Sandcell Node.js kernel"));
        assert!(
            NODE.trim_end().ends_with("})();"),
            "requests.js closes the function"
        );
        let node = std::path::Path::new("/usr/bin/node");
        sandcell_testkit::require!(node.exists(), "no {}", node.display());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kernel.js");
        std::fs::write(&file, NODE).unwrap();
        let out = std::process::Command::new(node)
            .arg("--check")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn every_language_has_a_program_and_a_command() {
        for lang in Language::ALL {
            assert!(!source(lang).trim().is_empty(), "{lang}");
            let argv = command(lang);
            assert!(argv[0].starts_with('/'), "{lang}: {argv:?}");
            let carried = argv.iter().any(|a| a == source(lang))
                || extra_env(lang).iter().any(|(_, v)| *v == source(lang));
            assert!(
                carried,
                "{lang}: the program is neither an argument nor in the environment"
            );
        }
    }
}
