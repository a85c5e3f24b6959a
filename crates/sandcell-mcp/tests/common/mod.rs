//! What the tests share: a service over the test backend, and callers.

use std::sync::Arc;

use sandcell_engine::Engine;
use sandcell_engine::fleet::Fleet;
use sandcell_service::ledger::StoreLedger;
use sandcell_service::signed_url::UrlSigner;
use sandcell_service::{Caller, Service};
use sandcell_store::Store;
use sandcell_testkit::local::LocalBackend;

/// A service over a fresh home and the test backend.
pub fn service(home: &std::path::Path) -> Arc<Service> {
    service_with(home, &[])
}

/// A service over a fresh home and the test backend, with these settings (dotted key, value).
pub fn service_with(home: &std::path::Path, settings: &[(&str, &str)]) -> Arc<Service> {
    let flags: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (config, _) = sandcell_service::config::load(home, None, &[], &flags).expect("settings");
    let store = Arc::new(Store::open(&config.database).expect("store"));
    let engine = Engine::builder().backend(LocalBackend::new()).build();
    let fleet = Arc::new(Fleet::new(
        engine,
        Arc::new(StoreLedger::new(store.clone())),
        config.fleet_limits(),
    ));
    let signer = UrlSigner::load_or_create(home).expect("signing key");
    Arc::new(Service::new(fleet, store, config, signer))
}

/// The agent runs over `service` (its `[agent]` settings).
#[allow(dead_code)]
pub fn runner(service: &Arc<Service>) -> Arc<sandcell_agent::Runner> {
    Arc::new(sandcell_agent::Runner::from_service(service.clone()).expect("the runner"))
}

pub fn caller(owner: &str) -> Caller {
    Caller {
        owner: owner.into(),
        key_id: format!("key-{owner}"),
        admin: false,
        request_id: None,
    }
}
