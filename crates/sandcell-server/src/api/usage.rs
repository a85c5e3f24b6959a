//! `GET /v1/sandboxes/{id}/metrics`: what a sandbox uses now, from its cgroup (the
//! service's `sandbox_usage`).

use axum::Json;
use axum::extract::State;
use sandcell_api::SandboxId;
use sandcell_api::usage::SandboxUsage;

use super::extract::ApiPath;
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody};
use crate::state::AppState;

/// CPU, memory and process counts of a sandbox (from cgroups; `null` where the host has
/// none).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, body = SandboxUsage),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn usage(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<SandboxUsage>> {
    Ok(Json(s.service.sandbox_usage(&caller, &id).await?))
}
