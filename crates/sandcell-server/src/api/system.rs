//! `GET /v1/system` and `GET /metrics` (the reports are the service's).

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use sandcell_api::system::SystemInfo;

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
    Ok(Json(s.service.system_info(&caller)?))
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
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.service.metrics_text(),
    ))
}
