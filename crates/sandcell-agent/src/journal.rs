//! Writing a run's trajectory: each event is committed to the store (with the run's record
//! when the event changes it) before the run goes on, then appended to the JSONL mirror
//! (`<home>/trajectories/<run>.jsonl`, rebuildable from the store) and sent to live
//! followers.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandcell_api::time::rfc3339;
use sandcell_service::ServiceError;
use sandcell_store::{RunRecord, Store};
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
        // Serialized once: the store keeps this text and the mirror gets the same line.
        let mut line = serde_json::to_string(&event)
            .map_err(|e| ServiceError::internal(format!("an event does not serialize: {e}")))?;
        if with_record {
            self.record.updated_at = now;
        }
        self.store.append_run_event_json(
            &event.run_id,
            event.seq,
            now,
            event.kind.name(),
            &line,
            with_record.then_some(&self.record),
        )?;
        self.seq = event.seq;
        line.push('\n');
        self.mirror(&line);
        // Nobody following is fine.
        let _ = self.live.send(event.clone());
        Ok(event)
    }

    /// Appends `line` (one event and its newline) to the JSONL mirror in one write; a failure
    /// is logged, never the run's end (the store has the event).
    fn mirror(&mut self, line: &str) {
        if self.mirror_file.is_none() {
            let path = self.mirror_path();
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
            // One write: formatting a value straight into the file made a system call per
            // JSON token (hundreds per step).
            Some(f) => f.write_all(line.as_bytes()),
            None => return,
        };
        if let Err(e) = written {
            // Opened again at the next event.
            self.mirror_file = None;
            tracing::warn!(path = %self.mirror_path().display(), error = %e, "the trajectory mirror was not written");
        }
    }

    fn mirror_path(&self) -> PathBuf {
        self.dir.join(format!("{}.jsonl", self.record.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> RunRecord {
        RunRecord {
            id: id.into(),
            owner: "alice".into(),
            root_id: id.into(),
            parent_id: None,
            depth: 0,
            mode: "tools".into(),
            model: "openai/m".into(),
            task: "t".into(),
            sandbox_id: None,
            status: "running".into(),
            reason: None,
            answer: None,
            settings: serde_json::json!({}),
            totals: serde_json::json!({}),
            created_at: 1,
            updated_at: 1,
            ended_at: None,
        }
    }

    #[test]
    fn every_event_is_stored_mirrored_and_sent_as_the_same_json() {
        let home = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open_in_memory().unwrap());
        let (live, mut rx) = broadcast::channel(16);
        let mut j = Journal::create(store.clone(), home.path(), record("run-1"), live).unwrap();
        j.next_step();
        let warning = |m: &str| EventKind::Warning { message: m.into() };
        j.emit(warning("one \"quoted\" é"), false).unwrap();
        j.record.status = "succeeded".into();
        j.emit(warning("two"), true).unwrap();

        let stored = store.run_events("run-1", 0, 0).unwrap();
        assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(stored[0].kind, "warning");
        assert_eq!(stored[0].event["message"], "one \"quoted\" é");
        assert_eq!(stored[1].event["step"], 1);
        // The event that carried the record saved it in the same commit.
        assert_eq!(store.get_run("run-1").unwrap().unwrap().status, "succeeded");

        let mirror =
            std::fs::read_to_string(trajectories_dir(home.path()).join("run-1.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = mirror
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let events: Vec<serde_json::Value> = stored.into_iter().map(|e| e.event).collect();
        assert_eq!(lines, events);
        assert!(mirror.ends_with('\n'));

        for want in &events {
            let sent = serde_json::to_value(rx.try_recv().unwrap()).unwrap();
            assert_eq!(&sent, want);
        }
    }
}
