//! Context records: made, ended one by one or with their sandbox, kept after it.

use sandcell_store::{ContextRecord, Store};

use super::sandbox;

fn context(sandbox_id: &str, id: &str, created_at: i64) -> ContextRecord {
    ContextRecord {
        sandbox_id: sandbox_id.to_owned(),
        id: id.to_owned(),
        owner: "alice".into(),
        language: "python".into(),
        cwd: None,
        created_at,
        ended_at: None,
        end_reason: None,
    }
}

#[test]
fn contexts_end_one_by_one_or_with_their_sandbox() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&sandbox("sb-1", "alice", 1)).unwrap();
    store.insert_context(&context("sb-1", "python", 2)).unwrap();
    let with_cwd = ContextRecord {
        cwd: Some("/tmp".into()),
        language: "node".into(),
        ..context("sb-1", "c-1", 3)
    };
    store.insert_context(&with_cwd).unwrap();
    store.insert_context(&context("sb-2", "python", 4)).unwrap();

    assert!(store.end_context("sb-1", "c-1", 10, "deleted").unwrap());
    assert!(!store.end_context("sb-1", "c-1", 11, "again").unwrap());
    assert!(!store.end_context("sb-1", "nope", 11, "x").unwrap());
    // The default context seen again while open: nothing changes.
    assert!(
        !store
            .insert_context_if_absent(&context("sb-1", "python", 50))
            .unwrap()
    );

    // The sandbox stops: its open contexts end in the same transaction, the others stay.
    store
        .transition("sb-1", "stopped", Some("deleted"), 20)
        .unwrap();
    let list = store.list_contexts("sb-1").unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(
        (
            list[0].id.as_str(),
            list[0].ended_at,
            list[0].end_reason.as_deref()
        ),
        ("python", Some(20), Some("the sandbox is stopped"))
    );
    assert_eq!(
        (
            list[1].clone().cwd,
            list[1].ended_at,
            list[1].end_reason.as_deref()
        ),
        (Some("/tmp".into()), Some(10), Some("deleted"))
    );
    assert_eq!(store.list_contexts("sb-2").unwrap()[0].ended_at, None);

    // An ended id made again is a new, open record.
    assert!(
        store
            .insert_context_if_absent(&context("sb-1", "python", 30))
            .unwrap()
    );
    let again = &store.list_contexts("sb-1").unwrap()[1];
    assert_eq!((again.created_at, again.ended_at), (30, None));

    // A forgotten sandbox's contexts stay, ended.
    store.insert_sandbox(&sandbox("sb-3", "alice", 1)).unwrap();
    store.insert_context(&context("sb-3", "python", 2)).unwrap();
    assert!(store.delete_sandbox("sb-3").unwrap());
    let kept = &store.list_contexts("sb-3").unwrap()[0];
    assert_eq!(kept.end_reason.as_deref(), Some("the sandbox was deleted"));
    assert!(kept.ended_at.is_some());
}
