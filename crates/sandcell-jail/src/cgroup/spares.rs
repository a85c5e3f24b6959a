//! Sandbox cgroups made ahead of time: finding the cgroup layout (reading mountinfo) and the
//! mkdirs took ~0.4 ms of every launch; taking a spare and writing the limits takes ~0.1 ms.
//!
//! A spare is a cgroup made by [`SandboxCgroup::make`] under a unique name, never used, and
//! described by `<dir>/<name>.json`. Taking one renames that file to `<name>.taken-<pid>`
//! (atomic: one taker wins), reads it and removes it; the cgroup then belongs to one sandbox
//! and is removed with it, as a cgroup made at launch would be.

use std::fs;
use std::path::{Path, PathBuf};

use super::SandboxCgroup;
use crate::error::JailError;
use crate::spares::{abandoned, ensure_pool_dir, unique};

/// Entries of the current layout (v3: cpuacct and freezer joined on v1). Entries of older
/// layouts are removed, with their cgroups, by the next refill.
const ENTRY: &str = ".v3.json";
const TAKEN: &str = ".taken-";

/// A directory of spare cgroups (one per cgroup parent).
#[derive(Debug, Clone)]
pub struct CgroupSpares {
    dir: PathBuf,
}

impl CgroupSpares {
    /// The spares kept in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Takes a spare, or `None` when there is none.
    pub fn take(&self) -> Option<SandboxCgroup> {
        for entry in fs::read_dir(&self.dir).ok()?.flatten() {
            let path = entry.path();
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(ENTRY)) else {
                continue;
            };
            let claim = self
                .dir
                .join(format!("{name}{TAKEN}{}", std::process::id()));
            if fs::rename(&path, &claim).is_err() {
                // Another launcher took it.
                continue;
            }
            let cg = read_entry(&claim);
            let _ = fs::remove_file(&claim);
            match cg {
                Some(cg) if cg.paths().iter().all(|p| p.is_dir()) => return Some(cg),
                // Gone (removed by hand, or a reboot kept the entry): nothing to use.
                _ => continue,
            }
        }
        None
    }

    /// How many spares are ready.
    pub fn spares(&self) -> usize {
        fs::read_dir(&self.dir).map_or(0, |list| {
            list.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(ENTRY))
                .count()
        })
    }

    /// Makes spares under `<root>/<parent>` until `target` exist; returns how many it made.
    pub fn refill(&self, root: &Path, parent: &str, target: usize) -> Result<usize, JailError> {
        ensure_pool_dir(&self.dir)?;
        let spares = self.sweep();
        let mut made = 0;
        for _ in spares..target {
            let cg = SandboxCgroup::make(root, parent, &unique("spare-"), false)?;
            let name = cg.paths()[0]
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| unique("spare-"));
            let tmp = self.dir.join(format!(".{name}.tmp"));
            let written = serde_json::to_vec(&cg)
                .map_err(|e| JailError::Config(e.to_string()))
                .and_then(|json| {
                    fs::write(&tmp, json)
                        .and_then(|()| fs::rename(&tmp, self.dir.join(format!("{name}{ENTRY}"))))
                        .map_err(|e| JailError::io("record a spare cgroup", e))
                });
            if let Err(e) = written {
                let _ = fs::remove_file(&tmp);
                let _ = cg.remove();
                return Err(e);
            }
            made += 1;
        }
        Ok(made)
    }

    /// Removes the cgroups of takers that died before reading their entry; returns the
    /// spares left.
    fn sweep(&self) -> usize {
        let Ok(list) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut spares = 0;
        for entry in list.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(ENTRY) {
                spares += 1;
            } else if name.ends_with(".json") && !name.starts_with('.') {
                let path = entry.path();
                if let Some(cg) = read_entry(&path) {
                    let _ = cg.remove();
                }
                let _ = fs::remove_file(&path);
            } else if let Some((_, pid)) = name.split_once(TAKEN) {
                let path = entry.path();
                if abandoned(&path, pid.parse().ok()) {
                    if let Some(cg) = read_entry(&path) {
                        let _ = cg.remove();
                    }
                    let _ = fs::remove_file(&path);
                }
            }
        }
        spares
    }
}

fn read_entry(path: &Path) -> Option<SandboxCgroup> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}
