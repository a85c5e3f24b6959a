//! Background processes and terminals: start a process that outlives the request, follow
//! its output from any offset (and again after a disconnect), feed its stdin, resize its
//! terminal; and `GET /pty`, a terminal over a WebSocket.

use sandcell_api::SandboxId;
use std::convert::Infallible;

use axum::Json;
use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, Stream, StreamExt};
use sandcell_api::exec::SseEvent;
use sandcell_api::processes::{
    MAX_STDIN_BYTES, OpenTerminal, OutputFrom, PTY_PID_HEADER, ProcessOutput, StartProcess,
    Started, TermSize,
};
use sandcell_service::processes::{Terminal, TerminalEvent};
use sandcell_service::{ErrorKind, ServiceError};

use super::exec::{sse, sse_event};
use super::extract::{ApiJson, ApiPath, query_pairs};
use super::processes::flag;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Starts a process in the background: the answer comes at once with its pid.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
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
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(input): ApiJson<StartProcess>,
) -> ApiResult<(StatusCode, Json<Started>)> {
    let started = s.service.start_process(&caller, &id, input).await?;
    Ok((StatusCode::CREATED, Json(started)))
}

/// `stdout_from` and `stderr_from` of a query (absent: the oldest byte still buffered).
fn output_from(raw: Option<&str>) -> Result<OutputFrom, ApiError> {
    let mut from = OutputFrom::default();
    for (k, v) in query_pairs(raw)? {
        let offset = || {
            v.parse::<u64>().map_err(|_| {
                ApiError::invalid(format!(
                    "'{k}' must be a byte offset (a whole number), got '{v}'"
                ))
            })
        };
        match k.as_str() {
            "stdout_from" => from.stdout_from = Some(offset()?),
            "stderr_from" => from.stderr_from = Some(offset()?),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (stdout_from, stderr_from)"
                )));
            }
        }
    }
    Ok(from)
}

/// Follows a process's output as server-sent events, from the offsets asked (default: all
/// still buffered): `stdout`/`stderr` `{"data", "offset"}` (the offset of the chunk's first
/// byte: reconnect with `stdout_from` = offset + bytes), `lost` `{"channel", "offset",
/// "bytes"}` when asked-for bytes are no longer buffered, then `exit`.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes/{pid}/stream", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
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
    ApiPath((id, pid)): ApiPath<(SandboxId, i32)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let from = output_from(raw.as_deref())?;
    let events = s.service.follow_process(&caller, &id, pid, from).await?;
    Ok(sse(events.map(|e| sse_event(e.name(), e.data()))))
}

/// Waits for a process to end and returns its output (from the offsets asked, default all
/// still buffered).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
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
    ApiPath((id, pid)): ApiPath<(SandboxId, i32)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<ProcessOutput>> {
    let from = output_from(raw.as_deref())?;
    Ok(Json(
        s.service.process_output(&caller, &id, pid, from).await?,
    ))
}

/// Writes the body to the process's stdin (or terminal); `close=true` closes it afterwards
/// (an empty body with `close=true` only closes).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
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
    ApiPath((id, pid)): ApiPath<(SandboxId, i32)>,
    RawQuery(raw): RawQuery,
    body: Body,
) -> ApiResult<StatusCode> {
    let mut close = false;
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "close" => close = flag("close", &v)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (close)"
                )));
            }
        }
    }
    let bytes = axum::body::to_bytes(body, MAX_STDIN_BYTES)
        .await
        .map_err(|_| {
            ServiceError::new(
                ErrorKind::BodyTooLarge,
                format!("a stdin write is at most {MAX_STDIN_BYTES} bytes"),
            )
        })?;
    s.service
        .write_process_stdin(&caller, &id, pid, &bytes, close)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resizes a process's terminal.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
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
    ApiPath((id, pid)): ApiPath<(SandboxId, i32)>,
    ApiJson(size): ApiJson<TermSize>,
) -> ApiResult<StatusCode> {
    s.service.resize_terminal(&caller, &id, pid, size).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What `GET /pty` starts or joins, from its query.
fn open_terminal(raw: Option<&str>) -> Result<OpenTerminal, ApiError> {
    let mut q = OpenTerminal::default();
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
                q.pid = Some(pid);
            }
            "cmd" => q.cmd = Some(v),
            "cwd" => q.cwd = Some(v),
            "rows" => q.rows = number("rows")?,
            "cols" => q.cols = number("cols")?,
            // Browsers cannot set headers on a WebSocket: the key may come here instead.
            "api_key" => {}
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (pid, cmd, cwd, rows, cols, api_key)"
                )));
            }
        }
    }
    Ok(q)
}

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
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
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
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(raw): RawQuery,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let req = open_terminal(raw.as_deref())?;
    let ws = ws.map_err(|e| {
        ApiError::invalid(format!(
            "this route speaks WebSocket only: {}",
            e.body_text()
        ))
    })?;
    // Opened (and attached) before the upgrade, so a wrong pid is an HTTP error, not a
    // closed socket.
    let terminal = s.service.open_terminal(&caller, &id, req).await?;
    let pid = terminal.pid;
    let mut response = ws
        .on_upgrade(move |socket| pump(socket, terminal))
        .into_response();
    // The terminal's pid, so that a client that started it can join it again.
    response
        .headers_mut()
        .insert(PTY_PID_HEADER, axum::http::HeaderValue::from(pid));
    Ok(response)
}

/// Pumps a terminal both ways until the process ends or the client goes.
async fn pump(socket: WebSocket, terminal: Terminal) {
    let Terminal {
        mut output, input, ..
    } = terminal;
    let (mut tx, mut rx) = socket.split();
    let (gone_tx, mut gone) = tokio::sync::oneshot::channel::<()>();
    // Keystrokes and resizes, in order, while output flows the other way.
    let reader = tokio::spawn(async move {
        let _gone = gone_tx;
        // A keystroke that cannot be written (the process just ended on the one before) does
        // not end the socket: the process's exit frame is still to come from the other side.
        while let Some(Ok(msg)) = rx.next().await {
            let _ = match &msg {
                Message::Binary(b) => input.keys(b).await,
                Message::Text(t) => input.text(t).await,
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
        }
    });
    loop {
        tokio::select! {
            event = output.next() => {
                let msg = match event {
                    Some(TerminalEvent::Output(b)) => Message::Binary(b.into()),
                    Some(TerminalEvent::Frame(frame)) => Message::Text(
                        serde_json::to_string(&frame).unwrap_or_default().into(),
                    ),
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
