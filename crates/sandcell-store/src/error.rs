//! The store's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory meant to hold the database file could not be created.
    #[error("cannot create the store directory {path}: {source}")]
    CreateDir {
        /// The directory that could not be created.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// SQLite refused an operation (I/O error, lock held past the busy timeout, bad SQL, ...).
    #[error("metadata database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database file would not switch to write-ahead logging (e.g. a file system without
    /// shared memory support), which the store's crash safety relies on.
    #[error(
        "the metadata database stays in journal mode {mode:?}: write-ahead logging (wal) is required"
    )]
    WalUnavailable {
        /// The journal mode SQLite reported instead of `wal`.
        mode: String,
    },
    /// Bringing the schema to this build's version failed.
    #[error("metadata schema migration failed: {0}")]
    Migration(String),
    /// The record asked for does not exist.
    #[error("{what} {id:?} not found")]
    NotFound {
        /// The kind of record ("sandbox", "api key", ...).
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// A record with the same id (or unique key) exists already.
    #[error("{what} {id:?} already exists")]
    AlreadyExists {
        /// The kind of record ("sandbox", "api key", ...).
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// A stored value does not decode (a JSON column that does not parse, a negative size).
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    /// An event out of its run's order: its number is not one more than the last one's.
    #[error("event {seq} of run {run_id:?} does not follow event {last}")]
    OutOfSequence {
        /// The run.
        run_id: String,
        /// The number the event carried.
        seq: u64,
        /// The run's last event number (0: none yet).
        last: u64,
    },
    /// A page cursor that this store did not hand out.
    #[error("invalid page cursor {0:?}")]
    InvalidCursor(String),
}

impl From<rusqlite_migration::Error> for StoreError {
    fn from(e: rusqlite_migration::Error) -> Self {
        match e {
            // The library's message quotes the whole step; its first line names it well enough.
            rusqlite_migration::Error::RusqliteError { query, err } => {
                StoreError::Migration(format!(
                    "{err} (running: {})",
                    query.trim().lines().next().unwrap_or_default()
                ))
            }
            other => StoreError::Migration(other.to_string()),
        }
    }
}

/// Whether `e` is a PRIMARY KEY or UNIQUE violation, which inserts report as
/// [`StoreError::AlreadyExists`].
pub(crate) fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_extended_error_code(),
        Some(rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY | rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
    )
}
