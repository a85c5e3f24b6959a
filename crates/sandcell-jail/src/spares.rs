//! What the pools of things made ahead of time share: network namespaces
//! ([`crate::netns_pool`]) and sandbox cgroups ([`crate::cgroup::spares`]). A launcher takes
//! one for its sandbox on the start path, and makes new ones at idle priority while its
//! sandbox runs. Each item is used by one sandbox only.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

use crate::error::JailError;

/// An item taken by a process that died before finishing with it is cleared once it is this
/// old (a younger one may belong to a taker that has not written its pid yet).
pub const ABANDONED_AFTER: Duration = Duration::from_secs(10);

/// Creates the pool directory `dir` (mode 0700) when missing and checks that only root can
/// write to it: what it holds becomes part of sandboxes.
pub fn ensure_pool_dir(dir: &Path) -> Result<(), JailError> {
    let op = |what: &str| format!("{what} the pool {}", dir.display());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| JailError::io(op("create"), e))?;
    let meta = fs::metadata(dir).map_err(|e| JailError::io(op("stat"), e))?;
    if meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        return Err(JailError::Config(format!(
            "{} must belong to root with mode 0700 (it has uid {} and mode {:o})",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// A name no other item of any pool on this host has: `<prefix><pid>-<nanoseconds>`.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}{}-{nanos}", std::process::id())
}

/// Whether the item whose claim is `claim` (a file at least [`ABANDONED_AFTER`] old) was
/// taken by process `taker`, which is gone.
pub fn abandoned(claim: &Path, taker: Option<u32>) -> bool {
    let old = fs::symlink_metadata(claim)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= ABANDONED_AFTER);
    let alive = taker.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
    old && !alive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_young_claims_are_not_abandoned() {
        assert_ne!(unique("x-"), unique("x-"));
        let dir = tempfile::tempdir().unwrap();
        let claim = dir.path().join("c");
        fs::write(&claim, "").unwrap();
        assert!(!abandoned(&claim, None), "a fresh claim is left alone");
        assert!(!abandoned(&dir.path().join("missing"), None));
    }
}
