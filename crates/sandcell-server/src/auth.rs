//! API keys: `X-API-Key: <key>` or `Authorization: Bearer <key>` on every `/v1` request.
//! A key belongs to an owner; every sandbox, export and key is scoped to its owner, and
//! another owner's resources are reported as missing (404), never as forbidden.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use sandcell_store::{ApiKeyRecord, Store};

use crate::error::ApiError;
use crate::state::AppState;

/// How long a looked-up key is trusted before the store is asked again (bounds how long a
/// revoked key keeps working).
const KEY_CACHE_TTL: Duration = Duration::from_secs(2);
/// How often a key's `last_used_at` is written (not on every request).
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Whose resources it may see.
    pub owner: String,
    /// The key it used.
    pub key_id: String,
    /// May manage keys.
    pub admin: bool,
    /// The request's id (for the audit log).
    pub request_id: Option<String>,
}

/// Looks keys up, with a short cache.
#[derive(Debug, Default)]
pub struct KeyCache {
    entries: Mutex<HashMap<String, (Caller, Instant)>>,
    touched: Mutex<HashMap<String, Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KeyCache {
    /// The caller behind `secret`, or `None` for an unknown or revoked key.
    pub fn authenticate(&self, store: &Store, secret: &str) -> Result<Option<Caller>, ApiError> {
        let hash = sandcell_store::hash_secret(secret);
        if let Some((caller, at)) = lock(&self.entries).get(&hash)
            && at.elapsed() < KEY_CACHE_TTL
        {
            return Ok(Some(caller.clone()));
        }
        let Some(record) = store
            .key_by_secret(secret)?
            .filter(|k| k.revoked_at.is_none())
        else {
            lock(&self.entries).remove(&hash);
            return Ok(None);
        };
        let caller = Caller {
            owner: record.owner.clone(),
            key_id: record.id.clone(),
            admin: record.admin,
            request_id: None,
        };
        lock(&self.entries).insert(hash, (caller.clone(), Instant::now()));
        let due = lock(&self.touched)
            .get(&record.id)
            .is_none_or(|t| t.elapsed() >= TOUCH_EVERY);
        if due {
            lock(&self.touched).insert(record.id.clone(), Instant::now());
            let _ = store.touch_key(&record.id, sandcell_engine::fleet::now_ms());
        }
        Ok(Some(caller))
    }

    /// Forgets every cached key (after a revocation through this service).
    pub fn clear(&self) {
        lock(&self.entries).clear();
    }
}

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

/// A new key for `owner`: the record to store and the secret to show once.
pub fn new_key(owner: &str, name: &str, admin: bool) -> Result<(ApiKeyRecord, String), ApiError> {
    let id = hex(&random_bytes(6)?);
    let secret = format!("sc_{id}_{}", hex(&random_bytes(24)?));
    let record = ApiKeyRecord {
        id: id.clone(),
        owner: owner.to_string(),
        name: name.to_string(),
        hash: sandcell_store::hash_secret(&secret),
        prefix: format!("sc_{id}_"),
        admin,
        created_at: sandcell_engine::fleet::now_ms(),
        last_used_at: None,
        revoked_at: None,
    };
    Ok((record, secret))
}

/// Checks an owner name: 1 to 64 of letters, digits, `-`, `_`, `.`, `@`.
pub fn check_owner(owner: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&owner.len())
        && owner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "owner '{owner}' must be 1 to 64 letters, digits, '-', '_', '.' or '@'"
        )))
    }
}

/// `n` bytes from the kernel's random source.
pub(crate) fn random_bytes(n: usize) -> Result<Vec<u8>, ApiError> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| ApiError::internal(format!("read /dev/urandom: {e}")))?;
    Ok(buf)
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_only_their_hash_is_kept() {
        let (a, sa) = new_key("alice", "laptop", false).unwrap();
        let (b, sb) = new_key("alice", "laptop", false).unwrap();
        assert_ne!(sa, sb);
        assert_ne!(a.id, b.id);
        assert!(sa.starts_with(&a.prefix) && sa.len() > 50, "{sa}");
        assert!(!a.hash.contains(&sa[a.prefix.len()..]));
        assert_eq!(a.hash, sandcell_store::hash_secret(&sa));
    }

    #[test]
    fn owner_names_are_checked() {
        assert!(check_owner("alice@example.com").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_owner(bad).is_err(), "{bad}");
        }
    }
}
