//! Sandbox records, transitions and their history.

use sandcell_store::{SandboxEvent, SandboxRecord, Store, StoreError};
use serde_json::json;

use super::{file_store, map, sandbox};

/// A record with every optional field set.
fn full_record() -> SandboxRecord {
    SandboxRecord {
        reason: Some("warming up".into()),
        labels: map(&[("team", "ml"), ("a.b \"c\" d", "x")]),
        metadata: map(&[("run", "42")]),
        idle_timeout_ms: Some(u64::try_from(i64::MAX).expect("fits")),
        expires_at: Some(9_000),
        ephemeral: true,
        runtime: json!({"host_pid": 1234, "cgroup": {"v2": "/sys/fs/cgroup/sandcell/sb"}}),
        ..sandbox("sb-full", "alice", 1_000)
    }
}

#[test]
fn insert_and_get_round_trip_every_field_and_record_a_first_event() {
    let store = Store::open_in_memory().unwrap();
    let record = full_record();
    store.insert_sandbox(&record).unwrap();
    assert_eq!(store.get_sandbox("sb-full").unwrap(), Some(record));
    assert_eq!(store.get_sandbox("nope").unwrap(), None);
    let events = store.events("sb-full").unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].from_state, "");
    assert_eq!(events[0].to_state, "creating");
    assert_eq!(events[0].at, 1_000);
    assert_eq!(events[0].reason.as_deref(), Some("warming up"));
}

#[test]
fn duplicate_insert_is_already_exists_and_changes_nothing() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    let mut other = sandbox("sb-1", "bob", 2);
    other.state = "running".into();
    match store.insert_sandbox(&other) {
        Err(StoreError::AlreadyExists { what, id }) => {
            assert_eq!(what, "sandbox");
            assert_eq!(id, "sb-1");
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(store.get_sandbox("sb-1").unwrap().unwrap().owner, "alice");
    // The failed insert's event was rolled back with it.
    assert_eq!(store.events("sb-1").unwrap().len(), 1);
}

#[test]
fn transitions_are_recorded_in_order_and_survive_reopen() {
    let (_dir, path, store) = file_store();
    store
        .insert_sandbox(&sandbox("sb-1", "alice", 100))
        .unwrap();
    let steps = [
        ("running", None, 110),
        ("paused", None, 120),
        ("running", None, 130),
        ("failed", Some("oom"), 140),
    ];
    for (to, reason, at) in steps {
        let record = store.transition("sb-1", to, reason, at).unwrap();
        assert_eq!(record.state, to);
        assert_eq!(record.reason.as_deref(), reason);
        assert_eq!(record.updated_at, at);
    }
    let expected: Vec<(String, String, Option<String>, i64)> = [
        ("", "creating", None, 100),
        ("creating", "running", None, 110),
        ("running", "paused", None, 120),
        ("paused", "running", None, 130),
        ("running", "failed", Some("oom"), 140),
    ]
    .iter()
    .map(|(f, t, r, at)| ((*f).into(), (*t).into(), r.map(String::from), *at))
    .collect();
    let summary = |events: &[SandboxEvent]| -> Vec<(String, String, Option<String>, i64)> {
        events
            .iter()
            .map(|e| {
                (
                    e.from_state.clone(),
                    e.to_state.clone(),
                    e.reason.clone(),
                    e.at,
                )
            })
            .collect()
    };
    let events = store.events("sb-1").unwrap();
    assert_eq!(summary(&events), expected);
    assert!(events.windows(2).all(|w| w[0].id < w[1].id));
    assert!(events.iter().all(|e| e.sandbox_id == "sb-1"));
    drop(store);

    let store = Store::open(&path).unwrap();
    assert_eq!(store.events("sb-1").unwrap(), events);
    let record = store.get_sandbox("sb-1").unwrap().unwrap();
    assert_eq!(record.state, "failed");
    assert_eq!(record.reason.as_deref(), Some("oom"));
    assert_eq!(record.updated_at, 140);
}

#[test]
fn a_transition_without_reason_clears_the_previous_one() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    store
        .transition("sb-1", "lost", Some("host pid gone"), 2)
        .unwrap();
    let record = store.transition("sb-1", "destroyed", None, 3).unwrap();
    assert_eq!(record.reason, None);
    assert_eq!(store.get_sandbox("sb-1").unwrap().unwrap().reason, None);
}

#[test]
fn transition_of_a_missing_sandbox_is_not_found_and_records_nothing() {
    let store = Store::open_in_memory().unwrap();
    match store.transition("ghost", "running", None, 1) {
        Err(StoreError::NotFound { what, id }) => {
            assert_eq!(what, "sandbox");
            assert_eq!(id, "ghost");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(store.events("ghost").unwrap().is_empty());
}

#[test]
fn update_replaces_mutable_fields_only() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    store.transition("sb-1", "running", None, 2).unwrap();
    let mut changed = full_record();
    changed.id = "sb-1".into();
    changed.owner = "mallory".into();
    changed.state = "destroyed".into();
    changed.created_at = 999;
    changed.updated_at = 50;
    changed.last_active_at = 60;
    store.update_sandbox(&changed).unwrap();

    let got = store.get_sandbox("sb-1").unwrap().unwrap();
    assert_eq!(got.spec, changed.spec);
    assert_eq!(got.labels, changed.labels);
    assert_eq!(got.metadata, changed.metadata);
    assert_eq!(got.runtime, changed.runtime);
    assert_eq!(got.idle_timeout_ms, changed.idle_timeout_ms);
    assert_eq!(got.expires_at, Some(9_000));
    assert!(got.ephemeral);
    assert_eq!((got.updated_at, got.last_active_at), (50, 60));
    // Identity and state are not the update's to change.
    assert_eq!(got.owner, "alice");
    assert_eq!(got.created_at, 1);
    assert_eq!(got.state, "running");
    assert_eq!(got.reason, None);
    assert_eq!(store.events("sb-1").unwrap().len(), 2);

    let missing = sandbox("ghost", "alice", 1);
    assert!(matches!(
        store.update_sandbox(&missing),
        Err(StoreError::NotFound {
            what: "sandbox",
            ..
        })
    ));
}

#[test]
fn touch_moves_last_active_forward_only() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 10)).unwrap();
    store.touch("sb-1", 50).unwrap();
    assert_eq!(
        store.get_sandbox("sb-1").unwrap().unwrap().last_active_at,
        50
    );
    store.touch("sb-1", 40).unwrap();
    let record = store.get_sandbox("sb-1").unwrap().unwrap();
    assert_eq!(record.last_active_at, 50);
    assert_eq!(record.updated_at, 10, "activity is not a record change");
    assert!(matches!(
        store.touch("ghost", 1),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn set_runtime_replaces_the_backend_data() {
    let (_dir, path, store) = file_store();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    let runtime = json!({"host_pid": 77, "agent_socket": "/run/sandcell/sb-1.sock"});
    store.set_runtime("sb-1", &runtime).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.get_sandbox("sb-1").unwrap().unwrap().runtime, runtime);
    assert!(matches!(
        store.set_runtime("ghost", &runtime),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn deleting_a_sandbox_keeps_its_events() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    store.transition("sb-1", "running", None, 2).unwrap();
    store.transition("sb-1", "destroyed", None, 3).unwrap();
    let events = store.events("sb-1").unwrap();
    assert_eq!(events.len(), 3);

    assert!(store.delete_sandbox("sb-1").unwrap());
    assert_eq!(store.get_sandbox("sb-1").unwrap(), None);
    assert_eq!(store.events("sb-1").unwrap(), events);
    assert!(!store.delete_sandbox("sb-1").unwrap());
    assert_eq!(store.count_sandboxes(None, &[]).unwrap(), 0);
}

#[test]
fn count_filters_by_owner_and_states() {
    let store = Store::open_in_memory().unwrap();
    for (id, owner, state) in [
        ("a1", "alice", "running"),
        ("a2", "alice", "paused"),
        ("a3", "alice", "destroyed"),
        ("b1", "bob", "running"),
    ] {
        store.insert_sandbox(&sandbox(id, owner, 1)).unwrap();
        store.transition(id, state, None, 2).unwrap();
    }
    assert_eq!(store.count_sandboxes(None, &[]).unwrap(), 4);
    assert_eq!(store.count_sandboxes(Some("alice"), &[]).unwrap(), 3);
    assert_eq!(store.count_sandboxes(None, &["running"]).unwrap(), 2);
    assert_eq!(
        store
            .count_sandboxes(Some("alice"), &["running", "paused"])
            .unwrap(),
        2
    );
    assert_eq!(store.count_sandboxes(Some("carol"), &[]).unwrap(), 0);
    assert_eq!(store.count_sandboxes(None, &["creating"]).unwrap(), 0);
}

#[test]
fn a_json_column_of_the_wrong_shape_is_reported_corrupt() {
    let (_dir, path, store) = file_store();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    // Valid JSON (the CHECK lets it through) that is not an object of strings.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE sandboxes SET labels = '[1, 2]' WHERE id = 'sb-1'",
        [],
    )
    .unwrap();
    match store.get_sandbox("sb-1") {
        Err(e @ StoreError::Corrupt(_)) => {
            let message = e.to_string();
            assert!(
                message.contains("sb-1") && message.contains("labels"),
                "{message}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // And invalid JSON never gets in.
    assert!(
        raw.execute("UPDATE sandboxes SET spec = '{' WHERE id = 'sb-1'", [])
            .is_err()
    );
}

#[test]
fn public_ports_are_kept_until_changed_or_their_sandbox_is_deleted() {
    let (_dir, path, store) = file_store();
    store.insert_sandbox(&sandbox("sb-a", "alice", 1)).unwrap();
    store.insert_sandbox(&sandbox("sb-b", "bob", 2)).unwrap();
    store.set_public_port("sb-a", 3000, Some("alice")).unwrap();
    store.set_public_port("sb-a", 8080, Some("alice")).unwrap();
    store.set_public_port("sb-b", 3000, Some("bob")).unwrap();
    // Made public twice: one row.
    store.set_public_port("sb-b", 3000, Some("bob")).unwrap();
    store.set_public_port("sb-a", 8080, None).unwrap();
    drop(store);
    // Kept across a reopen (a restart of the daemon).
    let store = Store::open(&path).unwrap();
    assert_eq!(
        store.public_ports().unwrap(),
        vec![
            ("sb-a".to_string(), 3000, "alice".to_string()),
            ("sb-b".to_string(), 3000, "bob".to_string()),
        ]
    );
    assert!(store.delete_sandbox("sb-a").unwrap());
    assert_eq!(
        store.public_ports().unwrap(),
        vec![("sb-b".to_string(), 3000, "bob".to_string())]
    );
}
