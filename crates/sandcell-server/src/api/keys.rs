//! `/v1/keys`: API keys. A key acts for its owner; an admin key may also manage other owners'
//! keys. Another owner's key is reported as missing, never as forbidden. The rules are the
//! service's (`sandcell_service::keys`).

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::keys::{CreateKey, KeyList, NewKey};

use super::extract::{ApiJson, ApiPath, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Creates a key.
#[utoipa::path(
    post, path = "/v1/keys", tag = "keys",
    request_body = CreateKey,
    responses(
        (status = 201, body = NewKey),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "Another owner or an admin key needs an admin key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateKey>,
) -> ApiResult<(StatusCode, Json<NewKey>)> {
    Ok((
        StatusCode::CREATED,
        Json(s.service.create_key(&caller, req)?),
    ))
}

/// Lists keys: the caller's owner's, or (admin) everyone's or `owner`'s.
#[utoipa::path(
    get, path = "/v1/keys", tag = "keys",
    params(("owner" = Option<String>, Query, description = "Admin keys: only this owner's")),
    responses(
        (status = 200, body = KeyList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<KeyList>> {
    let mut owner = None;
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "owner" => owner = Some(v),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (this route takes: owner)"
                )));
            }
        }
    }
    Ok(Json(s.service.list_keys(&caller, owner.as_deref())?))
}

/// Revokes a key at once (including the caller's own).
#[utoipa::path(
    delete, path = "/v1/keys/{key_id}", tag = "keys",
    params(("key_id" = String, Path, description = "Key id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn revoke(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(key_id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    s.service.revoke_key(&caller, &key_id)?;
    Ok(StatusCode::NO_CONTENT)
}
