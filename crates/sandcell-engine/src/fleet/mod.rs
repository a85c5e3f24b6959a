//! The fleet: the sandboxes a long-lived service runs for many owners. It keeps their records
//! (persisted through a [`Ledger`] before anything is acknowledged), scopes every call to an
//! owner, enforces caps, and ends sandboxes that sat idle or outlived their lifetime.
//!
//! The service (the daemon) owns one fleet over one engine; the CLI's one-shot runs use the
//! engine directly.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

mod caps;
mod expiry;
mod pools;
mod records;
mod recovery;

pub use caps::FleetLimits;
use caps::check_tags;
pub use pools::{POOL_OWNER, PoolPrepare, PoolSpec, PrepareFn};
pub use records::{
    Ledger, ListError, MemoryLedger, Millis, Page, RecordQuery, SandboxRecord, SandboxState,
};
pub use recovery::Recovery;

use crate::engine::{Engine, new_sandbox_id};
use crate::error::EngineError;
use crate::sandbox::Sandbox;
use crate::spec::SandboxSpec;

/// How to create a sandbox in the fleet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateOptions {
    /// What it should be.
    pub spec: SandboxSpec,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Idle timeout (default: the fleet's).
    pub idle_timeout_ms: Option<u64>,
    /// Lifetime from now (default: the fleet's; capped by its maximum).
    pub lifetime_ms: Option<u64>,
    /// Forget the record when it stops.
    pub ephemeral: bool,
    /// Start it from this process checkpoint instead of fresh (never from a warm pool).
    pub checkpoint: Option<Checkpoint>,
    /// The preparation ([`pools::PoolPrepare::key`]) a warm pool sandbox must have had to
    /// serve this create; `None` takes only from pools without one.
    pub pool_key: Option<String>,
}

/// A snapshot holding a process checkpoint, to start a sandbox from.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The snapshot's folder.
    pub dir: std::path::PathBuf,
    /// Its manifest.
    pub manifest: crate::snapshot::SnapshotManifest,
}

struct Live {
    sandbox: Sandbox,
    /// Whose it is (checked without a read of the ledger on every request).
    owner: String,
    last_active: AtomicI64,
    /// When it was paused (ms; 0: it is not), for the clocks that stop meanwhile.
    paused_at: AtomicI64,
    /// Serializes its pause and resume transitions.
    transition: Mutex<()>,
}

impl Live {
    fn new(sandbox: Sandbox, owner: String, last_active: Millis) -> Self {
        Self {
            sandbox,
            owner,
            last_active: AtomicI64::new(last_active),
            paused_at: AtomicI64::new(0),
            transition: Mutex::new(()),
        }
    }
}

/// A sandbox [`Fleet::create`] made.
#[derive(Debug, Clone, PartialEq)]
pub struct Created {
    /// Its record.
    pub record: SandboxRecord,
    /// It came ready from a warm pool.
    pub from_pool: bool,
    /// What its pool's preparation reported ([`PrepareFn`]), when it came from a
    /// pool that prepares.
    pub prepared: Option<serde_json::Value>,
    /// What came back, when it was started from a checkpoint.
    pub restore: Option<crate::snapshot::RestoreReport>,
}

/// The sandboxes of a service.
pub struct Fleet {
    engine: Engine,
    ledger: Arc<dyn Ledger>,
    limits: FleetLimits,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Serializes the cap check with the insert, so concurrent creates cannot overshoot.
    admission: tokio::sync::Mutex<()>,
    /// Warm pools: ready sandboxes handed out on create.
    pools: pools::Pools,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The current time.
pub fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn persistence(e: String) -> EngineError {
    EngineError::Persistence(e)
}

fn not_found(id: &str) -> EngineError {
    EngineError::NotFound {
        what: "sandbox",
        id: id.to_string(),
    }
}

impl Fleet {
    /// A fleet over `engine`, keeping its records in `ledger`.
    pub fn new(engine: Engine, ledger: Arc<dyn Ledger>, limits: FleetLimits) -> Self {
        Self {
            engine,
            ledger,
            limits,
            live: Mutex::new(HashMap::new()),
            admission: tokio::sync::Mutex::new(()),
            pools: pools::Pools::default(),
        }
    }

    /// The engine underneath.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The caps and defaults.
    pub fn limits(&self) -> &FleetLimits {
        &self.limits
    }

    /// Creates a sandbox for `owner`: the record is written (`creating`) before the sandbox
    /// starts, and again (`running` or `failed`) before this returns.
    pub async fn create(&self, owner: &str, opts: CreateOptions) -> Result<Created, EngineError> {
        check_tags("label", &opts.labels)?;
        check_tags("metadata", &opts.metadata)?;
        opts.spec.validate()?;
        self.engine.check_backend(&opts.spec)?;
        let lifetime = match (opts.lifetime_ms, self.limits.max_lifetime_ms) {
            (Some(asked), Some(max)) if asked > max => {
                return Err(EngineError::InvalidRequest(format!(
                    "a lifetime of {asked} ms is over the maximum of {max} ms"
                )));
            }
            (Some(0), _) => {
                return Err(EngineError::InvalidRequest(
                    "a lifetime must be positive".into(),
                ));
            }
            (Some(asked), _) => Some(asked),
            (None, _) => self.limits.default_lifetime_ms,
        };
        if opts.idle_timeout_ms == Some(0) {
            return Err(EngineError::InvalidRequest(
                "an idle timeout must be positive".into(),
            ));
        }
        let now = now_ms();
        let record = SandboxRecord {
            id: new_sandbox_id(),
            owner: owner.to_string(),
            state: SandboxState::Creating,
            reason: None,
            spec: opts.spec,
            labels: opts.labels,
            metadata: opts.metadata,
            created_at_ms: now,
            updated_at_ms: now,
            last_active_ms: now,
            idle_timeout_ms: opts.idle_timeout_ms.or(self.limits.default_idle_timeout_ms),
            expires_at_ms: lifetime
                .map(|l| now.saturating_add(i64::try_from(l).unwrap_or(i64::MAX))),
            ephemeral: opts.ephemeral,
            runtime: serde_json::Value::Null,
        };
        let admitted = self.admission.lock().await;
        self.check_caps(owner)?;
        if opts.checkpoint.is_none()
            && let Some((record, prepared)) =
                self.claim_from_pool(record.clone(), opts.pool_key.as_deref())?
        {
            return Ok(Created {
                record,
                from_pool: true,
                prepared,
                restore: None,
            });
        }
        self.ledger.insert(&record).map_err(persistence)?;
        drop(admitted);
        let mut record = record;
        let made = match &opts.checkpoint {
            Some(c) => self
                .engine
                .restore_checkpoint(record.id.clone(), record.spec.clone(), &c.dir, &c.manifest)
                .await
                .map(|(sandbox, report)| (sandbox, Some(report))),
            None => self
                .engine
                .create_with_id(record.id.clone(), record.spec.clone())
                .await
                .map(|sandbox| (sandbox, None)),
        };
        match made {
            Ok((sandbox, restore)) => {
                record.state = SandboxState::Running;
                record.updated_at_ms = now_ms();
                record.runtime = sandbox.runtime();
                if let Err(e) = self.ledger.update(&record) {
                    let _ = sandbox.destroy().await;
                    return Err(persistence(e));
                }
                let live = Arc::new(Live::new(
                    sandbox,
                    record.owner.clone(),
                    record.updated_at_ms,
                ));
                lock(&self.live).insert(record.id.clone(), live);
                Ok(Created {
                    record,
                    from_pool: false,
                    prepared: None,
                    restore,
                })
            }
            Err(e) => {
                record.state = SandboxState::Failed;
                record.reason = Some(e.to_string());
                record.updated_at_ms = now_ms();
                let _ = self.ledger.update(&record);
                Err(e)
            }
        }
    }

    /// `owner`'s sandbox `id` (another owner's is reported as missing).
    pub fn get(&self, owner: &str, id: &str) -> Result<SandboxRecord, EngineError> {
        let mut record = self
            .ledger
            .get(id)
            .map_err(persistence)?
            .filter(|r| r.owner == owner)
            .ok_or_else(|| not_found(id))?;
        if let Some(live) = lock(&self.live).get(id) {
            record.last_active_ms = live.last_active.load(Ordering::Relaxed);
        }
        Ok(record)
    }

    /// A page of `owner`'s sandboxes.
    pub fn list(
        &self,
        owner: &str,
        mut query: RecordQuery,
    ) -> Result<Page<SandboxRecord>, EngineError> {
        query.owner = Some(owner.to_string());
        let mut page = self.ledger.list(&query)?;
        let live = lock(&self.live);
        for r in &mut page.items {
            if let Some(l) = live.get(&r.id) {
                r.last_active_ms = l.last_active.load(Ordering::Relaxed);
            }
        }
        Ok(page)
    }

    /// The running sandbox `id` of `owner`, marked as used now.
    pub fn sandbox(&self, owner: &str, id: &str) -> Result<Sandbox, EngineError> {
        let live = self.live_of(owner, id)?;
        if live.sandbox.is_paused() {
            // Asked to do something, a paused sandbox resumes: its record now, its
            // processes as the request reaches them.
            self.record_resumed(id, &live)?;
        }
        live.last_active.store(now_ms(), Ordering::Relaxed);
        Ok(live.sandbox.clone())
    }

    /// As [`Self::sandbox`], without resuming a paused one (for reads that leave it be,
    /// such as its resource use).
    pub fn sandbox_as_is(&self, owner: &str, id: &str) -> Result<Sandbox, EngineError> {
        Ok(self.live_of(owner, id)?.sandbox.clone())
    }

    /// Pauses `owner`'s sandbox `id`: every process freezes (no CPU; memory, processes and
    /// kernel state kept) and its idle and lifetime clocks stop until it resumes. Pausing a
    /// paused sandbox changes nothing.
    pub async fn pause(&self, owner: &str, id: &str) -> Result<SandboxRecord, EngineError> {
        let live = self.live_of(owner, id)?;
        live.sandbox.pause().await?;
        let _turn = lock(&live.transition);
        let mut record = self.get(owner, id)?;
        if record.state == SandboxState::Paused || !live.sandbox.is_paused() {
            // Paused already, or resumed by a request that came meanwhile.
            return Ok(record);
        }
        let now = now_ms();
        record.state = SandboxState::Paused;
        record.reason = Some("paused".into());
        record.updated_at_ms = now;
        record.last_active_ms = live.last_active.load(Ordering::Relaxed);
        if let Err(e) = self.ledger.update(&record) {
            drop(_turn);
            let _ = live.sandbox.resume().await;
            return Err(persistence(e));
        }
        live.paused_at.store(now, Ordering::SeqCst);
        Ok(record)
    }

    /// Resumes `owner`'s paused sandbox `id` where it stopped; its lifetime is extended by
    /// the time it spent paused. Resuming a running sandbox changes nothing.
    pub async fn resume(&self, owner: &str, id: &str) -> Result<SandboxRecord, EngineError> {
        let live = self.live_of(owner, id)?;
        let record = self.record_resumed(id, &live)?;
        if live.sandbox.is_paused() {
            live.sandbox.resume().await?;
        }
        Ok(record)
    }

    /// Records `live` as running again (with its clocks moved by the time it was paused).
    /// Its processes are thawed by the caller, or by the sandbox itself on its next request
    /// (every request wakes a paused sandbox first).
    fn record_resumed(&self, id: &str, live: &Live) -> Result<SandboxRecord, EngineError> {
        let _turn = lock(&live.transition);
        let mut record = self
            .ledger
            .get(id)
            .map_err(persistence)?
            .ok_or_else(|| not_found(id))?;
        if record.state != SandboxState::Paused {
            return Ok(record);
        }
        let now = now_ms();
        let since = match live.paused_at.swap(0, Ordering::SeqCst) {
            0 => record.updated_at_ms,
            at => at,
        };
        let paused_for = (now - since).max(0);
        record.state = SandboxState::Running;
        record.reason = Some(format!("resumed after {paused_for} ms paused"));
        record.expires_at_ms = record.expires_at_ms.map(|t| t.saturating_add(paused_for));
        record.updated_at_ms = now;
        record.last_active_ms = now;
        // Recorded first: a sandbox running while its record says paused would have its
        // clocks stopped.
        self.ledger.update(&record).map_err(persistence)?;
        live.last_active.store(now, Ordering::Relaxed);
        Ok(record)
    }

    /// The running (or paused) sandbox `id` of `owner`; another owner's is not found.
    /// Whose running sandbox `id` is (`None`: none runs here by that id); no ledger read.
    pub fn owner_of(&self, id: &str) -> Option<String> {
        lock(&self.live).get(id).map(|l| l.owner.clone())
    }

    fn live_of(&self, owner: &str, id: &str) -> Result<Arc<Live>, EngineError> {
        let live = lock(&self.live).get(id).cloned();
        match live {
            Some(l) if l.owner == owner => Ok(l),
            _ => {
                let record = self.get(owner, id)?;
                Err(EngineError::SandboxGone {
                    id: id.to_string(),
                    reason: format!(
                        "it is {}{}",
                        record.state.as_str(),
                        record.reason.map(|r| format!(" ({r})")).unwrap_or_default()
                    ),
                })
            }
        }
    }

    /// Stops `owner`'s sandbox `id` (its record stays, `stopped`, unless it is ephemeral).
    pub async fn delete(&self, owner: &str, id: &str) -> Result<(), EngineError> {
        self.get(owner, id)?;
        self.stop(id, "deleted").await
    }

    /// Gives `owner`'s sandbox `id` `lifetime_ms` more from now (within the maximum).
    pub fn set_timeout(
        &self,
        owner: &str,
        id: &str,
        lifetime_ms: u64,
    ) -> Result<SandboxRecord, EngineError> {
        let mut record = self.get(owner, id)?;
        if !record.state.is_active() {
            return Err(EngineError::SandboxGone {
                id: id.to_string(),
                reason: format!("it is {}", record.state.as_str()),
            });
        }
        if lifetime_ms == 0 {
            return Err(EngineError::InvalidRequest(
                "a timeout must be positive".into(),
            ));
        }
        if let Some(max) = self.limits.max_lifetime_ms
            && lifetime_ms > max
        {
            return Err(EngineError::InvalidRequest(format!(
                "a timeout of {lifetime_ms} ms is over the maximum of {max} ms"
            )));
        }
        let now = now_ms();
        record.expires_at_ms =
            Some(now.saturating_add(i64::try_from(lifetime_ms).unwrap_or(i64::MAX)));
        record.updated_at_ms = now;
        self.ledger.update(&record).map_err(persistence)?;
        Ok(record)
    }

    /// Changes what `owner`'s running sandbox `id` reaches (see [`Sandbox::set_network`]);
    /// the record keeps it, so a restarted service and the sandbox's snapshots keep it too.
    pub fn set_network(
        &self,
        owner: &str,
        id: &str,
        policy: crate::spec::NetworkPolicy,
    ) -> Result<SandboxRecord, EngineError> {
        let sandbox = self.sandbox_as_is(owner, id)?;
        let mut record = self.get(owner, id)?;
        sandbox.set_network(policy.clone())?;
        record.spec.network = policy;
        record.updated_at_ms = now_ms();
        self.ledger.update(&record).map_err(persistence)?;
        Ok(record)
    }

    /// Gives `owner`'s sandbox `id` these secrets, replacing those it had: its egress proxy
    /// and the hub hold the values, its record the rest (for restores, forks and
    /// reattachments).
    pub fn set_secrets(
        &self,
        owner: &str,
        id: &str,
        secrets: sandcell_egress::Secrets,
    ) -> Result<SandboxRecord, EngineError> {
        let sandbox = self.sandbox_as_is(owner, id)?;
        let mut record = self.get(owner, id)?;
        record.spec.secrets = crate::egress::secret_refs(&secrets);
        sandbox.set_secrets(secrets)?;
        record.updated_at_ms = now_ms();
        self.ledger.update(&record).map_err(persistence)?;
        Ok(record)
    }

    /// Records sandbox `id` as ended with `reason` when it is gone (an operation found its
    /// agent gone: a failed checkpoint ends a gVisor sandbox), instead of leaving it
    /// `running` until the next collection. Whether it was gone.
    pub async fn settle_if_gone(&self, id: &str, reason: &str) -> bool {
        let gone = lock(&self.live)
            .get(id)
            .is_some_and(|l| l.sandbox.is_gone());
        if gone {
            let _ = self.stop(id, reason).await;
        }
        gone
    }

    /// Ends a sandbox: the record says `stopped` (with `reason`) before its processes go.
    async fn stop(&self, id: &str, reason: &str) -> Result<(), EngineError> {
        let live = lock(&self.live).remove(id);
        if let Some(mut record) = self.ledger.get(id).map_err(persistence)? {
            if record.ephemeral {
                self.ledger.remove(id).map_err(persistence)?;
            } else if record.state.is_active() {
                record.state = SandboxState::Stopped;
                record.reason = Some(reason.to_string());
                record.updated_at_ms = now_ms();
                if let Some(l) = &live {
                    record.last_active_ms = l.last_active.load(Ordering::Relaxed);
                }
                self.ledger.update(&record).map_err(persistence)?;
            }
        }
        if let Some(l) = live {
            l.sandbox.destroy().await?;
        }
        Ok(())
    }

    /// Ends every sandbox (for a service stopping with nothing to come back to).
    pub async fn stop_all(&self, reason: &str) {
        let ids: Vec<String> = lock(&self.live).keys().cloned().collect();
        for id in ids {
            let _ = self.stop(&id, reason).await;
        }
    }

    /// Sandboxes running now whose system is the image root `system_root`.
    pub fn sandboxes_on(&self, system_root: &str) -> u32 {
        lock(&self.live)
            .values()
            .filter(|l| l.sandbox.spec().system_root.as_deref() == Some(system_root))
            .count() as u32
    }

    /// The running sandboxes that mount the host folder `source` (volumes included), by id.
    pub fn sandboxes_mounting(&self, source: &str) -> Vec<String> {
        let mut ids: Vec<String> = lock(&self.live)
            .values()
            .filter(|l| l.sandbox.spec().mounts.iter().any(|m| m.source == source))
            .map(|l| l.sandbox.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// Sandboxes running now.
    pub fn running(&self) -> usize {
        lock(&self.live).len()
    }
}
