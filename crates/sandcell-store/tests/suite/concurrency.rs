//! Several handles on one file, used at once (the busy timeout serializes their writes).

use std::sync::{Arc, Barrier};

use sandcell_store::{Store, StoreError};

use super::{file_store, sandbox};

#[test]
fn two_handles_writing_from_two_threads_lose_nothing() {
    let (_dir, path, first) = file_store();
    let second = Store::open(&path).unwrap();
    let per_thread = 150;
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = [("a", first), ("b", second)]
        .into_iter()
        .map(|(name, store)| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || -> Result<(), StoreError> {
                barrier.wait();
                for i in 0..per_thread {
                    let id = format!("{name}-{i}");
                    store.insert_sandbox(&sandbox(&id, name, i))?;
                    store.transition(&id, "running", None, i + 1)?;
                    store.touch(&id, i + 2)?;
                }
                Ok(())
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap().unwrap();
    }

    let store = Store::open(&path).unwrap();
    assert_eq!(store.count_sandboxes(Some("a"), &["running"]).unwrap(), 150);
    assert_eq!(store.count_sandboxes(Some("b"), &["running"]).unwrap(), 150);
    for name in ["a", "b"] {
        for i in 0..per_thread {
            let id = format!("{name}-{i}");
            assert_eq!(store.events(&id).unwrap().len(), 2, "{id}");
            assert_eq!(
                store.get_sandbox(&id).unwrap().unwrap().last_active_at,
                i + 2
            );
        }
    }
}

#[test]
fn concurrent_transitions_of_one_sandbox_form_an_unbroken_chain() {
    let (_dir, path, first) = file_store();
    first.insert_sandbox(&sandbox("sb-1", "alice", 0)).unwrap();
    let second = Store::open(&path).unwrap();
    let first = Arc::new(first);
    let rounds = 100;
    let barrier = Arc::new(Barrier::new(3));
    // Two threads on one handle and one on another: both the mutex and SQLite's lock are
    // exercised.
    let handles: Vec<_> = [
        ("x", Arc::clone(&first)),
        ("y", Arc::clone(&first)),
        ("z", Arc::new(second)),
    ]
    .into_iter()
    .map(|(name, store)| {
        let barrier = Arc::clone(&barrier);
        std::thread::spawn(move || -> Result<(), StoreError> {
            barrier.wait();
            for i in 0..rounds {
                store.transition("sb-1", &format!("{name}{i}"), None, i)?;
            }
            Ok(())
        })
    })
    .collect();
    for handle in handles {
        handle.join().unwrap().unwrap();
    }

    let events = first.events("sb-1").unwrap();
    assert_eq!(events.len(), 1 + 3 * rounds as usize);
    // Each event starts where the one before ended: no transition read a stale state.
    for pair in events.windows(2) {
        assert_eq!(pair[1].from_state, pair[0].to_state, "{pair:?}");
    }
    assert_eq!(
        first.get_sandbox("sb-1").unwrap().unwrap().state,
        events.last().unwrap().to_state
    );
}
