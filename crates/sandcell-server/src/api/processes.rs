//! `/v1/sandboxes/{id}/processes`: every process in a sandbox, and signals to them.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::SandboxId;
use sandcell_api::processes::{DEFAULT_SIGNAL, ProcessList, parse_signal};

use super::extract::{ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Lists every process in the sandbox (its agent excluded).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, body = ProcessList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<ProcessList>> {
    Ok(Json(s.service.list_processes(&caller, &id).await?))
}

/// Sends a signal (default KILL) to a process, or with `tree=true` to it and its descendants.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("pid" = i32, Path, description = "Pid inside the sandbox"),
        ("signal" = Option<String>, Query, description = "TERM, KILL (default), INT, HUP… or a number"),
        ("tree" = Option<bool>, Query, description = "Its descendants too"),
    ),
    responses(
        (status = 204, description = "Sent"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn signal(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, pid)): ApiPath<(SandboxId, i32)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    let mut signal = DEFAULT_SIGNAL;
    let mut tree = false;
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "signal" => signal = parse_signal(&v)?,
            "tree" => tree = flag("tree", &v)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (signal, tree)"
                )));
            }
        }
    }
    s.service
        .signal_process(&caller, &id, pid, signal, tree)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A `true`/`false` (or `1`/`0`) query parameter.
pub fn flag(name: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::invalid(format!(
            "'{name}' must be true or false, got '{v}'"
        ))),
    }
}
