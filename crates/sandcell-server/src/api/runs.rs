//! `/v1/runs`: agent runs — start one (in the background, or waiting for its end), list,
//! show, cancel, and read or follow its trajectory (server-sent events, resumable by event
//! number, or one JSON list).

use std::convert::Infallible;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use sandcell_api::exec::SseEvent;
use sandcell_api::runs::{ForkRun, RunInfo, RunList, StartRun, StepSandbox};
use serde::Serialize;
use serde_json::Value;

use super::exec::sse;
use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Most runs or events one answer lists.
const MAX_LIMIT: u32 = 1000;

/// A run's events, oldest first (`GET /v1/runs/{run_id}/events?format=json`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RunEventList {
    /// Each event: `{v, run_id, root_run_id, seq, ts, step, depth, type, …}`, the fields after
    /// `type` depending on it (see docs/agent.md).
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<Value>,
}

/// Starts an agent run: a model that writes code, runs it in a sandbox's live kernels, reads
/// the result and goes on until it answers, within budgets. Answers at once (202, the run
/// `running`; follow it at `/v1/runs/{run_id}/events`), or with `"wait": true` when it has
/// ended (200).
#[utoipa::path(
    post, path = "/v1/runs", tag = "runs",
    request_body = StartRun,
    responses(
        (status = 202, description = "Started: it goes on in the background", body = RunInfo),
        (status = 200, description = "Ended (`wait`: true)", body = RunInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such sandbox (`sandbox_id`)", body = ErrorBody),
        (status = 409, description = "A mode this build cannot run", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn start(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<StartRun>,
) -> ApiResult<(StatusCode, Json<RunInfo>)> {
    let status = if req.wait {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(s.runner.start(&caller, req).await?)))
}

/// Lists the caller's runs, newest first.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs",
    params(("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)")),
    responses(
        (status = 200, body = RunList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<RunList>> {
    let limit = limit_only(query.as_deref())?;
    Ok(Json(s.runner.list(&caller, limit)?))
}

/// Shows a run: its status, why it ended, its answer, what it used.
#[utoipa::path(
    get, path = "/v1/runs/{run_id}", tag = "runs",
    params(("run_id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = RunInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
) -> ApiResult<Json<RunInfo>> {
    Ok(Json(s.runner.get(&caller, &run_id)?))
}

/// Cancels a run: its model call stops, its running cell is interrupted (the kernel's state
/// stays); answers once its end is recorded (`cancelled`). A run that has ended already is
/// answered as it is.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/cancel", tag = "runs",
    params(("run_id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = RunInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The run goes on in another process", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn cancel(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
) -> ApiResult<Json<RunInfo>> {
    Ok(Json(s.runner.cancel(&caller, &run_id).await?))
}

/// Resumes a run a stopped process left unfinished (`running` with no process, or `failed`
/// with reason `interrupted`): it goes on from its last committed step, its sandbox restored
/// from that step's snapshot when the next step had started to change it. The daemon resumes
/// such runs by itself when it starts; this is for the rest (an embedded run's, or one the
/// daemon could not take up). Answers at once; follow the events for the rest.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/resume", tag = "runs",
    params(("run_id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = RunInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The run is going on, has ended, or is a sub-run", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn resume(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
) -> ApiResult<Json<RunInfo>> {
    Ok(Json(s.runner.resume(&caller, &run_id, false).await?))
}

/// Forks a run at one of its committed steps: a new run whose history is the original's
/// steps up to `from_step` and whose sandbox is restored from that step's snapshot (a
/// variable set at that step is there, one set later is not); the original is never
/// changed. Answers at once (202), or with `"wait": true` when the fork has ended (200).
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/fork", tag = "runs",
    params(("run_id" = String, Path, description = "The original run")),
    request_body = ForkRun,
    responses(
        (status = 202, description = "Started: it goes on in the background", body = RunInfo),
        (status = 200, description = "Ended (`wait`: true)", body = RunInfo),
        (status = 400, description = "No such committed step, or bad input", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "No step snapshot to restore", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn fork(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
    ApiJson(req): ApiJson<ForkRun>,
) -> ApiResult<(StatusCode, Json<RunInfo>)> {
    let status = if req.wait {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(s.runner.fork(&caller, &run_id, req).await?)))
}

/// Opens a new sandbox as the run's sandbox was at the end of a committed step (restored
/// from the newest step snapshot at or before it), without starting a run.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/steps/{step}/sandbox", tag = "runs",
    params(
        ("run_id" = String, Path, description = "The run"),
        ("step" = u32, Path, description = "One of its committed steps"),
    ),
    responses(
        (status = 201, body = StepSandbox),
        (status = 400, description = "No such committed step", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "No step snapshot to restore", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn step_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((run_id, step)): ApiPath<(String, u32)>,
) -> ApiResult<(StatusCode, Json<StepSandbox>)> {
    let made = s.runner.step_sandbox(&caller, &run_id, step).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// A run's trajectory. As server-sent events (the default): each event's `id` is its number
/// (`seq`), its name its `type`, its data the event's JSON; the stored events after `after`
/// (or the `Last-Event-ID` header, which wins), then the live ones until `run_finished`, and
/// the stream ends; for a run that has ended, the stored ones. With `format=json` (or
/// `Accept: application/json`): `{"events": […]}`, at most `limit` after `after`.
#[utoipa::path(
    get, path = "/v1/runs/{run_id}/events", tag = "runs",
    params(
        ("run_id" = String, Path, description = "Run id"),
        ("after" = Option<u64>, Query, description = "Only events numbered after this one (default 0: all)"),
        ("format" = Option<String>, Query, description = "`sse` (default) or `json`"),
        ("limit" = Option<u32>, Query, description = "JSON: at most this many (1 to 1000, default 1000)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event (what an EventSource sends when it reconnects)"),
    ),
    responses(
        (status = 200, description = "Server-sent events, or one JSON list", content(
            (RunEventList = "application/json"),
            (SseEvent = "text/event-stream"),
        )),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn events(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let q = EventsQuery::parse(query.as_deref(), &headers)?;
    if q.json {
        let events = s.runner.events(&caller, &run_id, q.after, q.limit)?;
        return Ok(Json(RunEventList { events }).into_response());
    }
    let events = s.runner.follow(&caller, &run_id, q.after)?;
    Ok(event_stream(events).into_response())
}

/// What `GET /v1/runs/{run_id}/events` was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventsQuery {
    pub(crate) after: u64,
    pub(crate) json: bool,
    pub(crate) limit: u32,
}

impl EventsQuery {
    pub(crate) fn parse(raw: Option<&str>, headers: &HeaderMap) -> Result<Self, ApiError> {
        let mut q = Self {
            after: 0,
            json: false,
            limit: MAX_LIMIT,
        };
        let mut format = None;
        for (k, v) in query_pairs(raw)? {
            match k.as_str() {
                "after" => {
                    q.after = v.parse().map_err(|_| {
                        ApiError::invalid(format!(
                            "after '{v}' must be an event number (a whole number, 0 for all)"
                        ))
                    })?;
                }
                "format" => match v.as_str() {
                    "json" => format = Some(true),
                    "sse" => format = Some(false),
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "format '{v}' must be sse or json"
                        )));
                    }
                },
                "limit" => q.limit = parse_limit(&v)?,
                other => {
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter '{other}' (this route takes: after, format, limit)"
                    )));
                }
            }
        }
        if let Some(id) = headers.get("last-event-id") {
            let text = id.to_str().unwrap_or_default().trim();
            q.after = text.parse().map_err(|_| {
                ApiError::invalid(format!(
                    "Last-Event-ID '{text}' must be an event number (a whole number)"
                ))
            })?;
        }
        q.json = format.unwrap_or_else(|| wants_json(headers));
        Ok(q)
    }
}

/// Whether the `Accept` header asks for JSON rather than an event stream.
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    accept.contains("application/json") && !accept.contains("text/event-stream")
}

/// The `limit` of a listing that takes no other parameter (0: the default page).
pub(crate) fn limit_only(query: Option<&str>) -> Result<u32, ApiError> {
    let mut limit = 0;
    for (k, v) in query_pairs(query)? {
        match k.as_str() {
            "limit" => limit = parse_limit(&v)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (this route takes: limit)"
                )));
            }
        }
    }
    Ok(limit)
}

fn parse_limit(v: &str) -> Result<u32, ApiError> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "limit '{v}' must be a number from 1 to {MAX_LIMIT}"
            ))
        })
}

/// A run's events as server-sent events: `id` its number, the name its type.
fn event_stream<S>(events: S) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    S: Stream<Item = Value> + Send + 'static,
{
    sse(events.map(|e| {
        let mut event = Event::default().data(e.to_string());
        if let Some(seq) = e.get("seq").and_then(Value::as_u64) {
            event = event.id(seq.to_string());
        }
        if let Some(kind) = e.get("type").and_then(Value::as_str) {
            event = event.event(kind);
        }
        event
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_events_query_takes_after_format_limit_and_last_event_id() {
        let q = EventsQuery::parse(None, &HeaderMap::new()).unwrap();
        assert_eq!((q.after, q.json, q.limit), (0, false, MAX_LIMIT));
        let q = EventsQuery::parse(Some("after=3&format=json&limit=2"), &HeaderMap::new()).unwrap();
        assert_eq!((q.after, q.json, q.limit), (3, true, 2));
        // Last-Event-ID wins over `after` (an EventSource reconnects with the same URL).
        let q = EventsQuery::parse(Some("after=1"), &headers(&[("last-event-id", "7")])).unwrap();
        assert_eq!(q.after, 7);
        // Accept picks the format when the query does not.
        let json = headers(&[("accept", "application/json")]);
        assert!(EventsQuery::parse(None, &json).unwrap().json);
        assert!(!EventsQuery::parse(Some("format=sse"), &json).unwrap().json);
        let either = headers(&[("accept", "text/event-stream, application/json")]);
        assert!(!EventsQuery::parse(None, &either).unwrap().json);
        for bad in ["after=-1", "format=xml", "limit=0", "limit=1001", "tail=3"] {
            assert!(
                EventsQuery::parse(Some(bad), &HeaderMap::new()).is_err(),
                "{bad}"
            );
        }
        assert!(EventsQuery::parse(None, &headers(&[("last-event-id", "x")])).is_err());
    }
}
