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

use serde::{Deserialize, Serialize};

mod pools;

pub use pools::{POOL_OWNER, PoolSpec};

use crate::engine::{Engine, new_sandbox_id};
use crate::error::EngineError;
use crate::sandbox::Sandbox;
use crate::spec::SandboxSpec;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being started.
    Creating,
    /// Serving requests.
    Running,
    /// Frozen: keeps its memory and processes, uses no CPU.
    Paused,
    /// Ended on request or by its lifecycle rules; the record stays.
    Stopped,
    /// Could not be started (the reason says why).
    Failed,
    /// Found missing after a restart of the service (the reason says what was recovered).
    Lost,
}

impl SandboxState {
    /// The name used on the wire and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
            Self::Lost => "lost",
        }
    }

    /// Parses [`Self::as_str`]'s names.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Creating,
            Self::Running,
            Self::Paused,
            Self::Stopped,
            Self::Failed,
            Self::Lost,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// States in which a sandbox holds resources (and counts against the caps).
    pub const ACTIVE: [SandboxState; 3] = [Self::Creating, Self::Running, Self::Paused];

    /// Whether the sandbox holds resources.
    pub fn is_active(self) -> bool {
        Self::ACTIVE.contains(&self)
    }
}

/// What the fleet remembers of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// The sandbox id.
    pub id: String,
    /// Whose it is: every call is scoped to one owner.
    pub owner: String,
    /// Where it is in its life.
    pub state: SandboxState,
    /// Why it failed, was lost or stopped.
    pub reason: Option<String>,
    /// What it was created with.
    pub spec: SandboxSpec,
    /// Free-form labels (filterable).
    pub labels: BTreeMap<String, String>,
    /// Free-form metadata (filterable).
    pub metadata: BTreeMap<String, String>,
    /// When it was created.
    pub created_at_ms: Millis,
    /// When its record last changed.
    pub updated_at_ms: Millis,
    /// When it was last used.
    pub last_active_ms: Millis,
    /// Stopped after this long without use.
    pub idle_timeout_ms: Option<u64>,
    /// Stopped at this time whatever happens.
    pub expires_at_ms: Option<Millis>,
    /// Its record goes when it stops (instead of staying as `stopped`).
    pub ephemeral: bool,
    /// What the backend needs to reach it again after a restart of the service.
    pub runtime: serde_json::Value,
}

/// Which records a listing returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordQuery {
    /// Only this owner's.
    pub owner: Option<String>,
    /// Only in these states (empty: any).
    pub states: Vec<SandboxState>,
    /// Labels that must all match.
    pub labels: BTreeMap<String, String>,
    /// Metadata that must all match.
    pub metadata: BTreeMap<String, String>,
    /// At most this many (0: the ledger's default).
    pub limit: u32,
    /// Where the previous page ended.
    pub cursor: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass back as the cursor for the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// Where the fleet keeps its records. Every change is written here before the fleet answers.
pub trait Ledger: Send + Sync {
    /// Adds a record.
    fn insert(&self, record: &SandboxRecord) -> Result<(), String>;
    /// Replaces a record's mutable fields.
    fn update(&self, record: &SandboxRecord) -> Result<(), String>;
    /// One record.
    fn get(&self, id: &str) -> Result<Option<SandboxRecord>, String>;
    /// A page of records, ordered by creation.
    fn list(&self, query: &RecordQuery) -> Result<Page<SandboxRecord>, ListError>;
    /// Active sandboxes (all owners, or one).
    fn count_active(&self, owner: Option<&str>) -> Result<u64, String>;
    /// Forgets a record.
    fn remove(&self, id: &str) -> Result<(), String>;
}

/// Why a listing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListError {
    /// The cursor is not one a listing gave.
    InvalidCursor(String),
    /// The records could not be read.
    Failed(String),
}

impl From<ListError> for EngineError {
    fn from(e: ListError) -> Self {
        match e {
            ListError::InvalidCursor(m) => EngineError::InvalidRequest(m),
            ListError::Failed(m) => EngineError::Persistence(m),
        }
    }
}

/// A ledger in memory, for embedded use and tests.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    records: Mutex<BTreeMap<String, SandboxRecord>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ledger for MemoryLedger {
    fn insert(&self, record: &SandboxRecord) -> Result<(), String> {
        let mut records = lock(&self.records);
        if records.contains_key(&record.id) {
            return Err(format!("sandbox {} exists already", record.id));
        }
        records.insert(record.id.clone(), record.clone());
        Ok(())
    }

    fn update(&self, record: &SandboxRecord) -> Result<(), String> {
        match lock(&self.records).get_mut(&record.id) {
            Some(r) => {
                *r = record.clone();
                Ok(())
            }
            None => Err(format!("no sandbox {}", record.id)),
        }
    }

    fn get(&self, id: &str) -> Result<Option<SandboxRecord>, String> {
        Ok(lock(&self.records).get(id).cloned())
    }

    fn list(&self, q: &RecordQuery) -> Result<Page<SandboxRecord>, ListError> {
        let mut all: Vec<SandboxRecord> = lock(&self.records)
            .values()
            .filter(|r| q.owner.as_ref().is_none_or(|o| *o == r.owner))
            .filter(|r| q.states.is_empty() || q.states.contains(&r.state))
            .filter(|r| q.labels.iter().all(|(k, v)| r.labels.get(k) == Some(v)))
            .filter(|r| q.metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
            .cloned()
            .collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        let start = match &q.cursor {
            Some(c) => all
                .iter()
                .position(|r| r.id == *c)
                .map(|i| i + 1)
                .ok_or_else(|| ListError::InvalidCursor(format!("unknown page cursor {c:?}")))?,
            None => 0,
        };
        let limit = if q.limit == 0 { 100 } else { q.limit as usize };
        let items: Vec<SandboxRecord> = all.iter().skip(start).take(limit).cloned().collect();
        let next_cursor = (start + items.len() < all.len())
            .then(|| items.last().map(|r| r.id.clone()))
            .flatten();
        Ok(Page { items, next_cursor })
    }

    fn count_active(&self, owner: Option<&str>) -> Result<u64, String> {
        Ok(lock(&self.records)
            .values()
            .filter(|r| r.state.is_active() && owner.is_none_or(|o| o == r.owner))
            .count() as u64)
    }

    fn remove(&self, id: &str) -> Result<(), String> {
        lock(&self.records).remove(id);
        Ok(())
    }
}

/// Caps and default lifetimes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FleetLimits {
    /// Active sandboxes in all.
    pub max_sandboxes: Option<u64>,
    /// Active sandboxes per owner.
    pub max_per_owner: Option<u64>,
    /// Idle timeout of sandboxes that ask for none.
    pub default_idle_timeout_ms: Option<u64>,
    /// Lifetime of sandboxes that ask for none.
    pub default_lifetime_ms: Option<u64>,
    /// The longest lifetime a sandbox may ask for.
    pub max_lifetime_ms: Option<u64>,
}

impl Default for FleetLimits {
    fn default() -> Self {
        Self {
            max_sandboxes: Some(100),
            max_per_owner: Some(20),
            default_idle_timeout_ms: Some(30 * 60 * 1000),
            default_lifetime_ms: Some(2 * 60 * 60 * 1000),
            max_lifetime_ms: Some(24 * 60 * 60 * 1000),
        }
    }
}

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
    /// What came back, when it was started from a checkpoint.
    pub restore: Option<crate::snapshot::RestoreReport>,
}

/// What [`Fleet::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Reached again, running as before.
    pub reattached: Vec<String>,
    /// Could not be reached: ended and marked `lost`.
    pub lost: Vec<String>,
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
            && let Some(record) = self.claim_from_pool(record.clone())?
        {
            return Ok(Created {
                record,
                from_pool: true,
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

    fn check_caps(&self, owner: &str) -> Result<(), EngineError> {
        if let Some(max) = self.limits.max_sandboxes {
            // Ready pool sandboxes are the service's, not anybody's: they do not count.
            let pooled = self
                .ledger
                .count_active(Some(POOL_OWNER))
                .map_err(persistence)?;
            let n = self
                .ledger
                .count_active(None)
                .map_err(persistence)?
                .saturating_sub(pooled);
            if n >= max {
                return Err(EngineError::LimitExceeded(format!(
                    "the service runs {n} sandboxes, its maximum ({max}); delete one or wait"
                )));
            }
        }
        if let Some(max) = self.limits.max_per_owner {
            let n = self.ledger.count_active(Some(owner)).map_err(persistence)?;
            if n >= max {
                return Err(EngineError::LimitExceeded(format!(
                    "you have {n} active sandboxes, the maximum per owner ({max}); delete one or wait"
                )));
            }
        }
        Ok(())
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

    /// Stops every sandbox past its idle timeout or lifetime; returns (id, reason) of each.
    /// Also notices sandboxes that died on their own (their agent went away).
    pub async fn collect_expired(&self) -> Vec<(String, String)> {
        self.collect_expired_at(now_ms()).await
    }

    /// As [`Self::collect_expired`], judging idleness and lifetimes as of `now` (the same
    /// instant an [`Self::expiring`] before it used, so nothing it did not name is stopped).
    pub async fn collect_expired_at(&self, now: Millis) -> Vec<(String, String)> {
        let live: Vec<(String, Arc<Live>)> = lock(&self.live)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut ended = Vec::new();
        for (id, l) in live {
            let Ok(Some(record)) = self.ledger.get(&id) else {
                continue;
            };
            if record.state == SandboxState::Paused {
                if !l.sandbox.is_paused() {
                    // Woken through a handle held since before its pause (a terminal, say):
                    // the record follows.
                    let _ = self.record_resumed(&id, &l);
                }
                // Its clocks did not run while it was paused.
                continue;
            }
            let why = expiry(&record, &l, now);
            if let Some(why) = why
                && self.stop(&id, &why).await.is_ok()
            {
                ended.push((id, why));
            }
        }
        ended
    }

    /// The sandboxes [`Self::collect_expired_at`] would stop as of `now` for idleness or
    /// their lifetime, as (id, owner, why), without stopping them (to snapshot them first).
    pub fn expiring(&self, now: Millis) -> Vec<(String, String, String)> {
        let live: Vec<(String, Arc<Live>)> = lock(&self.live)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        live.into_iter()
            .filter_map(|(id, l)| {
                let record = self.ledger.get(&id).ok()??;
                if record.state == SandboxState::Paused || l.sandbox.is_gone() {
                    return None;
                }
                expiry(&record, &l, now).map(|why| (id, l.owner.clone(), why))
            })
            .collect()
    }

    /// Ends every sandbox (for a service stopping with nothing to come back to).
    pub async fn stop_all(&self, reason: &str) {
        let ids: Vec<String> = lock(&self.live).keys().cloned().collect();
        for id in ids {
            let _ = self.stop(&id, reason).await;
        }
    }

    /// Brings back the sandboxes a previous run of the service left: each active record is
    /// reattached (its kernels and processes as they were) or, when it cannot be, what is
    /// left of it is ended and the record marked `lost` with the reason. Call once, at start.
    pub async fn recover(&self) -> Result<Recovery, EngineError> {
        let mut recovery = Recovery::default();
        let mut cursor = None;
        let mut records = Vec::new();
        loop {
            let page = self.ledger.list(&RecordQuery {
                states: SandboxState::ACTIVE.to_vec(),
                limit: 500,
                cursor,
                ..RecordQuery::default()
            })?;
            records.extend(page.items);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        for mut record in records {
            if lock(&self.live).contains_key(&record.id) {
                continue;
            }
            if record.owner == POOL_OWNER {
                // A previous run's warm pool: ended, and made again by this run's refill.
                if !record.runtime.is_null() {
                    self.engine.kill_orphan(&record.spec, &record.runtime);
                }
                self.ledger.remove(&record.id).map_err(persistence)?;
                continue;
            }
            let attempt = if record.state == SandboxState::Creating {
                Err("the service stopped while it was being created".to_string())
            } else if record.runtime.is_null() {
                Err("its backend cannot reattach to it".to_string())
            } else {
                self.engine
                    .reattach(record.id.clone(), record.spec.clone(), &record.runtime)
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt {
                Ok(sandbox) => {
                    // The record says whether it is paused: the processes follow it.
                    let paused_at = record.updated_at_ms;
                    let paused = record.state == SandboxState::Paused;
                    if paused && !sandbox.is_paused() {
                        let _ = sandbox.pause().await;
                    } else if !paused && sandbox.is_paused() {
                        let _ = sandbox.resume().await;
                    }
                    record.reason = Some(if paused {
                        "paused; reattached after a restart of the service".into()
                    } else {
                        "reattached after a restart of the service".into()
                    });
                    record.updated_at_ms = now_ms();
                    self.ledger.update(&record).map_err(persistence)?;
                    let live = Arc::new(Live::new(
                        sandbox,
                        record.owner.clone(),
                        record.last_active_ms,
                    ));
                    if paused {
                        live.paused_at.store(paused_at, Ordering::SeqCst);
                    }
                    lock(&self.live).insert(record.id.clone(), live);
                    recovery.reattached.push(record.id);
                }
                Err(why) => {
                    let cleanup = if record.runtime.is_null() {
                        String::new()
                    } else {
                        format!(
                            "; {}",
                            self.engine.kill_orphan(&record.spec, &record.runtime)
                        )
                    };
                    record.state = SandboxState::Lost;
                    record.reason = Some(format!("not reattached after a restart: {why}{cleanup}"));
                    record.updated_at_ms = now_ms();
                    self.ledger.update(&record).map_err(persistence)?;
                    recovery.lost.push(record.id);
                }
            }
        }
        Ok(recovery)
    }

    /// Lets every running sandbox outlive this process, for [`Self::recover`] in the next
    /// one; returns how many. The fleet holds none afterwards.
    pub fn detach_all(&self) -> usize {
        let live: Vec<Arc<Live>> = lock(&self.live).drain().map(|(_, l)| l).collect();
        for l in &live {
            l.sandbox.detach();
            let _ = self.ledger.get(l.sandbox.id()).map(|r| {
                if let Some(mut r) = r {
                    r.last_active_ms = l.last_active.load(Ordering::Relaxed);
                    let _ = self.ledger.update(&r);
                }
            });
        }
        live.len()
    }

    /// Sandboxes running now.
    pub fn running(&self) -> usize {
        lock(&self.live).len()
    }
}

/// Why a running sandbox should stop now, if it should.
fn expiry(record: &SandboxRecord, l: &Live, now: Millis) -> Option<String> {
    let idle = now - l.last_active.load(Ordering::Relaxed);
    if record.expires_at_ms.is_some_and(|t| now >= t) {
        Some("its lifetime ended".to_string())
    } else if record
        .idle_timeout_ms
        .is_some_and(|t| idle >= i64::try_from(t).unwrap_or(i64::MAX))
    {
        Some(format!("idle for {} s", idle / 1000))
    } else if l.sandbox.is_gone() {
        Some("its agent went away".to_string())
    } else {
        None
    }
}

/// The one tag rule (`sandcell_api::rules::check_tags`), as the engine's error.
fn check_tags(what: &str, tags: &BTreeMap<String, String>) -> Result<(), EngineError> {
    sandcell_api::rules::check_tags(what, tags).map_err(|e| EngineError::InvalidRequest(e.0))
}
