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

/// A service over a fresh home and an engine without backends: for operations that need no
/// sandbox (keys, stored exports, reports).
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use sandcell_engine::Engine;
    use sandcell_engine::fleet::Fleet;
    use sandcell_store::Store;

    use crate::ledger::StoreLedger;
    use crate::signed_url::UrlSigner;
    use crate::{Caller, Service};

    /// The service and the home it lives in (removed when dropped).
    pub(crate) struct Harness {
        pub(crate) service: Service,
        pub(crate) _home: tempfile::TempDir,
    }

    /// A service with these settings (`exports.url_ttl_secs`, …).
    pub(crate) fn service(settings: &[(&str, &str)]) -> Harness {
        let home = tempfile::tempdir().expect("a home folder");
        let flags: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (config, _) =
            crate::config::load(home.path(), None, &[], &flags).expect("the settings");
        let store = Arc::new(Store::open(&config.database).expect("the store"));
        let fleet = Arc::new(Fleet::new(
            Engine::builder().build(),
            Arc::new(StoreLedger::new(store.clone())),
            config.fleet_limits(),
        ));
        let signer = UrlSigner::with_key([3; 32]);
        Harness {
            service: Service::new(fleet, store, config, signer),
            _home: home,
        }
    }

    /// A caller of `owner` (an admin one when `admin`).
    pub(crate) fn caller(owner: &str, admin: bool) -> Caller {
        Caller {
            owner: owner.into(),
            key_id: format!("key-{owner}"),
            admin,
            request_id: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{caller, service};

    #[test]
    fn the_report_names_the_caller_and_the_engines_backends() {
        let h = service(&[]);
        let info = h.service.system_info(&caller("alice", true)).unwrap();
        assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            (info.caller.owner.as_str(), info.caller.admin),
            ("alice", true)
        );
        assert_eq!(info.running, 0);
        // This engine was given no backend: none is reported.
        assert!(info.backends.is_empty());
        let text = h.service.metrics_text();
        assert!(
            text.contains("sandcell_sandboxes{state=\"running\"} 0"),
            "{text}"
        );
    }
}
