//! `GET /v1/system` and `GET /metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use sandcell_api::system::{BackendInfo, CallerInfo, SystemInfo};
use sandcell_engine::fleet::SandboxState;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

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
        backends: s
            .fleet
            .engine()
            .capabilities()
            .into_iter()
            .map(|c| BackendInfo {
                kind: c.kind.as_str().to_string(),
                available: c.available,
                isolation_level: c.isolation_level.as_str().to_string(),
                supports_pause: c.supports_pause,
                checkpoint_fidelity: c.checkpoint_fidelity.as_str().to_string(),
                host: c.host,
            })
            .collect(),
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
