//! Opening, reopening (a daemon restart) and the connection settings.

use std::sync::{Arc, Barrier};

use sandcell_store::{
    AuditEvent, Durability, ExportKind, ExportRecord, LATEST_SCHEMA_VERSION, Store, StoreError,
};

use super::{db_path, file_store, key, sandbox};

#[test]
fn open_creates_directories_uses_wal_and_migrates() {
    let (_dir, path) = db_path();
    assert!(!path.parent().unwrap().exists());
    let store = Store::open(&path).unwrap();
    assert!(path.exists());
    assert_eq!(store.schema_version().unwrap(), LATEST_SCHEMA_VERSION);

    // WAL is a property of the file, so another connection sees it; the -wal file exists while
    // the store is open.
    let raw = rusqlite::Connection::open(&path).unwrap();
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    assert!(std::path::Path::new(&wal).exists());
}

#[test]
fn reopen_keeps_every_kind_of_record() {
    let (_dir, path, store) = file_store();
    store.insert_sandbox(&sandbox("sb-1", "alice", 10)).unwrap();
    store.transition("sb-1", "running", None, 11).unwrap();
    store
        .insert_key(&key("k1", "alice", "secret-one", 5))
        .unwrap();
    let export = ExportRecord {
        id: "ex-1".into(),
        owner: "alice".into(),
        sandbox_id: "sb-1".into(),
        path: "/workspace/out.csv".into(),
        kind: ExportKind::File,
        created_at: 12,
        size: Some(42),
        sha256: Some("ab".repeat(32)),
        stored_path: Some("/var/lib/sandcell/exports/ex-1".into()),
    };
    store.insert_export(&export).unwrap();
    let audit = AuditEvent {
        id: 0,
        at: 13,
        owner: Some("alice".into()),
        key_id: Some("k1".into()),
        action: "sandbox.create".into(),
        target: Some("sb-1".into()),
        detail: None,
        request_id: Some("req-1".into()),
    };
    let audit_id = store.audit(&audit).unwrap();
    let before = store.get_sandbox("sb-1").unwrap().unwrap();
    drop(store);

    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), LATEST_SCHEMA_VERSION);
    assert_eq!(store.get_sandbox("sb-1").unwrap(), Some(before));
    assert_eq!(store.get_sandbox("sb-1").unwrap().unwrap().state, "running");
    assert_eq!(store.events("sb-1").unwrap().len(), 2);
    assert_eq!(store.key_by_secret("secret-one").unwrap().unwrap().id, "k1");
    assert_eq!(store.get_export("ex-1").unwrap(), Some(export));
    assert_eq!(
        store.list_audit(None, 0).unwrap(),
        vec![AuditEvent {
            id: audit_id,
            ..audit
        }]
    );
}

#[test]
fn open_with_full_durability_works_on_an_existing_file() {
    let (_dir, path, store) = file_store();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    drop(store);
    let store = Store::open_with(&path, Durability::PowerLoss).unwrap();
    assert!(store.get_sandbox("sb-1").unwrap().is_some());
    store.insert_sandbox(&sandbox("sb-2", "alice", 2)).unwrap();
    assert_eq!(store.count_sandboxes(None, &[]).unwrap(), 2);
}

#[test]
fn in_memory_store_is_migrated_and_private() {
    let a = Store::open_in_memory().unwrap();
    let b = Store::open_in_memory().unwrap();
    assert_eq!(a.schema_version().unwrap(), LATEST_SCHEMA_VERSION);
    a.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    assert!(a.get_sandbox("sb-1").unwrap().is_some());
    assert!(b.get_sandbox("sb-1").unwrap().is_none());
}

#[test]
fn a_database_from_a_newer_build_is_refused() {
    let (_dir, path, store) = file_store();
    drop(store);
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.pragma_update(None, "user_version", 99).unwrap();
    drop(raw);
    match Store::open(&path) {
        Err(StoreError::Migration(message)) => {
            assert!(message.contains("99"), "{message}");
            assert!(message.contains("newer"), "{message}");
        }
        other => panic!("expected a migration error, got {other:?}"),
    }
}

#[test]
fn an_uncreatable_directory_fails_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // The parent "directory" is a file, so it cannot be created.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"x").unwrap();
    match Store::open(&blocker.join("sandcell.db")) {
        Err(e @ StoreError::CreateDir { .. }) => {
            assert!(e.to_string().contains("blocker"), "{e}");
        }
        other => panic!("expected CreateDir, got {other:?}"),
    }
}

#[test]
fn many_stores_opening_one_fresh_file_at_once_all_succeed() {
    let (_dir, path) = db_path();
    let threads = 6;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let path = path.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let store = Store::open(&path)?;
                store.insert_sandbox(&sandbox(&format!("sb-{i}"), "alice", i as i64))?;
                store.schema_version()
            })
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap().unwrap(), LATEST_SCHEMA_VERSION);
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.count_sandboxes(None, &[]).unwrap(), threads as u64);
}

#[test]
fn losing_a_migration_race_to_another_process_is_not_an_error() {
    let (_dir, path) = db_path();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // The "other process": holds the write lock on a fresh WAL file, schema version 0.
    let other = rusqlite::Connection::open(&path).unwrap();
    other.pragma_update(None, "journal_mode", "WAL").unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();

    // This store reads version 0, then waits for the lock to migrate.
    let opener = {
        let path = path.clone();
        std::thread::spawn(move || Store::open(&path).and_then(|s| s.schema_version()))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Meanwhile the other process migrates (a stand-in schema is enough: the store's first
    // step now collides with it).
    other
        .execute_batch(&format!(
            "CREATE TABLE sandboxes (x); PRAGMA user_version = {LATEST_SCHEMA_VERSION}; COMMIT;"
        ))
        .unwrap();

    assert_eq!(opener.join().unwrap().unwrap(), LATEST_SCHEMA_VERSION);
}

#[test]
fn deferred_checkpoints_leave_the_log_to_grow_until_the_owner_checkpoints() {
    let (_dir, _path, store) = file_store();
    store.defer_checkpoints().unwrap();
    // Well past SQLite's 1000-page mark: nothing is copied back by the commits themselves.
    let note = "x".repeat(8000);
    for i in 0..600 {
        store
            .insert_sandbox(&sandbox(&format!("sb-{i}"), &note, i))
            .unwrap();
    }
    let (log, copied) = store.checkpoint().unwrap();
    assert!(log > 1000, "the log kept every page: {log}");
    assert_eq!(copied, log, "a checkpoint with no reader copies it all");
    // Every record is there, read from the database.
    assert!(store.get_sandbox("sb-599").unwrap().is_some());
}
