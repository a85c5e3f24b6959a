//! Wire types and the frame codec spoken between the Sandcell host and its guest agent.
//!
//! A connection carries length-prefixed frames (see [`frame`]). Control messages are JSON
//! ([`HostMessage`] host→guest, [`GuestMessage`] guest→host); bulk bytes (stdin, stdout,
//! stderr, file contents) travel as raw [`DataChunk`]s so they are never base64-inflated.
//! Every frame carries a request id, so many requests share one stream.
//!
//! # Processes: background, reattach, PTY
//!
//! Every process the agent starts with [`HostMessage::Exec`] is *tracked* by its pid (inside
//! the sandbox): the agent keeps the last [`ExecRequest::buffer_bytes`] (default
//! [`exec::DEFAULT_BUFFER_BYTES`]) of its stdout and of its stderr in ring buffers, the total
//! bytes written to each stream so far (the stream's *offset*), its command line, start time
//! and, once it has ended, its [`ExecExit`]. A foreground exec's entry is dropped when its exit
//! is sent on its request; a background exec's entry stays after its exit until
//! [`HostMessage::ReleaseProcess`], or until [`exec::EXITED_PROCESSES_KEPT`] later exits push
//! it out (oldest exit first), or until its pid is reused. Nothing about a tracked process
//! belongs to the request or the connection that started it.
//!
//! ```text
//! host                                   agent
//! Exec{background: true, ..}       ->    ExecStarted{pid}        (the request is over)
//! Attach{pid, stdout_from, ..}     ->    Attached{pid, stdout_offset, stderr_offset, ..}
//!                                        [OutputLost{channel, offset, bytes}]
//!                                        Stdout/Stderr chunks (buffered, then live)
//!                                        ExecExited(exit)        (the attachment is over)
//! Detach (on the Attach's id)      ->    Detached
//! ProcessStdin{pid} + Stdin chunks
//!   + EndOfData | StdinClose       ->    Ok (after the bytes are written)
//! ProcessStdinClose{pid}           ->    Ok
//! Resize{pid, rows, cols}          ->    Ok
//! ReleaseProcess{pid}              ->    Ok
//! ```
//!
//! - **Background** (`ExecRequest::background`): the exec's request ends with `ExecStarted`
//!   and its id is free again; the process is reached by pid from then on (a `Signal` by
//!   `exec_id` does not find it: signal its `pid`, with `tree` for its whole tree, and a
//!   tree SIGKILL marks its exit `killed`). Its output is only buffered; `stdout_limit` and
//!   `stderr_limit` do not apply, and its exit's `*_truncated` say whether its ring buffer
//!   had to drop bytes.
//! - **Attach** replays from the requested offsets and follows; any number of attachments
//!   may follow one process (foreground or background), each at its own pace. A slow
//!   attachment never slows the process: when the ring buffer overwrites bytes it has not
//!   sent yet it gets an [`GuestMessage::OutputLost`] and resumes at the oldest byte still
//!   there. Its chunks' `seq` starts at 0 like an exec's. Live output keeps the order between
//!   stdout and stderr as it is read; a replay sends each stream in order, alternating per
//!   chunk (the buffers do not record how the two interleaved). Its `ExecExited` is the
//!   process's exit with `stdout_truncated`/`stderr_truncated` saying whether this attachment
//!   lost bytes. An unknown (or released) pid is [`ErrorCode::NoSuchProcess`].
//! - **Stdin by pid**: the `ProcessStdin` request's `Stdin` chunks go, in order, into the same
//!   queue as the exec request's own stdin chunks; its `Ok` comes once they are written into
//!   the pipe or terminal (so it waits while the process does not read). A process started
//!   without `stdin: true` (and no pty) has none: [`ErrorCode::InvalidState`], as for one whose
//!   stdin is closed or that has exited.
//! - **PTY** (`ExecRequest::pty`): the process gets a new pseudo-terminal from the sandbox's
//!   devpts as stdin/stdout/stderr and controlling terminal, in a new session it leads (so
//!   its process group is its pid, as for any exec, and tree kills and timeouts work alike).
//!   Output arrives as stdout only, with the terminal's line discipline applied (`\r\n`,
//!   echo; ^C in the input sends SIGINT to its foreground process group); `TERM` defaults to
//!   `xterm-256color`. Closing stdin types ^D (end of input at the start of a line).
//! - **ListProcesses** marks tracked processes ([`ProcessInfo::tracked`]) with their
//!   background/pty flags, byte totals, start time and exit, and lists kept exited ones with
//!   state `X`.

#![forbid(unsafe_code)]

pub mod code;
pub mod exec;
pub mod frame;
pub mod fs;
pub mod host_call;
pub mod isolation;
pub mod message;

pub use code::{
    Artifact, CodeDone, CodeError, CodeStatus, Completeness, ContextInfo, Language, MimeBundle,
    RunCodeRequest, Unrepresentable, VariableInfo, Variables,
};
pub use exec::{
    ExecCommand, ExecExit, ExecRequest, ExecResult, ExitCause, ProcessInfo, PtySize, signal_name,
};
pub use frame::{
    Channel, DataChunk, Frame, FrameDecoder, FrameError, HEADER_LEN, MAX_FRAME_LEN, encode_data,
    encode_message,
};
pub use fs::{FileEntry, FileKind, mime_of_name};
pub use host_call::{
    HOST_CALLS_SINCE, HostCall, HostCallError, HostCallErrorKind, HostCallResult,
    MAX_PENDING_HOST_CALLS,
};
pub use isolation::{Feature, FeatureState, IsolationReport};
pub use message::{ErrorCode, GuestMessage, HostMessage, WireError};

/// The protocol version this build speaks. Bumped on any incompatible change. 2 added host
/// calls ([`host_call`]): a version-2 agent sends `HostCall` only to a host that greeted it
/// with 2, and a host falls back to 1 for an agent that only speaks 1 (a sandbox started by an
/// older build, reattached), so neither side ever receives a message it does not know.
pub const PROTOCOL_VERSION: u32 = 2;

/// Every protocol version this build can serve.
pub const SUPPORTED_VERSIONS: &[u32] = &[1, PROTOCOL_VERSION];

/// The uid and gid the sandboxed user runs as, inside every sandbox.
pub const SANDBOX_UID: u32 = 65532;

/// Directories inside a sandbox that the file API may touch; the first is the default.
pub const FILE_ROOTS: &[&str] = &["/workspace", "/home/sandbox", "/tmp"];

/// The folder, inside a sandbox, where the host's egress proxy listens (bound read-only from
/// the host; absent when the sandbox's network is `off`).
pub const EGRESS_DIR: &str = "/run/sandcell";

/// The HTTP proxy inside every sandbox with an egress proxy (`HTTP_PROXY`, `HTTPS_PROXY`).
pub const EGRESS_HTTP_PROXY: &str = "http://127.0.0.1:3128";

/// The SOCKS5 proxy inside every sandbox with an egress proxy (`ALL_PROXY`).
pub const EGRESS_SOCKS_PROXY: &str = "socks5h://127.0.0.1:1080";

/// The egress proxy's socket, in [`EGRESS_DIR`].
pub const EGRESS_SOCKET: &str = "/run/sandcell/egress.sock";

/// The first byte a guest sends on a connection to [`EGRESS_SOCKET`] when it hands the
/// accepted client's socket itself to the proxy (attached as `SCM_RIGHTS`) instead of
/// relaying its bytes. Neither an HTTP request nor a SOCKS5 greeting starts with it.
pub const EGRESS_HANDOVER: u8 = 0x00;
