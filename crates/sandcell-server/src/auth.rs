//! API keys: `X-API-Key: <key>` or `Authorization: Bearer <key>` on every `/v1` request.
//! A key belongs to an owner; every sandbox, export and key is scoped to its owner, and
//! another owner's resources are reported as missing (404), never as forbidden.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::state::AppState;

pub use sandcell_service::caller::Caller;

/// The key in a request's headers, if any.
pub fn presented_key(parts: &Parts) -> Option<String> {
    let headers = &parts.headers;
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim().to_string());
    }
    if let Some(auth) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        let (scheme, token) = auth.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_string());
    }
    // Browsers cannot set headers on a WebSocket: for an upgrade only, `?api_key=` will do.
    let upgrade = headers
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    let query = parts.uri.query()?;
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == "api_key")
        .map(|(_, v)| v)
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone());
        }
        let Some(secret) = presented_key(parts) else {
            return Err(ApiError::unauthenticated(
                "an API key is required: send it as 'X-API-Key: <key>' or 'Authorization: Bearer <key>'",
            ));
        };
        match state.keys.authenticate(&state.store, &secret)? {
            Some(mut caller) => {
                caller.request_id = parts
                    .extensions
                    .get::<crate::RequestId>()
                    .map(|r| r.0.clone());
                parts.extensions.insert(caller.clone());
                Ok(caller)
            }
            None => Err(ApiError::unauthenticated(
                "the API key is unknown or revoked",
            )),
        }
    }
}
