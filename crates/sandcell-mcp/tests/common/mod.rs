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
    let (config, _) = sandcell_service::config::load(home, None, &[], &[]).expect("settings");
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

pub fn caller(owner: &str) -> Caller {
    Caller {
        owner: owner.into(),
        key_id: format!("key-{owner}"),
        admin: false,
        request_id: None,
    }
}
