//! File metadata as the file API reports it.

use serde::{Deserialize, Serialize};

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by listings).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// One file or directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The entry's name (last path component).
    pub name: String,
    /// The absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// What it is.
    pub kind: FileKind,
    /// Convenience: `kind == Dir`.
    pub is_dir: bool,
    /// Permission bits (`0o644`), without the file-type bits.
    pub mode: u32,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Where a symlink points, for symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}
