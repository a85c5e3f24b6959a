//! Who is asking: the caller every operation is scoped to, and how a key becomes one.
//! A key belongs to an owner; every sandbox, export and key is scoped to its owner, and
//! another owner's resources are reported as missing, never as forbidden.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandcell_store::{ApiKeyRecord, Store};

use crate::error::ServiceError;

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
    pub fn authenticate(
        &self,
        store: &Store,
        secret: &str,
    ) -> Result<Option<Caller>, ServiceError> {
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

/// A new key for `owner`: the record to store and the secret to show once.
pub fn new_key(
    owner: &str,
    name: &str,
    admin: bool,
) -> Result<(ApiKeyRecord, String), ServiceError> {
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

/// `n` bytes from the kernel's random source.
pub fn random_bytes(n: usize) -> Result<Vec<u8>, ServiceError> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| ServiceError::internal(format!("read /dev/urandom: {e}")))?;
    Ok(buf)
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new id of a service-made record: `prefix` and 16 random hex digits (`ex-…`, `sn-…`).
pub fn new_record_id(prefix: &str) -> Result<String, ServiceError> {
    Ok(format!("{prefix}-{}", hex(&random_bytes(8)?)))
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
}
