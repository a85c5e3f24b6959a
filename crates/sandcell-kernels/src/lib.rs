//! Language kernels: one long-lived interpreter per context, holding its state.
//!
//! The kernel programs live in `kernels/` and are compiled into the binary; the guest agent
//! starts them with [`command`] and speaks the protocol in `PROTOCOL.md` with them over two
//! pipes whose descriptor numbers it passes in [`CTL_FD_VAR`] and [`EVENT_FD_VAR`].

use sandcell_protocol::Language;

/// Names the inherited descriptor the kernel reads requests from.
pub const CTL_FD_VAR: &str = "SANDCELL_KERNEL_CTL_FD";
/// Names the inherited descriptor the kernel writes events to.
pub const EVENT_FD_VAR: &str = "SANDCELL_KERNEL_EVENT_FD";
/// The protocol version, in `SANDCELL_KERNEL_PROTOCOL`.
pub const PROTOCOL_VAR: &str = "SANDCELL_KERNEL_PROTOCOL";
/// The version of `PROTOCOL.md` these kernels speak.
pub const PROTOCOL_VERSION: u32 = 1;
/// Where artifacts are collected, in `SANDCELL_OUTPUTS_DIR`.
pub const OUTPUTS_DIR_VAR: &str = "SANDCELL_OUTPUTS_DIR";
/// Bytes of stream text forwarded per stream and execution, in `SANDCELL_STREAM_LIMIT`.
pub const STREAM_LIMIT_VAR: &str = "SANDCELL_STREAM_LIMIT";
/// The default outputs folder inside a sandbox.
pub const DEFAULT_OUTPUTS_DIR: &str = "/workspace/outputs";
/// The default per-stream, per-execution limit of forwarded text.
pub const DEFAULT_STREAM_LIMIT: u64 = 1024 * 1024;

const PYTHON: &str = include_str!("../kernels/python/kernel.py");
const NODE: &str = include_str!("../kernels/node/kernel.js");
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

/// The command line that starts `language`'s kernel (the program rides on it, so nothing is
/// written to disk).
pub fn command(language: Language) -> Vec<String> {
    let src = source(language).to_string();
    let argv: Vec<&str> = match language {
        Language::Python => vec!["/usr/bin/python3", "-c"],
        Language::Node => vec!["/usr/bin/node", "-e"],
        Language::Bash => vec!["/bin/bash", "--noprofile", "--norc", "-c"],
        Language::R => vec!["/usr/bin/Rscript", "-e"],
    };
    let mut out: Vec<String> = argv.into_iter().map(str::to_string).collect();
    out.push(src);
    if language == Language::Bash {
        // $0 of the kernel shell.
        out.push("sandcell-kernel".into());
    }
    out
}

/// Extra environment a kernel of `language` needs besides the protocol variables.
pub fn extra_env(language: Language) -> Vec<(&'static str, &'static str)> {
    match language {
        // Figures are rendered off-screen and captured as PNG.
        Language::Python => vec![("MPLBACKEND", "Agg"), ("PYTHONUNBUFFERED", "1")],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_language_has_a_program_and_a_command() {
        for lang in Language::ALL {
            assert!(!source(lang).trim().is_empty(), "{lang}");
            let argv = command(lang);
            assert!(argv[0].starts_with('/'), "{lang}: {argv:?}");
            assert!(argv.iter().any(|a| a == source(lang)), "{lang}");
        }
    }
}
