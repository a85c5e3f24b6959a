//! The service's state and what every operation shares (the audit log).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use sandcell_engine::fleet::Fleet;
use sandcell_store::Store;

use crate::caller::{Caller, KeyCache};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::signed_url::UrlSigner;
use crate::usage::CpuSamples;

/// Everything the operations work on; cheap to share (`Arc<Service>`).
pub struct Service {
    /// The sandboxes.
    pub fleet: Arc<Fleet>,
    /// The records (keys, exports, snapshots, audit; the fleet's go through it too).
    pub store: Arc<Store>,
    /// API key lookups.
    pub keys: KeyCache,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    /// The settings in force (paths under `config.home`).
    pub config: Config,
    /// When the service started.
    pub started: Instant,
    /// The last CPU reading of each sandbox (for CPU percentages).
    pub cpu_samples: CpuSamples,
    /// Signs and checks export download links.
    pub signer: UrlSigner,
    /// Contexts recorded in the store already, so runs do not write them again.
    pub seen_contexts: SeenContexts,
    /// The models memories use (embeddings, infer) and the infer jobs running here.
    pub memory: crate::memory::MemoryModels,
    /// Where packages installed at create come from (found on first use), and what warm
    /// pools installed.
    pub packages: crate::packages::PackagesState,
    /// Ports made public by their owners (previews without a key or token).
    pub public_ports: crate::previews::PublicPorts,
    /// The writer of egress events to the audit log.
    pub egress_log: crate::network::EgressLog,
    /// Template builds.
    pub builds: crate::templates::Builds,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("home", &self.config.home)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service over a fleet and a store, with these settings and this signing key.
    pub fn new(fleet: Arc<Fleet>, store: Arc<Store>, config: Config, signer: UrlSigner) -> Self {
        let egress_log = crate::network::record_egress(&fleet, &store);
        // A store that cannot be read here fails every request after anyway; the ports stay
        // private meanwhile (never public by mistake).
        let public_ports = crate::previews::PublicPorts::load(&store).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "public preview ports could not be read");
            crate::previews::PublicPorts::default()
        });
        // Build steps run through this binary's `__build-step` (the daemon is `sandcell`).
        let helper = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sandcell"));
        let builds = crate::templates::Builds::new(&config, helper);
        Self {
            builds,
            egress_log,
            fleet,
            store,
            keys: KeyCache::default(),
            metrics: Metrics::default(),
            memory: crate::memory::MemoryModels::from_config(&config, |k| std::env::var(k).ok()),
            config,
            started: Instant::now(),
            cpu_samples: CpuSamples::default(),
            signer,
            seen_contexts: SeenContexts::default(),
            packages: crate::packages::PackagesState::default(),
            public_ports,
        }
    }

    /// Where snapshots are kept.
    pub fn snapshots_dir(&self) -> PathBuf {
        self.config.home.join("snapshots")
    }

    /// Records who did what (best effort: a failed audit write is logged, not fatal).
    pub fn audit(
        &self,
        caller: &Caller,
        action: &str,
        target: Option<&str>,
        detail: serde_json::Value,
    ) {
        let event = sandcell_store::AuditEvent {
            id: 0,
            at: sandcell_engine::fleet::now_ms(),
            owner: Some(caller.owner.clone()),
            key_id: Some(caller.key_id.clone()),
            action: action.to_string(),
            target: target.map(str::to_string),
            detail: (!detail.is_null()).then_some(detail),
            request_id: caller.request_id.clone(),
        };
        if let Err(e) = self.store.audit(&event) {
            tracing::warn!(action, error = %e, "could not record an audit event");
        }
    }
}

/// (sandbox, context) pairs known to be recorded; forgotten wholesale past a bound (a
/// forgotten pair costs one more idempotent write).
#[derive(Debug, Default)]
pub struct SeenContexts(Mutex<HashSet<(String, String)>>);

impl SeenContexts {
    const BOUND: usize = 100_000;

    fn set(&self) -> MutexGuard<'_, HashSet<(String, String)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Known to be recorded.
    pub fn contains(&self, key: &(String, String)) -> bool {
        self.set().contains(key)
    }

    /// Now recorded.
    pub fn insert(&self, key: (String, String)) {
        let mut set = self.set();
        if set.len() >= Self::BOUND {
            set.clear();
        }
        set.insert(key);
    }

    /// No longer open.
    pub fn remove(&self, key: &(String, String)) {
        self.set().remove(key);
    }
}
