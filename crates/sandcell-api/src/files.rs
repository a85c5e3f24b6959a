//! Files of a sandbox: list, stat, mkdir, remove, rename, and file contents streamed both
//! ways (the bodies of `/files/content` are raw bytes, not types).

use sandcell_protocol::{FileEntry, FileKind};
use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// Longest path accepted (the kernel's PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// The folder listed when no path is given.
pub const DEFAULT_DIR: &str = "/workspace";

/// Checks a path's shape; whether it stays inside the sandbox's folders is the agent's call
/// (it resolves every component without following links out).
pub fn check_path(path: &str) -> Result<(), ValidationError> {
    if path.is_empty() || path.len() > MAX_PATH || path.contains('\0') {
        return Err(ValidationError(format!(
            "a path must be 1 to {MAX_PATH} bytes without NUL"
        )));
    }
    Ok(())
}

/// Checks permission bits (at most `0o7777`).
pub fn check_mode(mode: u32) -> Result<(), ValidationError> {
    if mode > 0o7777 {
        return Err(ValidationError(
            "mode must be permission bits (at most 0o7777)".into(),
        ));
    }
    Ok(())
}

/// One file or directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileInfo {
    /// Last path component.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Permission bits, e.g. 420 (0o644).
    pub mode: u32,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Where a symlink points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

impl From<FileEntry> for FileInfo {
    fn from(e: FileEntry) -> Self {
        let kind = match e.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        };
        Self {
            name: e.name,
            path: e.path,
            size: e.size,
            kind: kind.to_string(),
            is_dir: e.is_dir,
            mode: e.mode,
            mtime: e.mtime,
            link_target: e.link_target,
        }
    }
}

/// A directory's entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileList {
    /// The entries, sorted by name.
    pub entries: Vec<FileInfo>,
}

/// A path to create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    /// Absolute path, or relative to `/workspace`.
    pub path: String,
}

/// A move.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Rename {
    /// Where it is.
    pub from: String,
    /// Where it goes (must not exist).
    pub to: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_modes_have_shapes() {
        assert!(check_path("/workspace/a.txt").is_ok());
        assert!(check_path("rel/a").is_ok());
        for bad in [String::new(), "a\0b".into(), "x".repeat(MAX_PATH + 1)] {
            assert!(check_path(&bad).is_err(), "{bad:?}");
        }
        assert!(check_mode(0o755).is_ok());
        assert!(check_mode(0o10000).is_err());
    }

    #[test]
    fn a_file_info_keeps_its_wire_form() {
        let info = FileInfo {
            name: "a".into(),
            path: "/workspace/a".into(),
            size: 1,
            kind: "file".into(),
            is_dir: false,
            mode: 0o644,
            mtime: 5,
            link_target: None,
        };
        let json = serde_json::to_value(&info).unwrap();
        assert!(json.get("link_target").is_none());
        assert_eq!(serde_json::from_value::<FileInfo>(json).unwrap(), info);
    }
}
