//! A sandbox's resource use.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A CPU sample older than this is not used for the percentage (a fresh pair is taken).
pub const SAMPLE_MAX_AGE: Duration = Duration::from_secs(60);

/// The last CPU reading of each sandbox, so a percentage covers the time since the last call.
#[derive(Debug, Default)]
pub struct CpuSamples(Mutex<HashMap<String, (Instant, u64)>>);

impl CpuSamples {
    /// Records `now` as `id`'s last reading; returns the one before.
    pub fn swap(&self, id: &str, now: (Instant, u64)) -> Option<(Instant, u64)> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Keeps the map from growing with sandboxes long gone.
        if map.len() > 10_000 {
            map.retain(|_, (at, _)| at.elapsed() < SAMPLE_MAX_AGE);
        }
        map.insert(id.to_string(), now)
    }
}
