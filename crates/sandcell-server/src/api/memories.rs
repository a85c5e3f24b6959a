//! `/v1/sandboxes/{id}/memories` (a sandbox's memories) and `/v1/memories` (the caller's
//! own): add, list, search (ranked full-text), show, delete.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::SandboxId;
use sandcell_api::memories::{
    AddMemory, Category, ListMemories, Memory, MemoryList, MemoryQuery, SearchMemories,
};
use sandcell_service::memory::Scope;

use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// A `limit` from the query string (its range is the service's to check).
fn parse_limit(v: &str) -> Result<u32, ApiError> {
    v.parse::<u32>()
        .map_err(|_| ApiError::invalid(format!("limit '{v}' must be a whole number")))
}

/// `category` from the query string.
fn parse_category(v: String) -> Result<Category, ApiError> {
    Ok(Category::new(v)?)
}

/// A listing's query: `limit`, `cursor`, `category`.
fn list_query(raw: Option<&str>) -> Result<ListMemories, ApiError> {
    let mut req = ListMemories::default();
    for (k, v) in query_pairs(raw)? {
        match k.as_str() {
            "limit" => req.limit = Some(parse_limit(&v)?),
            "cursor" => req.cursor = Some(v),
            "category" => req.category = Some(parse_category(v)?),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (this route takes: limit, cursor, category)"
                )));
            }
        }
    }
    Ok(req)
}

/// A search's query: `q` (required), `limit`, `category`.
fn search_query(raw: Option<&str>) -> Result<SearchMemories, ApiError> {
    let (mut q, mut limit, mut category) = (None, None, None);
    for (k, v) in query_pairs(raw)? {
        match k.as_str() {
            "q" => q = Some(MemoryQuery::new(v).map_err(|e| ApiError::invalid(format!("q: {e}")))?),
            "limit" => limit = Some(parse_limit(&v)?),
            "category" => category = Some(parse_category(v)?),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (this route takes: q, limit, category)"
                )));
            }
        }
    }
    let query = q.ok_or_else(|| ApiError::invalid("q (what to search for) is required"))?;
    Ok(SearchMemories {
        query,
        limit,
        category,
    })
}

/// Remembers something in a sandbox. A sandbox made later from a snapshot of this one
/// starts with the memories it had when the snapshot was taken.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/memories", tag = "memories",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = AddMemory,
    responses(
        (status = 201, body = Memory),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 429, description = "The sandbox holds the most memories it may", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn add_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<AddMemory>,
) -> ApiResult<(StatusCode, Json<Memory>)> {
    let made = s.service.add_memory(&caller, Scope::Sandbox(&id), req)?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// A sandbox's memories, newest first, a page at a time.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/memories", tag = "memories",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)"),
        ("cursor" = Option<String>, Query, description = "The previous page's next_cursor"),
        ("category" = Option<String>, Query, description = "Only this category"),
    ),
    responses(
        (status = 200, body = MemoryList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<MemoryList>> {
    let req = list_query(query.as_deref())?;
    Ok(Json(s.service.list_memories(
        &caller,
        Scope::Sandbox(&id),
        req,
    )?))
}

/// Searches a sandbox's memories for the words of `q`, most relevant first (bm25: the
/// memories matching more of them, and rarer ones, first). Search syntax in `q` is not
/// syntax: only its words count.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/memories/search", tag = "memories",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("q" = String, Query, description = "What to look for (not blank, at most 4096 bytes)"),
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 100, default 10)"),
        ("category" = Option<String>, Query, description = "Only this category"),
    ),
    responses(
        (status = 200, body = MemoryList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn search_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<MemoryList>> {
    let req = search_query(query.as_deref())?;
    Ok(Json(s.service.search_memories(
        &caller,
        Scope::Sandbox(&id),
        req,
    )?))
}

/// Shows one of a sandbox's memories.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/memories/{memory_id}", tag = "memories",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("memory_id" = String, Path, description = "Memory id"),
    ),
    responses(
        (status = 200, body = Memory),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, memory_id)): ApiPath<(SandboxId, String)>,
) -> ApiResult<Json<Memory>> {
    Ok(Json(s.service.get_memory(
        &caller,
        Scope::Sandbox(&id),
        &memory_id,
    )?))
}

/// Forgets one of a sandbox's memories. Sandboxes made later from a snapshot taken before
/// still have it.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/memories/{memory_id}", tag = "memories",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("memory_id" = String, Path, description = "Memory id"),
    ),
    responses(
        (status = 204, description = "Forgotten"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, memory_id)): ApiPath<(SandboxId, String)>,
) -> ApiResult<StatusCode> {
    s.service
        .delete_memory(&caller, Scope::Sandbox(&id), &memory_id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remembers something as the caller's own (of no sandbox).
#[utoipa::path(
    post, path = "/v1/memories", tag = "memories",
    request_body = AddMemory,
    responses(
        (status = 201, body = Memory),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 429, description = "The caller holds the most memories it may", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn add(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<AddMemory>,
) -> ApiResult<(StatusCode, Json<Memory>)> {
    let made = s.service.add_memory(&caller, Scope::Owner, req)?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// The caller's own memories (not its sandboxes'), newest first, a page at a time.
#[utoipa::path(
    get, path = "/v1/memories", tag = "memories",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)"),
        ("cursor" = Option<String>, Query, description = "The previous page's next_cursor"),
        ("category" = Option<String>, Query, description = "Only this category"),
    ),
    responses(
        (status = 200, body = MemoryList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<MemoryList>> {
    let req = list_query(query.as_deref())?;
    Ok(Json(s.service.list_memories(&caller, Scope::Owner, req)?))
}

/// Searches the caller's own memories (not its sandboxes') for the words of `q`, most
/// relevant first.
#[utoipa::path(
    get, path = "/v1/memories/search", tag = "memories",
    params(
        ("q" = String, Query, description = "What to look for (not blank, at most 4096 bytes)"),
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 100, default 10)"),
        ("category" = Option<String>, Query, description = "Only this category"),
    ),
    responses(
        (status = 200, body = MemoryList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn search(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<MemoryList>> {
    let req = search_query(query.as_deref())?;
    Ok(Json(s.service.search_memories(
        &caller,
        Scope::Owner,
        req,
    )?))
}

/// Shows any of the caller's memories by id, its own or a sandbox's (`sandbox_id` says).
#[utoipa::path(
    get, path = "/v1/memories/{memory_id}", tag = "memories",
    params(("memory_id" = String, Path, description = "Memory id")),
    responses(
        (status = 200, body = Memory),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(memory_id): ApiPath<String>,
) -> ApiResult<Json<Memory>> {
    Ok(Json(s.service.get_memory(
        &caller,
        Scope::Owner,
        &memory_id,
    )?))
}

/// Forgets any of the caller's memories by id, its own or a sandbox's.
#[utoipa::path(
    delete, path = "/v1/memories/{memory_id}", tag = "memories",
    params(("memory_id" = String, Path, description = "Memory id")),
    responses(
        (status = 204, description = "Forgotten"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(memory_id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    s.service.delete_memory(&caller, Scope::Owner, &memory_id)?;
    Ok(StatusCode::NO_CONTENT)
}
