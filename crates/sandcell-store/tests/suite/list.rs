//! Listing sandboxes: filters and cursor pagination.

use std::collections::HashSet;

use sandcell_store::{
    DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, SandboxQuery, SandboxRecord, Store, StoreError,
};

use super::{file_store, map, sandbox};

const ODD_KEY: &str = "team.name \"quoted\" it's";

/// All pages of `query` (`limit` per page), checking each page's size on the way.
fn all_pages(store: &Store, mut query: SandboxQuery) -> Vec<SandboxRecord> {
    let limit = query.limit as usize;
    let mut items = Vec::new();
    for _ in 0..10_000 {
        let page = store.list_sandboxes(&query).expect("list a page");
        assert!(page.items.len() <= limit, "page larger than its limit");
        items.extend(page.items);
        match page.next_cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => return items,
        }
    }
    panic!("pagination does not end");
}

fn ids(items: &[SandboxRecord]) -> Vec<&str> {
    items.iter().map(|s| s.id.as_str()).collect()
}

fn labelled_store() -> Store {
    let store = Store::open_in_memory().expect("open an in-memory store");
    let rows = [
        (
            "s1",
            "alice",
            "running",
            map(&[(ODD_KEY, "ml"), ("env", "prod")]),
            map(&[("run", "1")]),
        ),
        (
            "s2",
            "alice",
            "paused",
            map(&[(ODD_KEY, "web")]),
            map(&[("run", "2")]),
        ),
        // Keys that a JSON path spliced together from the ODD_KEY would confuse with it.
        (
            "s3",
            "alice",
            "running",
            map(&[("team", "ml"), ("team.name", "ml")]),
            map(&[]),
        ),
        (
            "s4",
            "bob",
            "running",
            map(&[(ODD_KEY, "ml")]),
            map(&[("run", "1")]),
        ),
        ("s5", "bob", "stopped", map(&[]), map(&[(ODD_KEY, "ml")])),
    ];
    for (i, (id, owner, state, labels, metadata)) in rows.into_iter().enumerate() {
        let record = SandboxRecord {
            labels,
            metadata,
            ..sandbox(id, owner, i64::try_from(i).expect("small"))
        };
        store.insert_sandbox(&record).expect("insert");
        store.transition(id, state, None, 100).expect("transition");
    }
    store
}

fn list(store: &Store, query: SandboxQuery) -> Vec<String> {
    store
        .list_sandboxes(&query)
        .expect("list")
        .items
        .into_iter()
        .map(|s| s.id)
        .collect()
}

#[test]
fn list_filters_by_owner_state_labels_and_metadata() {
    let store = labelled_store();
    assert_eq!(
        list(&store, SandboxQuery::default()),
        ["s1", "s2", "s3", "s4", "s5"]
    );
    let q = |f: fn(&mut SandboxQuery)| {
        let mut query = SandboxQuery::default();
        f(&mut query);
        query
    };
    assert_eq!(
        list(&store, q(|q| q.owner = Some("alice".into()))),
        ["s1", "s2", "s3"]
    );
    assert_eq!(
        list(&store, q(|q| q.states = vec!["running".into()])),
        ["s1", "s3", "s4"]
    );
    assert_eq!(
        list(
            &store,
            q(|q| q.states = vec!["paused".into(), "stopped".into()])
        ),
        ["s2", "s5"]
    );
    assert_eq!(
        list(&store, q(|q| q.labels = map(&[(ODD_KEY, "ml")]))),
        ["s1", "s4"]
    );
    assert_eq!(
        list(
            &store,
            q(|q| {
                q.owner = Some("alice".into());
                q.labels = map(&[(ODD_KEY, "ml"), ("env", "prod")]);
            })
        ),
        ["s1"]
    );
    // All labels must match, and exactly.
    assert!(
        list(
            &store,
            q(|q| q.labels = map(&[(ODD_KEY, "ml"), ("env", "dev")]))
        )
        .is_empty()
    );
    assert!(list(&store, q(|q| q.labels = map(&[(ODD_KEY, "m")]))).is_empty());
    assert_eq!(
        list(&store, q(|q| q.labels = map(&[("team", "ml")]))),
        ["s3"]
    );
    assert_eq!(
        list(&store, q(|q| q.metadata = map(&[("run", "1")]))),
        ["s1", "s4"]
    );
    // Labels and metadata are separate namespaces.
    assert_eq!(
        list(&store, q(|q| q.metadata = map(&[(ODD_KEY, "ml")]))),
        ["s5"]
    );
    assert_eq!(
        list(
            &store,
            q(|q| {
                q.labels = map(&[(ODD_KEY, "ml")]);
                q.metadata = map(&[("run", "1")]);
                q.states = vec!["running".into()];
                q.owner = Some("bob".into());
            })
        ),
        ["s4"]
    );
}

#[test]
fn hostile_filter_values_match_nothing() {
    let store = labelled_store();
    for key in ["x' OR 1=1 --", "$", "$.env", "\"", "env\") OR (1=1"] {
        let query = SandboxQuery {
            labels: map(&[(key, "prod")]),
            ..SandboxQuery::default()
        };
        assert!(
            list(&store, query).is_empty(),
            "key {key:?} matched something"
        );
    }
    let query = SandboxQuery {
        owner: Some("alice' OR '1'='1".into()),
        ..SandboxQuery::default()
    };
    assert!(list(&store, query).is_empty());
}

#[test]
fn pages_cover_every_row_once_in_order() {
    let (_dir, _path, store) = file_store();
    // 250 rows, three per created_at, ids not in insertion order, two owners.
    let mut expected = Vec::new();
    for i in 0..250_i64 {
        let id = format!("sb-{:03}", (i * 37) % 250);
        let owner = if i % 2 == 0 { "alice" } else { "bob" };
        store.insert_sandbox(&sandbox(&id, owner, i / 3)).unwrap();
        expected.push((i / 3, id, owner));
    }
    expected.sort();

    let items = all_pages(
        &store,
        SandboxQuery {
            limit: 40,
            ..SandboxQuery::default()
        },
    );
    let got: Vec<(i64, String)> = items.iter().map(|s| (s.created_at, s.id.clone())).collect();
    let want: Vec<(i64, String)> = expected
        .iter()
        .map(|(at, id, _)| (*at, id.clone()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(ids(&items).into_iter().collect::<HashSet<_>>().len(), 250);

    // A filtered listing paginates over the filtered rows only.
    let alice = all_pages(
        &store,
        SandboxQuery {
            owner: Some("alice".into()),
            limit: 7,
            ..SandboxQuery::default()
        },
    );
    let want_alice: Vec<&str> = expected
        .iter()
        .filter(|(_, _, owner)| *owner == "alice")
        .map(|(_, id, _)| id.as_str())
        .collect();
    assert_eq!(ids(&alice), want_alice);
}

#[test]
fn page_exactly_full_then_empty_end() {
    let store = Store::open_in_memory().unwrap();
    for i in 0..10 {
        store
            .insert_sandbox(&sandbox(&format!("sb-{i}"), "alice", 5))
            .unwrap();
    }
    let first = store
        .list_sandboxes(&SandboxQuery {
            limit: 10,
            ..SandboxQuery::default()
        })
        .unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.next_cursor, None, "no page follows a full last page");

    let first = store
        .list_sandboxes(&SandboxQuery {
            limit: 5,
            ..SandboxQuery::default()
        })
        .unwrap();
    let second = store
        .list_sandboxes(&SandboxQuery {
            limit: 5,
            cursor: first.next_cursor.clone(),
            ..SandboxQuery::default()
        })
        .unwrap();
    assert_eq!(ids(&first.items), ["sb-0", "sb-1", "sb-2", "sb-3", "sb-4"]);
    assert_eq!(ids(&second.items), ["sb-5", "sb-6", "sb-7", "sb-8", "sb-9"]);
    assert_eq!(second.next_cursor, None);
}

#[test]
fn rows_added_between_pages_are_neither_repeated_nor_skip_others() {
    let store = Store::open_in_memory().unwrap();
    for i in 0..6 {
        store
            .insert_sandbox(&sandbox(&format!("sb-{i}"), "alice", i))
            .unwrap();
    }
    let query = SandboxQuery {
        limit: 3,
        ..SandboxQuery::default()
    };
    let first = store.list_sandboxes(&query).unwrap();
    // One row before the cursor (not shown again) and one after it (shown).
    store
        .insert_sandbox(&sandbox("sb-early", "alice", 0))
        .unwrap();
    store
        .insert_sandbox(&sandbox("sb-late", "alice", 100))
        .unwrap();
    let rest = all_pages(
        &store,
        SandboxQuery {
            cursor: first.next_cursor,
            ..query
        },
    );
    assert_eq!(ids(&first.items), ["sb-0", "sb-1", "sb-2"]);
    assert_eq!(ids(&rest), ["sb-3", "sb-4", "sb-5", "sb-late"]);
}

#[test]
fn limit_defaults_and_caps() {
    let store = Store::open_in_memory().unwrap();
    for i in 0..(MAX_PAGE_SIZE + 5) {
        store
            .insert_sandbox(&sandbox(&format!("sb-{i:05}"), "alice", i64::from(i)))
            .unwrap();
    }
    let default = store.list_sandboxes(&SandboxQuery::default()).unwrap();
    assert_eq!(default.items.len(), DEFAULT_PAGE_SIZE as usize);
    assert!(default.next_cursor.is_some());
    let capped = store
        .list_sandboxes(&SandboxQuery {
            limit: u32::MAX,
            ..SandboxQuery::default()
        })
        .unwrap();
    assert_eq!(capped.items.len(), MAX_PAGE_SIZE as usize);
    assert!(capped.next_cursor.is_some());
}

#[test]
fn a_foreign_cursor_is_rejected() {
    let store = labelled_store();
    for cursor in ["", "garbage", "x:sb-1"] {
        let query = SandboxQuery {
            cursor: Some(cursor.into()),
            ..SandboxQuery::default()
        };
        assert!(
            matches!(
                store.list_sandboxes(&query),
                Err(StoreError::InvalidCursor(_))
            ),
            "cursor {cursor:?} accepted"
        );
    }
}
