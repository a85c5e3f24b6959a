//! What every handler shares.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sandcell_engine::fleet::Fleet;
use sandcell_store::Store;

use crate::auth::KeyCache;
use crate::config::Config;
use crate::metrics::Metrics;

/// The service's state, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The sandboxes.
    pub fleet: Arc<Fleet>,
    /// The records (keys, exports, audit; the fleet's go through it too).
    pub store: Arc<Store>,
    /// API key lookups.
    pub keys: Arc<KeyCache>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// The settings in force.
    pub config: Arc<Config>,
    /// When the service started.
    pub started: Instant,
    /// The last CPU reading of each sandbox (for CPU percentages).
    pub cpu_samples: Arc<crate::api::usage::CpuSamples>,
    /// Requests seen (for request ids).
    pub requests: Arc<AtomicU64>,
    /// Signs and checks export download links.
    pub signer: Arc<crate::signed_url::UrlSigner>,
    /// Contexts recorded in the store already, so runs do not write them again.
    pub seen_contexts: Arc<SeenContexts>,
}

/// (sandbox, context) pairs known to be recorded; forgotten wholesale past a bound (a
/// forgotten pair costs one more idempotent write).
#[derive(Debug, Default)]
pub struct SeenContexts(std::sync::Mutex<std::collections::HashSet<(String, String)>>);

impl SeenContexts {
    const BOUND: usize = 100_000;

    fn set(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<(String, String)>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

impl AppState {
    /// A number for the next request's id.
    pub fn next_request_id(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed)
    }
}
