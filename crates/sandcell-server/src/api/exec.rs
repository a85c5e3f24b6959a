//! `/v1/sandboxes/{id}/exec`: run a command and get its result, or stream it as
//! server-sent events.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use sandcell_engine::{ExecEvent, ExecStream};
use sandcell_protocol::{ExecRequest, ExecResult, ExitCause};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{ApiJson, ApiPath, check_sandbox_id};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// A command to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
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
    pub timeout_secs: Option<f64>,
    /// Text written to the command's stdin, then closed.
    pub stdin: Option<String>,
}

impl ExecInput {
    /// The engine request.
    pub fn request(&self) -> Result<ExecRequest, ApiError> {
        let mut req = match (&self.cmd, &self.argv) {
            (Some(cmd), None) => {
                if cmd.trim().is_empty() {
                    return Err(ApiError::invalid("cmd is empty"));
                }
                ExecRequest::shell(cmd.clone())
            }
            (None, Some(argv)) => {
                if argv.is_empty() || argv[0].is_empty() {
                    return Err(ApiError::invalid("argv needs at least a program"));
                }
                ExecRequest::argv(argv.clone())
            }
            _ => return Err(ApiError::invalid("give exactly one of cmd and argv")),
        };
        req.env = self.env.clone();
        req.cwd = self.cwd.clone();
        req.stdin = self.stdin.is_some();
        req.timeout_ms = self
            .timeout_secs
            .map(|t| {
                if t.is_finite() && t > 0.0 && t <= 7.0 * 86_400.0 {
                    Ok((t * 1000.0).ceil() as u64)
                } else {
                    Err(ApiError::invalid(format!(
                        "timeout_secs {t} must be positive and at most 7 days"
                    )))
                }
            })
            .transpose()?;
        Ok(req)
    }
}

/// How a command ended, with its output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

/// The `exit` event of a streamed exec.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ExitEvent {
    /// The exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Exited with code 0.
    pub ok: bool,
    /// How it ended.
    #[serde(flatten)]
    pub result: ExitInfo,
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

/// Runs a command and returns when it ends.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecInput,
    responses(
        (status = 200, description = "It ran (see `cause` for how it ended)", body = ExecOutput),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running", body = ErrorBody),
        (status = 422, description = "The program could not be started", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn exec(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(input): ApiJson<ExecInput>,
) -> ApiResult<Json<ExecOutput>> {
    check_sandbox_id(&id)?;
    let req = input.request()?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let start = Instant::now();
    let out = match &input.stdin {
        Some(text) => sandbox.exec_with_stdin(req, text.as_bytes()).await?,
        None => sandbox.exec(req).await?,
    };
    s.metrics.exec_latency.observe(start.elapsed());
    Ok(Json(ExecOutput {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        exit_code: out.result.exit_code,
        ok: out.result.exit_code == Some(0),
        result: ExitInfo::from(&out.result),
    }))
}

/// Runs a command and streams it: `stdout` and `stderr` events (`{"data": text}`), then one
/// `exit` event (like the `exec` response without the output), or an `error` event.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec/stream", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecInput,
    responses(
        (status = 200, description = "Server-sent events: stdout, stderr, exit (or error)", content_type = "text/event-stream", body = SseEvent),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn exec_stream(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(input): ApiJson<ExecInput>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    check_sandbox_id(&id)?;
    let req = input.request()?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let mut stream = sandbox.exec_stream(req).await?;
    if let Some(text) = &input.stdin {
        stream.write_stdin(text.as_bytes()).await?;
        stream.close_stdin().await?;
    }
    Ok(Sse::new(exec_events(stream)).keep_alive(KeepAlive::default()))
}

/// The SSE events of an exec stream.
pub fn exec_events(stream: ExecStream) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(Some(stream), |state| async move {
        let mut stream = state?;
        let event = match stream.next().await {
            None => return None,
            Some(Ok(ExecEvent::Stdout(b))) => data_event("stdout", &b),
            Some(Ok(ExecEvent::Stderr(b))) => data_event("stderr", &b),
            Some(Ok(ExecEvent::Exit(result))) => {
                // As the collected answer, without the output.
                let body = ExitEvent {
                    exit_code: result.exit_code,
                    ok: result.exit_code == Some(0),
                    result: ExitInfo::from(&result),
                };
                return Some((Ok(json_event("exit", &body)), None));
            }
            Some(Err(e)) => {
                let err = ApiError::from(e);
                return Some((Ok(json_event("error", err.body())), None));
            }
        };
        Some((Ok(event), Some(stream)))
    })
}

fn data_event(name: &str, bytes: &[u8]) -> Event {
    json_event(
        name,
        &serde_json::json!({"data": String::from_utf8_lossy(bytes)}),
    )
}

/// One server-sent event as the stream carries it: its name and its JSON data.
#[derive(Debug, Serialize, ToSchema)]
pub struct SseEvent {
    /// The event's name (`stdout`, `exit`, …).
    pub event: String,
    /// The event's JSON body.
    pub data: String,
}

/// An SSE event named `name` carrying `body` as JSON.
pub fn json_event(name: &str, body: &impl Serialize) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(body).unwrap_or_else(|_| "{}".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_become_requests_or_clear_errors() {
        let input = ExecInput {
            cmd: Some("echo hi".into()),
            timeout_secs: Some(1.5),
            ..ExecInput::default()
        };
        let req = input.request().unwrap();
        assert_eq!(req.timeout_ms, Some(1500));
        for bad in [
            ExecInput::default(),
            ExecInput {
                cmd: Some("x".into()),
                argv: Some(vec!["y".into()]),
                ..ExecInput::default()
            },
            ExecInput {
                argv: Some(vec![]),
                ..ExecInput::default()
            },
            ExecInput {
                cmd: Some("x".into()),
                timeout_secs: Some(-1.0),
                ..ExecInput::default()
            },
        ] {
            assert_eq!(
                bad.request().unwrap_err().code(),
                "invalid_argument",
                "{bad:?}"
            );
        }
    }
}
