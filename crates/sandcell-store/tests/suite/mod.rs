//! Shared helpers of the store tests (no `unwrap` here: clippy allows it in `#[test]`s only).

mod audit;
mod concurrency;
mod contexts;
mod exports;
mod keys;
mod list;
mod migrations;
mod open;
mod sandboxes;
mod snapshots;

use std::collections::BTreeMap;
use std::path::PathBuf;

use sandcell_store::{ApiKeyRecord, SandboxRecord, Store, hash_secret};
use serde_json::json;
use tempfile::TempDir;

/// A temporary directory and the database path inside it (in a subdirectory, so that `open`
/// has to create it).
pub fn db_path() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("home").join("sandcell.db");
    (dir, path)
}

/// A store on a fresh file, with the directory that holds it.
pub fn file_store() -> (TempDir, PathBuf, Store) {
    let (dir, path) = db_path();
    let store = Store::open(&path).expect("open the store");
    (dir, path, store)
}

/// A plain sandbox record in state `creating`.
pub fn sandbox(id: &str, owner: &str, created_at: i64) -> SandboxRecord {
    SandboxRecord {
        id: id.to_owned(),
        owner: owner.to_owned(),
        state: "creating".to_owned(),
        reason: None,
        spec: json!({"template": "python", "limits": {"memory": 536870912}}),
        labels: BTreeMap::new(),
        metadata: BTreeMap::new(),
        created_at,
        updated_at: created_at,
        last_active_at: created_at,
        idle_timeout_ms: None,
        expires_at: None,
        ephemeral: false,
        runtime: serde_json::Value::Null,
    }
}

/// A string map from pairs.
pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// An unrevoked key for `secret`.
pub fn key(id: &str, owner: &str, secret: &str, created_at: i64) -> ApiKeyRecord {
    ApiKeyRecord {
        id: id.to_owned(),
        owner: owner.to_owned(),
        name: format!("{id} key"),
        hash: hash_secret(secret),
        prefix: secret.chars().take(8).collect(),
        admin: false,
        created_at,
        last_used_at: None,
        revoked_at: None,
    }
}

/// Names of the user tables in a database (SQLite's own `sqlite_*` tables left out).
pub fn tables(conn: &rusqlite::Connection) -> Vec<String> {
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite_%' ORDER BY name",
        )
        .expect("prepare the table listing");
    stmt.query_map([], |row| row.get(0))
        .expect("list tables")
        .collect::<Result<_, _>>()
        .expect("read table names")
}
