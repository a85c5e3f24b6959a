//! The host side of the comparisons: the Python interpreter the benchmarks time against,
//! running a host program quietly, finding one on `PATH`. It uses no other benchmark module.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::bail;

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
