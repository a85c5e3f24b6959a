//! Snapshot records and their lineage.

use sandcell_store::{AutoSnapshotRecord, SnapshotRecord, Store, StoreError};

fn snapshot(
    id: &str,
    owner: &str,
    sandbox_id: &str,
    parent: Option<&str>,
    at: i64,
) -> SnapshotRecord {
    SnapshotRecord {
        id: id.into(),
        owner: owner.into(),
        sandbox_id: sandbox_id.into(),
        parent_id: parent.map(Into::into),
        name: format!("{id} name"),
        description: String::new(),
        tags: [("k".to_string(), "v".to_string())].into(),
        fidelity: "language".into(),
        created_at: at,
        size: 1234,
        manifest: serde_json::json!({"files": {"sha256": "ab"}}),
        path: format!("/var/lib/sandcell/snapshots/{id}"),
    }
}

#[test]
fn snapshots_are_kept_listed_and_traced_to_their_parents() {
    let store = Store::open_in_memory().unwrap();
    let root = snapshot("sn-1", "alice", "sb-1", None, 1);
    store.insert_snapshot(&root).unwrap();
    assert!(matches!(
        store.insert_snapshot(&root),
        Err(StoreError::AlreadyExists { .. })
    ));
    assert_eq!(store.get_snapshot("sn-1").unwrap(), Some(root.clone()));
    assert_eq!(store.get_snapshot("nope").unwrap(), None);

    // sb-2 is forked from sn-1; its snapshot is sn-1's child.
    store.set_sandbox_origin("sb-2", "sn-1").unwrap();
    assert_eq!(
        store.sandbox_origin("sb-2").unwrap().as_deref(),
        Some("sn-1")
    );
    assert_eq!(store.sandbox_origin("sb-1").unwrap(), None);
    store
        .insert_snapshot(&snapshot("sn-2", "alice", "sb-2", Some("sn-1"), 2))
        .unwrap();
    store
        .insert_snapshot(&snapshot("sn-3", "bob", "sb-9", None, 3))
        .unwrap();
    assert_eq!(store.snapshot_children("sn-1").unwrap(), ["sn-2"]);
    assert_eq!(store.sandboxes_from_snapshot("sn-1").unwrap(), ["sb-2"]);

    let ids = |v: Vec<SnapshotRecord>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_snapshots(Some("alice"), None).unwrap()),
        ["sn-1", "sn-2"]
    );
    assert_eq!(
        ids(store.list_snapshots(None, Some("sb-9")).unwrap()),
        ["sn-3"]
    );
    assert_eq!(ids(store.list_snapshots(None, None).unwrap()).len(), 3);

    assert!(store.delete_snapshot("sn-2").unwrap());
    assert!(!store.delete_snapshot("sn-2").unwrap());
    assert!(store.snapshot_children("sn-1").unwrap().is_empty());
}

#[test]
fn automatic_snapshot_settings_are_kept_per_sandbox() {
    let store = Store::open_in_memory().unwrap();
    let a = AutoSnapshotRecord {
        sandbox_id: "sb-1".into(),
        owner: "alice".into(),
        interval_ms: Some(60_000),
        before_reclaim: true,
        keep: 3,
        last_at: None,
    };
    store.set_auto_snapshot(&a).unwrap();
    assert_eq!(store.auto_snapshot("sb-1").unwrap(), Some(a.clone()));
    let later = AutoSnapshotRecord {
        last_at: Some(5),
        interval_ms: None,
        ..a
    };
    store.set_auto_snapshot(&later).unwrap();
    assert_eq!(store.auto_snapshots().unwrap(), [later]);
    assert!(store.delete_auto_snapshot("sb-1").unwrap());
    assert_eq!(store.auto_snapshot("sb-1").unwrap(), None);
}
