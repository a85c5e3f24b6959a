//! `/v1/sandboxes`: create, get, list, delete, set the timeout.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_engine::fleet::{RecordQuery, SandboxState};

use super::extract::{ApiJson, ApiPath, check_sandbox_id, query_pairs};
use super::types::{
    CreateSandbox, SandboxInfo, SandboxList, SetTimeout, create_options, secs_to_ms,
};
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
    // Checked before anything is made.
    let auto = req
        .auto_snapshot
        .as_ref()
        .map(|a| a.record(&caller.owner, ""))
        .transpose()?;
    let (status, Json(info)) = if let Some(snapshot_id) = &req.snapshot_id {
        restore(&s, &caller, snapshot_id, &req).await?
    } else {
        create_new(&s, &caller, req).await?
    };
    if let Some(mut auto) = auto {
        auto.sandbox_id = info.id.clone();
        // Recorded before the sandbox is handed out; unrecorded, it is not kept.
        if let Err(e) = s.store.set_auto_snapshot(&auto) {
            let _ = s.fleet.delete(&caller.owner, &info.id).await;
            return Err(e.into());
        }
    }
    Ok((status, Json(info)))
}

/// `POST /v1/sandboxes` without a snapshot.
async fn create_new(
    s: &AppState,
    caller: &Caller,
    req: CreateSandbox,
) -> ApiResult<(StatusCode, Json<SandboxInfo>)> {
    let opts = create_options(
        req.spec()?,
        req.labels,
        req.metadata,
        req.idle_timeout_secs,
        req.timeout_secs,
        req.ephemeral,
    )?;
    let start = Instant::now();
    let created = s.fleet.create(&caller.owner, opts).await;
    match &created {
        Ok(r) => {
            s.metrics.creates_ok.fetch_add(1, Ordering::Relaxed);
            if r.from_pool {
                s.metrics.pool_hits.fetch_add(1, Ordering::Relaxed);
            } else {
                s.metrics.pool_misses.fetch_add(1, Ordering::Relaxed);
            }
            s.metrics.create_latency.observe(start.elapsed());
        }
        Err(_) => {
            s.metrics.creates_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    let record = created?.record;
    crate::audit(
        s,
        caller,
        "sandbox.create",
        Some(&record.id),
        serde_json::Value::Null,
    );
    Ok((StatusCode::CREATED, Json(SandboxInfo::from(&record))))
}

/// One sandbox.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
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
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxInfo>> {
    check_sandbox_id(&id)?;
    let record = s.fleet.get(&caller.owner, &id)?;
    Ok(Json(SandboxInfo::from(&record)))
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
    let mut query = RecordQuery::default();
    let mut all_states = false;
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "state" => {
                for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if name == "all" {
                        all_states = true;
                        continue;
                    }
                    let state = SandboxState::parse(name).ok_or_else(|| {
                        ApiError::invalid(format!(
                            "state '{name}' is not one of creating, running, paused, stopped, failed, lost, all"
                        ))
                    })?;
                    query.states.push(state);
                }
            }
            "label" => insert_pair(&mut query.labels, "label", &v)?,
            "metadata" => insert_pair(&mut query.metadata, "metadata", &v)?,
            "limit" => {
                let n: u32 = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid(format!("limit '{v}' must be a number from 1 to 1000"))
                    })?;
                query.limit = n;
            }
            "cursor" => query.cursor = Some(v),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (state, label, metadata, limit, cursor)"
                )));
            }
        }
    }
    if query.states.is_empty() && !all_states {
        query.states = SandboxState::ACTIVE.to_vec();
    }
    let page = s.fleet.list(&caller.owner, query)?;
    Ok(Json(SandboxList {
        items: page.items.iter().map(SandboxInfo::from).collect(),
        next_cursor: page.next_cursor,
    }))
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
    params(("id" = String, Path, description = "Sandbox id")),
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
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    check_sandbox_id(&id)?;
    s.fleet.delete(&caller.owner, &id).await?;
    crate::audit(
        &s,
        &caller,
        "sandbox.delete",
        Some(&id),
        serde_json::Value::Null,
    );
    Ok(StatusCode::NO_CONTENT)
}

/// Sets how long from now the sandbox may live.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
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
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<SetTimeout>,
) -> ApiResult<Json<SandboxInfo>> {
    check_sandbox_id(&id)?;
    let ms = secs_to_ms("timeout_secs", req.timeout_secs)?;
    let record = s.fleet.set_timeout(&caller.owner, &id, ms)?;
    Ok(Json(SandboxInfo::from(&record)))
}

/// `POST /v1/sandboxes` with `snapshot_id`: the snapshot's settings and files in a new
/// sandbox; what the request may add is its own labels, metadata, timeouts, ephemerality.
async fn restore(
    s: &AppState,
    caller: &Caller,
    snapshot_id: &str,
    req: &CreateSandbox,
) -> ApiResult<(StatusCode, Json<SandboxInfo>)> {
    if req.template.is_some()
        || req.size.is_some()
        || req.limits.is_some()
        || !req.env.is_empty()
        || req.network.is_some()
        || !req.kernels.is_empty()
        || req.backend.is_some()
        || req.checkpointable
    {
        return Err(ApiError::invalid(
            "a sandbox restored from a snapshot takes the snapshot's backend, template, size, \
             limits, env, network and kernels: give only labels, metadata, timeouts or ephemeral with \
             'snapshot_id'",
        ));
    }
    let opts = create_options(
        Default::default(),
        req.labels.clone(),
        req.metadata.clone(),
        req.idle_timeout_secs,
        req.timeout_secs,
        req.ephemeral,
    )?;
    let made = super::snapshots::restore_one(s, caller, snapshot_id, &opts).await?;
    crate::audit(
        s,
        caller,
        "sandbox.restore",
        Some(&made.sandbox.id),
        serde_json::json!({"snapshot": snapshot_id, "restore": made.restore}),
    );
    let mut info = made.sandbox;
    info.restore = Some(serde_json::to_value(&made.restore).unwrap_or_default());
    Ok((StatusCode::CREATED, Json(info)))
}

/// Pauses the sandbox: every process in it freezes (no CPU; memory, processes and kernel
/// state kept) and its idle and lifetime clocks stop. Anything asked of it later (exec,
/// code, files…) resumes it first; so does `POST …/resume`.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
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
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxInfo>> {
    check_sandbox_id(&id)?;
    let record = s.fleet.pause(&caller.owner, &id).await?;
    crate::audit(
        &s,
        &caller,
        "sandbox.pause",
        Some(&id),
        serde_json::Value::Null,
    );
    Ok(Json(SandboxInfo::from(&record)))
}

/// Resumes a paused sandbox where it stopped; its lifetime is extended by the time it spent
/// paused.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
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
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxInfo>> {
    check_sandbox_id(&id)?;
    let record = s.fleet.resume(&caller.owner, &id)?;
    crate::audit(
        &s,
        &caller,
        "sandbox.resume",
        Some(&id),
        serde_json::Value::Null,
    );
    Ok(Json(SandboxInfo::from(&record)))
}
