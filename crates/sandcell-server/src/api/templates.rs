//! `/v1/templates` and `/v1/builds`: build a template from a Dockerfile and a context (a
//! job: follow its log live), list, show and delete templates.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandcell_api::exec::SseEvent;
use sandcell_api::templates::{
    BuildInfo, BuildList, BuildLog, StartBuild, TemplateInfo, TemplateList,
};

use super::exec::sse;
use super::extract::{ApiJson, ApiPath};
use super::runs::EventsQuery;
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody};
use crate::state::AppState;

/// Builds a template: each step of the Dockerfile in a build sandbox, its changes a cached
/// layer of the daemon's image store (docs/templates.md). Answers at once (202, the build
/// `queued` or `running`; follow `/v1/builds/{build_id}/logs`), or with `"wait": true` when
/// it has ended (200). Needs an admin key: templates are shared by every owner.
#[utoipa::path(
    post, path = "/v1/templates", tag = "templates",
    request_body = StartBuild,
    responses(
        (status = 202, description = "Started: it goes on in the background", body = BuildInfo),
        (status = 200, description = "Ended (`wait`: true)", body = BuildInfo),
        (status = 400, description = "A bad name, Dockerfile (with its line) or context", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn build(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<StartBuild>,
) -> ApiResult<(StatusCode, Json<BuildInfo>)> {
    let status = if req.wait {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(s.service.start_build(&caller, req).await?)))
}

/// Lists the templates: the images of the daemon's store, built or imported.
#[utoipa::path(
    get, path = "/v1/templates", tag = "templates",
    responses((status = 200, body = TemplateList), (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub async fn list(State(s): State<AppState>, _caller: Caller) -> ApiResult<Json<TemplateList>> {
    Ok(Json(s.service.list_templates().await?))
}

/// Shows a template: its layers, size, kernels, environment, the sandboxes on it.
#[utoipa::path(
    get, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name (`name[:tag]`)")),
    responses(
        (status = 200, body = TemplateInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    _caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<TemplateInfo>> {
    Ok(Json(s.service.get_template(&name).await?))
}

/// Deletes a template's name (its layers go at the next garbage collection); refused (409)
/// while sandboxes run on it. Needs an admin key.
#[utoipa::path(
    delete, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name (`name[:tag]`)")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Sandboxes run on it", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    s.service.delete_template(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists the builds this daemon has run since it started, newest first.
#[utoipa::path(
    get, path = "/v1/builds", tag = "templates",
    responses((status = 200, body = BuildList), (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub async fn list_builds(State(s): State<AppState>, _caller: Caller) -> Json<BuildList> {
    Json(s.service.list_builds())
}

/// Shows a build: its state, the step running, each finished step's exit code, duration,
/// layer and size and whether it was cached, the image it made.
#[utoipa::path(
    get, path = "/v1/builds/{build_id}", tag = "templates",
    params(("build_id" = String, Path, description = "Build id")),
    responses(
        (status = 200, body = BuildInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_build(
    State(s): State<AppState>,
    _caller: Caller,
    ApiPath(build_id): ApiPath<String>,
) -> ApiResult<Json<BuildInfo>> {
    Ok(Json(s.service.build_info(&build_id)?))
}

/// Cancels a build: its running step is killed; answers when it has ended (`cancelled`).
#[utoipa::path(
    post, path = "/v1/builds/{build_id}/cancel", tag = "templates",
    params(("build_id" = String, Path, description = "Build id")),
    responses(
        (status = 200, body = BuildInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn cancel_build(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(build_id): ApiPath<String>,
) -> ApiResult<Json<BuildInfo>> {
    Ok(Json(s.service.cancel_build(&caller, &build_id).await?))
}

/// A build's log: `warning`, `base`, `step_started`, `output` (the steps' stdout and
/// stderr), `network`, `step_finished`, `smoke` and `finished` events. As server-sent events
/// (the default): each event's `id` is its number, its name its kind; the events after
/// `after` (or `Last-Event-ID`), then the live ones until `finished`. With `format=json` (or
/// `Accept: application/json`): `{"events": […]}`, at most `limit` after `after`.
#[utoipa::path(
    get, path = "/v1/builds/{build_id}/logs", tag = "templates",
    params(
        ("build_id" = String, Path, description = "Build id"),
        ("after" = Option<u64>, Query, description = "Only events numbered after this one (default 0: all)"),
        ("format" = Option<String>, Query, description = "`sse` (default) or `json`"),
        ("limit" = Option<u32>, Query, description = "JSON: at most this many (1 to 1000, default 1000)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event"),
    ),
    responses(
        (status = 200, description = "Server-sent events, or one JSON list", content(
            (BuildLog = "application/json"),
            (SseEvent = "text/event-stream"),
        )),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn logs(
    State(s): State<AppState>,
    _caller: Caller,
    ApiPath(build_id): ApiPath<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let q = EventsQuery::parse(query.as_deref(), &headers)?;
    if q.json {
        let log = s.service.build_log(&build_id, q.after, q.limit as usize)?;
        return Ok(Json(log).into_response());
    }
    let events = s.service.follow_build(&build_id, q.after)?;
    Ok(sse(events.map(|e| {
        let data = serde_json::to_value(&e).unwrap_or_default();
        let kind = data["event"].as_str().unwrap_or("event").to_string();
        Event::default()
            .id(e.seq.to_string())
            .event(kind)
            .data(data.to_string())
    }))
    .into_response())
}
