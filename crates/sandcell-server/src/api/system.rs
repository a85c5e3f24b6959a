//! `GET /v1/system` and `GET /metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use sandcell_engine::fleet::SandboxState;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// The service.
#[derive(Debug, Serialize, ToSchema)]
pub struct SystemInfo {
    /// Sandcell's version.
    pub version: String,
    /// Seconds since the service started.
    pub uptime_secs: u64,
    /// Sandboxes running now (all owners).
    pub running: u64,
    /// The backends and what each offers on this host.
    #[schema(value_type = Vec<Object>)]
    pub backends: Vec<sandcell_engine::BackendCapabilities>,
    /// The caller's identity.
    pub caller: CallerInfo,
}

/// Who is asking.
#[derive(Debug, Serialize, ToSchema)]
pub struct CallerInfo {
    /// The key's owner.
    pub owner: String,
    /// The key's id.
    pub key_id: String,
    /// Whether it is an admin key.
    pub admin: bool,
}

/// Version, backends and their capabilities.
#[utoipa::path(
    get, path = "/v1/system", tag = "system",
    responses(
        (status = 200, body = SystemInfo),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn system(State(s): State<AppState>, caller: Caller) -> ApiResult<Json<SystemInfo>> {
    Ok(Json(SystemInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_secs: s.started.elapsed().as_secs(),
        running: s.fleet.running() as u64,
        backends: s.fleet.engine().capabilities(),
        caller: CallerInfo {
            owner: caller.owner,
            key_id: caller.key_id,
            admin: caller.admin,
        },
    }))
}

/// Prometheus metrics (text exposition format).
pub async fn metrics(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
) -> ApiResult<impl IntoResponse> {
    // The figures count every owner's sandboxes: a key is required unless the operator
    // opened the route for a scraper that cannot send one.
    if !s.config.metrics.public {
        caller?;
    }
    let mut states = Vec::new();
    for state in [
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Stopped,
        SandboxState::Failed,
        SandboxState::Lost,
    ] {
        let n = s
            .store
            .count_sandboxes(None, &[state.as_str()])
            .unwrap_or(0);
        states.push((state.as_str(), n));
    }
    let pools = s.fleet.pool_ready_counts();
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(&states, &pools),
    ))
}
