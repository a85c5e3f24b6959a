//! The audit log.

use sandcell_store::{AuditEvent, Store};
use serde_json::json;

fn event(at: i64, owner: Option<&str>, action: &str) -> AuditEvent {
    AuditEvent {
        id: 0,
        at,
        owner: owner.map(String::from),
        key_id: owner.map(|o| format!("key-{o}")),
        action: action.to_owned(),
        target: Some("sb-1".into()),
        detail: Some(json!({"template": "python", "n": at})),
        request_id: Some(format!("req-{at}")),
    }
}

#[test]
fn audit_assigns_increasing_ids_and_lists_newest_first() {
    let store = Store::open_in_memory().unwrap();
    let mut written = Vec::new();
    for (i, owner) in [Some("alice"), Some("bob"), None, Some("alice")]
        .into_iter()
        .enumerate()
    {
        // Clock deliberately non-monotonic: order is the log's, not the timestamps'.
        let at = 100 - i64::try_from(i).unwrap();
        let e = event(at, owner, &format!("action.{i}"));
        let id = store.audit(&e).unwrap();
        written.push(AuditEvent { id, ..e });
    }
    assert!(written.windows(2).all(|w| w[0].id < w[1].id));

    let all = store.list_audit(None, 0).unwrap();
    let mut newest_first = written.clone();
    newest_first.reverse();
    assert_eq!(all, newest_first);

    let alice = store.list_audit(Some("alice"), 0).unwrap();
    assert_eq!(
        alice.iter().map(|e| e.action.as_str()).collect::<Vec<_>>(),
        ["action.3", "action.0"]
    );
    let latest_two = store.list_audit(None, 2).unwrap();
    assert_eq!(latest_two, newest_first[..2]);
}

#[test]
fn an_event_without_optional_fields_round_trips() {
    let store = Store::open_in_memory().unwrap();
    let bare = AuditEvent {
        id: 0,
        at: 5,
        owner: None,
        key_id: None,
        action: "daemon.start".into(),
        target: None,
        detail: None,
        request_id: None,
    };
    let id = store.audit(&bare).unwrap();
    assert_eq!(
        store.list_audit(None, 10).unwrap(),
        [AuditEvent { id, ..bare }]
    );
}

#[test]
fn a_targets_events_list_by_action_prefix_in_pages() {
    let store = Store::open_in_memory().unwrap();
    let mut batch = Vec::new();
    for i in 0..5 {
        let action = if i % 2 == 0 {
            "egress.allowed"
        } else {
            "egress.denied"
        };
        batch.push(event(i, Some("alice"), action));
    }
    batch.push(event(9, Some("alice"), "sandbox.create"));
    batch.push(AuditEvent {
        target: Some("sb-2".into()),
        ..event(10, Some("alice"), "egress.denied")
    });
    store.audit_many(&batch).unwrap();
    let egress = store.list_audit_of("sb-1", "egress.", None, 0).unwrap();
    assert_eq!(
        egress.iter().map(|e| e.at).collect::<Vec<_>>(),
        [4, 3, 2, 1, 0]
    );
    let page = store.list_audit_of("sb-1", "egress.", None, 2).unwrap();
    let next = store
        .list_audit_of("sb-1", "egress.", Some(page[1].id), 2)
        .unwrap();
    assert_eq!(next.iter().map(|e| e.at).collect::<Vec<_>>(), [2, 1]);
    let denied = store
        .list_audit_of("sb-1", "egress.denied", None, 0)
        .unwrap();
    assert_eq!(denied.len(), 2);
    assert!(
        store
            .list_audit_of("sb-3", "egress.", None, 0)
            .unwrap()
            .is_empty()
    );
}
