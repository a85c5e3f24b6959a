//! `/v1/sandboxes/{id}/snapshots` and `/v1/snapshots`: take, list, show (with lineage),
//! delete, and fork (restore into new sandboxes).

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::SandboxId;
use sandcell_api::snapshots::{
    AutoSnapshot, CreateSnapshot, ForkResult, ForkSnapshot, SnapshotInfo, SnapshotList,
};

use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Takes a snapshot: the sandbox's `/workspace`, `/home/sandbox` and `/tmp` (and its
/// kernels' variables), read while it is paused for that moment, or a process checkpoint
/// where the sandbox has one; checksummed and kept on disk; listed only once whole.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = CreateSnapshot,
    responses(
        (status = 201, body = SnapshotInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running, or cannot be snapshotted here", body = ErrorBody),
        (status = 507, description = "No room on the host's disk", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<CreateSnapshot>,
) -> ApiResult<(StatusCode, Json<SnapshotInfo>)> {
    let info = s.service.create_snapshot(&caller, &id, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Lists the caller's snapshots (`?sandbox=` for one sandbox's).
#[utoipa::path(
    get, path = "/v1/snapshots", tag = "snapshots",
    params(("sandbox" = Option<String>, Query, description = "Only this sandbox's")),
    responses(
        (status = 200, body = SnapshotList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<SnapshotList>> {
    let mut sandbox = None;
    for (k, v) in query_pairs(query.as_deref())? {
        match k.as_str() {
            "sandbox" => sandbox = Some(SandboxId::parse(v)?),
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{k}' (this route takes: sandbox)"
                )));
            }
        }
    }
    Ok(Json(s.service.list_snapshots(&caller, sandbox.as_ref())?))
}

/// Shows a snapshot with its lineage: its parent, its children, the sandboxes made from it.
#[utoipa::path(
    get, path = "/v1/snapshots/{snapshot_id}", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 200, body = SnapshotInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(snapshot_id): ApiPath<String>,
) -> ApiResult<Json<SnapshotInfo>> {
    Ok(Json(s.service.get_snapshot(&caller, &snapshot_id)?))
}

/// Deletes a snapshot and its files. One with children (snapshots of sandboxes forked from
/// it) is refused: delete those first.
#[utoipa::path(
    delete, path = "/v1/snapshots/{snapshot_id}", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "It has children", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(snapshot_id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    s.service.delete_snapshot(&caller, &snapshot_id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Makes new sandboxes from a snapshot, each independent of the others: the snapshot's
/// settings, its files checked against their checksum and written in, a fresh id.
#[utoipa::path(
    post, path = "/v1/snapshots/{snapshot_id}/fork", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    request_body = ForkSnapshot,
    responses(
        (status = 201, body = ForkResult),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The snapshot is corrupt on disk", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn fork(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(snapshot_id): ApiPath<String>,
    ApiJson(req): ApiJson<ForkSnapshot>,
) -> ApiResult<(StatusCode, Json<ForkResult>)> {
    let made = s.service.fork_snapshot(&caller, &snapshot_id, req).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// A sandbox's automatic snapshots.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/auto-snapshot", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, body = AutoSnapshot),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_auto(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<AutoSnapshot>> {
    Ok(Json(s.service.get_auto_snapshot(&caller, &id)?))
}

/// Sets a sandbox's automatic snapshots (replacing what it had).
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/auto-snapshot", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = AutoSnapshot,
    responses(
        (status = 200, body = AutoSnapshot),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not active", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_auto(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<AutoSnapshot>,
) -> ApiResult<Json<AutoSnapshot>> {
    Ok(Json(s.service.set_auto_snapshot(&caller, &id, req)?))
}
