//! The lifecycle tick: what the daemon's loop runs every `limits.gc_interval_secs`.

use std::sync::atomic::Ordering;

use crate::Service;

/// What one tick did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tick {
    /// Sandboxes stopped (id, why).
    pub stopped: Vec<(String, String)>,
}

impl Service {
    /// One round of the lifecycle as of `now` (ms since the epoch): automatic snapshots
    /// first (some of the sandboxes are about to be stopped), then idle and expired
    /// sandboxes stopped. One instant for both, so no sandbox is stopped that was not
    /// snapshotted first.
    pub async fn tick(&self, now: i64) -> Tick {
        self.auto_snapshot_round(now).await;
        let stopped = self.fleet.collect_expired_at(now).await;
        for (id, why) in &stopped {
            self.metrics.expired.fetch_add(1, Ordering::Relaxed);
            tracing::info!(sandbox = %id, reason = %why, "sandbox stopped by its lifecycle");
        }
        // Off the writes' path: commits no longer checkpoint the log themselves (the daemon
        // defers them), so the log is copied back here, once a tick.
        if let Err(e) = self.store.checkpoint() {
            tracing::warn!(error = %e, "the store's log was not checkpointed");
        }
        Tick { stopped }
    }
}
