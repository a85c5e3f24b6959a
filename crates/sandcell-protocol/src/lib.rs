//! Wire types and the frame codec spoken between the Sandcell host and its guest agent.
//!
//! A connection carries length-prefixed frames (see [`frame`]). Control messages are JSON
//! ([`HostMessage`] host→guest, [`GuestMessage`] guest→host); bulk bytes (stdin, stdout,
//! stderr, file contents) travel as raw [`DataChunk`]s so they are never base64-inflated.
//! Every frame carries a request id, so many requests share one stream.

pub mod code;
pub mod exec;
pub mod frame;
pub mod fs;
pub mod isolation;
pub mod message;

pub use code::{
    Artifact, CodeDone, CodeError, CodeStatus, Completeness, ContextInfo, Language, MimeBundle,
    RunCodeRequest, Unrepresentable, VariableInfo, Variables,
};
pub use exec::{
    ExecCommand, ExecExit, ExecRequest, ExecResult, ExitCause, ProcessInfo, signal_name,
};
pub use frame::{
    Channel, DataChunk, Frame, FrameDecoder, FrameError, HEADER_LEN, MAX_FRAME_LEN, encode_data,
    encode_message,
};
pub use fs::{FileEntry, FileKind, mime_of_name};
pub use isolation::{Feature, FeatureState, IsolationReport};
pub use message::{ErrorCode, GuestMessage, HostMessage, WireError};

/// The protocol version this build speaks. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

/// Every protocol version this build can serve.
pub const SUPPORTED_VERSIONS: &[u32] = &[PROTOCOL_VERSION];

/// The uid and gid the sandboxed user runs as, inside every sandbox.
pub const SANDBOX_UID: u32 = 65532;

/// Directories inside a sandbox that the file API may touch; the first is the default.
pub const FILE_ROOTS: &[&str] = &["/workspace", "/home/sandbox", "/tmp"];
