//! Sandcell's typed operations, under every front end.
//!
//! [`Service`] holds the fleet, the store, the metrics, the audit log and the settings; its
//! operations (one module per resource) take typed requests from `sandcell-api` and a
//! [`Caller`], and return typed responses or a [`ServiceError`] of a closed set of kinds. The
//! REST server only extracts, calls and maps errors to HTTP; the in-process MCP tools, the
//! CLI's embedded paths and the agent runtime call the same operations. [`Service::tick`]
//! runs one round of the lifecycle (automatic snapshots, then expiry).
//!
//! A crate rather than a module tree of the server: the agent runtime and a second API
//! dialect must reach these operations without linking axum or HTTP at all.

#![forbid(unsafe_code)]

pub mod caller;
pub mod code;
pub mod config;
pub mod error;
pub mod exec;
pub mod files;
pub mod git;
pub mod images;
pub mod keys;
pub mod ledger;
pub mod lifecycle;
pub mod memory;
pub mod metrics;
pub mod network;
pub mod packages;
pub mod previews;
pub mod processes;
pub mod sandboxes;
pub mod secrets;
pub mod signed_url;
pub mod snapshots;
pub mod system;
pub mod templates;
pub mod transfer;
pub mod usage;
pub mod volumes;

mod service;

pub use caller::Caller;
pub use error::{ErrorKind, ServiceError, ServiceResult};
pub use service::{SeenContexts, Service};

/// Whether the service runs as root (who may give files to other users' ids).
pub(crate) fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}
