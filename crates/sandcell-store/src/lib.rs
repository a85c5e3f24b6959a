//! The Sandcell daemon's metadata store, on SQLite.
//!
//! It keeps what must outlive the daemon process: sandbox records and the history of their
//! state transitions, API keys (as SHA-256 hashes, never the secrets), exports copied out of
//! sandboxes, the contexts (kernels) of sandboxes, agent runs and their trajectories, memories
//! (with their full-text index, their vectors, and the jobs that extract them with a model),
//! and the audit log. Files themselves (exports, snapshots,
//! trajectories) live on disk next to the database; the store only records where.
//!
//! # Plain records, JSON columns
//!
//! The store depends on no other Sandcell crate. Whatever belongs to the engine or a backend
//! (the sandbox spec, the backend's re-attach data, audit details) is a JSON column the store
//! never interprets, and the daemon maps records to engine types. So the engine's types can
//! grow without a schema migration, and the store stays testable on its own. Labels and
//! metadata are JSON objects of strings, which list queries filter on with `json_each`.
//!
//! # Durability
//!
//! The database runs in WAL mode. Every write is one transaction, committed before the method
//! returns, so a transition the daemon acknowledges is on disk in the write-ahead log. A
//! committed transaction is never lost when the daemon crashes or is killed with `kill -9`,
//! with either [`Durability`]: the log is in the OS page cache the moment the commit returns,
//! and the next open replays it. What the default `synchronous=NORMAL` gives up is only the
//! fsync per commit: an OS crash or power loss may roll back the last commits (the file stays
//! consistent). [`Durability::PowerLoss`] (`synchronous=FULL`) closes that gap at one fsync
//! per write.
//!
//! Several connections (threads with their own [`Store`], or processes) may share one file:
//! writes take SQLite's write lock at the start of their transaction and wait up to
//! [`BUSY_TIMEOUT`] for it.

#![forbid(unsafe_code)]

mod audit;
mod contexts;
mod error;
mod exports;
mod keys;
mod memories;
mod memory_jobs;
mod previews;
mod records;
mod runs;
mod sandboxes;
mod schema;
mod snapshots;
mod store;
mod threads;

pub use error::StoreError;
pub use keys::hash_secret;
pub use memories::{MAX_QUERY_TERMS, MemoryHit, MemoryRecord, MemoryVector, fts_query};
pub use memory_jobs::MemoryJobRecord;
pub use records::{
    ApiKeyRecord, AuditEvent, AutoSnapshotRecord, ContextRecord, ExportKind, ExportRecord, Page,
    RunEventRecord, RunRecord, SandboxEvent, SandboxQuery, SandboxRecord, SnapshotRecord,
};
pub use schema::{LATEST_SCHEMA_VERSION, migrations};
pub use store::{BUSY_TIMEOUT, Durability, Store, page_size};
pub use threads::ThreadRecord;

/// Page size of a listing that asks for none (`limit: 0`).
pub const DEFAULT_PAGE_SIZE: u32 = 100;

/// The largest page a listing returns, whatever it asks for.
pub const MAX_PAGE_SIZE: u32 = 1000;

/// The store is shared by the daemon's threads.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Store>();
};
