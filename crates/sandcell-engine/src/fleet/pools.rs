//! Warm pools: sandboxes started ahead of time for a spec, handed out by `create` when a
//! request asks for exactly that spec, and refilled in the background.
//!
//! A ready sandbox has a record owned by [`POOL_OWNER`] (no key can have that owner), so a
//! crash of the service orphans nothing: [`Fleet::recover`] ends what the pools held.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Fleet, Live, SandboxRecord, SandboxState, lock, now_ms, persistence};
use crate::error::EngineError;
use crate::sandbox::Sandbox;
use crate::snapshot::SnapshotManifest;
use crate::spec::SandboxSpec;

/// The owner of ready pool sandboxes (not a valid key owner).
pub const POOL_OWNER: &str = "(pool)";

/// One warm pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// Its name (in metrics), e.g. `python/small`.
    pub name: String,
    /// What its sandboxes are.
    pub spec: SandboxSpec,
    /// How many it keeps ready.
    pub size: usize,
    /// Work done on each of its sandboxes before it counts as ready (packages installed,
    /// say); only creates naming the same key take from such a pool.
    pub prepare: Option<PoolPrepare>,
    /// A folder of the pool's own (emptied when the pool starts) where it keeps a snapshot of
    /// its first sandbox, taken once that sandbox is prepared: the others are restored from
    /// it, state and all, instead of being made and prepared each. Only where the backend
    /// checkpoints whole sandboxes (gVisor); elsewhere each is made and prepared.
    pub seed: Option<PathBuf>,
}

/// What [`PoolPrepare`] runs on a started pool sandbox: its report (kept with the sandbox
/// and handed to the create that takes it, [`super::Created::prepared`]), or why it failed,
/// which drops the sandbox.
pub type PrepareFn = dyn Fn(Sandbox) -> Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>>
    + Send
    + Sync;

/// How long a pool whose sandbox could not be started or prepared waits before it is tried
/// again, the first time; each failure in a row doubles it, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Preparation of a pool's sandboxes, named by a key that creates must give to match
/// ([`super::CreateOptions::pool_key`]): the spec alone cannot tell a sandbox with packages
/// installed from one without.
#[derive(Clone)]
pub struct PoolPrepare {
    /// What a create names to take a sandbox prepared this way.
    pub key: String,
    /// The preparation.
    pub run: Arc<PrepareFn>,
}

impl std::fmt::Debug for PoolPrepare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolPrepare")
            .field("key", &self.key)
            .finish()
    }
}

impl PartialEq for PoolPrepare {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

/// The pools and their ready sandboxes.
#[derive(Default)]
pub(super) struct Pools {
    specs: std::sync::Mutex<Vec<PoolSpec>>,
    ready: std::sync::Mutex<HashMap<String, VecDeque<Ready>>>,
    /// Pools that failed lately: not tried again before `next`.
    failing: std::sync::Mutex<HashMap<String, Failing>>,
    /// Wakes the refiller after a sandbox was taken.
    taken: tokio::sync::Notify,
    /// The snapshot of each seeded pool, once taken (`None`: its backend cannot take one,
    /// so its sandboxes are made the usual way).
    seeds: std::sync::Mutex<HashMap<String, Option<Seed>>>,
}

/// A seeded pool's snapshot (in its [`PoolSpec::seed`] folder) and its sandbox's preparation
/// report, which every sandbox restored from it carries.
#[derive(Clone)]
struct Seed {
    manifest: SnapshotManifest,
    prepared: Option<serde_json::Value>,
}

/// A ready pool sandbox and what its preparation reported.
struct Ready {
    sandbox: Sandbox,
    prepared: Option<serde_json::Value>,
}

/// A pool's failures in a row.
#[derive(Debug, Clone, Copy)]
struct Failing {
    next: Instant,
    wait: Duration,
}

impl Fleet {
    /// Sets the warm pools (at start, before [`Self::refill_pools`] runs).
    pub fn set_pools(&self, pools: Vec<PoolSpec>) {
        *lock(&self.pools.specs) = pools;
    }

    /// Ready sandboxes by pool name, for metrics.
    pub fn pool_ready_counts(&self) -> Vec<(String, u64)> {
        let specs = lock(&self.pools.specs).clone();
        let ready = lock(&self.pools.ready);
        specs
            .iter()
            .map(|p| {
                let n = ready.get(&p.name).map_or(0, VecDeque::len);
                (p.name.clone(), n as u64)
            })
            .collect()
    }

    /// Starts sandboxes until every pool is full; one at a time, so that refilling never
    /// competes much with the requests being served. Returns how many it started.
    ///
    /// A pool whose sandbox cannot be started or prepared (a package that will not install,
    /// say) stays short and is left alone for a while, longer after each failure in a row
    /// (5 s, doubling, at most 5 min); the other pools fill meanwhile, and creates go the
    /// slow way.
    pub async fn refill_pools(&self) -> usize {
        self.refill_pools_until(|| false).await
    }

    /// [`Fleet::refill_pools`], stopping before the next sandbox once `stop()` says so. Its
    /// future must not be dropped midway (a sandbox it is making would be left running, in
    /// no pool): a caller that stops waits for it, which takes at most one sandbox's start.
    pub async fn refill_pools_until(&self, stop: impl Fn() -> bool) -> usize {
        let mut started = 0;
        loop {
            if stop() {
                return started;
            }
            let wanted = {
                let specs = lock(&self.pools.specs);
                let ready = lock(&self.pools.ready);
                let failing = lock(&self.pools.failing);
                let now = Instant::now();
                specs
                    .iter()
                    .find(|p| {
                        ready.get(&p.name).map_or(0, VecDeque::len) < p.size
                            && failing.get(&p.name).is_none_or(|f| f.next <= now)
                    })
                    .cloned()
            };
            let Some(pool) = wanted else {
                return started;
            };
            match self.start_pooled(&pool).await {
                Ok(ready) => {
                    lock(&self.pools.failing).remove(&pool.name);
                    lock(&self.pools.ready)
                        .entry(pool.name.clone())
                        .or_default()
                        .push_back(ready);
                    started += 1;
                }
                Err(e) => {
                    let mut failing = lock(&self.pools.failing);
                    let wait = failing
                        .get(&pool.name)
                        .map_or(RETRY_FIRST, |f| (f.wait * 2).min(RETRY_MAX));
                    tracing::warn!(pool = %pool.name, error = %e, retry_in_s = wait.as_secs(), "a warm pool stays short");
                    failing.insert(
                        pool.name.clone(),
                        Failing {
                            next: Instant::now() + wait,
                            wait,
                        },
                    );
                }
            }
        }
    }

    /// Waits until a pool sandbox is taken (or `limit` passes).
    pub async fn pool_taken(&self, limit: std::time::Duration) {
        let _ = tokio::time::timeout(limit, self.pools.taken.notified()).await;
    }

    async fn start_pooled(&self, pool: &PoolSpec) -> Result<Ready, EngineError> {
        let now = now_ms();
        let mut record = SandboxRecord {
            id: crate::engine::new_sandbox_id(),
            owner: POOL_OWNER.to_string(),
            state: SandboxState::Creating,
            reason: Some(format!("warm pool {}", pool.name)),
            spec: pool.spec.clone(),
            labels: Default::default(),
            metadata: Default::default(),
            created_at_ms: now,
            updated_at_ms: now,
            last_active_ms: now,
            idle_timeout_ms: None,
            expires_at_ms: None,
            ephemeral: true,
            runtime: serde_json::Value::Null,
        };
        self.ledger.insert(&record).map_err(persistence)?;
        match self.make_pooled(pool, &record.id).await {
            Ok(ready) => {
                record.state = SandboxState::Running;
                record.runtime = ready.sandbox.runtime();
                record.updated_at_ms = now_ms();
                if let Err(e) = self.ledger.update(&record) {
                    let _ = ready.sandbox.destroy().await;
                    let _ = self.ledger.remove(&record.id);
                    return Err(persistence(e));
                }
                Ok(ready)
            }
            Err(e) => {
                let _ = self.ledger.remove(&record.id);
                Err(e)
            }
        }
    }

    /// A new sandbox of `pool` with id `id`: restored from the pool's seed snapshot when it
    /// has one, else made and prepared (and, for a seeded pool, snapshotted as its seed).
    async fn make_pooled(&self, pool: &PoolSpec, id: &str) -> Result<Ready, EngineError> {
        let seed = lock(&self.pools.seeds).get(&pool.name).cloned();
        if let (Some(dir), Some(Some(seed))) = (&pool.seed, &seed) {
            let (sandbox, _) = self
                .engine
                .restore_checkpoint(id.to_string(), pool.spec.clone(), dir, &seed.manifest)
                .await?;
            return Ok(Ready {
                sandbox,
                prepared: seed.prepared.clone(),
            });
        }
        let sandbox = self
            .engine
            .create_with_id(id.to_string(), pool.spec.clone())
            .await?;
        let prepared = match &pool.prepare {
            Some(prepare) => match (prepare.run)(sandbox.clone()).await {
                Ok(report) => Some(report),
                Err(why) => {
                    let _ = sandbox.destroy().await;
                    tracing::warn!(pool = %pool.name, error = %why, "a warm pool sandbox could not be prepared");
                    return Err(EngineError::Launch {
                        stage: "prepare a warm pool sandbox".into(),
                        message: why,
                    });
                }
            },
            None => None,
        };
        if let (Some(dir), None) = (&pool.seed, seed) {
            let seeded = if sandbox.backend_instance().checkpoints() {
                match take_seed(&sandbox, dir).await {
                    Ok(manifest) => Some(Seed {
                        manifest,
                        prepared: prepared.clone(),
                    }),
                    Err(e) => {
                        let _ = sandbox.destroy().await;
                        return Err(e);
                    }
                }
            } else {
                tracing::info!(pool = %pool.name, backend = pool.spec.backend.as_str(), "this backend cannot checkpoint a whole sandbox: the pool's sandboxes are each made and prepared");
                None
            };
            lock(&self.pools.seeds).insert(pool.name.clone(), seeded);
        }
        Ok(Ready { sandbox, prepared })
    }

    /// Hands a ready sandbox with `wanted`'s spec, prepared as `pool_key` names (or not
    /// prepared, for `None`), to `wanted`'s owner, if a pool has one: its record becomes
    /// `wanted` (with the pool sandbox's id and runtime). Returns it with its preparation's
    /// report.
    pub(super) fn claim_from_pool(
        &self,
        mut wanted: SandboxRecord,
        pool_key: Option<&str>,
    ) -> Result<Option<(SandboxRecord, Option<serde_json::Value>)>, EngineError> {
        let name = {
            let specs = lock(&self.pools.specs);
            let found = specs.iter().find(|p| {
                p.spec == wanted.spec && p.prepare.as_ref().map(|p| p.key.as_str()) == pool_key
            });
            match found {
                Some(p) => p.name.clone(),
                None => return Ok(None),
            }
        };
        let Ready { sandbox, prepared } = loop {
            let next = lock(&self.pools.ready)
                .get_mut(&name)
                .and_then(VecDeque::pop_front);
            let Some(ready) = next else {
                return Ok(None);
            };
            // One that died while waiting is dropped (and its record with it).
            if ready.sandbox.is_gone() {
                let _ = self.ledger.remove(ready.sandbox.id());
                continue;
            }
            break ready;
        };
        self.pools.taken.notify_one();
        wanted.id = sandbox.id().to_string();
        wanted.state = SandboxState::Running;
        wanted.runtime = sandbox.runtime();
        wanted.updated_at_ms = now_ms();
        // The pool's record gives way to the owner's (same id: the sandbox keeps it).
        let swapped = self
            .ledger
            .remove(&wanted.id)
            .and_then(|()| self.ledger.insert(&wanted));
        if let Err(e) = swapped {
            let s = sandbox.clone();
            tokio::spawn(async move {
                let _ = s.destroy().await;
            });
            return Err(persistence(e));
        }
        let live = Arc::new(Live::new(
            sandbox,
            wanted.owner.clone(),
            wanted.updated_at_ms,
        ));
        lock(&self.live).insert(wanted.id.clone(), live);
        Ok(Some((wanted, prepared)))
    }

    /// Adds a pool, or replaces the one of the same name (a template built again): the
    /// replaced pool's ready sandboxes (on the old spec) are ended. The refiller fills it at
    /// its next round.
    pub async fn upsert_pool(&self, pool: PoolSpec) {
        let pool_name = pool.name.clone();
        let stale: Vec<Sandbox> = {
            let mut specs = lock(&self.pools.specs);
            let replaced = specs.iter().position(|p| p.name == pool.name);
            let old = replaced.map(|i| specs.remove(i));
            let name = pool.name.clone();
            specs.push(pool);
            match old {
                Some(_) => self.take_ready(&name),
                None => Vec::new(),
            }
        };
        lock(&self.pools.failing).clear();
        // A rebuilt template's pool takes a new seed of its new sandboxes.
        lock(&self.pools.seeds).remove(&pool_name);
        self.pools.taken.notify_one();
        self.end_ready(stale).await;
    }

    /// Removes pool `name` (a deleted template's): its ready sandboxes are ended; returns
    /// its seed folder, if it had one, for the caller to remove.
    pub async fn remove_pool(&self, name: &str) -> Option<PathBuf> {
        let (seed, stale) = {
            let mut specs = lock(&self.pools.specs);
            let removed = specs
                .iter()
                .position(|p| p.name == name)
                .map(|i| specs.remove(i));
            (removed.and_then(|p| p.seed), self.take_ready(name))
        };
        lock(&self.pools.seeds).remove(name);
        lock(&self.pools.failing).remove(name);
        self.end_ready(stale).await;
        seed
    }

    /// Ends every ready pool sandbox and forgets its record.
    pub async fn drain_pools(&self) {
        let drained: Vec<Sandbox> = lock(&self.pools.ready)
            .drain()
            .flat_map(|(_, q)| q)
            .map(|ready| ready.sandbox)
            .collect();
        self.end_ready(drained).await;
    }

    /// Pool `name`'s ready sandboxes, out of the pool.
    fn take_ready(&self, name: &str) -> Vec<Sandbox> {
        lock(&self.pools.ready)
            .remove(name)
            .map(|q| q.into_iter().map(|r| r.sandbox).collect())
            .unwrap_or_default()
    }

    /// Ends sandboxes taken out of their pools, and their records.
    async fn end_ready(&self, sandboxes: Vec<Sandbox>) {
        for sandbox in sandboxes {
            let _ = sandbox.destroy().await;
            let _ = self.ledger.remove(sandbox.id());
        }
    }
}

/// Takes the snapshot of a seeded pool into `dir`, emptied first (a seed of an earlier run of
/// the service, or of the pool before its template was rebuilt, is never restored).
async fn take_seed(sandbox: &Sandbox, dir: &Path) -> Result<SnapshotManifest, EngineError> {
    let fresh = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        match std::fs::remove_dir_all(&fresh) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&fresh)
    })
    .await
    .map_err(|e| EngineError::io("empty the pool's seed folder", std::io::Error::other(e)))?
    .map_err(|e| EngineError::io(format!("empty {}", dir.display()), e))?;
    sandbox.snapshot_to(dir).await
}
