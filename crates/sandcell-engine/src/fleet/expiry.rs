//! Expiry: sandboxes that sat idle, outlived their lifetime or lost their agent are stopped.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Fleet, Live, Millis, SandboxRecord, SandboxState, lock, now_ms};

impl Fleet {
    /// Stops every sandbox past its idle timeout or lifetime; returns (id, reason) of each.
    /// Also notices sandboxes that died on their own (their agent went away).
    pub async fn collect_expired(&self) -> Vec<(String, String)> {
        self.collect_expired_at(now_ms()).await
    }

    /// As [`Self::collect_expired`], judging idleness and lifetimes as of `now` (the same
    /// instant an [`Self::expiring`] before it used, so nothing it did not name is stopped).
    pub async fn collect_expired_at(&self, now: Millis) -> Vec<(String, String)> {
        let live: Vec<(String, Arc<Live>)> = lock(&self.live)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut ended = Vec::new();
        for (id, l) in live {
            let Ok(Some(record)) = self.ledger.get(&id) else {
                continue;
            };
            if record.state == SandboxState::Paused {
                if !l.sandbox.is_paused() {
                    // Woken through a handle held since before its pause (a terminal, say):
                    // the record follows.
                    let _ = self.record_resumed(&id, &l);
                }
                // Its clocks did not run while it was paused.
                continue;
            }
            let why = expiry(&record, &l, now);
            if let Some(why) = why
                && self.stop(&id, &why).await.is_ok()
            {
                ended.push((id, why));
            }
        }
        ended
    }

    /// The sandboxes [`Self::collect_expired_at`] would stop as of `now` for idleness or
    /// their lifetime, as (id, owner, why), without stopping them (to snapshot them first).
    pub fn expiring(&self, now: Millis) -> Vec<(String, String, String)> {
        let live: Vec<(String, Arc<Live>)> = lock(&self.live)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        live.into_iter()
            .filter_map(|(id, l)| {
                let record = self.ledger.get(&id).ok()??;
                if record.state == SandboxState::Paused || l.sandbox.is_gone() {
                    return None;
                }
                expiry(&record, &l, now).map(|why| (id, l.owner.clone(), why))
            })
            .collect()
    }
}

/// Why a running sandbox should stop now, if it should.
fn expiry(record: &SandboxRecord, l: &Live, now: Millis) -> Option<String> {
    let idle = now - l.last_active.load(Ordering::Relaxed);
    if record.expires_at_ms.is_some_and(|t| now >= t) {
        Some("its lifetime ended".to_string())
    } else if record
        .idle_timeout_ms
        .is_some_and(|t| idle >= i64::try_from(t).unwrap_or(i64::MAX))
    {
        Some(format!("idle for {} s", idle / 1000))
    } else if l.sandbox.is_gone() {
        Some("its agent went away".to_string())
    } else {
        None
    }
}
