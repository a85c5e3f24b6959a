//! `/v1/sandboxes`: create, get, list, delete, set the timeout.

use sandcell_api::SandboxId;
use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::sandboxes::{CreateSandbox, SandboxInfo, SandboxList, SetTimeout};
use sandcell_engine::fleet::SandboxState;
use sandcell_service::sandboxes::ListSandboxes;

use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Creates a sandbox.
#[utoipa::path(
    post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandbox,
    responses(
        (status = 201, description = "Running", body = SandboxInfo),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "No valid API key", body = ErrorBody),
        (status = 404, description = "No such template", body = ErrorBody),
        (status = 429, description = "A cap was reached", body = ErrorBody),
        (status = 500, description = "The sandbox could not start", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> ApiResult<(StatusCode, Json<SandboxInfo>)> {
    let info = s.service.create_sandbox(&caller, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// One sandbox.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, body = SandboxInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such sandbox (for this key)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(s.service.get_sandbox(&caller, &id)?))
}

/// Lists sandboxes: by default the active ones (creating, running, paused).
#[utoipa::path(
    get, path = "/v1/sandboxes", tag = "sandboxes",
    params(
        ("state" = Option<String>, Query, description = "Only these states (repeatable, or comma-separated; `all` for every state)"),
        ("label" = Option<String>, Query, description = "`key:value` that must match (repeatable)"),
        ("metadata" = Option<String>, Query, description = "`key:value` that must match (repeatable)"),
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses(
        (status = 200, body = SandboxList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<SandboxList>> {
    let mut req = ListSandboxes::default();
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "state" => {
                for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if name == "all" {
                        req.all_states = true;
                        continue;
                    }
                    let state = SandboxState::parse(name).ok_or_else(|| {
                        ApiError::invalid(format!(
                            "state '{name}' is not one of creating, running, paused, stopped, failed, lost, all"
                        ))
                    })?;
                    req.states.push(state);
                }
            }
            "label" => insert_pair(&mut req.labels, "label", &v)?,
            "metadata" => insert_pair(&mut req.metadata, "metadata", &v)?,
            "limit" => {
                req.limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid(format!("limit '{v}' must be a number from 1 to 1000"))
                    })?;
            }
            "cursor" => req.cursor = Some(v),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (state, label, metadata, limit, cursor)"
                )));
            }
        }
    }
    Ok(Json(s.service.list_sandboxes(&caller, req)?))
}

fn insert_pair(map: &mut BTreeMap<String, String>, what: &str, v: &str) -> Result<(), ApiError> {
    let (k, val) = v
        .split_once(':')
        .ok_or_else(|| ApiError::invalid(format!("{what} '{v}' must be key:value")))?;
    if k.is_empty() {
        return Err(ApiError::invalid(format!("{what} '{v}' has an empty key")));
    }
    map.insert(k.to_string(), val.to_string());
    Ok(())
}

/// Stops a sandbox and frees everything it holds (its record stays, `stopped`, unless it
/// is ephemeral).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 204, description = "Stopped"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<StatusCode> {
    s.service.delete_sandbox(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets how long from now the sandbox may live.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = SetTimeout,
    responses(
        (status = 200, body = SandboxInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not active", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_timeout(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<SetTimeout>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(s.service.set_sandbox_timeout(
        &caller,
        &id,
        req.timeout_secs,
    )?))
}

/// Pauses the sandbox: every process in it freezes (no CPU; memory, processes and kernel
/// state kept) and its idle and lifetime clocks stop. Anything asked of it later (exec,
/// code, files…) resumes it first; so does `POST …/resume`.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, description = "Paused (or paused already)", body = SandboxInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running, or this host cannot pause", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn pause(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(s.service.pause_sandbox(&caller, &id).await?))
}

/// Resumes a paused sandbox where it stopped; its lifetime is extended by the time it spent
/// paused.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, description = "Running (or running already)", body = SandboxInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running or paused", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn resume(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(s.service.resume_sandbox(&caller, &id).await?))
}
