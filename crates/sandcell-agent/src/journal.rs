//! Writing a run's trajectory: each event is committed to the store (with the run's record
//! when the event changes it) before the run goes on, then appended to the JSONL mirror
//! (`<home>/trajectories/<run>.jsonl`, rebuildable from the store) and sent to live
//! followers.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandcell_api::time::rfc3339;
use sandcell_service::ServiceError;
use sandcell_store::{RunEventRecord, RunRecord, Store};
use tokio::sync::broadcast;

use crate::event::{EVENT_VERSION, Event, EventKind};

/// The folder of the trajectories' mirrors and artifacts.
pub fn trajectories_dir(home: &Path) -> PathBuf {
    home.join("trajectories")
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One run's trajectory writer, and its record as it stands.
#[derive(Debug)]
pub struct Journal {
    store: Arc<Store>,
    dir: PathBuf,
    /// The run's record, saved with the events that change it.
    pub record: RunRecord,
    seq: u64,
    step: u32,
    live: broadcast::Sender<Event>,
    /// The mirror, opened at the first event and kept open (one open per event showed in
    /// the per-step cost).
    mirror_file: Option<std::fs::File>,
}

impl Journal {
    /// Records a new run and opens its trajectory.
    pub fn create(
        store: Arc<Store>,
        home: &Path,
        record: RunRecord,
        live: broadcast::Sender<Event>,
    ) -> Result<Self, ServiceError> {
        store.insert_run(&record)?;
        Ok(Self {
            store,
            dir: trajectories_dir(home),
            record,
            seq: 0,
            step: 0,
            live,
            mirror_file: None,
        })
    }

    /// Opens the trajectory of a run recorded earlier (resumed after a restart) to go on
    /// after event `seq`, filing under `step`.
    pub fn reopen(
        store: Arc<Store>,
        home: &Path,
        record: RunRecord,
        live: broadcast::Sender<Event>,
        seq: u64,
        step: u32,
    ) -> Self {
        Self {
            store,
            dir: trajectories_dir(home),
            record,
            seq,
            step,
            live,
            mirror_file: None,
        }
    }

    /// The step events are filed under now.
    pub fn step(&self) -> u32 {
        self.step
    }

    /// Moves on to the next step.
    pub fn next_step(&mut self) -> u32 {
        self.step += 1;
        self.step
    }

    /// The folder of this run's artifacts (made on first use).
    pub fn artifacts_dir(&self) -> PathBuf {
        self.dir.join(&self.record.id)
    }

    /// Writes an event (and the run's record with it when `with_record`).
    pub fn emit(&mut self, kind: EventKind, with_record: bool) -> Result<Event, ServiceError> {
        let now = now_ms();
        let event = Event {
            v: EVENT_VERSION,
            run_id: self.record.id.clone(),
            root_run_id: self.record.root_id.clone(),
            seq: self.seq + 1,
            ts: rfc3339(now),
            step: self.step,
            depth: self.record.depth,
            kind,
        };
        let value = serde_json::to_value(&event)
            .map_err(|e| ServiceError::internal(format!("an event does not serialize: {e}")))?;
        if with_record {
            self.record.updated_at = now;
        }
        self.store.append_run_event(
            &RunEventRecord {
                run_id: event.run_id.clone(),
                seq: event.seq,
                at: now,
                kind: event.kind.name().to_string(),
                event: value.clone(),
            },
            with_record.then_some(&self.record),
        )?;
        self.seq = event.seq;
        self.mirror(&value);
        // Nobody following is fine.
        let _ = self.live.send(event.clone());
        Ok(event)
    }

    /// Appends to the JSONL mirror; a failure is logged, never the run's end (the store has
    /// the event).
    fn mirror(&mut self, value: &serde_json::Value) {
        let path = self.dir.join(format!("{}.jsonl", self.record.id));
        if self.mirror_file.is_none() {
            let opened = std::fs::create_dir_all(&self.dir).and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
            });
            match opened {
                Ok(f) => self.mirror_file = Some(f),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "the trajectory mirror was not opened");
                    return;
                }
            }
        }
        let written = match self.mirror_file.as_mut() {
            Some(f) => writeln!(f, "{value}"),
            None => return,
        };
        if let Err(e) = written {
            // Opened again at the next event.
            self.mirror_file = None;
            tracing::warn!(path = %path.display(), error = %e, "the trajectory mirror was not written");
        }
    }
}
