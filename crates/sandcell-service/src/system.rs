//! The service itself: the `GET /v1/system` report (version, uptime, backends from the
//! engine, the caller) and the Prometheus metrics text.

use sandcell_api::system::{BackendInfo, CallerInfo, SystemInfo};
use sandcell_engine::BackendCapabilities;
use sandcell_engine::fleet::SandboxState;

use crate::{Caller, Service, ServiceResult};

/// What the API says about a backend.
pub fn backend_info(c: BackendCapabilities) -> BackendInfo {
    BackendInfo {
        kind: c.kind.as_str().to_string(),
        available: c.available,
        isolation_level: c.isolation_level.as_str().to_string(),
        supports_pause: c.supports_pause,
        checkpoint_fidelity: c.checkpoint_fidelity.as_str().to_string(),
        host: c.host,
    }
}

/// The states `/metrics` counts sandboxes in.
const COUNTED_STATES: [SandboxState; 6] = [
    SandboxState::Creating,
    SandboxState::Running,
    SandboxState::Paused,
    SandboxState::Stopped,
    SandboxState::Failed,
    SandboxState::Lost,
];

impl Service {
    /// Version, uptime, sandboxes running, the backends this engine was given and what
    /// each offers on this host, and who is asking.
    pub fn system_info(&self, caller: &Caller) -> ServiceResult<SystemInfo> {
        Ok(SystemInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_secs: self.started.elapsed().as_secs(),
            running: self.fleet.running() as u64,
            backends: self
                .fleet
                .engine()
                .capabilities()
                .into_iter()
                .map(backend_info)
                .collect(),
            caller: CallerInfo {
                owner: caller.owner.clone(),
                key_id: caller.key_id.clone(),
                admin: caller.admin,
            },
        })
    }

    /// The service's counters in Prometheus' text format (every owner's sandboxes: front
    /// ends decide who may read it).
    pub fn metrics_text(&self) -> String {
        let states: Vec<(&str, u64)> = COUNTED_STATES
            .iter()
            .map(|state| {
                let n = self
                    .store
                    .count_sandboxes(None, &[state.as_str()])
                    .unwrap_or(0);
                (state.as_str(), n)
            })
            .collect();
        let pools = self.fleet.pool_ready_counts();
        self.metrics.render(&states, &pools)
    }
}
