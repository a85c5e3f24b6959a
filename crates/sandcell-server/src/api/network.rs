//! `/v1/sandboxes/{id}/network`: what a sandbox's network reaches (read and changed live),
//! and its egress events; `…/secrets`, what its proxy puts in for placeholders; `…/git/clone`,
//! a clone made through the same proxies.

use axum::Json;
use axum::extract::{RawQuery, State};
use sandcell_api::SandboxId;
use sandcell_api::git::{GitClone, GitCloneResult};
use sandcell_api::network::{EgressEventList, NetworkInfo, SetNetwork};
use sandcell_api::sandboxes::{SecretList, SetSecrets};

use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// What the sandbox's network reaches now, its proxy addresses inside, and what its egress
/// proxy carried.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, body = NetworkInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_network(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<NetworkInfo>> {
    Ok(Json(s.service.network_info(&caller, &id)?))
}

/// Changes what the running sandbox's network reaches: its egress proxy decides the next
/// connection (and the next plain-HTTP request) under the new policy; open tunnels stay.
/// `off` is set when a sandbox is made and cannot be set or left here.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = SetNetwork,
    responses(
        (status = 200, body = NetworkInfo),
        (status = 400, description = "A bad policy, or a change to or from `off`", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_network(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<SetNetwork>,
) -> ApiResult<Json<NetworkInfo>> {
    Ok(Json(s.service.set_network(&caller, &id, req)?))
}

/// The sandbox's secrets: names, placeholders and hosts, never values; `held` is false for
/// one whose value the daemon lost in a restart (its placeholder is refused until given).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/secrets", tag = "network",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, body = SecretList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_secrets(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<SecretList>> {
    Ok(Json(s.service.get_secrets(&caller, &id)?))
}

/// Replaces the running sandbox's secrets, from its next request on: a name it has keeps
/// its placeholder (give a value again after a restart of the daemon, or rotate it); a new
/// name gets a new placeholder (answered here; processes already running do not have it in
/// their environment); a name left out is forgotten.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/secrets", tag = "network",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = SetSecrets,
    responses(
        (status = 200, body = SecretList),
        (status = 400, description = "A bad secret, or a sandbox with network `off`", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_secrets(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<SetSecrets>,
) -> ApiResult<Json<SecretList>> {
    Ok(Json(s.service.set_secrets(&caller, &id, req)?))
}

/// The sandbox's egress events, newest first: every connection (and plain-HTTP request)
/// its proxy allowed or denied, with host, port, bytes and reason. They are entries of the
/// audit log (`egress.allowed`, `egress.denied`) and outlive the sandbox.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/network/events", tag = "network",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)"),
        ("before" = Option<i64>, Query, description = "Only events older than this one (`next_before` of the previous page)"),
    ),
    responses(
        (status = 200, body = EgressEventList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn egress_events(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<EgressEventList>> {
    let (mut limit, mut before) = (0, None);
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid(format!("limit '{v}' must be a number from 1 to 1000"))
                    })?;
            }
            "before" => {
                before = Some(v.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    ApiError::invalid(format!("before '{v}' must be a positive event id"))
                })?);
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (limit, before)"
                )));
            }
        }
    }
    Ok(Json(s.service.egress_events(&caller, &id, before, limit)?))
}

/// Clones a git repository into the sandbox. The clone runs on the host, through an egress
/// proxy that allows only the repository's host (the sandbox's own policy is not changed);
/// credentials (in the URL or as `username`/`password`) are used there and never enter the
/// sandbox. The working tree with its `.git` is copied in, owned by the sandbox's user.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/git/clone", tag = "network",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = GitClone,
    responses(
        (status = 200, body = GitCloneResult),
        (status = 400, description = "A bad request, or the clone failed (git's message)", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The path is not empty, or the sandbox is not running", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn git_clone(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<GitClone>,
) -> ApiResult<Json<GitCloneResult>> {
    Ok(Json(s.service.git_clone(&caller, &id, req).await?))
}
