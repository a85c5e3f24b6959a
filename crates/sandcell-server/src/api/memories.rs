//! `/v1/sandboxes/{id}/memories` (a sandbox's memories) and `/v1/memories` (the caller's
//! own): add, list, search (full-text, or hybrid with embeddings), show, delete; and
//! `…/memories/infer`: facts extracted from a text by the configured model, as background
//! jobs (start, list, show).

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::SandboxId;
use sandcell_api::memories::{
    AddMemory, Category, InferJob, InferJobList, InferMemories, ListInferJobs, ListMemories,
    Memory, MemoryList, MemoryQuery, SearchMemories,
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

/// An infer job listing's query: `limit`, `cursor`.
fn jobs_query(raw: Option<&str>) -> Result<ListInferJobs, ApiError> {
    let mut req = ListInferJobs::default();
    for (k, v) in query_pairs(raw)? {
        match k.as_str() {
            "limit" => req.limit = Some(parse_limit(&v)?),
            "cursor" => req.cursor = Some(v),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (this route takes: limit, cursor)"
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
    let made = s
        .service
        .add_memory(&caller, Scope::Sandbox(&id), req)
        .await?;
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

/// Searches a sandbox's memories for `q`, most relevant first: by its words (bm25: the
/// memories matching more of them, and rarer ones, first), fused with embedding similarity
/// when the daemon has an embedding model (`ranking: hybrid`; each result's `matched_by`
/// says how it was found). When the embeddings endpoint fails the answer is the full-text
/// ranking with `ranking: fts` and a `warning`. Search syntax in `q` is not syntax.
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
    Ok(Json(
        s.service
            .search_memories(&caller, Scope::Sandbox(&id), req)
            .await?,
    ))
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
    let made = s.service.add_memory(&caller, Scope::Owner, req).await?;
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
    Ok(Json(
        s.service
            .search_memories(&caller, Scope::Owner, req)
            .await?,
    ))
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

/// Starts extracting facts from a text with the configured model (`memory.infer_model`,
/// else `agent.model`), each added as a memory of the sandbox (with the request's category
/// and metadata, plus `source: infer`). Answers at once with the job, `queued`; follow it
/// with `GET …/memories/infer/{job_id}`. No model configured: a 400 at once.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/memories/infer", tag = "memories",
    params(("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$")),
    request_body = InferMemories,
    responses(
        (status = 202, description = "Accepted: the job runs in the background", body = InferJob),
        (status = 400, description = "Bad input, or no model to infer with", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn infer_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    ApiJson(req): ApiJson<InferMemories>,
) -> ApiResult<(StatusCode, Json<InferJob>)> {
    let job = s
        .service
        .infer_memories(&caller, Scope::Sandbox(&id), req)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(job)))
}

/// A sandbox's infer jobs, newest first, a page at a time.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/memories/infer", tag = "memories",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)"),
        ("cursor" = Option<String>, Query, description = "The previous page's next_cursor"),
    ),
    responses(
        (status = 200, body = InferJobList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_infer_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<SandboxId>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<InferJobList>> {
    let req = jobs_query(query.as_deref())?;
    Ok(Json(s.service.list_infer_jobs(
        &caller,
        Scope::Sandbox(&id),
        req,
    )?))
}

/// One of a sandbox's infer jobs: `queued`, `running`, `succeeded` (with the ids of the
/// memories it added) or `failed` (with why; `interrupted: …` when the daemon stopped while
/// it ran).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/memories/infer/{job_id}", tag = "memories",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("job_id" = String, Path, description = "Infer job id"),
    ),
    responses(
        (status = 200, body = InferJob),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_infer_sandbox(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, job_id)): ApiPath<(SandboxId, String)>,
) -> ApiResult<Json<InferJob>> {
    Ok(Json(s.service.get_infer_job(
        &caller,
        Scope::Sandbox(&id),
        &job_id,
    )?))
}

/// Starts extracting facts from a text with the configured model, each added as one of the
/// caller's own memories (see the sandbox route).
#[utoipa::path(
    post, path = "/v1/memories/infer", tag = "memories",
    request_body = InferMemories,
    responses(
        (status = 202, description = "Accepted: the job runs in the background", body = InferJob),
        (status = 400, description = "Bad input, or no model to infer with", body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn infer(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<InferMemories>,
) -> ApiResult<(StatusCode, Json<InferJob>)> {
    let job = s.service.infer_memories(&caller, Scope::Owner, req).await?;
    Ok((StatusCode::ACCEPTED, Json(job)))
}

/// The caller's own infer jobs (not its sandboxes'), newest first, a page at a time.
#[utoipa::path(
    get, path = "/v1/memories/infer", tag = "memories",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)"),
        ("cursor" = Option<String>, Query, description = "The previous page's next_cursor"),
    ),
    responses(
        (status = 200, body = InferJobList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_infer(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<InferJobList>> {
    let req = jobs_query(query.as_deref())?;
    Ok(Json(s.service.list_infer_jobs(
        &caller,
        Scope::Owner,
        req,
    )?))
}

/// Any of the caller's infer jobs by id, its own or a sandbox's (`sandbox_id` says).
#[utoipa::path(
    get, path = "/v1/memories/infer/{job_id}", tag = "memories",
    params(("job_id" = String, Path, description = "Infer job id")),
    responses(
        (status = 200, body = InferJob),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_infer(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(job_id): ApiPath<String>,
) -> ApiResult<Json<InferJob>> {
    Ok(Json(s.service.get_infer_job(
        &caller,
        Scope::Owner,
        &job_id,
    )?))
}
