//! Caps: how many sandboxes the service and each owner may have, default lifetimes, and
//! the rules on labels and metadata.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Fleet, POOL_OWNER, persistence};
use crate::error::EngineError;

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

impl Fleet {
    pub(super) fn check_caps(&self, owner: &str) -> Result<(), EngineError> {
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
}

/// The one tag rule (`sandcell_api::rules::check_tags`), as the engine's error.
pub(super) fn check_tags(what: &str, tags: &BTreeMap<String, String>) -> Result<(), EngineError> {
    sandcell_api::rules::check_tags(what, tags).map_err(|e| EngineError::InvalidRequest(e.0))
}
