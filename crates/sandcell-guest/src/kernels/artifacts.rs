//! Artifacts: files in the outputs folder that an execution created or changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use sandcell_kernels::DEFAULT_OUTPUTS_DIR;
use sandcell_protocol::Artifact;

use crate::sync::lock;
use crate::workers::Workers;

/// Files of the outputs folder looked at for artifacts, at most.
const ARTIFACT_SCAN_LIMIT: usize = 10_000;

/// A directory's inode, size and modification time. While it is unchanged, an empty
/// directory is still empty: an entry added changes its size on tmpfs (where `/workspace`
/// is), and its mtime elsewhere. One `statx` instead of a listing, twice per execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirStamp {
    ino: u64,
    size: u64,
    mtime: (i64, u32),
}

fn dir_stamp(dir: &Path) -> Option<DirStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    Some(DirStamp {
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), u32::try_from(m.mtime_nsec()).unwrap_or(0)),
    })
}

pub(super) fn outputs_dir() -> String {
    DEFAULT_OUTPUTS_DIR.to_string()
}

type OutputsSnapshot = BTreeMap<PathBuf, (u64, SystemTime)>;

/// Below this many files (at the last look) the outputs folder is scanned on the runtime
/// thread: cheaper than a hop to a worker thread and back, twice per execution.
const INLINE_SCAN_MAX: usize = 64;

/// What the last look at the outputs folder found, so that the next look is cheap.
#[derive(Debug, Default)]
pub(super) struct Outputs {
    /// Files in the outputs folder at the last look.
    seen: AtomicUsize,
    /// The outputs folder's stamp when the last look found it empty (see [`DirStamp`]).
    empty: Mutex<Option<DirStamp>>,
}

impl Outputs {
    /// Files in the outputs folder with their size and mtime (None when there is no folder).
    pub(super) async fn snapshot(&self, workers: &Workers) -> Option<OutputsSnapshot> {
        let dir = PathBuf::from(outputs_dir());
        // Taken before the listing: an entry added after it changes the stamp.
        let stamp = dir_stamp(&dir);
        if stamp.is_some() && *lock(&self.empty) == stamp {
            return Some(BTreeMap::new());
        }
        let listed = dir.clone();
        let scan_all = move || {
            let mut out = BTreeMap::new();
            scan(&listed, 0, &mut out).then_some(out)
        };
        let last = self.seen.load(Ordering::Relaxed);
        let snapshot = if last < INLINE_SCAN_MAX {
            scan_all()
        } else {
            workers.run(scan_all).await.ok().flatten()
        };
        let seen = snapshot.as_ref().map_or(0, BTreeMap::len);
        self.seen.store(seen, Ordering::Relaxed);
        // No files may still mean subfolders, whose new files the stamp would not show.
        let empty = seen == 0 && std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
        *lock(&self.empty) = if empty { stamp } else { None };
        snapshot
    }

    /// The files created or changed since `before`, as artifacts.
    pub(super) async fn changed(
        &self,
        workers: &Workers,
        before: OutputsSnapshot,
    ) -> Vec<Artifact> {
        let Some(after) = self.snapshot(workers).await else {
            return Vec::new();
        };
        after
            .into_iter()
            .filter(|(path, meta)| before.get(path) != Some(meta))
            .map(|(path, (size, _))| Artifact {
                mime: mime_of(&path).to_string(),
                path: path.display().to_string(),
                size,
            })
            .collect()
    }
}

fn scan(dir: &Path, depth: usize, out: &mut OutputsSnapshot) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return depth > 0;
    };
    for entry in entries.flatten() {
        if out.len() >= ARTIFACT_SCAN_LIMIT {
            break;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() && depth < 8 {
            scan(&entry.path(), depth + 1, out);
        } else if meta.is_file() {
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            out.insert(entry.path(), (meta.len(), mtime));
        }
    }
    true
}

/// A MIME type from a file name.
fn mime_of(path: &Path) -> &'static str {
    sandcell_protocol::mime_of_name(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_types_from_names() {
        assert_eq!(mime_of(Path::new("/w/outputs/plot.PNG")), "image/png");
        assert_eq!(mime_of(Path::new("data.csv")), "text/csv");
        assert_eq!(mime_of(Path::new("blob")), "application/octet-stream");
    }
}
