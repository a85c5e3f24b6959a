//! Background processes and terminals: start a process that outlives the request, follow
//! its output from any offset (and again after a disconnect), feed its stdin, resize its
//! terminal; and `GET /pty`, a terminal over a WebSocket.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::Json;
use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, Stream, StreamExt};
use sandcell_engine::{AttachEvent, AttachFrom, AttachStream, Sandbox};
use sandcell_protocol::{Channel, ExecRequest, PtySize};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::exec::{ExecInput, ExitEvent, ExitInfo, SseEvent, json_event};
use super::extract::{ApiJson, ApiPath, check_sandbox_id, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Most bytes one stdin write may carry.
const MAX_STDIN_BYTES: usize = 16 << 20;

/// A terminal's size.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TermSize {
    /// Rows (1 to 1000).
    pub rows: u16,
    /// Columns (1 to 1000).
    pub cols: u16,
}

impl TermSize {
    fn check(self) -> Result<PtySize, ApiError> {
        if !(1..=1000).contains(&self.rows) || !(1..=1000).contains(&self.cols) {
            return Err(ApiError::invalid(
                "rows and cols must each be from 1 to 1000",
            ));
        }
        Ok(PtySize {
            rows: self.rows,
            cols: self.cols,
        })
    }
}

/// `POST /processes`: a process that runs on after the request.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
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
    pub timeout_secs: Option<f64>,
    /// Keep its stdin open for `POST …/stdin` (a terminal always has input).
    #[serde(default)]
    pub stdin: bool,
    /// Run it on a terminal of this size.
    pub pty: Option<TermSize>,
    /// Bytes of each stream kept for attaching later (default 1 MiB, at most 64 MiB).
    pub buffer_bytes: Option<u64>,
}

impl StartProcess {
    fn request(&self) -> Result<ExecRequest, ApiError> {
        let mut req = ExecInput {
            cmd: self.cmd.clone(),
            argv: self.argv.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            timeout_secs: self.timeout_secs,
            stdin: None,
        }
        .request()?;
        req.background = true;
        req.stdin = self.stdin;
        req.pty = self.pty.map(TermSize::check).transpose()?;
        if let Some(b) = self.buffer_bytes {
            if b > sandcell_protocol::exec::MAX_BUFFER_BYTES {
                return Err(ApiError::invalid(format!(
                    "buffer_bytes must be at most {}",
                    sandcell_protocol::exec::MAX_BUFFER_BYTES
                )));
            }
            req.buffer_bytes = Some(b);
        }
        Ok(req)
    }
}

/// A started process.
#[derive(Debug, Serialize, ToSchema)]
pub struct Started {
    /// Its pid in the sandbox: the handle for its output, stdin, terminal and signals.
    pub pid: i32,
    /// The exec id its processes carry (`SANDCELL_EXEC_ID`).
    pub exec_id: u32,
}

/// Everything a process wrote (from the offsets asked), once it ended.
#[derive(Debug, Serialize, ToSchema)]
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

/// Starts a process in the background: the answer comes at once with its pid.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = StartProcess,
    responses(
        (status = 201, body = Started),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn start(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(input): ApiJson<StartProcess>,
) -> ApiResult<(StatusCode, Json<Started>)> {
    check_sandbox_id(&id)?;
    let req = input.request()?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let started = sandbox.spawn(req).await?;
    Ok((
        StatusCode::CREATED,
        Json(Started {
            pid: started.pid,
            exec_id: started.exec_id,
        }),
    ))
}

/// `stdout_from` and `stderr_from` of a query (absent: the oldest byte still buffered).
fn attach_from(raw: Option<&str>) -> Result<AttachFrom, ApiError> {
    let mut from = AttachFrom::buffered();
    for (k, v) in query_pairs(raw)? {
        let offset = || {
            v.parse::<u64>().map_err(|_| {
                ApiError::invalid(format!(
                    "'{k}' must be a byte offset (a whole number), got '{v}'"
                ))
            })
        };
        match k.as_str() {
            "stdout_from" => from.stdout = Some(offset()?),
            "stderr_from" => from.stderr = Some(offset()?),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (stdout_from, stderr_from)"
                )));
            }
        }
    }
    Ok(from)
}

fn check_pid(pid: i32) -> Result<(), ApiError> {
    if pid < 2 {
        return Err(ApiError::invalid(format!(
            "pid {pid} is not a process of the sandbox's (pid 1 is its agent)"
        )));
    }
    Ok(())
}

/// Follows a process's output as server-sent events, from the offsets asked (default: all
/// still buffered): `stdout`/`stderr` `{"data", "offset"}` (the offset of the chunk's first
/// byte: reconnect with `stdout_from` = offset + bytes), `lost` `{"channel", "offset",
/// "bytes"}` when asked-for bytes are no longer buffered, then `exit`.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes/{pid}/stream", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = i32, Path, description = "Pid in the sandbox"),
        ("stdout_from" = Option<u64>, Query, description = "Stdout offset to start at"),
        ("stderr_from" = Option<u64>, Query, description = "Stderr offset to start at"),
    ),
    responses(
        (status = 200, description = "Server-sent events: stdout, stderr, lost, exit", content_type = "text/event-stream", body = SseEvent),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stream(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    check_sandbox_id(&id)?;
    check_pid(pid)?;
    let from = attach_from(raw.as_deref())?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let attach = sandbox.attach(pid, from).await?;
    Ok(Sse::new(attach_events(attach)).keep_alive(KeepAlive::default()))
}

fn attach_events(attach: AttachStream) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(Some(attach), |state| async move {
        let mut attach = state?;
        let before = [attach.stdout_offset(), attach.stderr_offset()];
        let event = match attach.next().await? {
            Ok(AttachEvent::Stdout(b)) => chunk_event("stdout", &b, before[0]),
            Ok(AttachEvent::Stderr(b)) => chunk_event("stderr", &b, before[1]),
            Ok(AttachEvent::Lost {
                channel,
                offset,
                bytes,
            }) => json_event(
                "lost",
                &serde_json::json!({
                    "channel": if channel == Channel::Stderr { "stderr" } else { "stdout" },
                    "offset": offset,
                    "bytes": bytes,
                }),
            ),
            Ok(AttachEvent::Exit(result)) => {
                let body = ExitEvent {
                    exit_code: result.exit_code,
                    ok: result.exit_code == Some(0),
                    result: ExitInfo::from(&result),
                };
                return Some((Ok(json_event("exit", &body)), None));
            }
            Err(e) => {
                let err = ApiError::from(e);
                return Some((Ok(json_event("error", err.body())), None));
            }
        };
        Some((Ok(event), Some(attach)))
    })
}

fn chunk_event(name: &str, bytes: &[u8], offset: u64) -> Event {
    json_event(
        name,
        &serde_json::json!({
            "data": String::from_utf8_lossy(bytes),
            "offset": offset,
            "bytes": bytes.len(),
        }),
    )
}

/// Waits for a process to end and returns its output (from the offsets asked, default all
/// still buffered).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = i32, Path, description = "Pid in the sandbox"),
        ("stdout_from" = Option<u64>, Query, description = "Stdout offset to start at"),
        ("stderr_from" = Option<u64>, Query, description = "Stderr offset to start at"),
    ),
    responses(
        (status = 200, body = ProcessOutput),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn output(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<ProcessOutput>> {
    check_sandbox_id(&id)?;
    check_pid(pid)?;
    let from = attach_from(raw.as_deref())?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let out = sandbox.attach(pid, from).await?.collect().await?;
    Ok(Json(ProcessOutput {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stdout_lost: out.stdout_lost,
        stderr_lost: out.stderr_lost,
        exit_code: out.result.exit_code,
        ok: out.result.exit_code == Some(0),
        result: ExitInfo::from(&out.result),
    }))
}

/// Writes the body to the process's stdin (or terminal); `close=true` closes it afterwards
/// (an empty body with `close=true` only closes).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = i32, Path, description = "Pid in the sandbox"),
        ("close" = Option<bool>, Query, description = "Close stdin after writing"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 204, description = "Written"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Its stdin is closed, or it has none", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stdin(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    RawQuery(raw): RawQuery,
    body: Body,
) -> ApiResult<StatusCode> {
    check_sandbox_id(&id)?;
    check_pid(pid)?;
    let mut close = false;
    for (k, v) in query_pairs(raw.as_deref())? {
        match (k.as_str(), v.as_str()) {
            ("close", "true" | "1") => close = true,
            ("close", "false" | "0") => close = false,
            ("close", other) => {
                return Err(ApiError::invalid(format!(
                    "'close' must be true or false, got '{other}'"
                )));
            }
            (other, _) => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (close)"
                )));
            }
        }
    }
    let bytes = axum::body::to_bytes(body, MAX_STDIN_BYTES)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("a stdin write is at most {MAX_STDIN_BYTES} bytes"),
            )
        })?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    if !bytes.is_empty() {
        sandbox.write_process_stdin(pid, &bytes).await?;
    }
    if close {
        sandbox.close_process_stdin(pid).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Resizes a process's terminal.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = i32, Path, description = "Pid in the sandbox"),
    ),
    request_body = TermSize,
    responses(
        (status = 204, description = "Resized"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "It has no terminal", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn resize(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    ApiJson(size): ApiJson<TermSize>,
) -> ApiResult<StatusCode> {
    check_sandbox_id(&id)?;
    check_pid(pid)?;
    let size = size.check()?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    sandbox.resize_pty(pid, size.rows, size.cols).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What `GET /pty` starts or joins.
#[derive(Debug)]
struct PtyQuery {
    pid: Option<i32>,
    cmd: Option<String>,
    cwd: Option<String>,
    size: TermSize,
}

fn pty_query(raw: Option<&str>) -> Result<PtyQuery, ApiError> {
    let mut q = PtyQuery {
        pid: None,
        cmd: None,
        cwd: None,
        size: TermSize { rows: 24, cols: 80 },
    };
    for (k, v) in query_pairs(raw)? {
        let number = |what: &str| {
            v.parse::<u16>().map_err(|_| {
                ApiError::invalid(format!(
                    "'{what}' must be a number from 1 to 1000, got '{v}'"
                ))
            })
        };
        match k.as_str() {
            "pid" => {
                let pid = v
                    .parse::<i32>()
                    .map_err(|_| ApiError::invalid(format!("'pid' must be a pid, got '{v}'")))?;
                check_pid(pid)?;
                q.pid = Some(pid);
            }
            "cmd" => q.cmd = Some(v),
            "cwd" => q.cwd = Some(v),
            "rows" => q.size.rows = number("rows")?,
            "cols" => q.size.cols = number("cols")?,
            // Browsers cannot set headers on a WebSocket: the key may come here instead.
            "api_key" => {}
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (pid, cmd, cwd, rows, cols, api_key)"
                )));
            }
        }
    }
    q.size.check()?;
    Ok(q)
}

/// The header of a terminal's 101 answer that carries its pid.
pub const PTY_PID_HEADER: &str = "x-sandcell-pid";

/// A terminal over a WebSocket: starts `cmd` (default an interactive `bash -l`) on a new
/// terminal, or with `pid` joins a running terminal process (its recent output is replayed).
/// Binary (or text) frames from the client are typed into the terminal; text frames that
/// are JSON `{"type": "resize", "rows": R, "cols": C}` resize it. The server sends the
/// terminal's bytes as binary frames and, when the process ends, a text frame
/// `{"type": "exit", …}` before closing. The 101 answer names the process in
/// `X-Sandcell-Pid`; it survives a dropped connection: join it again with `pid`.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/pty", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = Option<i32>, Query, description = "Join this terminal process instead of starting one"),
        ("cmd" = Option<String>, Query, description = "Command line to start (default `bash -l`)"),
        ("cwd" = Option<String>, Query, description = "Its working directory"),
        ("rows" = Option<u16>, Query, description = "Terminal rows (default 24)"),
        ("cols" = Option<u16>, Query, description = "Terminal columns (default 80)"),
        ("api_key" = Option<String>, Query, description = "The API key, for clients that cannot send headers"),
    ),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn pty(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    RawQuery(raw): RawQuery,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    check_sandbox_id(&id)?;
    let q = pty_query(raw.as_deref())?;
    let ws = ws.map_err(|e| {
        ApiError::invalid(format!(
            "this route speaks WebSocket only: {}",
            e.body_text()
        ))
    })?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let (pid, from) = match q.pid {
        Some(pid) => (pid, AttachFrom::buffered()),
        None => {
            let start = StartProcess {
                cmd: Some(q.cmd.unwrap_or_else(|| "exec bash -l".into())),
                cwd: q.cwd,
                pty: Some(q.size),
                stdin: true,
                ..StartProcess::default()
            };
            let started = sandbox.spawn(start.request()?).await?;
            (started.pid, AttachFrom::start())
        }
    };
    // Attached before the upgrade, so a wrong pid is an HTTP error, not a closed socket.
    let attach = sandbox.attach(pid, from).await?;
    let mut response = ws
        .on_upgrade(move |socket| terminal(socket, sandbox, attach))
        .into_response();
    // The terminal's pid, so that a client that started it can join it again.
    response
        .headers_mut()
        .insert(PTY_PID_HEADER, axum::http::HeaderValue::from(pid));
    Ok(response)
}

/// For a `{"type": "resize", "rows": R, "cols": C}` text frame, the size it asks for (none
/// when it names no valid one); `None` for any other text, which is typed.
fn resize_of(text: &str) -> Option<Option<(u16, u16)>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if v["type"] != "resize" {
        return None;
    }
    let dim = |k: &str| v[k].as_u64().and_then(|n| u16::try_from(n).ok());
    Some(dim("rows").zip(dim("cols")))
}

/// Pumps a terminal both ways until the process ends or the client goes.
async fn terminal(socket: WebSocket, sandbox: Sandbox, mut attach: AttachStream) {
    let pid = attach.pid();
    let (mut tx, mut rx) = socket.split();
    let input = sandbox.clone();
    let (gone_tx, mut gone) = tokio::sync::oneshot::channel::<()>();
    // Keystrokes and resizes, in order, while output flows the other way.
    let reader = tokio::spawn(async move {
        let _gone = gone_tx;
        // A keystroke that cannot be written (the process just ended on the one before) does
        // not end the socket: the process's exit frame is still to come from the other side.
        while let Some(Ok(msg)) = rx.next().await {
            let keys = match &msg {
                Message::Binary(b) => b.as_ref(),
                Message::Text(t) => match resize_of(t) {
                    Some(size) => {
                        if let Some((rows, cols)) = size {
                            let _ = input.resize_pty(pid, rows, cols).await;
                        }
                        continue;
                    }
                    None => t.as_bytes(),
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            let _ = input.write_process_stdin(pid, keys).await;
        }
    });
    loop {
        tokio::select! {
            event = attach.next() => {
                let msg = match event {
                    Some(Ok(AttachEvent::Stdout(b) | AttachEvent::Stderr(b))) => Message::Binary(b.into()),
                    Some(Ok(AttachEvent::Lost { bytes, .. })) => Message::Text(
                        serde_json::json!({"type": "lost", "bytes": bytes}).to_string().into(),
                    ),
                    Some(Ok(AttachEvent::Exit(result))) => {
                        let body = serde_json::json!({
                            "type": "exit",
                            "exit_code": result.exit_code,
                            "ok": result.success(),
                            "result": ExitInfo::from(&result),
                        });
                        let _ = tx.send(Message::Text(body.to_string().into())).await;
                        break;
                    }
                    Some(Err(e)) => {
                        let err = ApiError::from(e);
                        let body = serde_json::json!({"type": "error", "code": err.code(), "message": err.body().message});
                        let _ = tx.send(Message::Text(body.to_string().into())).await;
                        break;
                    }
                    None => break,
                };
                if tx.send(msg).await.is_err() {
                    break;
                }
            }
            // The client went away: the process runs on (join it again with ?pid=).
            _ = &mut gone => break,
        }
    }
    reader.abort();
    let _ = tx.close().await;
}
