//! Export records.

use sandcell_store::{ExportKind, ExportRecord, Store, StoreError};

use super::sandbox;

fn export(id: &str, owner: &str, sandbox_id: &str, created_at: i64) -> ExportRecord {
    ExportRecord {
        id: id.to_owned(),
        owner: owner.to_owned(),
        sandbox_id: sandbox_id.to_owned(),
        path: format!("/workspace/{id}"),
        kind: ExportKind::File,
        created_at,
        size: None,
        sha256: None,
        stored_path: None,
    }
}

#[test]
fn insert_get_list_delete() {
    let store = Store::open_in_memory().unwrap();
    let full = ExportRecord {
        kind: ExportKind::Dir,
        size: Some(u64::try_from(i64::MAX).unwrap()),
        sha256: Some("0f".repeat(32)),
        stored_path: Some("/var/lib/sandcell/exports/e1".into()),
        ..export("e1", "alice", "sb-1", 3)
    };
    store.insert_export(&full).unwrap();
    store
        .insert_export(&export("e2", "alice", "sb-2", 1))
        .unwrap();
    store
        .insert_export(&export("e3", "bob", "sb-1", 2))
        .unwrap();

    assert_eq!(store.get_export("e1").unwrap(), Some(full));
    assert_eq!(store.get_export("nope").unwrap(), None);
    let ids = |list: Vec<ExportRecord>| list.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_exports(None, None).unwrap()),
        ["e2", "e3", "e1"]
    );
    assert_eq!(
        ids(store.list_exports(Some("alice"), None).unwrap()),
        ["e2", "e1"]
    );
    assert_eq!(
        ids(store.list_exports(None, Some("sb-1")).unwrap()),
        ["e3", "e1"]
    );
    assert_eq!(
        ids(store.list_exports(Some("bob"), Some("sb-1")).unwrap()),
        ["e3"]
    );
    assert!(
        store
            .list_exports(Some("bob"), Some("sb-2"))
            .unwrap()
            .is_empty()
    );

    assert!(store.delete_export("e1").unwrap());
    assert!(!store.delete_export("e1").unwrap());
    assert_eq!(store.get_export("e1").unwrap(), None);
    assert_eq!(ids(store.list_exports(None, None).unwrap()), ["e2", "e3"]);
}

#[test]
fn duplicate_export_is_already_exists() {
    let store = Store::open_in_memory().unwrap();
    store
        .insert_export(&export("e1", "alice", "sb-1", 1))
        .unwrap();
    assert!(matches!(
        store.insert_export(&export("e1", "bob", "sb-2", 2)),
        Err(StoreError::AlreadyExists { what: "export", .. })
    ));
    assert_eq!(store.get_export("e1").unwrap().unwrap().owner, "alice");
}

#[test]
fn exports_outlive_their_sandbox() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    store
        .insert_export(&export("e1", "alice", "sb-1", 2))
        .unwrap();
    assert!(store.delete_sandbox("sb-1").unwrap());
    assert_eq!(store.list_exports(None, Some("sb-1")).unwrap().len(), 1);
}

#[test]
fn a_size_past_i64_is_refused_not_wrapped() {
    let store = Store::open_in_memory().unwrap();
    let huge = ExportRecord {
        size: Some(u64::MAX),
        ..export("e1", "alice", "sb-1", 1)
    };
    assert!(matches!(
        store.insert_export(&huge),
        Err(StoreError::Sqlite(_))
    ));
    assert_eq!(store.get_export("e1").unwrap(), None);
}
