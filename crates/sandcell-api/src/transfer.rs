//! Moving files between sandboxes and the host: exports (a file or folder copied out of a
//! sandbox and kept by the service), imports (from an allowed host path, inline text or
//! base64, or an export), and the artifacts folder.

use serde::{Deserialize, Serialize};

/// The sandbox folder code executions leave files in.
pub const ARTIFACTS_DIR: &str = "/workspace/outputs";

/// `POST /exports`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateExport {
    /// A file or folder in the sandbox.
    pub path: String,
}

/// An export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportInfo {
    /// Its id.
    pub id: String,
    /// The sandbox it came from.
    pub sandbox_id: String,
    /// The path it had there.
    pub path: String,
    /// `file` or `dir`.
    pub kind: String,
    /// Bytes (of all files, for a folder).
    pub size: Option<u64>,
    /// SHA-256 of a file's bytes.
    pub sha256: Option<String>,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// Where to download it (a folder comes as a tar archive), with the API key.
    pub download_url: String,
    /// The same download without an API key, for whoever holds this link, until
    /// `signed_url_expires_at` (each answer about the export gives a fresh one; none when
    /// `exports.url_ttl_secs` is 0). Relative to the service's address.
    pub signed_url: Option<String>,
    /// When `signed_url` stops working (RFC 3339).
    pub signed_url_expires_at: Option<String>,
}

/// Exports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportList {
    /// Oldest first (in the order they were made).
    pub exports: Vec<ExportInfo>,
}

/// `POST /import`: where the files go and exactly one source.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    /// Where it goes in the sandbox (a folder source becomes this folder).
    pub path: String,
    /// A host file or folder inside one of the service's `import.allowed_paths`.
    pub host_path: Option<String>,
    /// The file's content as text.
    pub text: Option<String>,
    /// The file's content in base64.
    pub base64: Option<String>,
    /// An export of yours (from any of your sandboxes, running or not).
    pub export_id: Option<String>,
    /// Permission bits of imported files, e.g. 493 (0o755).
    pub mode: Option<u32>,
}

/// What an import wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportResult {
    /// Where it went (absolute).
    pub path: String,
    /// Files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// A file in the artifacts folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Artifact {
    /// Its path in the sandbox (download it with `/files/content?path=`).
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// Its MIME type, from its name.
    pub mime: String,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
}

/// The artifacts folder's files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArtifactList {
    /// Files under `/workspace/outputs`, by path.
    pub artifacts: Vec<Artifact>,
}
