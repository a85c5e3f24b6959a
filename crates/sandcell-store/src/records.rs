//! The plain records the store reads and writes.
//!
//! Times are milliseconds since the Unix epoch, supplied by the caller (the store never reads
//! the clock, so tests and the daemon decide what "now" is).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One sandbox as the daemon remembers it across restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Unique id, chosen by the daemon.
    pub id: String,
    /// The owner (tenant / API key owner) it belongs to.
    pub owner: String,
    /// Lifecycle state (`creating`, `running`, ...); free text, the store does not interpret it.
    pub state: String,
    /// Why the sandbox is in its state, for `failed` and `lost`.
    pub reason: Option<String>,
    /// The sandbox's spec as the engine serialized it.
    pub spec: Value,
    /// User labels; list queries filter on them.
    pub labels: BTreeMap<String, String>,
    /// User metadata; list queries filter on it too.
    pub metadata: BTreeMap<String, String>,
    /// When it was created (ms).
    pub created_at: i64,
    /// When the record last changed (ms).
    pub updated_at: i64,
    /// When something last happened in it (ms), for the idle timeout.
    pub last_active_at: i64,
    /// Idle time after which the GC stops it, if any.
    pub idle_timeout_ms: Option<u64>,
    /// Hard deadline from its maximum lifetime (ms), if any.
    pub expires_at: Option<i64>,
    /// Destroyed rather than kept when the daemon shuts down.
    pub ephemeral: bool,
    /// Backend data needed to re-attach after a daemon restart (host pid, cgroup record,
    /// agent socket path); opaque to the store.
    pub runtime: Value,
}

/// One recorded state change of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxEvent {
    /// Position in the store's event log, assigned by the store (increasing, never reused).
    pub id: i64,
    /// The sandbox it happened to (kept after the sandbox record is deleted).
    pub sandbox_id: String,
    /// When (ms).
    pub at: i64,
    /// The state before; empty for the sandbox's first event.
    pub from_state: String,
    /// The state after.
    pub to_state: String,
    /// Why, when known.
    pub reason: Option<String>,
}

/// An API key; the secret itself is never stored, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// Short public id (what `revoke` and audit records name).
    pub id: String,
    /// The owner the key acts as.
    pub owner: String,
    /// A human name for the key.
    pub name: String,
    /// SHA-256 of the secret, lowercase hex (see [`crate::hash_secret`]).
    pub hash: String,
    /// The secret's first characters, shown to users to recognise the key.
    pub prefix: String,
    /// Whether the key may administer other owners' resources and keys.
    pub admin: bool,
    /// When it was created (ms).
    pub created_at: i64,
    /// When it was last used (ms).
    pub last_used_at: Option<i64>,
    /// When it was revoked (ms); revoked keys no longer authenticate.
    pub revoked_at: Option<i64>,
}

/// What an export holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportKind {
    /// A single file.
    File,
    /// A directory tree.
    Dir,
}

impl ExportKind {
    /// The value stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportKind::File => "file",
            ExportKind::Dir => "dir",
        }
    }

    /// Parses a stored `kind` value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "file" => Some(ExportKind::File),
            "dir" => Some(ExportKind::Dir),
            _ => None,
        }
    }
}

/// A file or directory exported out of a sandbox; it outlives the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRecord {
    /// Unique id.
    pub id: String,
    /// The owner it belongs to.
    pub owner: String,
    /// The sandbox it came from (which may since have been deleted).
    pub sandbox_id: String,
    /// Its path inside the sandbox.
    pub path: String,
    /// File or directory.
    pub kind: ExportKind,
    /// When it was exported (ms).
    pub created_at: i64,
    /// Size in bytes, when known.
    pub size: Option<u64>,
    /// SHA-256 of the content (lowercase hex), when known.
    pub sha256: Option<String>,
    /// Where the daemon keeps a copy on the host, if it keeps one.
    pub stored_path: Option<String>,
}

/// A context (a kernel) of a sandbox, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextRecord {
    /// The sandbox it belongs to.
    pub sandbox_id: String,
    /// Its id within the sandbox.
    pub id: String,
    /// The sandbox's owner.
    pub owner: String,
    /// Its language (`python`, `node`, …).
    pub language: String,
    /// Its working directory, when one was asked for.
    pub cwd: Option<String>,
    /// When it was made (ms).
    pub created_at: i64,
    /// When it ended (ms), if it has.
    pub ended_at: Option<i64>,
    /// Why it ended.
    pub end_reason: Option<String>,
}

/// A snapshot of a sandbox: files (and, by fidelity, state) kept on disk, recorded once
/// whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Unique id.
    pub id: String,
    /// The owner it belongs to.
    pub owner: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The snapshot that sandbox was restored or forked from, if any.
    pub parent_id: Option<String>,
    /// A name given by its owner.
    pub name: String,
    /// A description given by its owner.
    pub description: String,
    /// Tags given by its owner.
    pub tags: BTreeMap<String, String>,
    /// `files`, `language` or `process`.
    pub fidelity: String,
    /// When it was taken (ms).
    pub created_at: i64,
    /// Bytes on disk.
    pub size: u64,
    /// What it holds and their checksums (JSON the engine writes and reads).
    pub manifest: serde_json::Value,
    /// Its folder on the host.
    pub path: String,
}

/// When a sandbox is snapshotted on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoSnapshotRecord {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its owner.
    pub owner: String,
    /// Every this many ms (None: not on an interval).
    pub interval_ms: Option<u64>,
    /// Just before it is stopped for idleness or its lifetime.
    pub before_reclaim: bool,
    /// Interval snapshots kept (older ones are deleted).
    pub keep: u32,
    /// When the last interval snapshot was taken (ms).
    pub last_at: Option<i64>,
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Position in the log, assigned by the store ([`crate::Store::audit`] ignores it).
    pub id: i64,
    /// When (ms).
    pub at: i64,
    /// The owner acting, if authenticated.
    pub owner: Option<String>,
    /// The API key used, if any.
    pub key_id: Option<String>,
    /// What was done (`sandbox.create`, `key.revoke`, ...).
    pub action: String,
    /// What it was done to (a sandbox id, a key id, ...).
    pub target: Option<String>,
    /// Action-specific details.
    pub detail: Option<Value>,
    /// The API request it belongs to, to correlate with logs.
    pub request_id: Option<String>,
}

/// Filters and position for [`crate::Store::list_sandboxes`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxQuery {
    /// Only this owner's sandboxes.
    pub owner: Option<String>,
    /// Only sandboxes in one of these states; empty means any.
    pub states: Vec<String>,
    /// Only sandboxes carrying all these labels with exactly these values.
    pub labels: BTreeMap<String, String>,
    /// Only sandboxes carrying all these metadata entries with exactly these values.
    pub metadata: BTreeMap<String, String>,
    /// Page size: 0 means [`crate::DEFAULT_PAGE_SIZE`], larger than [`crate::MAX_PAGE_SIZE`]
    /// is capped.
    pub limit: u32,
    /// Where to continue: the `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The records on this page, in listing order.
    pub items: Vec<T>,
    /// Pass this as the next query's cursor to get the following page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// One agent run as the store keeps it. What the agent puts in `settings` (budgets, options)
/// and `totals` (usage so far) is JSON the store does not interpret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Unique id (`run-…`).
    pub id: String,
    /// Whose run it is.
    pub owner: String,
    /// The run at the top of its tree (itself for a top-level run).
    pub root_id: String,
    /// The run that started this one as a sub-run, if any.
    pub parent_id: Option<String>,
    /// 0 for a top-level run, one more per level of sub-runs.
    pub depth: u32,
    /// `tools` or `repl`.
    pub mode: String,
    /// The model string (`provider/model`).
    pub model: String,
    /// The task (or prompt) it was given.
    pub task: String,
    /// The sandbox it runs in, once it has one.
    pub sandbox_id: Option<String>,
    /// `queued`, `running`, `succeeded`, `failed`, `cancelled`; free text to the store.
    pub status: String,
    /// Why it ended (`final`, `budget:tokens`, …).
    pub reason: Option<String>,
    /// Its answer, when it gave one.
    pub answer: Option<String>,
    /// What it was started with (budgets, options).
    pub settings: Value,
    /// Usage so far (tokens, cost, steps).
    pub totals: Value,
    /// When it was made (ms).
    pub created_at: i64,
    /// When the record last changed (ms).
    pub updated_at: i64,
    /// When it ended (ms), if it has.
    pub ended_at: Option<i64>,
}

/// One event of a run's trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEventRecord {
    /// The run.
    pub run_id: String,
    /// Its place in the run's trajectory: 1, 2, 3, … without gaps.
    pub seq: u64,
    /// When (ms).
    pub at: i64,
    /// The event's type (`llm_response`, `tool_result`, …), for filtering without parsing.
    pub kind: String,
    /// The whole event as the agent wrote it.
    pub event: Value,
}
