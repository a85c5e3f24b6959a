//! API keys.

use std::fmt::Write as _;

use rusqlite::{OptionalExtension, Row, params};
use sha2::{Digest, Sha256};

use crate::error::{StoreError, is_unique_violation};
use crate::records::ApiKeyRecord;
use crate::store::{Store, count_from_sql};

const WHAT: &str = "api key";

const COLUMNS: &str = "id, owner, name, hash, prefix, admin, created_at, last_used_at, revoked_at";

/// The SHA-256 of an API key secret, lowercase hex: what the store keeps instead of the
/// secret. A plain (unsalted, fast) hash is enough because secrets are long random strings,
/// not passwords, and it lets a key be found by its hash in one indexed lookup.
pub fn hash_secret(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: row.get(0)?,
        owner: row.get(1)?,
        name: row.get(2)?,
        hash: row.get(3)?,
        prefix: row.get(4)?,
        admin: row.get(5)?,
        created_at: row.get(6)?,
        last_used_at: row.get(7)?,
        revoked_at: row.get(8)?,
    })
}

impl Store {
    /// Inserts a new key. A key with the same id, or the same secret hash, is
    /// [`StoreError::AlreadyExists`].
    pub fn insert_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        let inserted = self
            .conn()
            .prepare_cached(&format!(
                "INSERT INTO api_keys ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))?
            .execute(params![
                key.id,
                key.owner,
                key.name,
                key.hash,
                key.prefix,
                key.admin,
                key.created_at,
                key.last_used_at,
                key.revoked_at,
            ]);
        match inserted {
            Err(e) if is_unique_violation(&e) => {
                // Say which constraint: a colliding hash means one secret was issued twice, and
                // the secret is then named by its public prefix.
                Err(if e.to_string().contains("api_keys.hash") {
                    StoreError::AlreadyExists {
                        what: "api key secret",
                        id: key.prefix.clone(),
                    }
                } else {
                    StoreError::AlreadyExists {
                        what: WHAT,
                        id: key.id.clone(),
                    }
                })
            }
            other => other.map(drop).map_err(StoreError::from),
        }
    }

    /// The unrevoked key whose secret is `secret`, if any.
    pub fn key_by_secret(&self, secret: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        Ok(self
            .conn()
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM api_keys WHERE hash = ?1 AND revoked_at IS NULL"
            ))?
            .query_row([hash_secret(secret)], from_row)
            .optional()?)
    }

    /// The key with this id (revoked or not), if any.
    pub fn get_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        Ok(self
            .conn()
            .prepare_cached(&format!("SELECT {COLUMNS} FROM api_keys WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?)
    }

    /// `owner`'s keys (or everyone's), revoked ones included (see `revoked_at`), oldest first.
    pub fn list_keys(&self, owner: Option<&str>) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let conn = self.conn();
        let keys = match owner {
            Some(owner) => conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM api_keys WHERE owner = ?1 ORDER BY created_at, id"
                ))?
                .query_map([owner], from_row)?
                .collect::<Result<_, _>>()?,
            None => conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM api_keys ORDER BY created_at, id"
                ))?
                .query_map([], from_row)?
                .collect::<Result<_, _>>()?,
        };
        Ok(keys)
    }

    /// Revokes a key at `at_ms`. Returns whether the key exists; revoking it again keeps the
    /// first revocation time.
    pub fn revoke_key(&self, id: &str, at_ms: i64) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?2) WHERE id = ?1",
            )?
            .execute(params![id, at_ms])?;
        Ok(changed > 0)
    }

    /// Records that a key was used at `at_ms` (never moving `last_used_at` backwards).
    pub fn touch_key(&self, id: &str, at_ms: i64) -> Result<(), StoreError> {
        let changed = self
            .conn()
            .prepare_cached("UPDATE api_keys SET last_used_at = MAX(COALESCE(last_used_at, ?2), ?2) WHERE id = ?1")?
            .execute(params![id, at_ms])?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                what: WHAT,
                id: id.to_owned(),
            });
        }
        Ok(())
    }

    /// How many keys exist, revoked ones included (zero means the daemon has never issued one).
    pub fn count_keys(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn()
            .prepare_cached("SELECT COUNT(*) FROM api_keys")?
            .query_row([], |row| row.get(0))?;
        Ok(count_from_sql(n))
    }
}
