//! One timed scenario of `bench daemon`: its key, its name and its samples.

use std::time::Duration;

use serde_json::{Value, json};

use super::server::DEFAULT_BACKEND;
use crate::bench::stats::{mean, quantile};

/// One timed scenario.
pub(super) struct Row {
    pub(super) key: String,
    pub(super) name: String,
    pub(super) samples: Vec<Duration>,
}

impl Row {
    pub(super) fn new(key: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            name: name.into(),
            samples: Vec::new(),
        }
    }

    /// A row of a scenario run on `backend`: the key gets `_<backend>` (none for the
    /// default backend), the name ` (<backend>)`.
    pub(super) fn on(backend: &str, key: &str, name: &str) -> Self {
        let key = if backend == DEFAULT_BACKEND {
            key.to_string()
        } else {
            format!("{key}_{backend}")
        };
        Self::new(key, format!("{name} ({backend})"))
    }

    pub(super) fn median(&self) -> f64 {
        quantile(&self.samples, 0.5)
    }

    pub(super) fn p99(&self) -> f64 {
        quantile(&self.samples, 0.99)
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "key": self.key, "scenario": self.name, "runs": self.samples.len(),
            "median_ms": self.median(), "p99_ms": self.p99(), "mean_ms": mean(&self.samples),
        })
    }
}
