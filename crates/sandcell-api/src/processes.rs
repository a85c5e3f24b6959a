//! Processes: every process in a sandbox and signals to them; background processes (start,
//! follow their output from any offset, collect it, feed their stdin, resize their
//! terminal) and terminals over a WebSocket (`GET …/pty`).

use std::collections::BTreeMap;

use sandcell_protocol::ProcessInfo;
use serde::{Deserialize, Serialize};

use crate::exec::{ExitEvent, ExitInfo, StreamError, json_text};
use crate::rules::ValidationError;
use crate::values::Timeout;

/// Most bytes one stdin write may carry.
pub const MAX_STDIN_BYTES: usize = 16 << 20;

/// The header of a terminal's 101 answer that carries its pid.
pub const PTY_PID_HEADER: &str = "x-sandcell-pid";

/// One process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessView {
    /// Pid inside the sandbox.
    pub pid: i32,
    /// Parent pid.
    pub ppid: i32,
    /// Process group.
    pub pgid: i32,
    /// State letter (R, S, D, Z, T…).
    pub state: String,
    /// Command line.
    pub cmdline: String,
    /// Resident memory in bytes.
    pub rss_bytes: u64,
    /// The exec that started its tree, when known.
    pub exec_id: Option<u32>,
    /// Started by an exec or a background start (its output can be attached to).
    pub tracked: bool,
    /// Started in the background.
    pub background: bool,
    /// Runs on a terminal.
    pub pty: bool,
    /// It has ended (kept so its output and exit can still be read).
    pub exited: bool,
    /// Its exit code, once it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub exit_signal: Option<i32>,
    /// Stdout bytes written so far.
    pub stdout_bytes: Option<u64>,
    /// Stderr bytes written so far.
    pub stderr_bytes: Option<u64>,
    /// When it started, milliseconds since the epoch.
    pub started_at_ms: Option<u64>,
}

impl From<ProcessInfo> for ProcessView {
    fn from(p: ProcessInfo) -> Self {
        Self {
            pid: p.pid,
            ppid: p.ppid,
            pgid: p.pgid,
            state: p.state,
            cmdline: p.cmdline,
            rss_bytes: p.rss_bytes,
            exec_id: p.exec_id,
            tracked: p.tracked,
            background: p.background,
            pty: p.pty,
            exited: p.exited,
            exit_code: p.exit.as_ref().and_then(|e| e.exit_code),
            exit_signal: p.exit.as_ref().and_then(|e| e.signal),
            stdout_bytes: p.stdout_bytes,
            stderr_bytes: p.stderr_bytes,
            started_at_ms: p.started_at_ms,
        }
    }
}

/// A sandbox's processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessList {
    /// By pid.
    pub processes: Vec<ProcessView>,
}

/// Signal numbers by name, for `?signal=`.
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("KILL", 9),
    ("USR1", 10),
    ("USR2", 12),
    ("TERM", 15),
    ("CONT", 18),
    ("STOP", 19),
];

/// The signal `DELETE …/processes/{pid}` sends when none is named.
pub const DEFAULT_SIGNAL: i32 = 9;

/// Parses `KILL`, `SIGKILL` or `9`.
pub fn parse_signal(v: &str) -> Result<i32, ValidationError> {
    let name = v.trim().to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    if let Some((_, n)) = SIGNALS.iter().find(|(s, _)| *s == name) {
        return Ok(*n);
    }
    name.parse::<i32>()
        .ok()
        .filter(|n| (1..=64).contains(n))
        .ok_or_else(|| {
            ValidationError(format!(
                "signal '{v}' is not a signal name (TERM, KILL, INT, HUP, …) or number from 1 to 64"
            ))
        })
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TermSize {
    /// Rows (1 to 1000).
    pub rows: u16,
    /// Columns (1 to 1000).
    pub cols: u16,
}

impl TermSize {
    /// A new terminal's size when none is asked.
    pub const DEFAULT: TermSize = TermSize { rows: 24, cols: 80 };

    /// Checks both are from 1 to 1000.
    pub fn check(self) -> Result<Self, ValidationError> {
        if !(1..=1000).contains(&self.rows) || !(1..=1000).contains(&self.cols) {
            return Err(ValidationError(
                "rows and cols must each be from 1 to 1000".into(),
            ));
        }
        Ok(self)
    }
}

/// `POST /processes`: a process that runs on after the request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    /// A command line for `/bin/sh -c` (give this or `argv`).
    pub cmd: Option<String>,
    /// An argument vector.
    pub argv: Option<Vec<String>>,
    /// Environment variables added to the sandbox's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default `/workspace`).
    pub cwd: Option<String>,
    /// Seconds before its tree is killed (default: none; the sandbox's exec timeout does not
    /// apply to background processes).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, exclusive_minimum = 0, maximum = 604800))]
    pub timeout_secs: Option<Timeout>,
    /// Keep its stdin open for `POST …/stdin` (a terminal always has input).
    #[serde(default)]
    pub stdin: bool,
    /// Run it on a terminal of this size.
    pub pty: Option<TermSize>,
    /// Bytes of each stream kept for attaching later (default 1 MiB, at most 64 MiB).
    pub buffer_bytes: Option<u64>,
}

/// A started process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Started {
    /// Its pid in the sandbox: the handle for its output, stdin, terminal and signals.
    pub pid: i32,
    /// The exec id its processes carry (`SANDCELL_EXEC_ID`).
    pub exec_id: u32,
}

/// Where to start reading a process's output (`?stdout_from=&stderr_from=`); absent: the
/// oldest byte still buffered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputFrom {
    /// Stdout offset to start at.
    pub stdout_from: Option<u64>,
    /// Stderr offset to start at.
    pub stderr_from: Option<u64>,
}

/// Everything a process wrote (from the offsets asked), once it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessOutput {
    /// Stdout (invalid UTF-8 replaced).
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
    /// Stdout bytes no longer buffered when asked for.
    pub stdout_lost: u64,
    /// Stderr bytes no longer buffered when asked for.
    pub stderr_lost: u64,
    /// The exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Exited with code 0.
    pub ok: bool,
    /// How it ended.
    #[serde(flatten)]
    pub result: ExitInfo,
}

/// The `stdout` and `stderr` events of a followed process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputChunk {
    /// The bytes as text (invalid UTF-8 replaced).
    pub data: String,
    /// The offset of the chunk's first byte in its stream (reconnect with `…_from` =
    /// offset + bytes).
    pub offset: u64,
    /// The chunk's length in bytes.
    pub bytes: usize,
}

/// The `lost` event of a followed process: bytes asked for that are no longer buffered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LostOutput {
    /// `stdout` or `stderr`.
    pub channel: String,
    /// The offset of the first lost byte.
    pub offset: u64,
    /// How many.
    pub bytes: u64,
}

/// One event of `GET …/processes/{pid}/stream`: its SSE name is
/// [`ProcessStreamEvent::name`], its data the JSON of what it carries.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessStreamEvent {
    /// `stdout`.
    Stdout(OutputChunk),
    /// `stderr`.
    Stderr(OutputChunk),
    /// `lost`.
    Lost(LostOutput),
    /// `exit`: the last event.
    Exit(ExitEvent),
    /// `error`: the stream ended without an exit.
    Error(StreamError),
}

impl ProcessStreamEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stdout(_) => "stdout",
            Self::Stderr(_) => "stderr",
            Self::Lost(_) => "lost",
            Self::Exit(_) => "exit",
            Self::Error(_) => "error",
        }
    }

    /// The SSE data: the JSON of what it carries.
    pub fn data(&self) -> String {
        match self {
            Self::Stdout(c) | Self::Stderr(c) => json_text(c),
            Self::Lost(l) => json_text(l),
            Self::Exit(e) => json_text(e),
            Self::Error(e) => json_text(e),
        }
    }

    /// Parses an SSE event of the stream (`None` for an unknown name).
    pub fn parse(name: &str, data: &str) -> Option<Result<Self, serde_json::Error>> {
        Some(match name {
            "stdout" => serde_json::from_str(data).map(Self::Stdout),
            "stderr" => serde_json::from_str(data).map(Self::Stderr),
            "lost" => serde_json::from_str(data).map(Self::Lost),
            "exit" => serde_json::from_str(data).map(Self::Exit),
            "error" => serde_json::from_str(data).map(Self::Error),
            _ => return None,
        })
    }
}

/// `GET …/pty` (its query): start a terminal, or join one (`pid`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenTerminal {
    /// Join this terminal process instead of starting one.
    pub pid: Option<i32>,
    /// Command line to start (default `exec bash -l`).
    pub cmd: Option<String>,
    /// Its working directory.
    pub cwd: Option<String>,
    /// Terminal rows (default 24).
    pub rows: u16,
    /// Terminal columns (default 80).
    pub cols: u16,
}

impl Default for OpenTerminal {
    fn default() -> Self {
        Self {
            pid: None,
            cmd: None,
            cwd: None,
            rows: TermSize::DEFAULT.rows,
            cols: TermSize::DEFAULT.cols,
        }
    }
}

impl OpenTerminal {
    /// The terminal's size.
    pub fn size(&self) -> TermSize {
        TermSize {
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// A JSON text frame of a terminal's WebSocket: the client sends `resize`; the server sends
/// `lost`, then `exit` or `error` before it closes. (Terminal bytes go as binary frames.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TerminalFrame {
    /// Resize the terminal.
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// Output no longer buffered was skipped.
    Lost {
        /// How many bytes.
        bytes: u64,
    },
    /// The process ended.
    Exit {
        /// The exit code, when it exited.
        exit_code: Option<i32>,
        /// Exited with code 0.
        ok: bool,
        /// How it ended.
        result: ExitInfo,
    },
    /// The terminal broke off.
    Error {
        /// A stable, machine-readable code.
        code: String,
        /// What went wrong.
        message: String,
    },
}

impl TerminalFrame {
    /// For a `{"type": "resize", "rows": R, "cols": C}` text frame, the size it asks for
    /// (none when it names no valid one); `None` for any other text, which is typed.
    pub fn resize_of(text: &str) -> Option<Option<TermSize>> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        if v["type"] != "resize" {
            return None;
        }
        let dim = |k: &str| v[k].as_u64().and_then(|n| u16::try_from(n).ok());
        Some(
            dim("rows")
                .zip(dim("cols"))
                .map(|(rows, cols)| TermSize { rows, cols }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_or_number() {
        assert_eq!(parse_signal("TERM").unwrap(), 15);
        assert_eq!(parse_signal("sigkill").unwrap(), 9);
        assert_eq!(parse_signal("2").unwrap(), 2);
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("NOPE").is_err());
    }

    #[test]
    fn terminal_frames_keep_their_wire_form() {
        let resize = r#"{"type":"resize","rows":30,"cols":100}"#;
        assert_eq!(
            TerminalFrame::resize_of(resize),
            Some(Some(TermSize {
                rows: 30,
                cols: 100
            }))
        );
        assert_eq!(
            serde_json::from_str::<TerminalFrame>(resize).unwrap(),
            TerminalFrame::Resize {
                rows: 30,
                cols: 100
            }
        );
        assert_eq!(
            TerminalFrame::resize_of(r#"{"type":"resize","rows":-1}"#),
            Some(None)
        );
        assert_eq!(TerminalFrame::resize_of("ls\n"), None);
        let lost = serde_json::to_value(TerminalFrame::Lost { bytes: 3 }).unwrap();
        assert_eq!(lost, serde_json::json!({"type": "lost", "bytes": 3}));
        assert!(TermSize { rows: 0, cols: 80 }.check().is_err());
    }
}
