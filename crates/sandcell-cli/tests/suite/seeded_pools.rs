//! Warm pools seeded from a snapshot (a template's `snapshot` strategy), over real
//! sandboxes: on gVisor the first sandbox is made and warmed, then checkpointed, and the
//! others are restored from it with the warm state; on `process` (no whole-sandbox
//! checkpoint of an ordinary sandbox) each is made and warmed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandcell_engine::fleet::{
    CreateOptions, Fleet, FleetLimits, MemoryLedger, PoolPrepare, PoolSpec,
};
use sandcell_engine::{BackendKind, SandboxSpec};
use sandcell_protocol::Language;

use super::common::engine;

/// A pool of `size` on `backend` whose preparation sets `warm = 41` in Python, counting its
/// runs.
fn warm_pool(backend: BackendKind, seed: &std::path::Path, runs: Arc<AtomicUsize>) -> PoolSpec {
    let prepare = move |sandbox: sandcell_engine::Sandbox| {
        let runs = runs.clone();
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let ran = sandbox
                .run(Language::Python, "warm = 41")
                .await
                .map_err(|e| e.to_string())?;
            match ran.error {
                None => Ok(serde_json::json!({"warmed": true})),
                Some(e) => Err(e.evalue),
            }
        })
            as std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<serde_json::Value, String>> + Send>,
            >
    };
    PoolSpec {
        name: format!("seeded/{}", backend.as_str()),
        spec: SandboxSpec {
            backend,
            ..SandboxSpec::default()
        },
        size: 2,
        prepare: Some(PoolPrepare {
            key: "warm".into(),
            run: Arc::new(prepare),
        }),
        seed: Some(seed.to_path_buf()),
    }
}

async fn warm_value(fleet: &Fleet, id: &str) -> String {
    let sandbox = fleet.sandbox("alice", id).expect("sandbox");
    let ran = sandbox
        .run(Language::Python, "warm + 1")
        .await
        .expect("run");
    ran.result()
        .and_then(|r| r.get("text/plain"))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

fn keyed(backend: BackendKind) -> CreateOptions {
    CreateOptions {
        pool_key: Some("warm".into()),
        spec: SandboxSpec {
            backend,
            ..SandboxSpec::default()
        },
        ..CreateOptions::default()
    }
}

#[tokio::test]
async fn a_seeded_pool_on_gvisor_restores_its_sandboxes_from_one_warmed_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = tmp.path().join("seed");
    // A leftover of an earlier run is never restored: the folder is emptied first.
    std::fs::create_dir_all(&seed).unwrap();
    std::fs::write(seed.join("stale"), b"x").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let fleet = Fleet::new(
        engine(),
        Arc::new(MemoryLedger::default()),
        FleetLimits::default(),
    );
    let pool = warm_pool(BackendKind::Gvisor, &seed, runs.clone());
    let name = pool.name.clone();
    fleet.set_pools(vec![pool]);
    assert_eq!(fleet.refill_pools().await, 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "warmed once, restored once");
    assert!(!seed.join("stale").exists());
    assert!(
        std::fs::read_dir(&seed).unwrap().count() > 0,
        "the seed snapshot is kept"
    );

    let mut ids = Vec::new();
    for _ in 0..3 {
        let made = fleet
            .create("alice", keyed(BackendKind::Gvisor))
            .await
            .expect("create");
        assert!(made.from_pool);
        assert_eq!(made.prepared, Some(serde_json::json!({"warmed": true})));
        assert_eq!(warm_value(&fleet, &made.record.id).await, "42");
        ids.push(made.record.id.clone());
        fleet.refill_pools().await;
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "every later sandbox came from the seed"
    );
    // Each restored sandbox is its own: its own id as its host name.
    for id in &ids {
        let sandbox = fleet.sandbox("alice", id).unwrap();
        let out = sandbox
            .exec(sandcell_protocol::ExecRequest::shell("hostname"))
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), id);
    }
    // Removing the pool ends its ready sandboxes and hands its seed folder back.
    assert_eq!(fleet.remove_pool(&name).await, Some(seed.clone()));
    assert!(fleet.pool_ready_counts().is_empty());
    fleet.stop_all("test over").await;
}

#[tokio::test]
async fn a_seeded_pool_on_process_makes_and_warms_each_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = tmp.path().join("seed");
    let runs = Arc::new(AtomicUsize::new(0));
    let fleet = Fleet::new(
        engine(),
        Arc::new(MemoryLedger::default()),
        FleetLimits::default(),
    );
    fleet.set_pools(vec![warm_pool(BackendKind::Process, &seed, runs.clone())]);
    assert_eq!(fleet.refill_pools().await, 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(!seed.exists(), "no snapshot taken");
    let made = fleet
        .create("alice", keyed(BackendKind::Process))
        .await
        .expect("create");
    assert!(made.from_pool);
    assert_eq!(warm_value(&fleet, &made.record.id).await, "42");
    fleet.drain_pools().await;
    fleet.stop_all("test over").await;
}
