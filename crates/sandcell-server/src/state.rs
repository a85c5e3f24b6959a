//! What every handler shares: the service, and what only HTTP needs.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sandcell_agent::Runner;
use sandcell_service::Service;

/// The server's state, cheap to clone: the typed service every handler calls, and the agent
/// runs over it.
#[derive(Clone)]
pub struct AppState {
    /// The operations.
    pub service: Arc<Service>,
    /// Agent runs (`/v1/runs`, the MCP agent tools).
    pub runner: Arc<Runner>,
    /// Requests seen (for request ids).
    pub requests: Arc<AtomicU64>,
}

impl AppState {
    /// State over a service and the runs over it.
    pub fn new(service: Arc<Service>, runner: Arc<Runner>) -> Self {
        Self {
            service,
            runner,
            requests: Arc::new(AtomicU64::new(1)),
        }
    }

    /// A number for the next request's id.
    pub fn next_request_id(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed)
    }
}

impl Deref for AppState {
    type Target = Service;

    fn deref(&self) -> &Service {
        &self.service
    }
}
