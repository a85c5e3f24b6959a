//! Control messages. Each is the JSON payload of one message frame.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::code::{
    CodeDone, CodeError, Completeness, ContextInfo, FailedVariable, Language, MimeBundle,
    RunCodeRequest, SkippedVariable, VariableInfo, Variables,
};
use crate::exec::{ExecExit, ExecRequest, ProcessInfo};
use crate::frame::Channel;
use crate::fs::FileEntry;
use crate::host_call::{HostCall, HostCallResult};
use crate::isolation::IsolationReport;

/// Host → guest. Each request has its own id; replies carry the same id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    /// Must be the first request: proposes a protocol version.
    Hello { protocol: u32, client: String },
    /// Liveness check; answered by [`GuestMessage::Pong`].
    Ping,
    /// Make a new connection to the host inside the sandbox and move to it: answered by
    /// [`GuestMessage::Rehomed`], with the host's end attached (`SCM_RIGHTS`); everything
    /// after that goes over the new connection. (A sandbox restored by CRIU was given a
    /// connection from the host's network namespace, which CRIU could not dump again.)
    Rehome,
    /// Names the sandbox `name` (after a restore: the checkpoint held its source's name).
    /// Reply: `Ok`, also when it already has that name.
    SetHostname { name: String },
    /// Starts a process. Replies: `ExecStarted`, stdout/stderr chunks, then `ExecExited`;
    /// with `background`, only `ExecStarted`.
    Exec(ExecRequest),
    /// Ends the stdin stream of the exec with this request id (on a pty: sends the
    /// terminal's end-of-file character, ^D). Also ends a `ProcessStdin` request's stream the
    /// same way.
    StdinClose,
    /// Follows a tracked process's output: replies `Attached`, then what its ring buffers
    /// hold from the given offsets (`OutputLost` first for bytes no longer buffered), then
    /// new output as it comes, then `ExecExited` (at once if it has ended). Offsets count the
    /// stream's bytes from its start; `None` starts at the oldest byte still buffered, an
    /// offset past the end at the next new byte. See the crate docs.
    Attach {
        pid: i32,
        #[serde(default)]
        stdout_from: Option<u64>,
        #[serde(default)]
        stderr_from: Option<u64>,
    },
    /// Sent on an `Attach` request's id: ends that attachment. Reply: `Detached` (nothing
    /// when the attachment had already ended).
    Detach,
    /// Writes to a tracked process's stdin (pipe or pty) by pid: followed by `Stdin` chunks
    /// on this request's id and `EndOfData`, or `StdinClose` to also close the stdin. Reply:
    /// `Ok` once the bytes are written to the process's stdin.
    ProcessStdin { pid: i32 },
    /// Closes a tracked process's stdin by pid (on a pty: sends ^D). Reply: `Ok`.
    ProcessStdinClose { pid: i32 },
    /// Sets the window size of a pty process's terminal (the kernel sends it SIGWINCH).
    /// Reply: `Ok`.
    Resize { pid: i32, rows: u16, cols: u16 },
    /// Forgets an exited tracked process: its buffered output and exit. Reply: `Ok`.
    ReleaseProcess { pid: i32 },
    /// Sends a signal to an exec's process (by its request id) or to a pid, optionally to the
    /// whole tree (its process group, its descendants and their sessions).
    Signal {
        exec_id: Option<u32>,
        pid: Option<i32>,
        signal: i32,
        tree: bool,
    },
    /// Lists the sandbox's processes. Reply: `Processes`.
    ListProcesses,
    /// Writes a file: followed by `File` chunks and `EndOfData`. Reply: `Entry`.
    WriteFile {
        path: String,
        mode: Option<u32>,
        append: bool,
    },
    /// Ends the data of a `WriteFile`.
    EndOfData,
    /// Abandons a `WriteFile` whose data will not all come: the partial file is removed and
    /// the target left as it was. With a windowed `ReadFile`'s id: stops the read (a
    /// `ReadDone` with the bytes sent so far follows). No reply of its own.
    AbortData,
    /// Reads a file. Replies: `File` chunks then `ReadDone`. With a `window`, at most that
    /// many chunks go out before the host grants more with `ReadCredit` (a slow reader of a
    /// large file must not make the host buffer all of it).
    ReadFile {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u32>,
    },
    /// Connects to `port` on the sandbox's loopback (a server inside it, for the host's
    /// previews). Reply: `Ok` once connected (`Error` with `NotFound` when nothing listens),
    /// then the connection's bytes both ways on this id: host→guest as `Stdin` chunks, ended
    /// by `StdinClose` (the write half shut down) or `AbortData` (all closed); guest→host as
    /// `Stdout` chunks, at most `window` of them before the host grants more with
    /// `ReadCredit`, ended by `ReadDone` when the server closes.
    ConnectPort { port: u16, window: u32 },
    /// Lets the windowed `ReadFile` (or `ConnectPort`) with this id send `chunks` more chunks.
    /// No reply.
    ReadCredit { chunks: u32 },
    /// Lists a directory. Reply: `Listing`.
    ListDir { path: String },
    /// Describes one path without following a final symlink. Reply: `Entry`.
    Stat { path: String },
    /// Creates a directory and its missing parents. Reply: `Entry`.
    MakeDir { path: String },
    /// Removes a file, symlink or (with `recursive`, or when empty) a directory. Reply: `Ok`.
    Remove { path: String, recursive: bool },
    /// Renames within the sandbox. Reply: `Entry` for the new path.
    Rename { from: String, to: String },
    /// Kills every process and ends the agent.
    Shutdown,
    /// Sandbox-wide settings for kernels, sent once after `Hello`: environment variables of
    /// every kernel (a context's own win), kernels to start at once so the first execution
    /// does not wait for one, and the working directory of contexts that name none (a
    /// template's). Reply: `Ok` (the kernels start in the background).
    Prepare {
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        kernels: Vec<Language>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
    },
    /// Runs code in a kernel. Replies: code events (and, from protocol 2, `HostCall`s the
    /// host answers with `HostCallReply` on the same id), then `CodeDone`.
    RunCode(RunCodeRequest),
    /// Sent on a `RunCode` request's id (protocol 2): the answer to its `HostCall` number
    /// `call`. No reply; one for an execution that has ended, or a call it no longer waits
    /// for, is dropped.
    HostCallReply { call: u64, result: HostCallResult },
    /// Starts a new context. Reply: `Context`.
    CreateContext {
        language: Language,
        /// Working directory of its kernel (default `/workspace`).
        #[serde(default)]
        cwd: Option<String>,
        /// Extra environment of its kernel.
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// Lists the contexts. Reply: `Contexts`.
    ListContexts,
    /// Stops a context's kernel and forgets it. Reply: `Ok`.
    DestroyContext { context: String },
    /// Interrupts the context's running execution, keeping its state. Reply: `Ok`.
    Interrupt { context: String },
    /// Replaces the context's kernel with a fresh one (clean state). Reply: `Context`.
    RestartContext { context: String },
    /// Asks whether `code` is a complete cell. Reply: `Completeness`.
    IsComplete {
        #[serde(default)]
        context: Option<String>,
        #[serde(default)]
        language: Option<Language>,
        code: String,
    },
    /// Reads variables (all user variables when `names` is absent). Reply: `Variables`.
    GetVariables {
        context: String,
        #[serde(default)]
        names: Option<Vec<String>>,
    },
    /// Sets variables from JSON values. Reply: `VariableNames`.
    SetVariables {
        context: String,
        values: BTreeMap<String, serde_json::Value>,
    },
    /// Deletes variables (all user variables when `names` is absent). Reply: `VariableNames`.
    ClearVariables {
        context: String,
        #[serde(default)]
        names: Option<Vec<String>>,
    },
    /// Lists the user variables. Reply: `VariableList`.
    ListVariables { context: String },
    /// Writes the context's variables to the file `path` inside the sandbox (Python and
    /// Node; language fidelity for snapshots). Reply: `KernelStateSaved`.
    DumpKernelState { context: String, path: String },
    /// Restores the variables of a file `DumpKernelState` wrote into the context, creating
    /// the context (with this id and language) and starting its kernel when there is none
    /// yet, as in a sandbox restored from a snapshot. Reply: `KernelStateLoaded`.
    LoadKernelState {
        context: String,
        language: Language,
        path: String,
    },
}

/// Guest → host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GuestMessage {
    /// Sent by the launcher on id 0 before the agent speaks: the agent's pid on the host and
    /// the isolation the launcher set up outside the sandbox (cgroups, id maps). `cgroup` is
    /// the launcher's record of the sandbox's cgroup, which only the process backend reads
    /// (so the host needs no filesystem probing to use it).
    Launched {
        host_pid: i32,
        report: IsolationReport,
        cgroup: Option<serde_json::Value>,
    },
    /// Sent on id 0 when setting up the sandbox failed; the connection then closes.
    LaunchFailed { stage: String, message: String },
    /// Accepts `Hello`.
    HelloOk {
        protocol: u32,
        agent_version: String,
        isolation: IsolationReport,
    },
    /// Answers `Ping`.
    Pong,
    /// The reply to [`HostMessage::Rehome`], carrying the host's end of the new connection;
    /// `inode` is the agent's end's.
    Rehomed { inode: u64 },
    /// The exec's process is running.
    ExecStarted { pid: i32 },
    /// The exec's process ended; all of its output was sent before this.
    ExecExited(ExecExit),
    /// Answers `Attach`: the offsets at which this attachment's stdout and stderr chunks
    /// start, and the process's exec timeout (for classifying its exit).
    Attached {
        pid: i32,
        stdout_offset: u64,
        stderr_offset: u64,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// Bytes `offset..offset + bytes` of an attached stream left the ring buffer before
    /// this attachment could send them; the stream's next chunk starts after them.
    OutputLost {
        channel: Channel,
        offset: u64,
        bytes: u64,
    },
    /// Answers `Detach`: nothing more comes on the attachment.
    Detached,
    /// Text the code wrote (`stdout` or `stderr`).
    CodeStream { name: String, text: String },
    /// Rich output shown during the execution.
    CodeDisplay {
        data: MimeBundle,
        #[serde(default)]
        metadata: serde_json::Map<String, serde_json::Value>,
    },
    /// The value of the cell's last expression.
    CodeResult {
        data: MimeBundle,
        #[serde(default)]
        metadata: serde_json::Map<String, serde_json::Value>,
    },
    /// An error the code raised.
    CodeError(CodeError),
    /// The execution ended; nothing more follows for it.
    CodeDone(Box<CodeDone>),
    /// Code in the execution asks the host something and waits (protocol 2; see
    /// [`crate::host_call`]): answer with `HostCallReply` on the same id.
    HostCall(HostCall),
    /// Describes one context.
    Context { context: ContextInfo },
    /// Every context.
    Contexts { contexts: Vec<ContextInfo> },
    /// Answers `IsComplete`.
    Completeness {
        status: Completeness,
        #[serde(default)]
        indent: Option<String>,
    },
    /// Answers `GetVariables`.
    Variables(Variables),
    /// Names set or cleared.
    VariableNames { names: Vec<String> },
    /// Answers `ListVariables`.
    VariableList { variables: Vec<VariableInfo> },
    /// A request without another reply succeeded.
    Ok,
    /// Answers `ReadFile` after the last chunk.
    ReadDone { size: u64 },
    /// Answers `ListDir`.
    Listing { entries: Vec<FileEntry> },
    /// Answers `Stat`, `MakeDir`, `WriteFile` and `Rename`.
    Entry { entry: FileEntry },
    /// Answers `ListProcesses`.
    Processes { processes: Vec<ProcessInfo> },
    /// The request failed; id 0 means the connection-level failure (bad frame, …).
    Error(WireError),
    /// Answers `DumpKernelState`: the variables written, those left out and why, and the
    /// file's size in bytes.
    KernelStateSaved {
        saved: Vec<String>,
        #[serde(default)]
        skipped: Vec<SkippedVariable>,
        bytes: u64,
    },
    /// Answers `LoadKernelState`: the variables restored, and those that failed and why.
    KernelStateLoaded {
        restored: Vec<String>,
        #[serde(default)]
        failed: Vec<FailedVariable>,
    },
}

/// A structured error on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct WireError {
    /// Machine-readable class.
    pub code: ErrorCode,
    /// Lowercase, specific, human-readable.
    pub message: String,
}

impl WireError {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Error classes shared by every front end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A frame could not be decoded.
    BadFrame,
    /// A frame was over the size limit.
    FrameTooLarge,
    /// The proposed protocol version is not served.
    UnsupportedVersion,
    /// A request came before a successful `Hello`.
    HandshakeRequired,
    /// The request's fields are invalid.
    InvalidArgument,
    /// The request is not valid in the current state (e.g. two requests with one id).
    InvalidState,
    /// The path leaves the sandbox's file roots (`..`, absolute elsewhere, escaping symlink).
    PathOutsideSandbox,
    /// The path does not exist.
    NotFound,
    /// The path already exists.
    AlreadyExists,
    /// A directory was expected.
    NotADirectory,
    /// A file was expected.
    IsADirectory,
    /// A directory to remove is not empty.
    DirectoryNotEmpty,
    /// The sandbox's storage is full.
    NoSpace,
    /// Permission denied.
    PermissionDenied,
    /// The process could not be started.
    SpawnFailed,
    /// No such exec or process.
    NoSuchProcess,
    /// Another I/O error.
    Io,
    /// A cap or quota was reached (sandboxes, sizes).
    LimitExceeded,
    /// Not now, for a moment (the sandbox is being snapshotted): the same request may
    /// succeed shortly.
    Unavailable,
    /// A bug or unexpected condition in the agent.
    Internal,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::PtySize;

    fn round_trip_host(msg: HostMessage) {
        let json = serde_json::to_string(&msg).unwrap();
        let back: HostMessage = serde_json::from_str(&json).unwrap();
        assert_eq!(back, msg, "{json}");
    }

    fn round_trip_guest(msg: GuestMessage) {
        let json = serde_json::to_string(&msg).unwrap();
        let back: GuestMessage = serde_json::from_str(&json).unwrap();
        assert_eq!(back, msg, "{json}");
    }

    #[test]
    fn process_messages_round_trip() {
        let mut bg = ExecRequest::shell("sleep 1");
        bg.background = true;
        bg.stdin = true;
        bg.pty = Some(PtySize {
            rows: 40,
            cols: 120,
        });
        bg.buffer_bytes = Some(4096);
        round_trip_host(HostMessage::Exec(bg));
        round_trip_host(HostMessage::Attach {
            pid: 7,
            stdout_from: Some(10),
            stderr_from: None,
        });
        round_trip_host(HostMessage::Detach);
        round_trip_host(HostMessage::ProcessStdin { pid: 7 });
        round_trip_host(HostMessage::ProcessStdinClose { pid: 7 });
        round_trip_host(HostMessage::Resize {
            pid: 7,
            rows: 50,
            cols: 132,
        });
        round_trip_host(HostMessage::ReleaseProcess { pid: 7 });
        round_trip_guest(GuestMessage::Attached {
            pid: 7,
            stdout_offset: 3,
            stderr_offset: 0,
            timeout_ms: Some(1000),
        });
        round_trip_guest(GuestMessage::OutputLost {
            channel: Channel::Stderr,
            offset: 0,
            bytes: 4000,
        });
        round_trip_guest(GuestMessage::Detached);
    }

    #[test]
    fn process_messages_have_stable_json() {
        let json = serde_json::to_string(&HostMessage::Resize {
            pid: 7,
            rows: 50,
            cols: 132,
        })
        .unwrap();
        assert_eq!(json, r#"{"type":"resize","pid":7,"rows":50,"cols":132}"#);
        let lost = GuestMessage::OutputLost {
            channel: Channel::Stdout,
            offset: 1,
            bytes: 2,
        };
        assert_eq!(
            serde_json::to_string(&lost).unwrap(),
            r#"{"type":"output_lost","channel":"stdout","offset":1,"bytes":2}"#
        );
        // Offsets may be left out: both streams start at their oldest buffered byte.
        let attach: HostMessage = serde_json::from_str(r#"{"type":"attach","pid":3}"#).unwrap();
        assert_eq!(
            attach,
            HostMessage::Attach {
                pid: 3,
                stdout_from: None,
                stderr_from: None
            }
        );
    }

    #[test]
    fn a_foreground_exec_is_encoded_as_before() {
        // Requests that use none of the new fields look exactly as they did, so an agent
        // that predates them reads them unchanged.
        let json = serde_json::to_string(&HostMessage::Exec(ExecRequest::argv(["true"]))).unwrap();
        assert_eq!(
            json,
            r#"{"type":"exec","command":{"argv":["true"]},"env":{},"cwd":null,"stdin":false,"timeout_ms":null,"stdout_limit":1048576,"stderr_limit":1048576}"#
        );
    }

    #[test]
    fn kernel_state_messages_have_stable_json() {
        let dump = HostMessage::DumpKernelState {
            context: "python".into(),
            path: "/tmp/.sandcell-state/python.pkl".into(),
        };
        assert_eq!(
            serde_json::to_string(&dump).unwrap(),
            r#"{"type":"dump_kernel_state","context":"python","path":"/tmp/.sandcell-state/python.pkl"}"#
        );
        round_trip_host(dump);
        round_trip_host(HostMessage::LoadKernelState {
            context: "node-2".into(),
            language: Language::Node,
            path: "/tmp/s".into(),
        });
        let saved = GuestMessage::KernelStateSaved {
            saved: vec!["x".into()],
            skipped: vec![SkippedVariable {
                name: "fh".into(),
                type_name: "TextIOWrapper".into(),
                reason: "an open file".into(),
            }],
            bytes: 12,
        };
        assert_eq!(
            serde_json::to_string(&saved).unwrap(),
            r#"{"type":"kernel_state_saved","saved":["x"],"skipped":[{"name":"fh","type":"TextIOWrapper","reason":"an open file"}],"bytes":12}"#
        );
        round_trip_guest(saved);
        round_trip_guest(GuestMessage::KernelStateLoaded {
            restored: vec!["x".into()],
            failed: vec![FailedVariable {
                name: "np".into(),
                reason: "ModuleNotFoundError: No module named 'numpy'".into(),
            }],
        });
    }

    #[test]
    fn host_call_messages_round_trip_with_stable_json() {
        use crate::host_call::{HostCallErrorKind, HostCallResult};
        let call = GuestMessage::HostCall(HostCall {
            call: 7,
            method: "llm_query".into(),
            payload: serde_json::json!({"prompt": "hi"}),
        });
        assert_eq!(
            serde_json::to_string(&call).unwrap(),
            r#"{"type":"host_call","call":7,"method":"llm_query","payload":{"prompt":"hi"}}"#
        );
        round_trip_guest(call);
        let reply = HostMessage::HostCallReply {
            call: 7,
            result: HostCallResult::Ok(serde_json::json!("hello")),
        };
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"type":"host_call_reply","call":7,"result":{"ok":"hello"}}"#
        );
        round_trip_host(reply);
        round_trip_host(HostMessage::HostCallReply {
            call: u64::MAX,
            result: HostCallResult::error(HostCallErrorKind::Cancelled, "the run was cancelled"),
        });
        // A reply whose result is not one of the two shapes is refused, not guessed at.
        assert!(
            serde_json::from_str::<HostMessage>(
                r#"{"type":"host_call_reply","call":1,"result":{"maybe":1}}"#
            )
            .is_err()
        );
    }

    #[test]
    fn frames_of_protocol_1_still_decode() {
        // What a version-1 host sends and what a version-1 agent answers are unchanged.
        let hello: HostMessage =
            serde_json::from_str(r#"{"type":"hello","protocol":1,"client":"old"}"#).unwrap();
        assert_eq!(
            hello,
            HostMessage::Hello {
                protocol: 1,
                client: "old".into()
            }
        );
        let run: HostMessage = serde_json::from_str(
            r#"{"type":"run_code","context":null,"language":"python","code":"1","timeout_ms":null}"#,
        )
        .unwrap();
        assert!(matches!(run, HostMessage::RunCode(_)));
        let stream: GuestMessage =
            serde_json::from_str(r#"{"type":"code_stream","name":"stdout","text":"x"}"#).unwrap();
        assert!(matches!(stream, GuestMessage::CodeStream { .. }));
        let frame = crate::encode_message(5, &HostMessage::Ping);
        let mut d = crate::FrameDecoder::default();
        d.feed(&frame);
        assert!(matches!(
            d.next_frame::<HostMessage>(),
            Some(Ok(crate::Frame::Message {
                id: 5,
                msg: HostMessage::Ping
            }))
        ));
    }

    #[test]
    fn messages_are_tagged_snake_case() {
        let json = serde_json::to_string(&HostMessage::Stat { path: "a".into() }).unwrap();
        assert_eq!(json, r#"{"type":"stat","path":"a"}"#);
        let err = GuestMessage::Error(WireError::new(ErrorCode::NotFound, "no such file: a"));
        let json = serde_json::to_string(&err).unwrap();
        assert_eq!(
            json,
            r#"{"type":"error","code":"not_found","message":"no such file: a"}"#
        );
    }
}
