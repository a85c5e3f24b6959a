//! Recovery: after a restart of the service, the sandboxes the previous run left are
//! reattached or marked lost; before a stop, they are detached so that they outlive it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Fleet, Live, POOL_OWNER, RecordQuery, SandboxState, lock, now_ms, persistence};
use crate::error::EngineError;

/// What [`Fleet::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Reached again, running as before.
    pub reattached: Vec<String>,
    /// Could not be reached: ended and marked `lost`.
    pub lost: Vec<String>,
}

impl Fleet {
    /// Brings back the sandboxes a previous run of the service left: each active record is
    /// reattached (its kernels and processes as they were) or, when it cannot be, what is
    /// left of it is ended and the record marked `lost` with the reason. Call once, at start.
    pub async fn recover(&self) -> Result<Recovery, EngineError> {
        let mut recovery = Recovery::default();
        let mut cursor = None;
        let mut records = Vec::new();
        loop {
            let page = self.ledger.list(&RecordQuery {
                states: SandboxState::ACTIVE.to_vec(),
                limit: 500,
                cursor,
                ..RecordQuery::default()
            })?;
            records.extend(page.items);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        for mut record in records {
            if lock(&self.live).contains_key(&record.id) {
                continue;
            }
            if record.owner == POOL_OWNER {
                // A previous run's warm pool: ended, and made again by this run's refill.
                if !record.runtime.is_null() {
                    self.engine.kill_orphan(&record.spec, &record.runtime);
                }
                self.ledger.remove(&record.id).map_err(persistence)?;
                continue;
            }
            let attempt = if record.state == SandboxState::Creating {
                Err("the service stopped while it was being created".to_string())
            } else if record.runtime.is_null() {
                Err("its backend cannot reattach to it".to_string())
            } else {
                self.engine
                    .reattach(record.id.clone(), record.spec.clone(), &record.runtime)
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt {
                Ok(sandbox) => {
                    // The record says whether it is paused: the processes follow it.
                    let paused_at = record.updated_at_ms;
                    let paused = record.state == SandboxState::Paused;
                    if paused && !sandbox.is_paused() {
                        let _ = sandbox.pause().await;
                    } else if !paused && sandbox.is_paused() {
                        let _ = sandbox.resume().await;
                    }
                    record.reason = Some(if paused {
                        "paused; reattached after a restart of the service".into()
                    } else {
                        "reattached after a restart of the service".into()
                    });
                    record.updated_at_ms = now_ms();
                    self.ledger.update(&record).map_err(persistence)?;
                    let live = Arc::new(Live::new(
                        sandbox,
                        record.owner.clone(),
                        record.last_active_ms,
                    ));
                    if paused {
                        live.paused_at.store(paused_at, Ordering::SeqCst);
                    }
                    lock(&self.live).insert(record.id.clone(), live);
                    recovery.reattached.push(record.id);
                }
                Err(why) => {
                    let cleanup = if record.runtime.is_null() {
                        String::new()
                    } else {
                        format!(
                            "; {}",
                            self.engine.kill_orphan(&record.spec, &record.runtime)
                        )
                    };
                    record.state = SandboxState::Lost;
                    record.reason = Some(format!("not reattached after a restart: {why}{cleanup}"));
                    record.updated_at_ms = now_ms();
                    self.ledger.update(&record).map_err(persistence)?;
                    recovery.lost.push(record.id);
                }
            }
        }
        Ok(recovery)
    }

    /// Lets every running sandbox outlive this process, for [`Self::recover`] in the next
    /// one; returns how many. The fleet holds none afterwards.
    pub fn detach_all(&self) -> usize {
        let live: Vec<Arc<Live>> = lock(&self.live).drain().map(|(_, l)| l).collect();
        for l in &live {
            l.sandbox.detach();
            let _ = self.ledger.get(l.sandbox.id()).map(|r| {
                if let Some(mut r) = r {
                    r.last_active_ms = l.last_active.load(Ordering::Relaxed);
                    let _ = self.ledger.update(&r);
                }
            });
        }
        live.len()
    }
}
