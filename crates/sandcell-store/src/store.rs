//! Opening the database: pragmas, migrations, and the shared helpers of the record modules.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, TransactionBehavior};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::StoreError;
use crate::schema::migrations;

/// How long a statement waits for another connection's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How hard a commit is pushed to disk before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=NORMAL`: a commit is in the write-ahead log (the OS page cache) when it
    /// returns, so it survives the daemon's crash or `kill -9`; the log is fsynced at
    /// checkpoints, so an OS crash or power loss may roll back the last commits (never corrupt
    /// the file). After a power loss every sandbox process is gone anyway and the daemon's
    /// restart reconciliation is to mark them lost, so this is the default.
    #[default]
    Process,
    /// `synchronous=FULL`: every commit is fsynced before it returns, so it also survives an OS
    /// crash or power loss, at the price of one fsync per write.
    PowerLoss,
}

impl Durability {
    fn pragma_value(self) -> &'static str {
        match self {
            Durability::Process => "NORMAL",
            Durability::PowerLoss => "FULL",
        }
    }
}

/// The daemon's metadata store: one SQLite connection, shared by the daemon's threads.
///
/// Several `Store`s (or processes) may open the same file; SQLite's locking and the
/// [`BUSY_TIMEOUT`] serialize their writes.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
}

impl Store {
    /// Opens (creating it and its parent directories if needed) the database at `path` with
    /// [`Durability::Process`] and migrates it to the latest schema.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Self::open_with(path, Durability::default())
    }

    /// Opens the database at `path` with the given durability and migrates it.
    pub fn open_with(path: &Path, durability: Durability) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let conn = Connection::open(path)?;
        // First, so that every later step (the WAL switch, migrations) waits out another
        // connection's lock instead of failing at once.
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode = enable_wal(&conn)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::WalUnavailable { mode });
        }
        conn.pragma_update(None, "synchronous", durability.pragma_value())?;
        Self::finish_open(conn)
    }

    /// Opens a private in-memory database (for tests; it has no WAL and dies with the `Store`).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Self::finish_open(Connection::open_in_memory()?)
    }

    fn finish_open(mut conn: Connection) -> Result<Store, StoreError> {
        conn.pragma_update(None, "foreign_keys", true)?;
        // Read-then-write transactions must take the write lock at BEGIN: a deferred one that
        // read a snapshot another connection has since changed gets SQLITE_BUSY at its first
        // write without the busy timeout being consulted.
        conn.set_transaction_behavior(TransactionBehavior::Immediate);
        migrate(&mut conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    /// Stops SQLite from checkpointing the write-ahead log inside a commit (every ~1000
    /// pages, with an fsync: a 15–40 ms pause of whichever write reaches the mark, measured in
    /// `sandcell bench agent`); the owner calls [`Store::checkpoint`] on its own schedule
    /// instead. Commits stay as durable: they are in the log either way.
    pub fn defer_checkpoints(&self) -> Result<(), StoreError> {
        self.conn().pragma_update(None, "wal_autocheckpoint", 0)?;
        Ok(())
    }

    /// Copies the write-ahead log into the database as far as readers allow (`PASSIVE`: it
    /// waits for no one), so the log does not grow without bound; returns the log's pages
    /// and how many were copied.
    pub fn checkpoint(&self) -> Result<(i64, i64), StoreError> {
        Ok(self
            .conn()
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                Ok((row.get(1)?, row.get(2)?))
            })?)
    }

    /// The database's schema version (`user_version`); [`crate::LATEST_SCHEMA_VERSION`] after
    /// a successful open.
    pub fn schema_version(&self) -> Result<usize, StoreError> {
        let conn = self.conn();
        Ok(migrations().current_version(&conn)?.into())
    }

    /// The connection. A panic while it was held leaves nothing half-done (an open transaction
    /// rolls back when dropped during unwinding), so a poisoned lock is still usable.
    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Switches the file to WAL and returns the journal mode SQLite reports. On a fresh file the
/// switch needs an exclusive lock, and SQLite reports another connection's lock at once rather
/// than consulting the busy timeout (the pragma holds a read lock by then), so a daemon and a
/// CLI opening a new file together retry here, for up to [`BUSY_TIMEOUT`]. Every later open
/// finds the file in WAL mode already (the mode is stored in the file).
fn enable_wal(conn: &Connection) -> Result<String, StoreError> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            other => return Ok(other?),
        }
    }
}

/// Migrates to the latest version. Two processes opening a fresh file at once can both read
/// the old `user_version` before either migrates; the loser's migration then fails (a table
/// exists already) and rolls back, so it reads the version again before giving up.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let migrations = migrations();
    let mut attempts = 0;
    loop {
        let pending = migrations.pending_migrations(conn)?;
        if pending < 0 {
            return Err(StoreError::Migration(format!(
                "the database is at schema version {}, newer than this build's {}",
                i64::from(pending).unsigned_abs() + crate::LATEST_SCHEMA_VERSION as u64,
                crate::LATEST_SCHEMA_VERSION
            )));
        }
        if pending == 0 {
            return Ok(());
        }
        match migrations.to_latest(conn) {
            Ok(()) => return Ok(()),
            Err(e) => {
                attempts += 1;
                if attempts >= 3 {
                    return Err(e.into());
                }
            }
        }
    }
}

/// A JSON object of strings as stored text.
pub(crate) fn string_map_json(map: &BTreeMap<String, String>) -> String {
    Value::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
    .to_string()
}

/// Decodes a JSON column of record `id`.
pub(crate) fn parse_json<T: DeserializeOwned>(
    table: &str,
    id: &str,
    column: &str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!(
            "{table} {id:?}: column {column} does not decode: {e}"
        ))
    })
}

/// A `u64` as an SQLite integer; values past `i64::MAX` are refused rather than wrapped.
pub(crate) fn u64_to_sql(value: Option<u64>) -> Result<Option<i64>, StoreError> {
    value
        .map(|v| {
            i64::try_from(v)
                .map_err(|e| StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(e.into())))
        })
        .transpose()
}

/// An SQLite integer back as a `u64`; a negative one is corrupt.
pub(crate) fn u64_from_sql(
    table: &str,
    id: &str,
    column: &str,
    value: Option<i64>,
) -> Result<Option<u64>, StoreError> {
    value
        .map(|v| {
            u64::try_from(v).map_err(|_| {
                StoreError::Corrupt(format!("{table} {id:?}: column {column} is negative ({v})"))
            })
        })
        .transpose()
}

/// A count from SQL (never negative).
pub(crate) fn count_from_sql(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The page size a `limit` asks for.
pub fn page_size(limit: u32) -> u32 {
    match limit {
        0 => crate::DEFAULT_PAGE_SIZE,
        n => n.min(crate::MAX_PAGE_SIZE),
    }
}

/// The `WHERE` clause (with its leading space, or empty) and values of a listing filtered
/// by owner and/or sandbox; four shapes at most, so the statement cache serves them all.
pub(crate) fn owner_and_sandbox(
    owner: Option<&str>,
    sandbox_id: Option<&str>,
) -> (String, Vec<rusqlite::types::Value>) {
    let mut conditions = Vec::new();
    let mut values = Vec::new();
    if let Some(owner) = owner {
        conditions.push("owner = ?");
        values.push(rusqlite::types::Value::Text(owner.to_owned()));
    }
    if let Some(sandbox_id) = sandbox_id {
        conditions.push("sandbox_id = ?");
        values.push(rusqlite::types::Value::Text(sandbox_id.to_owned()));
    }
    let clause = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    (clause, values)
}
