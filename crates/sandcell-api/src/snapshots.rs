//! Snapshots: take, list, show with lineage, delete, fork (restore into new sandboxes), and
//! a sandbox's automatic snapshots.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::sandboxes::SandboxInfo;
use crate::values::{Seconds, Tags};

/// Forks one request may make.
pub const MAX_FORKS: u32 = 16;
/// A snapshot name's longest length, in bytes.
pub const MAX_NAME: usize = 200;
/// A snapshot description's longest length, in bytes.
pub const MAX_DESCRIPTION: usize = 4000;
/// Interval snapshots kept when `keep` is not given.
pub const DEFAULT_KEEP: u32 = 3;
/// The tag automatic snapshots carry (`interval` or `before-reclaim`).
pub const AUTO_TAG: &str = "auto";

/// `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// A name (default: the sandbox id and the time).
    pub name: Option<String>,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// Tags to find it by.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub tags: Tags,
    /// What it keeps of the named volumes the sandbox mounts (host folders are never kept).
    #[serde(default)]
    pub volumes: VolumeCarry,
}

/// What a snapshot keeps of its sandbox's named volumes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum VolumeCarry {
    /// Nothing: a sandbox made from it mounts the same volumes again, as they are then.
    #[default]
    Mount,
    /// A copy of each, taken with the rest while the sandbox is paused: each sandbox made
    /// from it mounts a new volume of its own (`<name>-<6 hex>`), filled from the copy.
    Copy,
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotInfo {
    /// Its id.
    pub id: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The snapshot that sandbox came from (its parent in the lineage).
    pub parent_id: Option<String>,
    /// Its name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// `files`, `language` or `process`: what a restore brings back.
    pub fidelity: String,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// Bytes on disk.
    pub size: u64,
    /// Files carried.
    pub files: u64,
    /// What it holds: the carried files and their checksum, what was skipped, what a
    /// snapshot of this fidelity does not carry.
    pub manifest: serde_json::Value,
    /// The named volumes it keeps copies of (`"volumes": "copy"` when taken).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeCopyInfo>,
    /// Snapshots taken of sandboxes forked from this one (only when shown alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<String>>,
    /// Sandboxes restored or forked from it (only when shown alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<Vec<String>>,
}

/// A volume a snapshot keeps a copy of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeCopyInfo {
    /// The volume it was taken of.
    pub volume: String,
    /// Where the sandbox mounted it (and sandboxes made from the snapshot mount the copy).
    pub path: String,
    /// The copy's size (a tar archive).
    pub bytes: u64,
}

/// Snapshots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotList {
    /// Oldest first.
    pub snapshots: Vec<SnapshotInfo>,
}

/// `POST /v1/snapshots/{id}/fork`: how many sandboxes, and what each gets besides the
/// snapshot's own settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ForkSnapshot {
    /// How many sandboxes (1 to 16; default 1).
    pub count: Option<u32>,
    /// Labels of the new sandboxes.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub labels: Tags,
    /// Metadata of the new sandboxes.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub metadata: Tags,
    /// Lifetime in seconds.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub timeout_secs: Option<Seconds>,
    /// Idle timeout in seconds.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub idle_timeout_secs: Option<Seconds>,
    /// Forget each new sandbox's record when it stops.
    #[serde(default)]
    pub ephemeral: bool,
    /// Values for the snapshot's secrets, by name (needed when the daemon restarted since
    /// the snapshot was taken; otherwise they replace the values the forks would inherit).
    #[serde(default)]
    pub secrets: Vec<crate::sandboxes::SecretInput>,
}

/// One sandbox made from a snapshot, and what came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Forked {
    /// The new sandbox.
    pub sandbox: SandboxInfo,
    /// What the restore brought back (fidelity, files, what was not carried).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub restore: serde_json::Value,
}

/// The result of a fork.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkResult {
    /// The sandboxes, in order.
    pub sandboxes: Vec<Forked>,
}

/// Automatic snapshots of one sandbox (`auto_snapshot` at creation, or
/// `PUT /v1/sandboxes/{id}/auto-snapshot`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AutoSnapshot {
    /// Take one every this many seconds while it runs (none: no interval snapshots).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub interval_secs: Option<Seconds>,
    /// Take one just before it is stopped for idleness or its lifetime.
    #[serde(default)]
    pub before_reclaim: bool,
    /// Interval snapshots kept (the oldest go; default 3, at most 100).
    pub keep: Option<u32>,
}
