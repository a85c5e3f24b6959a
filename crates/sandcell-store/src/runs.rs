//! Agent runs and their trajectories: one row per run, one per event, the events numbered
//! from 1 without gaps so that a reader can resume at any number and a writer that lost track
//! (two writers, a replay after a crash) is refused rather than interleaved.

use rusqlite::{OptionalExtension, Row, Transaction, params};

use crate::error::{StoreError, is_unique_violation};
use crate::records::{RunEventRecord, RunRecord};
use crate::store::{Store, page_size, parse_json, u64_from_sql, u64_to_sql};

const COLUMNS: &str = "id, owner, root_id, parent_id, depth, mode, model, task, sandbox_id, \
                       status, reason, answer, settings, totals, created_at, updated_at, ended_at";

/// A row before its JSON columns are checked.
struct RawRun {
    record: RunRecord,
    settings: String,
    totals: String,
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<RawRun> {
    Ok(RawRun {
        record: RunRecord {
            id: row.get(0)?,
            owner: row.get(1)?,
            root_id: row.get(2)?,
            parent_id: row.get(3)?,
            depth: row.get(4)?,
            mode: row.get(5)?,
            model: row.get(6)?,
            task: row.get(7)?,
            sandbox_id: row.get(8)?,
            status: row.get(9)?,
            reason: row.get(10)?,
            answer: row.get(11)?,
            settings: serde_json::Value::Null,
            totals: serde_json::Value::Null,
            created_at: row.get(14)?,
            updated_at: row.get(15)?,
            ended_at: row.get(16)?,
        },
        settings: row.get(12)?,
        totals: row.get(13)?,
    })
}

impl RawRun {
    fn decode(self) -> Result<RunRecord, StoreError> {
        let mut r = self.record;
        r.settings = parse_json("run", &r.id, "settings", &self.settings)?;
        r.totals = parse_json("run", &r.id, "totals", &self.totals)?;
        Ok(r)
    }
}

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<(String, i64, i64, String, String)> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

fn update_run_in(tx: &Transaction<'_>, r: &RunRecord) -> Result<(), StoreError> {
    let changed = tx
        .prepare_cached(
            "UPDATE runs SET sandbox_id = ?2, status = ?3, reason = ?4, answer = ?5, \
             totals = ?6, updated_at = ?7, ended_at = ?8 WHERE id = ?1",
        )?
        .execute(params![
            r.id,
            r.sandbox_id,
            r.status,
            r.reason,
            r.answer,
            r.totals.to_string(),
            r.updated_at,
            r.ended_at,
        ])?;
    if changed == 0 {
        return Err(StoreError::NotFound {
            what: "run",
            id: r.id.clone(),
        });
    }
    Ok(())
}

impl Store {
    /// Records a new run.
    pub fn insert_run(&self, r: &RunRecord) -> Result<(), StoreError> {
        let inserted = self
            .conn()
            .prepare_cached(&format!(
                "INSERT INTO runs ({COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
            ))?
            .execute(params![
                r.id,
                r.owner,
                r.root_id,
                r.parent_id,
                r.depth,
                r.mode,
                r.model,
                r.task,
                r.sandbox_id,
                r.status,
                r.reason,
                r.answer,
                r.settings.to_string(),
                r.totals.to_string(),
                r.created_at,
                r.updated_at,
                r.ended_at,
            ]);
        match inserted {
            Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists {
                what: "run",
                id: r.id.clone(),
            }),
            other => other.map(drop).map_err(StoreError::from),
        }
    }

    /// Saves what changes as a run goes (sandbox, status, reason, answer, totals, times);
    /// what it was started with never changes.
    pub fn update_run(&self, r: &RunRecord) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        update_run_in(&tx, r)?;
        tx.commit()?;
        Ok(())
    }

    /// The run with this id, if any.
    pub fn get_run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.conn()
            .prepare_cached(&format!("SELECT {COLUMNS} FROM runs WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?
            .map(RawRun::decode)
            .transpose()
    }

    /// Runs of `owner` (everyone's when `None`), newest first, at most `limit` (0: the
    /// default page), started before `before` (ms) when given.
    pub fn list_runs(
        &self,
        owner: Option<&str>,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM runs WHERE (?1 IS NULL OR owner = ?1) \
             AND (?2 IS NULL OR created_at < ?2) ORDER BY created_at DESC, id DESC LIMIT ?3"
        );
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![owner, before, page_size(limit)], from_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(RawRun::decode).collect()
    }

    /// Every run in `status` (the daemon's restart looks for `running` ones), oldest first.
    pub fn runs_with_status(&self, status: &str) -> Result<Vec<RunRecord>, StoreError> {
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM runs WHERE status = ?1 ORDER BY created_at, id"
            ))?;
            let rows = stmt.query_map([status], from_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(RawRun::decode).collect()
    }

    /// The runs started by run `id` as its sub-runs, oldest first.
    pub fn child_runs(&self, id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM runs WHERE parent_id = ?1 ORDER BY created_at, id"
            ))?;
            let rows = stmt.query_map([id], from_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(RawRun::decode).collect()
    }

    /// Appends an event to its run's trajectory, and saves `run` with it in the same
    /// transaction when given (an event that ends a run and the run's end are one commit).
    /// The event's number must be one more than the run's last.
    pub fn append_run_event(
        &self,
        e: &RunEventRecord,
        run: Option<&RunRecord>,
    ) -> Result<(), StoreError> {
        let json = e.event.to_string();
        self.append_run_event_json(&e.run_id, e.seq, e.at, &e.kind, &json, run)
    }

    /// [`Store::append_run_event`] for an event the caller has serialized already (`json`,
    /// one JSON object): a writer that also mirrors the event writes it once, not twice.
    pub fn append_run_event_json(
        &self,
        run_id: &str,
        seq: u64,
        at: i64,
        kind: &str,
        json: &str,
        run: Option<&RunRecord>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let last: i64 = tx
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE run_id = ?1")?
            .query_row([run_id], |row| row.get(0))?;
        let last = u64_from_sql("run", run_id, "seq", Some(last))?.unwrap_or(0);
        if seq != last + 1 {
            return Err(StoreError::OutOfSequence {
                run_id: run_id.to_string(),
                seq,
                last,
            });
        }
        tx.prepare_cached(
            "INSERT INTO run_events (run_id, seq, at, kind, event) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![run_id, u64_to_sql(Some(seq))?, at, kind, json])?;
        if let Some(r) = run {
            update_run_in(&tx, r)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Events of run `id` after number `after` (0: from the first), at most `limit` (0: the
    /// default page), in order.
    pub fn run_events(
        &self,
        id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<RunEventRecord>, StoreError> {
        let rows = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(
                "SELECT run_id, seq, at, kind, event FROM run_events \
                 WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(
                params![
                    id,
                    u64_to_sql(Some(after.min(i64::MAX as u64)))?,
                    page_size(limit)
                ],
                event_from_row,
            )?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        rows.into_iter()
            .map(|(run_id, seq, at, kind, event)| {
                Ok(RunEventRecord {
                    seq: u64_from_sql("run", &run_id, "seq", Some(seq))?.unwrap_or(0),
                    event: parse_json("run", &run_id, "event", &event)?,
                    run_id,
                    at,
                    kind,
                })
            })
            .collect()
    }

    /// The number of run `id`'s last event (0: none).
    pub fn last_run_seq(&self, id: &str) -> Result<u64, StoreError> {
        let last: i64 = self
            .conn()
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE run_id = ?1")?
            .query_row([id], |row| row.get(0))?;
        Ok(u64_from_sql("run", id, "seq", Some(last))?.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(id: &str, owner: &str, at: i64) -> RunRecord {
        RunRecord {
            id: id.into(),
            owner: owner.into(),
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
            settings: json!({"max_iterations": 10}),
            totals: json!({}),
            created_at: at,
            updated_at: at,
            ended_at: None,
        }
    }

    fn event(run_id: &str, seq: u64) -> RunEventRecord {
        RunEventRecord {
            run_id: run_id.into(),
            seq,
            at: 5,
            kind: "note".into(),
            event: json!({"seq": seq}),
        }
    }

    #[test]
    fn runs_round_trip_list_newest_first_and_by_owner() {
        let s = Store::open_in_memory().unwrap();
        s.insert_run(&run("run-a", "alice", 1)).unwrap();
        s.insert_run(&run("run-b", "alice", 2)).unwrap();
        s.insert_run(&run("run-c", "bob", 3)).unwrap();
        assert!(matches!(
            s.insert_run(&run("run-a", "alice", 4)),
            Err(StoreError::AlreadyExists { .. })
        ));
        let ids = |v: Vec<RunRecord>| v.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(
            ids(s.list_runs(Some("alice"), 0, None).unwrap()),
            ["run-b", "run-a"]
        );
        assert_eq!(ids(s.list_runs(None, 1, None).unwrap()), ["run-c"]);
        assert_eq!(
            ids(s.list_runs(Some("alice"), 0, Some(2)).unwrap()),
            ["run-a"]
        );

        let mut r = s.get_run("run-a").unwrap().unwrap();
        assert_eq!(r.settings["max_iterations"], 10);
        r.status = "succeeded".into();
        r.answer = Some("42".into());
        r.totals = json!({"input_tokens": 300});
        r.ended_at = Some(9);
        s.update_run(&r).unwrap();
        assert_eq!(s.get_run("run-a").unwrap().unwrap(), r);
        assert_eq!(
            ids(s.runs_with_status("running").unwrap()),
            ["run-b", "run-c"]
        );
        assert!(matches!(
            s.update_run(&run("run-x", "alice", 1)),
            Err(StoreError::NotFound { .. })
        ));
    }

    #[test]
    fn events_are_numbered_without_gaps_and_read_from_any_number() {
        let s = Store::open_in_memory().unwrap();
        s.insert_run(&run("run-a", "alice", 1)).unwrap();
        assert_eq!(s.last_run_seq("run-a").unwrap(), 0);
        s.append_run_event(&event("run-a", 1), None).unwrap();
        // A gap and a repeat are both refused, and nothing of them is kept.
        for bad in [3, 1] {
            assert!(matches!(
                s.append_run_event(&event("run-a", bad), None),
                Err(StoreError::OutOfSequence { last: 1, .. })
            ));
        }
        let mut done = s.get_run("run-a").unwrap().unwrap();
        done.status = "succeeded".into();
        s.append_run_event(&event("run-a", 2), Some(&done)).unwrap();
        assert_eq!(s.get_run("run-a").unwrap().unwrap().status, "succeeded");
        let seqs = |after| {
            s.run_events("run-a", after, 0)
                .unwrap()
                .into_iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>()
        };
        assert_eq!(seqs(0), [1, 2]);
        assert_eq!(seqs(1), [2]);
        assert_eq!(s.run_events("run-a", 0, 0).unwrap()[1].event["seq"], 2);
        // A number past any event (past SQLite's integers, too) is the empty end.
        assert!(s.run_events("run-a", u64::MAX, 0).unwrap().is_empty());
        // An event whose run update fails is not kept either.
        assert!(
            s.append_run_event(&event("run-a", 3), Some(&run("run-x", "a", 1)))
                .is_err()
        );
        assert_eq!(s.last_run_seq("run-a").unwrap(), 2);
    }

    #[test]
    fn an_event_serialized_by_its_writer_is_kept_as_written() {
        let s = Store::open_in_memory().unwrap();
        s.insert_run(&run("run-a", "alice", 1)).unwrap();
        let text = r#"{"seq":1,"type":"note","text":"é \"q\""}"#;
        s.append_run_event_json("run-a", 1, 7, "note", text, None)
            .unwrap();
        assert!(matches!(
            s.append_run_event_json("run-a", 3, 7, "note", text, None),
            Err(StoreError::OutOfSequence { last: 1, .. })
        ));
        // Text that is not JSON is refused, and the number stays free.
        assert!(
            s.append_run_event_json("run-a", 2, 7, "note", "{not json", None)
                .is_err()
        );
        let e = &s.run_events("run-a", 0, 0).unwrap()[0];
        assert_eq!((e.seq, e.at, e.kind.as_str()), (1, 7, "note"));
        assert_eq!(
            e.event,
            serde_json::from_str::<serde_json::Value>(text).unwrap()
        );
        assert_eq!(s.last_run_seq("run-a").unwrap(), 1);
    }
}
