//! `/v1/threads`: conversations that persist across agent runs (a run joins one with
//! `thread_id` on `POST /v1/runs`): make, list, show, rename, delete.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::runs::{CreateThread, RenameThread, ThreadInfo, ThreadList};

use super::extract::{ApiJson, ApiPath};
use super::runs::limit_only;
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody};
use crate::state::AppState;

/// Makes a thread. Its runs (`POST /v1/runs` with `thread_id`) each see the conversation
/// of the ones before and share one sandbox.
#[utoipa::path(
    post, path = "/v1/threads", tag = "threads",
    request_body = CreateThread,
    responses(
        (status = 201, body = ThreadInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateThread>,
) -> ApiResult<(StatusCode, Json<ThreadInfo>)> {
    Ok((
        StatusCode::CREATED,
        Json(s.runner.create_thread(&caller, req)?),
    ))
}

/// Lists the caller's threads, the most recently used first.
#[utoipa::path(
    get, path = "/v1/threads", tag = "threads",
    params(("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)")),
    responses(
        (status = 200, body = ThreadList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<ThreadList>> {
    let limit = limit_only(query.as_deref())?;
    Ok(Json(s.runner.list_threads(&caller, limit)?))
}

/// One thread.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}", tag = "threads",
    params(("thread_id" = String, Path, description = "Thread id")),
    responses(
        (status = 200, body = ThreadInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<String>,
) -> ApiResult<Json<ThreadInfo>> {
    Ok(Json(s.runner.get_thread(&caller, &thread_id)?))
}

/// Renames a thread.
#[utoipa::path(
    patch, path = "/v1/threads/{thread_id}", tag = "threads",
    params(("thread_id" = String, Path, description = "Thread id")),
    request_body = RenameThread,
    responses(
        (status = 200, body = ThreadInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn rename(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<String>,
    ApiJson(req): ApiJson<RenameThread>,
) -> ApiResult<Json<ThreadInfo>> {
    Ok(Json(s.runner.rename_thread(&caller, &thread_id, req)?))
}

/// Deletes a thread and its sandbox (its runs and their trajectories stay).
#[utoipa::path(
    delete, path = "/v1/threads/{thread_id}", tag = "threads",
    params(("thread_id" = String, Path, description = "Thread id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A run is going on in it", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    s.runner.delete_thread(&caller, &thread_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
