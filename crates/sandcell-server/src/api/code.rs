//! `/v1/sandboxes/{id}/code` and `/contexts`: code in language kernels whose state persists,
//! collected or streamed; contexts, interrupts, restarts and variables.

use sandcell_api::SandboxId;
use std::convert::Infallible;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use futures_util::{Stream, StreamExt};
use sandcell_api::code::{
    CodeInput, CodeResult, ContextView, CreateContext, SetVariables, VariableNames, VariablesView,
    add_names,
};
use sandcell_api::exec::SseEvent;

use super::exec::{sse, sse_event};
use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Runs code in a kernel and returns when it ends. The context's state persists.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = CodeInput,
    responses(
        (status = 200, description = "It ran (see `done.status`)", body = CodeResult),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn run(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(input): ApiJson<CodeInput>,
) -> ApiResult<Json<CodeResult>> {
    Ok(Json(s.service.run_code(&caller, &id, input).await?))
}

/// Runs code and streams its events as they happen: `stdout`/`stderr` (`{"text"}`),
/// `display`/`result` (`{"data": bundle}`), `error` (`{"name","value","traceback"}`), then
/// `done` (like `done` of the collected result), or an `error` event with an error `code`.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code/stream", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = CodeInput,
    responses(
        (status = 200, description = "Server-sent events", content_type = "text/event-stream", body = SseEvent),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn run_stream(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(input): ApiJson<CodeInput>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let events = s.service.run_code_stream(&caller, &id, input).await?;
    Ok(sse(events.map(|e| sse_event(e.name(), e.data()))))
}

/// Starts a new context (a kernel of its own).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = CreateContext,
    responses(
        (status = 201, body = ContextView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_context(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<CreateContext>,
) -> ApiResult<(StatusCode, Json<ContextView>)> {
    let view = s.service.create_context(&caller, &id, req).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// Lists the contexts.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    responses(
        (status = 200, body = Vec<ContextView>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_contexts(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
) -> ApiResult<Json<Vec<ContextView>>> {
    Ok(Json(s.service.list_contexts(&caller, &id).await?))
}

/// Stops a context's kernel and forgets it.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/contexts/{context}", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"), ("context" = String, Path, description = "Context id")),
    responses(
        (status = 204, description = "Gone"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_context(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(SandboxId, String)>,
) -> ApiResult<StatusCode> {
    s.service.delete_context(&caller, &id, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Interrupts the context's running execution; its state stays.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts/{context}/interrupt", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"), ("context" = String, Path, description = "Context id")),
    responses(
        (status = 204, description = "Interrupted (or nothing was running)"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn interrupt(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(SandboxId, String)>,
) -> ApiResult<StatusCode> {
    s.service.interrupt_context(&caller, &id, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replaces the context's kernel with a fresh one (clean state).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts/{context}/restart", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"), ("context" = String, Path, description = "Context id")),
    responses(
        (status = 200, body = ContextView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn restart(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(SandboxId, String)>,
) -> ApiResult<Json<ContextView>> {
    Ok(Json(
        s.service.restart_context(&caller, &id, &context).await?,
    ))
}

/// `?names=a,b` (repeatable): the names asked for, or `None` for all.
fn names_param(raw: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    let mut names: Option<Vec<String>> = None;
    for (k, v) in query_pairs(raw)? {
        if k != "names" {
            return Err(ApiError::invalid(format!(
                "unknown query parameter '{k}' (names)"
            )));
        }
        add_names(names.get_or_insert_with(Vec::new), &v);
    }
    Ok(names)
}

/// Reads variables (all of them without `names`), as JSON where they convert exactly.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/contexts/{context}/variables", tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("context" = String, Path, description = "Context id (`python` for the default Python context)"),
        ("names" = Option<String>, Query, description = "Comma-separated names (default: all)"),
    ),
    responses(
        (status = 200, body = VariablesView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_variables(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(SandboxId, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<VariablesView>> {
    let names = names_param(raw.as_deref())?;
    Ok(Json(
        s.service
            .get_variables(&caller, &id, &context, names)
            .await?,
    ))
}

/// Sets variables from JSON values.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/contexts/{context}/variables", tag = "code",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"), ("context" = String, Path, description = "Context id")),
    request_body = SetVariables,
    responses(
        (status = 200, body = VariableNames),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_variables(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(SandboxId, String)>,
    ApiJson(req): ApiJson<SetVariables>,
) -> ApiResult<Json<VariableNames>> {
    Ok(Json(
        s.service.set_variables(&caller, &id, &context, req).await?,
    ))
}

/// Deletes variables (all of them without `names`).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/contexts/{context}/variables", tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("context" = String, Path, description = "Context id"),
        ("names" = Option<String>, Query, description = "Comma-separated names (default: all)"),
    ),
    responses(
        (status = 200, body = VariableNames),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn clear_variables(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(SandboxId, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<VariableNames>> {
    let names = names_param(raw.as_deref())?;
    Ok(Json(
        s.service
            .clear_variables(&caller, &id, &context, names)
            .await?,
    ))
}
