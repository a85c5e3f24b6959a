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
}

impl AppState {
    /// A number for the next request's id.
    pub fn next_request_id(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed)
    }
}
