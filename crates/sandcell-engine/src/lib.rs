//! The Sandcell engine: the one API every front end (CLI, REST, MCP, SDKs) calls.
//!
//! An [`Engine`] is built with the backends it may use ([`Backend`] implementations such as
//! the `process` backend) and creates [`Sandbox`]es from a [`SandboxSpec`]. A sandbox runs
//! the guest agent, which the engine reaches through a [`client::GuestClient`].

#![forbid(unsafe_code)]

pub mod backend;
pub mod client;
mod code;
pub mod egress;
mod engine;
pub mod error;
pub mod fleet;
pub mod host_call;
mod process;
mod sandbox;
pub mod snapshot;
pub mod spec;
mod transfer;

pub use backend::{
    Backend, BackendCapabilities, BackendFeatures, BackendInstance, CheckpointSupport, Fidelity,
    GuestStream, IsolationLevel, LaunchedSandbox, ResourceCounters,
};
pub use code::{CodeEvent, CodeOutput, CodeRun, CodeStream, OutputKind};
pub use engine::{Engine, EngineBuilder, new_sandbox_id};
pub use error::EngineError;
pub use host_call::{HostCallFuture, HostCallHandler, HostCallRequest};
pub use process::{AttachEvent, AttachFrom, AttachOutput, AttachStream, BackgroundProcess};
pub use sandbox::{ExecEvent, ExecOutput, ExecStream, Sandbox, Timings};
pub use sandcell_api::volumes::MountMode;
pub use snapshot::{FilesCapture, FilesRestore, RestoreReport, SnapshotManifest};
pub use spec::{BackendKind, NetworkPolicy, SandboxLimits, SandboxMount, SandboxSpec};
pub use transfer::{Download, Upload};
