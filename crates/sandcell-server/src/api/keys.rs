//! `/v1/keys`: API keys. A key acts for its owner; an admin key may also manage other owners'
//! keys. Another owner's key is reported as missing, never as forbidden.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_api::keys::{CreateKey, KeyInfo, KeyList, NewKey};
use sandcell_store::ApiKeyRecord;

use super::extract::{ApiJson, ApiPath, query_pairs};
use super::types::rfc3339;
use crate::auth::{Caller, check_owner, new_key};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

fn key_info(k: &ApiKeyRecord) -> KeyInfo {
    KeyInfo {
        id: k.id.clone(),
        owner: k.owner.clone(),
        name: k.name.clone(),
        prefix: k.prefix.clone(),
        admin: k.admin,
        created_at: rfc3339(k.created_at),
        last_used_at: k.last_used_at.map(rfc3339),
        revoked_at: k.revoked_at.map(rfc3339),
    }
}

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
    let name = req.name.trim();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "'name' must be 1 to 100 characters without control characters",
        ));
    }
    let owner = req.owner.unwrap_or_else(|| caller.owner.clone());
    check_owner(&owner)?;
    if (owner != caller.owner || req.admin) && !caller.admin {
        return Err(ApiError::forbidden(
            "only an admin key can create keys for another owner or admin keys",
        ));
    }
    let (record, secret) = new_key(&owner, name, req.admin)?;
    s.store.insert_key(&record)?;
    crate::audit(
        &s,
        &caller,
        "key.create",
        Some(&record.id),
        serde_json::json!({"owner": owner, "admin": req.admin}),
    );
    Ok((
        StatusCode::CREATED,
        Json(NewKey {
            key: secret,
            info: key_info(&record),
        }),
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
            "owner" => {
                check_owner(&v)?;
                owner = Some(v);
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (this route takes: owner)"
                )));
            }
        }
    }
    let scope = if caller.admin {
        owner
    } else {
        Some(caller.owner.clone())
    };
    let keys = s.store.list_keys(scope.as_deref())?;
    Ok(Json(KeyList {
        keys: keys.iter().map(key_info).collect(),
    }))
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
    if key_id.is_empty() || key_id.len() > 64 || !key_id.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ApiError::invalid(format!("'{key_id}' is not a key id")));
    }
    let visible = s
        .store
        .get_key(&key_id)?
        .filter(|k| caller.admin || k.owner == caller.owner);
    if visible.is_none() {
        return Err(ApiError::not_found("key", &key_id));
    }
    s.store
        .revoke_key(&key_id, sandcell_engine::fleet::now_ms())?;
    s.keys.clear();
    crate::audit(
        &s,
        &caller,
        "key.revoke",
        Some(&key_id),
        serde_json::Value::Null,
    );
    Ok(StatusCode::NO_CONTENT)
}
