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

/// A MIME type from a file name's extension (`application/octet-stream` when unknown).
pub fn mime_of_name(name: &str) -> &'static str {
    let file = name.rsplit('/').next().unwrap_or(name);
    let ext = match file.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => ext.to_ascii_lowercase(),
        _ => String::new(),
    };
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "parquet" => "application/vnd.apache.parquet",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "py" => "text/x-python",
        "js" => "text/javascript",
        "r" => "text/x-r",
        "sh" => "application/x-sh",
        "wav" => "audio/wav",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        _ => "application/octet-stream",
    }
}
