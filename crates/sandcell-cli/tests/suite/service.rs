//! The service's operations called directly (no HTTP), as the agent runtime and the MCP
//! tools call them: snapshot take / fork (all or nothing) / lineage / retention, and the
//! lifecycle tick's automatic-snapshot round, over a real store and real sandboxes.

use std::sync::Arc;

use sandcell_api::sandboxes::CreateSandbox;
use sandcell_api::snapshots::{AUTO_TAG, AutoSnapshot, CreateSnapshot, ForkSnapshot};
use sandcell_api::{SandboxId, Seconds};
use sandcell_engine::fleet::{Fleet, SandboxState, now_ms};
use sandcell_protocol::ExecRequest;
use sandcell_service::ledger::StoreLedger;
use sandcell_service::signed_url::UrlSigner;
use sandcell_service::{Caller, ErrorKind, Service};
use sandcell_store::Store;

use super::common::{engine, text};

struct Harness {
    service: Arc<Service>,
    _home: tempfile::TempDir,
}

/// A service over a fresh home (SQLite store, snapshots folder) with these settings.
fn service(settings: &[(&str, &str)]) -> Harness {
    let home = tempfile::tempdir().expect("home");
    let flags: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (config, _) =
        sandcell_service::config::load(home.path(), None, &[], &flags).expect("settings");
    let store = Arc::new(Store::open(&config.database).expect("store"));
    let fleet = Arc::new(Fleet::new(
        engine(),
        Arc::new(StoreLedger::new(store.clone())),
        config.fleet_limits(),
    ));
    let signer = UrlSigner::load_or_create(home.path()).expect("signing key");
    Harness {
        service: Arc::new(Service::new(fleet, store, config, signer)),
        _home: home,
    }
}

fn caller(owner: &str) -> Caller {
    Caller {
        owner: owner.into(),
        key_id: format!("key-{owner}"),
        admin: false,
        request_id: None,
    }
}

/// A sandbox id from a response.
fn sid(id: &str) -> SandboxId {
    SandboxId::parse(id).expect("a sandbox id")
}

async fn sh(s: &Service, who: &Caller, id: &str, line: &str) -> String {
    let sandbox = s.fleet.sandbox(&who.owner, id).expect("sandbox");
    text(
        &sandbox
            .exec(ExecRequest::shell(line))
            .await
            .expect("exec")
            .stdout,
    )
}

fn running(s: &Service, owner: &str) -> usize {
    s.fleet
        .list(
            owner,
            sandcell_engine::fleet::RecordQuery {
                states: vec![SandboxState::Running],
                ..Default::default()
            },
        )
        .expect("list")
        .items
        .len()
}

#[tokio::test]
async fn snapshots_are_taken_forked_with_lineage_and_kept_from_other_owners() {
    sandcell_testkit::skip_unless_root!();
    let h = service(&[]);
    let s = &h.service;
    let alice = caller("alice");
    let made = s
        .create_sandbox(&alice, CreateSandbox::default())
        .await
        .expect("create");
    sh(s, &alice, &made.id, "echo one > /workspace/note").await;

    let snap = s
        .create_snapshot(
            &alice,
            &sid(&made.id),
            CreateSnapshot {
                name: Some("first".into()),
                ..Default::default()
            },
        )
        .await
        .expect("snapshot");
    assert_eq!(
        (snap.sandbox_id.as_str(), snap.name.as_str()),
        (made.id.as_str(), "first")
    );
    sh(s, &alice, &made.id, "echo two > /workspace/note").await;

    let forks = s
        .fork_snapshot(
            &alice,
            &snap.id,
            ForkSnapshot {
                count: Some(2),
                ..Default::default()
            },
        )
        .await
        .expect("fork");
    assert_eq!(forks.sandboxes.len(), 2);
    for f in &forks.sandboxes {
        // The snapshot's moment, not the original's later state.
        assert_eq!(
            sh(s, &alice, &f.sandbox.id, "cat /workspace/note").await,
            "one\n"
        );
        assert!(f.restore.get("fidelity").is_some(), "{:?}", f.restore);
    }
    // A snapshot of a fork is the snapshot's child; the parent shows its forks.
    let child = s
        .create_snapshot(
            &alice,
            &sid(&forks.sandboxes[0].sandbox.id),
            CreateSnapshot::default(),
        )
        .await
        .expect("snapshot of a fork");
    assert_eq!(child.parent_id.as_deref(), Some(snap.id.as_str()));
    let shown = s.get_snapshot(&alice, &snap.id).expect("get");
    assert_eq!(shown.children, Some(vec![child.id.clone()]));
    assert_eq!(shown.sandboxes.as_ref().map(Vec::len), Some(2));

    // Another owner sees nothing of it.
    let bob = caller("bob");
    let e = s.get_snapshot(&bob, &snap.id).expect_err("bob's view");
    assert_eq!(e.kind, ErrorKind::NotFound);
    let e = s
        .fork_snapshot(&bob, &snap.id, ForkSnapshot::default())
        .await
        .expect_err("bob's fork");
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(
        s.list_snapshots(&bob, None)
            .expect("list")
            .snapshots
            .is_empty()
    );

    // A parent with children stays until they go.
    let e = s
        .delete_snapshot(&alice, &snap.id)
        .expect_err("has children");
    assert_eq!(e.kind, ErrorKind::HasChildren);
    s.delete_snapshot(&alice, &child.id).expect("delete child");
    s.delete_snapshot(&alice, &snap.id).expect("delete parent");

    for sb in s
        .list_sandboxes(&alice, Default::default())
        .expect("list")
        .items
    {
        s.delete_sandbox(&alice, &sid(&sb.id))
            .await
            .expect("delete");
    }
}

#[tokio::test]
async fn a_fork_is_all_or_nothing() {
    sandcell_testkit::skip_unless_root!();
    // Room for the original and two forks, not three.
    let h = service(&[("limits.max_per_owner", "3")]);
    let s = &h.service;
    let alice = caller("alice");
    let made = s
        .create_sandbox(&alice, CreateSandbox::default())
        .await
        .expect("create");
    let snap = s
        .create_snapshot(&alice, &sid(&made.id), CreateSnapshot::default())
        .await
        .expect("snapshot");
    let e = s
        .fork_snapshot(
            &alice,
            &snap.id,
            ForkSnapshot {
                count: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect_err("over the cap");
    assert_eq!(e.kind, ErrorKind::LimitExceeded, "{e}");
    // The two it made before the cap are gone again.
    assert_eq!(running(s, "alice"), 1);
    let ok = s
        .fork_snapshot(
            &alice,
            &snap.id,
            ForkSnapshot {
                count: Some(2),
                ..Default::default()
            },
        )
        .await
        .expect("two fit");
    assert_eq!(ok.sandboxes.len(), 2);
    for sb in s
        .list_sandboxes(&alice, Default::default())
        .expect("list")
        .items
    {
        s.delete_sandbox(&alice, &sid(&sb.id))
            .await
            .expect("delete");
    }
}

#[tokio::test]
async fn the_tick_takes_interval_snapshots_keeps_the_newest_and_snapshots_before_reclaim() {
    sandcell_testkit::skip_unless_root!();
    let h = service(&[]);
    let s = &h.service;
    let alice = caller("alice");
    let made = s
        .create_sandbox(
            &alice,
            CreateSandbox {
                idle_timeout_secs: Some(Seconds::new(3600).unwrap()),
                auto_snapshot: Some(AutoSnapshot {
                    interval_secs: Some(Seconds::new(60).unwrap()),
                    before_reclaim: true,
                    keep: Some(2),
                }),
                ..Default::default()
            },
        )
        .await
        .expect("create");
    let interval = |s: &Service| {
        s.list_snapshots(&alice, Some(&sid(&made.id)))
            .expect("list")
            .snapshots
            .into_iter()
            .filter(|r| r.tags.get(AUTO_TAG).is_some_and(|v| v == "interval"))
            .count()
    };

    // Due at once (never taken), then not again within the interval, then again after it.
    let t0 = now_ms();
    s.tick(t0).await;
    assert_eq!(interval(s), 1);
    s.tick(t0 + 30_000).await;
    assert_eq!(interval(s), 1);
    s.tick(t0 + 61_000).await;
    s.tick(t0 + 122_000).await;
    // Three taken, the oldest pruned to `keep`.
    assert_eq!(interval(s), 2);

    // Past its idle timeout: a snapshot before it is reclaimed, then it is stopped.
    let later = now_ms() + 3_601_000;
    let tick = s.tick(later).await;
    assert!(
        tick.stopped.iter().any(|(id, _)| *id == made.id),
        "{tick:?}"
    );
    let before = s
        .list_snapshots(&alice, Some(&sid(&made.id)))
        .expect("list")
        .snapshots
        .into_iter()
        .filter(|r| r.tags.get(AUTO_TAG).is_some_and(|v| v == "before-reclaim"))
        .count();
    assert_eq!(before, 1);
    assert_eq!(
        s.get_sandbox(&alice, &sid(&made.id)).expect("record").state,
        "stopped"
    );
}
