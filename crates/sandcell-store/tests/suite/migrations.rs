//! The schema migrations, both ways.

use sandcell_store::{LATEST_SCHEMA_VERSION, Store, migrations};

use super::{db_path, sandbox, tables};

/// The user tables expected at each schema version.
fn expected_tables(version: usize) -> Vec<&'static str> {
    let mut all = Vec::new();
    if version >= 1 {
        all.extend(["sandbox_events", "sandboxes"]);
    }
    if version >= 2 {
        all.push("api_keys");
    }
    if version >= 3 {
        all.push("exports");
    }
    if version >= 4 {
        all.push("audit_events");
    }
    if version >= 5 {
        all.push("contexts");
    }
    if version >= 6 {
        all.extend(["sandbox_origins", "snapshots"]);
    }
    if version >= 7 {
        all.push("auto_snapshots");
    }
    if version >= 8 {
        all.extend(["run_events", "runs"]);
    }
    if version >= 9 {
        // The full-text index and the shadow tables FTS5 keeps it in.
        all.extend([
            "memories",
            "memories_fts",
            "memories_fts_config",
            "memories_fts_data",
            "memories_fts_docsize",
            "memories_fts_idx",
        ]);
    }
    if version >= 10 {
        all.push("threads");
    }
    if version >= 11 {
        all.extend(["memory_jobs", "memory_vectors"]);
    }
    if version >= 13 {
        all.push("public_ports");
    }
    all.sort_unstable();
    all
}

#[test]
fn migrations_definitions_are_valid() {
    migrations().validate().unwrap();
    assert_eq!(LATEST_SCHEMA_VERSION, 13);
}

#[test]
fn a_version_4_database_gains_contexts_and_keeps_its_records() {
    let (_dir, path) = db_path();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        migrations().to_version(&mut conn, 4).unwrap();
        conn.execute(
            "INSERT INTO sandboxes (id, owner, state, spec, labels, metadata, created_at, \
             updated_at, last_active_at, ephemeral, runtime) VALUES \
             ('sb-old', 'alice', 'running', '{}', '{}', '{}', 1, 1, 1, 0, '{}')",
            [],
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert!(store.get_sandbox("sb-old").unwrap().is_some());
    assert!(store.list_contexts("sb-old").unwrap().is_empty());
}

#[test]
fn up_to_latest_down_to_zero_and_up_again() {
    let (_dir, path) = db_path();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    let m = migrations();
    assert!(tables(&conn).is_empty());

    m.to_latest(&mut conn).unwrap();
    assert_eq!(tables(&conn), expected_tables(LATEST_SCHEMA_VERSION));
    assert_eq!(usize::from(m.current_version(&conn).unwrap()), 13);

    m.to_version(&mut conn, 0).unwrap();
    assert!(tables(&conn).is_empty(), "left: {:?}", tables(&conn));
    assert_eq!(usize::from(m.current_version(&conn).unwrap()), 0);

    m.to_latest(&mut conn).unwrap();
    assert_eq!(tables(&conn), expected_tables(LATEST_SCHEMA_VERSION));
    drop(conn);

    // The re-created schema is the one the store works with.
    let store = Store::open(&path).unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    assert_eq!(store.events("sb-1").unwrap().len(), 1);
}

#[test]
fn every_step_goes_down_and_up_alone() {
    let mut conn = rusqlite::Connection::open_in_memory().unwrap();
    let m = migrations();
    for version in 1..=LATEST_SCHEMA_VERSION {
        m.to_version(&mut conn, version).unwrap();
        assert_eq!(tables(&conn), expected_tables(version), "up to {version}");
    }
    for version in (0..LATEST_SCHEMA_VERSION).rev() {
        m.to_version(&mut conn, version).unwrap();
        assert_eq!(tables(&conn), expected_tables(version), "down to {version}");
    }
}

#[test]
fn indexes_exist_after_migrating() {
    let mut conn = rusqlite::Connection::open_in_memory().unwrap();
    migrations().to_latest(&mut conn).unwrap();
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
        .unwrap();
    let names: Vec<String> = stmt
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for expected in [
        "sandboxes_by_created",
        "sandboxes_by_owner",
        "sandboxes_by_state",
        "sandbox_events_by_sandbox",
        "api_keys_by_owner",
        "exports_by_owner",
        "exports_by_sandbox",
        "audit_events_by_owner",
        "memories_by_scope",
        "memories_by_sandbox",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "missing {expected} in {names:?}"
        );
    }
}
