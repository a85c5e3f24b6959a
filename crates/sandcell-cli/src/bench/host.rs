//! The host side of the comparisons: the Python interpreter the benchmarks time against,
//! running a host program quietly, finding one on `PATH`, finding the test kit's
//! `scripted-llm` and `fake-registries`. It uses no other benchmark module.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The interpreter both the sandboxes and the host comparisons run.
pub(super) const PYTHON: &str = "/usr/bin/python3";

/// Runs `cmd` with no stdin and its output discarded; fails unless it succeeds.
pub(super) fn check(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}

/// The first `name` on `PATH`.
pub(super) fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// `scripted-llm` beside this binary (`cargo build -p sandcell-testkit --features llm --bin
/// scripted-llm` puts it there), or at `$SANDCELL_SCRIPTED_LLM`.
pub(super) fn scripted_llm_bin() -> anyhow::Result<PathBuf> {
    test_kit_bin("scripted-llm", "SANDCELL_SCRIPTED_LLM", "llm")
}

/// `fake-registries` beside this binary (`cargo build -p sandcell-testkit --features
/// registries --bin fake-registries` puts it there), or at `$SANDCELL_FAKE_REGISTRIES`.
pub(super) fn fake_registries_bin() -> anyhow::Result<PathBuf> {
    test_kit_bin("fake-registries", "SANDCELL_FAKE_REGISTRIES", "registries")
}

/// The test kit's binary `name` at `$var`, else beside this binary (a release build also
/// finds a debug one), built with the test kit's `feature`.
fn test_kit_bin(name: &str, var: &str, feature: &str) -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("find the sandcell binary")?;
    let dir = exe.parent().context("the binary's folder")?;
    for candidate in [dir.join(name), dir.join("../debug").join(name)] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "no {name} beside {} (build it: cargo build --release -p sandcell-testkit --features {feature} --bin {name}), or set ${var}",
        exe.display()
    )
}
