//! `/v1/volumes`: named volumes, folders that outlive the sandboxes that mount them
//! (`mounts` at create).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandcell_api::volumes::{CreateVolume, VolumeInfo, VolumeList};

use super::extract::{ApiJson, ApiPath};
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody};
use crate::state::AppState;

/// Makes a volume of the caller's (a create's `mounts` also makes one on first use).
#[utoipa::path(
    post, path = "/v1/volumes", tag = "volumes",
    request_body = CreateVolume,
    responses(
        (status = 201, description = "Made", body = VolumeInfo),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 409, description = "It exists", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateVolume>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    let made = s.service.create_volume(&caller, &req.name)?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// Lists the caller's volumes, with their sizes and the sandboxes mounting them.
#[utoipa::path(
    get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList), (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub async fn list(State(s): State<AppState>, caller: Caller) -> ApiResult<Json<VolumeList>> {
    Ok(Json(s.service.list_volumes(&caller)?))
}

/// Shows one of the caller's volumes.
#[utoipa::path(
    get, path = "/v1/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "Volume name")),
    responses(
        (status = 200, body = VolumeInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<VolumeInfo>> {
    Ok(Json(s.service.get_volume(&caller, &name)?))
}

/// Deletes one of the caller's volumes and its files; refused (409) while a sandbox mounts
/// it.
#[utoipa::path(
    delete, path = "/v1/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "Volume name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A sandbox mounts it", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    s.service.delete_volume(&caller, &name)?;
    Ok(StatusCode::NO_CONTENT)
}
