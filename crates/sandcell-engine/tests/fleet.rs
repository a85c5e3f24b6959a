//! The fleet over the test backend (`sandcell_testkit::local`): the real guest agent on a
//! thread, no isolation, no root. Caps, expiry, ownership, recovery after a restart, warm
//! pools, and an exec and a file round trip through Engine, end to end.

use std::sync::Arc;
use std::time::Duration;

use sandcell_engine::fleet::{
    CreateOptions, Fleet, FleetLimits, Ledger, MemoryLedger, PoolPrepare, PoolSpec, SandboxState,
    now_ms,
};
use sandcell_engine::{
    BackendKind, CheckpointSupport, Engine, EngineError, Fidelity, IsolationLevel, SandboxSpec,
};
use sandcell_protocol::ExecRequest;
use sandcell_testkit::local::LocalBackend;

fn engine(backend: &LocalBackend) -> Engine {
    Engine::builder().backend(backend.clone()).build()
}

/// A fleet over a fresh test backend, with `limits` and no default timeouts unless given.
fn fleet(limits: FleetLimits) -> (Fleet, LocalBackend, Arc<MemoryLedger>) {
    let backend = LocalBackend::new();
    let ledger = Arc::new(MemoryLedger::default());
    let fleet = Fleet::new(engine(&backend), ledger.clone(), limits);
    (fleet, backend, ledger)
}

fn no_limits() -> FleetLimits {
    FleetLimits {
        max_sandboxes: None,
        max_per_owner: None,
        default_idle_timeout_ms: None,
        default_lifetime_ms: None,
        max_lifetime_ms: None,
    }
}

/// Waits until `backend` runs `n` agents (ending one may finish on a thread).
async fn wait_running(backend: &LocalBackend, n: usize) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while backend.running() != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{} agents run, not {n}", backend.running());
}

async fn create(fleet: &Fleet, owner: &str) -> Result<String, EngineError> {
    Ok(fleet
        .create(owner, CreateOptions::default())
        .await?
        .record
        .id)
}

#[tokio::test]
async fn an_exec_and_a_file_round_trip_through_the_engine() {
    let backend = LocalBackend::new();
    let engine = engine(&backend);
    let sandbox = engine.create(SandboxSpec::default()).await.unwrap();
    assert_eq!(backend.running(), 1);

    let out = sandbox
        .exec(ExecRequest::shell("echo hello; pwd; echo oops >&2; exit 3"))
        .await
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let workspace = &backend.roots_of(sandbox.id())[0];
    assert_eq!(
        stdout,
        format!("hello\n{}\n", workspace.canonicalize().unwrap().display())
    );
    assert_eq!(out.stderr, b"oops\n");
    assert_eq!(out.result.exit_code, Some(3));

    sandbox
        .write_file("notes/a.txt", b"written by the host", None)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(workspace.join("notes/a.txt")).unwrap(),
        b"written by the host"
    );
    let out = sandbox
        .exec(ExecRequest::shell("cat notes/a.txt; printf back > b.txt"))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"written by the host");
    assert_eq!(sandbox.read_file("b.txt").await.unwrap(), b"back");

    sandbox.destroy().await.unwrap();
    assert!(sandbox.is_destroyed());
    assert_eq!(backend.running(), 0, "destroy ends the agent");
    assert!(sandbox.exec(ExecRequest::shell("true")).await.is_err());
}

#[tokio::test]
async fn the_test_backend_says_what_it_lacks() {
    let backend = LocalBackend::new();
    let engine = engine(&backend);
    assert_eq!(engine.backend_kinds(), vec![BackendKind::Process]);
    let caps = engine.capabilities();
    assert_eq!(caps.len(), 1);
    assert_eq!(caps[0].isolation_level, IsolationLevel::None);
    assert_eq!(caps[0].checkpoint_fidelity, Fidelity::None);
    assert!(!caps[0].supports_pause);
    assert!(!caps[0].features.limits);
    assert_eq!(caps[0].features.checkpoint, CheckpointSupport::Never);
    // The wire form keeps its strings; the engine-only flags are not reported.
    let json = serde_json::to_value(&caps[0]).unwrap();
    assert_eq!(json["isolation_level"], "none");
    assert_eq!(json["checkpoint_fidelity"], "none");
    assert!(json.get("features").is_none(), "{json}");

    let sandbox = engine.create(SandboxSpec::default()).await.unwrap();
    assert!(matches!(
        sandbox.pause().await,
        Err(EngineError::Unsupported(_))
    ));
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        sandbox.snapshot_to(dir.path()).await,
        Err(EngineError::Unsupported(_))
    ));
    // A checkpointable spec asks for what this backend cannot do.
    let spec = SandboxSpec {
        checkpointable: true,
        ..SandboxSpec::default()
    };
    assert!(matches!(
        engine.create(spec).await,
        Err(EngineError::InvalidSpec(_))
    ));
    sandbox.destroy().await.unwrap();
}

#[tokio::test]
async fn the_caps_refuse_past_the_limits() {
    let (fleet, backend, _) = fleet(FleetLimits {
        max_sandboxes: Some(3),
        max_per_owner: Some(2),
        ..no_limits()
    });
    let a1 = create(&fleet, "alice").await.unwrap();
    create(&fleet, "alice").await.unwrap();
    let per_owner = create(&fleet, "alice").await.unwrap_err();
    assert!(
        matches!(&per_owner, EngineError::LimitExceeded(m) if m.contains("per owner")),
        "{per_owner}"
    );
    create(&fleet, "bob").await.unwrap();
    let total = create(&fleet, "carol").await.unwrap_err();
    assert!(
        matches!(&total, EngineError::LimitExceeded(m) if m.contains("the service runs 3")),
        "{total}"
    );
    assert_eq!(fleet.running(), 3);
    assert_eq!(backend.running(), 3, "a refused create starts nothing");

    // A deleted sandbox no longer counts.
    fleet.delete("alice", &a1).await.unwrap();
    create(&fleet, "carol").await.unwrap();
    fleet.stop_all("test over").await;
    assert_eq!(backend.running(), 0);
}

#[tokio::test]
async fn another_owner_finds_nothing() {
    let (fleet, backend, _) = fleet(no_limits());
    let id = create(&fleet, "alice").await.unwrap();
    let not_found = |r: Result<_, EngineError>| matches!(r, Err(EngineError::NotFound { .. }));
    assert!(not_found(fleet.get("bob", &id).map(|_| ())));
    assert!(not_found(fleet.sandbox("bob", &id).map(|_| ())));
    assert!(not_found(fleet.sandbox_as_is("bob", &id).map(|_| ())));
    assert!(not_found(fleet.pause("bob", &id).await.map(|_| ())));
    assert!(not_found(fleet.resume("bob", &id).await.map(|_| ())));
    assert!(not_found(fleet.set_timeout("bob", &id, 1000).map(|_| ())));
    assert!(not_found(fleet.delete("bob", &id).await));
    let theirs = fleet
        .list("bob", sandcell_engine::fleet::RecordQuery::default())
        .unwrap();
    assert!(theirs.items.is_empty());

    // Still alice's, still running.
    let sandbox = fleet.sandbox("alice", &id).unwrap();
    let out = sandbox.exec(ExecRequest::shell("echo mine")).await.unwrap();
    assert_eq!(out.stdout, b"mine\n");
    fleet.delete("alice", &id).await.unwrap();
    assert_eq!(
        fleet.get("alice", &id).unwrap().state,
        SandboxState::Stopped
    );
    assert_eq!(backend.running(), 0);
}

#[tokio::test]
async fn idle_and_lifetime_expiry_stop_sandboxes() {
    let (fleet, backend, _) = fleet(no_limits());
    let idle = fleet
        .create(
            "alice",
            CreateOptions {
                idle_timeout_ms: Some(60_000),
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap()
        .record;
    let lifetime = fleet
        .create(
            "alice",
            CreateOptions {
                lifetime_ms: Some(120_000),
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap()
        .record;
    let forever = create(&fleet, "alice").await.unwrap();

    // Nothing is due yet.
    assert!(fleet.collect_expired_at(now_ms()).await.is_empty());
    // Used: the idle clock starts again (it is read, not written, by the collector).
    fleet.sandbox("alice", &idle.id).unwrap();

    // A minute and a half on: only the idle one.
    let ended = fleet.collect_expired_at(now_ms() + 90_000).await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].0, idle.id);
    assert!(ended[0].1.starts_with("idle for"), "{ended:?}");
    let record = fleet.get("alice", &idle.id).unwrap();
    assert_eq!(record.state, SandboxState::Stopped);

    // Past its lifetime (no use extends that).
    fleet.sandbox("alice", &lifetime.id).unwrap();
    let ended = fleet.collect_expired_at(now_ms() + 121_000).await;
    assert_eq!(
        ended,
        vec![(lifetime.id.clone(), "its lifetime ended".into())]
    );

    // Without timeouts it runs on.
    assert!(
        fleet
            .collect_expired_at(now_ms() + 365 * 86_400_000)
            .await
            .is_empty()
    );
    assert_eq!(fleet.running(), 1);
    assert_eq!(backend.running(), 1);
    fleet.delete("alice", &forever).await.unwrap();
}

#[tokio::test]
async fn a_sandbox_whose_agent_went_away_is_collected() {
    let (fleet, backend, _) = fleet(no_limits());
    let id = create(&fleet, "alice").await.unwrap();
    let sandbox = fleet.sandbox("alice", &id).unwrap();
    // The agent's end: an exec of `kill` on the agent would end the test process, so the
    // sandbox's handle is cut from below instead.
    sandbox.kill();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !sandbox.is_gone() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let ended = fleet.collect_expired_at(now_ms()).await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].1, "its agent went away");
    assert_eq!(fleet.running(), 0);
    wait_running(&backend, 0).await;
}

#[tokio::test]
async fn a_restarted_fleet_reattaches_or_marks_lost() {
    let backend = LocalBackend::new();
    let ledger = Arc::new(MemoryLedger::default());
    let first = Fleet::new(engine(&backend), ledger.clone(), no_limits());
    let kept = create(&first, "alice").await.unwrap();
    let gone = create(&first, "bob").await.unwrap();
    first
        .sandbox("alice", &kept)
        .unwrap()
        .write_file("state.txt", b"before the restart", None)
        .await
        .unwrap();
    // A background process keeps running across the restart.
    let bg = first
        .sandbox("alice", &kept)
        .unwrap()
        .spawn(ExecRequest::shell("sleep 300"))
        .await
        .unwrap();

    // The service stops, leaving its sandboxes running.
    assert_eq!(first.detach_all(), 2);
    drop(first);
    assert_eq!(
        backend.running(),
        2,
        "detached sandboxes outlive their fleet"
    );
    // One of them does not survive the "restart": its agent ends while no service runs.
    let runtime = ledger.get(&gone).unwrap().unwrap().runtime;
    let found = sandcell_engine::Backend::kill_orphan(&backend, &runtime);
    assert!(found.starts_with("ending"), "{found}");
    wait_running(&backend, 1).await;

    let second = Fleet::new(engine(&backend), ledger.clone(), no_limits());
    let recovery = second.recover().await.unwrap();
    assert_eq!(recovery.reattached, vec![kept.clone()]);
    assert_eq!(recovery.lost, vec![gone.clone()]);
    assert_eq!(second.get("bob", &gone).unwrap().state, SandboxState::Lost);
    // Ownership came back with the record.
    assert!(matches!(
        second.get("bob", &kept),
        Err(EngineError::NotFound { .. })
    ));
    let sandbox = second.sandbox("alice", &kept).unwrap();
    assert_eq!(
        sandbox.read_file("state.txt").await.unwrap(),
        b"before the restart"
    );
    let pids: Vec<i32> = sandbox
        .processes()
        .await
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    assert!(pids.contains(&bg.pid), "{pids:?} lacks {}", bg.pid);

    // Recovering twice changes nothing.
    let again = second.recover().await.unwrap();
    assert!(
        again.reattached.is_empty() && again.lost.is_empty(),
        "{again:?}"
    );
    second.stop_all("test over").await;
    assert_eq!(backend.running(), 0);
}

#[tokio::test]
async fn a_warm_pool_hands_out_ready_sandboxes_and_refills() {
    let (fleet, backend, ledger) = fleet(FleetLimits {
        max_sandboxes: Some(2),
        ..no_limits()
    });
    fleet.set_pools(vec![PoolSpec {
        name: "default".into(),
        spec: SandboxSpec::default(),
        size: 2,
        prepare: None,
        seed: None,
    }]);
    assert_eq!(fleet.refill_pools().await, 2);
    assert_eq!(fleet.pool_ready_counts(), vec![("default".into(), 2)]);
    assert_eq!(backend.running(), 2);

    // Ready pool sandboxes are not anybody's: they do not count against the caps.
    let made = fleet
        .create("alice", CreateOptions::default())
        .await
        .unwrap();
    assert!(made.from_pool);
    assert_eq!(made.record.owner, "alice");
    assert_eq!(fleet.pool_ready_counts(), vec![("default".into(), 1)]);
    let sandbox = fleet.sandbox("alice", &made.record.id).unwrap();
    let out = sandbox.exec(ExecRequest::shell("echo warm")).await.unwrap();
    assert_eq!(out.stdout, b"warm\n");
    // The record is alice's now.
    assert_eq!(ledger.get(&made.record.id).unwrap().unwrap().owner, "alice");

    // Another spec does not match the pool: started fresh.
    let other = fleet
        .create(
            "alice",
            CreateOptions {
                spec: SandboxSpec {
                    env: [("A".to_string(), "1".to_string())].into(),
                    ..SandboxSpec::default()
                },
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(!other.from_pool);

    assert_eq!(fleet.refill_pools().await, 1);
    assert_eq!(fleet.pool_ready_counts(), vec![("default".into(), 2)]);
    fleet.drain_pools().await;
    assert_eq!(fleet.pool_ready_counts(), vec![("default".into(), 0)]);
    fleet.stop_all("test over").await;
    assert_eq!(backend.running(), 0);
}

#[tokio::test]
async fn a_prepared_pool_serves_only_creates_naming_its_key() {
    let (fleet, backend, ledger) = fleet(no_limits());
    let prepare = |sandbox: sandcell_engine::Sandbox| {
        Box::pin(async move {
            let out = sandbox
                .exec(ExecRequest::shell("echo prepared > /tmp/mark"))
                .await
                .map_err(|e| e.to_string())?;
            if out.result.success() {
                Ok(serde_json::json!({"mark": "/tmp/mark"}))
            } else {
                Err("the mark was not written".to_string())
            }
        })
            as std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<serde_json::Value, String>> + Send>,
            >
    };
    fleet.set_pools(vec![PoolSpec {
        name: "prepared".into(),
        spec: SandboxSpec::default(),
        size: 1,
        prepare: Some(PoolPrepare {
            key: "mark".into(),
            run: Arc::new(prepare),
        }),
        seed: None,
    }]);
    assert_eq!(fleet.refill_pools().await, 1);

    // Same spec, no key: the prepared sandbox is not what it asked for.
    let plain = fleet
        .create("alice", CreateOptions::default())
        .await
        .unwrap();
    assert!(!plain.from_pool);
    assert_eq!(plain.prepared, None);
    assert_eq!(fleet.pool_ready_counts(), vec![("prepared".into(), 1)]);

    let keyed = fleet
        .create(
            "alice",
            CreateOptions {
                pool_key: Some("mark".into()),
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(keyed.from_pool);
    // The preparation's report comes with the sandbox that took it.
    assert_eq!(
        keyed.prepared,
        Some(serde_json::json!({"mark": "/tmp/mark"}))
    );
    let sandbox = fleet.sandbox("alice", &keyed.record.id).unwrap();
    let out = sandbox
        .exec(ExecRequest::shell("cat /tmp/mark"))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"prepared\n");
    fleet.drain_pools().await;

    // A preparation that fails leaves the pool short and no sandbox or record behind; the
    // pool after it still fills, and the failing one is not tried again at once.
    let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = tries.clone();
    let failing = move |_sandbox: sandcell_engine::Sandbox| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Err("the registry is down".to_string()) })
            as std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<serde_json::Value, String>> + Send>,
            >
    };
    fleet.set_pools(vec![
        PoolSpec {
            name: "failing".into(),
            spec: SandboxSpec::default(),
            size: 1,
            prepare: Some(PoolPrepare {
                key: "down".into(),
                run: Arc::new(failing),
            }),
            seed: None,
        },
        PoolSpec {
            name: "plain".into(),
            spec: SandboxSpec::default(),
            size: 1,
            prepare: None,
            seed: None,
        },
    ]);
    let records_before = ledger.count_active(None).unwrap();
    assert_eq!(fleet.refill_pools().await, 1);
    assert_eq!(
        fleet.pool_ready_counts(),
        vec![("failing".into(), 0), ("plain".into(), 1)]
    );
    assert_eq!(ledger.count_active(None).unwrap(), records_before + 1);
    assert_eq!(fleet.refill_pools().await, 0);
    assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 1);
    fleet.drain_pools().await;
    assert_eq!(ledger.count_active(None).unwrap(), records_before);
    fleet.stop_all("test over").await;
    assert_eq!(backend.running(), 0);
}
