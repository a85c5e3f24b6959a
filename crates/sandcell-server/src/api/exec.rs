//! `/v1/sandboxes/{id}/exec`: run a command and get its result, or stream it as
//! server-sent events.

use sandcell_api::SandboxId;
use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use sandcell_api::exec::{ExecInput, ExecOutput, SseEvent};

use super::extract::{ApiJson, ApiPath};
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody};
use crate::state::AppState;

/// Runs a command and returns when it ends.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
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
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(input): ApiJson<ExecInput>,
) -> ApiResult<Json<ExecOutput>> {
    Ok(Json(s.service.exec(&caller, &id, input).await?))
}

/// Runs a command and streams it: `stdout` and `stderr` events (`{"data": text}`), then one
/// `exit` event (like the `exec` response without the output), or an `error` event.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/exec/stream", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
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
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(input): ApiJson<ExecInput>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let events = s.service.exec_stream(&caller, &id, input).await?;
    Ok(sse(events.map(|e| sse_event(e.name(), e.data()))))
}

/// Server-sent events with keep-alives.
pub fn sse<S>(events: S) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    S: Stream<Item = Event> + Send + 'static,
{
    Sse::new(events.map(Ok)).keep_alive(KeepAlive::default())
}

/// An SSE event named `name` carrying `data`, its JSON text.
pub fn sse_event(name: &str, data: String) -> Event {
    Event::default().event(name).data(data)
}
