//! Exec: run a command and get its result (`POST /v1/sandboxes/{id}/exec`), or stream it as
//! server-sent events (`…/exec/stream`); what every stream's `exit` and `error` events carry.

use std::collections::BTreeMap;

use sandcell_protocol::{ExecResult, ExitCause};
use serde::{Deserialize, Serialize};

use crate::values::Timeout;

/// A command to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecInput {
    /// A command line for `/bin/sh -c` (give this or `argv`).
    pub cmd: Option<String>,
    /// An argument vector (give this or `cmd`).
    pub argv: Option<Vec<String>>,
    /// Environment variables added to the sandbox's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default `/workspace`).
    pub cwd: Option<String>,
    /// Seconds before the whole process tree is killed (default: the sandbox's exec timeout).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, exclusive_minimum = 0, maximum = 604800))]
    pub timeout_secs: Option<Timeout>,
    /// Text written to the command's stdin, then closed.
    pub stdin: Option<String>,
}

/// How a command ended, with its output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecOutput {
    /// Its stdout (invalid UTF-8 replaced; at most the exec's output limit).
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// The exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Exited with code 0.
    pub ok: bool,
    /// How it ended.
    #[serde(flatten)]
    pub result: ExitInfo,
}

/// The `exit` event of a streamed exec (and of a followed process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExitEvent {
    /// The exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Exited with code 0.
    pub ok: bool,
    /// How it ended.
    #[serde(flatten)]
    pub result: ExitInfo,
}

impl From<&ExecResult> for ExitEvent {
    fn from(r: &ExecResult) -> Self {
        Self {
            exit_code: r.exit_code,
            ok: r.exit_code == Some(0),
            result: ExitInfo::from(r),
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExitInfo {
    /// `exited`, `signaled`, `oom_killed`, `timeout`, `pids_limit` or `killed`.
    pub cause: String,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Its name (`SIGKILL`).
    pub signal_name: Option<String>,
    /// Killed by the OOM killer: the sandbox hit its memory limit.
    pub oom_killed: bool,
    /// Ran past its timeout; the whole tree was killed.
    pub timed_out: bool,
    /// The sandbox's process limit refused a fork.
    pub pids_limit_hit: bool,
    /// The cause in a sentence.
    pub message: String,
    /// Stdout went over the limit and was cut.
    pub stdout_truncated: bool,
    /// Stderr went over the limit and was cut.
    pub stderr_truncated: bool,
    /// Milliseconds from start to exit.
    pub duration_ms: f64,
}

impl From<&ExecResult> for ExitInfo {
    fn from(r: &ExecResult) -> Self {
        Self {
            cause: match r.cause {
                ExitCause::Exited => "exited",
                ExitCause::Signaled => "signaled",
                ExitCause::OomKilled => "oom_killed",
                ExitCause::Timeout => "timeout",
                ExitCause::PidsLimit => "pids_limit",
                ExitCause::Killed => "killed",
            }
            .to_string(),
            signal: r.signal,
            signal_name: r.signal_name.clone(),
            oom_killed: r.oom_killed,
            timed_out: r.timed_out,
            pids_limit_hit: r.pids_limit_hit,
            message: r.message.clone(),
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            duration_ms: r.duration_ms,
        }
    }
}

/// The `stdout` and `stderr` events of a streamed exec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecChunk {
    /// The bytes as text (invalid UTF-8 replaced).
    pub data: String,
}

/// The `error` event that ends a stream early: the service's error, as every error body
/// carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamError {
    /// A stable, machine-readable code (`sandbox_gone`, `unresponsive`, …).
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// More about it, when there is more.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub details: serde_json::Value,
}

/// One event of `POST …/exec/stream`: its SSE name is [`ExecStreamEvent::name`], its data
/// the JSON of what it carries.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecStreamEvent {
    /// `stdout`.
    Stdout(ExecChunk),
    /// `stderr`.
    Stderr(ExecChunk),
    /// `exit`: the last event.
    Exit(ExitEvent),
    /// `error`: the stream ended without an exit.
    Error(StreamError),
}

impl ExecStreamEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stdout(_) => "stdout",
            Self::Stderr(_) => "stderr",
            Self::Exit(_) => "exit",
            Self::Error(_) => "error",
        }
    }

    /// The SSE data: the JSON of what it carries.
    pub fn data(&self) -> String {
        match self {
            Self::Stdout(c) | Self::Stderr(c) => json_text(c),
            Self::Exit(e) => json_text(e),
            Self::Error(e) => json_text(e),
        }
    }

    /// Parses an SSE event of the stream (`None` for an unknown name, which a newer server
    /// may send).
    pub fn parse(name: &str, data: &str) -> Option<Result<Self, serde_json::Error>> {
        Some(match name {
            "stdout" => serde_json::from_str(data).map(Self::Stdout),
            "stderr" => serde_json::from_str(data).map(Self::Stderr),
            "exit" => serde_json::from_str(data).map(Self::Exit),
            "error" => serde_json::from_str(data).map(Self::Error),
            _ => return None,
        })
    }
}

/// The JSON of a wire type (which always serializes: string keys, no failing impls).
pub(crate) fn to_json(v: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// The JSON text of a wire type, its fields in their declared order.
pub(crate) fn json_text(v: &impl Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

/// One server-sent event as the stream carries it: its name and its JSON data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SseEvent {
    /// The event's name (`stdout`, `exit`, …).
    pub event: String,
    /// The event's JSON body.
    pub data: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_events_round_trip_through_their_sse_form() {
        let events = [
            ExecStreamEvent::Stdout(ExecChunk {
                data: "hi\n".into(),
            }),
            ExecStreamEvent::Exit(ExitEvent {
                exit_code: Some(0),
                ok: true,
                result: ExitInfo {
                    cause: "exited".into(),
                    signal: None,
                    signal_name: None,
                    oom_killed: false,
                    timed_out: false,
                    pids_limit_hit: false,
                    message: "exited with code 0".into(),
                    stdout_truncated: false,
                    stderr_truncated: false,
                    duration_ms: 1.5,
                },
            }),
            ExecStreamEvent::Error(StreamError {
                code: "sandbox_gone".into(),
                message: "gone".into(),
                details: serde_json::Value::Null,
            }),
        ];
        for e in events {
            let data = e.data();
            assert!(!data.contains("details"), "{data}");
            let back = ExecStreamEvent::parse(e.name(), &data).unwrap().unwrap();
            assert_eq!(back, e);
        }
        assert!(ExecStreamEvent::parse("later", "{}").is_none());
    }
}
