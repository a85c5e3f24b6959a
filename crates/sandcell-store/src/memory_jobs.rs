//! Jobs that extract memories from a text with a model (`infer`): their status, the
//! memories they added, why they failed, and which process runs them (`schema.rs`, step 11).

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};

use crate::error::{StoreError, is_unique_violation};
use crate::records::Page;
use crate::store::{Store, page_size, parse_json, string_map_json};

const COLUMNS: &str = "seq, id, owner, sandbox_id, status, model, text, category, metadata, \
                       memories, error, worker, created_at, updated_at";

/// One job as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryJobRecord {
    /// Its place in the store's order (inserts ignore it): listings go newest first by it.
    pub seq: i64,
    /// Unique id, chosen by the service.
    pub id: String,
    /// Whose job it is.
    pub owner: String,
    /// The sandbox whose memories it adds; `None` for the owner's own.
    pub sandbox_id: Option<String>,
    /// `queued`, `running`, `succeeded` or `failed`.
    pub status: String,
    /// The model asked (`provider/model`).
    pub model: String,
    /// The text to extract from.
    pub text: String,
    /// The category of the memories it adds.
    pub category: String,
    /// The metadata of the memories it adds.
    pub metadata: BTreeMap<String, String>,
    /// The ids of the memories it added, in order.
    pub memories: Vec<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// The process running it (the service's own token): a job left `queued` or `running`
    /// by a process that is gone was interrupted.
    pub worker: String,
    /// When it was made (ms).
    pub created_at: i64,
    /// When its status last changed (ms).
    pub updated_at: i64,
}

struct RawJob {
    record: MemoryJobRecord,
    metadata: String,
    memories: String,
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<RawJob> {
    Ok(RawJob {
        record: MemoryJobRecord {
            seq: row.get(0)?,
            id: row.get(1)?,
            owner: row.get(2)?,
            sandbox_id: row.get(3)?,
            status: row.get(4)?,
            model: row.get(5)?,
            text: row.get(6)?,
            category: row.get(7)?,
            metadata: BTreeMap::new(),
            memories: Vec::new(),
            error: row.get(10)?,
            worker: row.get(11)?,
            created_at: row.get(12)?,
            updated_at: row.get(13)?,
        },
        metadata: row.get(8)?,
        memories: row.get(9)?,
    })
}

impl RawJob {
    fn decode(self) -> Result<MemoryJobRecord, StoreError> {
        let mut r = self.record;
        r.metadata = parse_json("memory job", &r.id, "metadata", &self.metadata)?;
        r.memories = parse_json("memory job", &r.id, "memories", &self.memories)?;
        Ok(r)
    }
}

fn ids_json(ids: &[String]) -> String {
    serde_json::Value::from(ids.to_vec()).to_string()
}

impl Store {
    /// Records a new job.
    pub fn insert_memory_job(&self, j: &MemoryJobRecord) -> Result<(), StoreError> {
        let inserted = self
            .conn()
            .prepare_cached(
                "INSERT INTO memory_jobs (id, owner, sandbox_id, status, model, text, category, \
                 metadata, memories, error, worker, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![
                j.id,
                j.owner,
                j.sandbox_id,
                j.status,
                j.model,
                j.text,
                j.category,
                string_map_json(&j.metadata),
                ids_json(&j.memories),
                j.error,
                j.worker,
                j.created_at,
                j.updated_at,
            ]);
        match inserted {
            Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists {
                what: "memory job",
                id: j.id.clone(),
            }),
            other => other.map(drop).map_err(StoreError::from),
        }
    }

    /// The job with this id.
    pub fn get_memory_job(&self, id: &str) -> Result<Option<MemoryJobRecord>, StoreError> {
        self.conn()
            .prepare_cached(&format!("SELECT {COLUMNS} FROM memory_jobs WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?
            .map(RawJob::decode)
            .transpose()
    }

    /// Sets job `id`'s status, memories and error (and `updated_at`), unless it has ended
    /// already (`succeeded` or `failed` are final); whether it changed.
    pub fn update_memory_job(
        &self,
        id: &str,
        status: &str,
        memories: &[String],
        error: Option<&str>,
        at: i64,
    ) -> Result<bool, StoreError> {
        let n = self
            .conn()
            .prepare_cached(
                "UPDATE memory_jobs SET status = ?2, memories = ?3, error = ?4, updated_at = ?5 \
                 WHERE id = ?1 AND status IN ('queued', 'running')",
            )?
            .execute(params![id, status, ids_json(memories), error, at])?;
        Ok(n > 0)
    }

    /// Jobs of one scope (`owner`'s own with `sandbox_id` `None`, else that sandbox's),
    /// newest first; a page of `limit` starting after the job at `before` (a `seq`).
    pub fn list_memory_jobs(
        &self,
        owner: &str,
        sandbox_id: Option<&str>,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Page<MemoryJobRecord>, StoreError> {
        let size = page_size(limit);
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM memory_jobs WHERE owner = ?1 AND sandbox_id IS ?2 \
                 AND (?3 IS NULL OR seq < ?3) ORDER BY seq DESC LIMIT ?4"
            ))?;
            let rows = stmt.query_map(
                params![owner, sandbox_id, before, i64::from(size) + 1],
                from_row,
            )?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let mut items = raws
            .into_iter()
            .map(RawJob::decode)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() > size as usize {
            items.truncate(size as usize);
            items.last().map(|j| j.seq.to_string())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, sandbox: Option<&str>, at: i64) -> MemoryJobRecord {
        MemoryJobRecord {
            seq: 0,
            id: id.into(),
            owner: "alice".into(),
            sandbox_id: sandbox.map(str::to_owned),
            status: "queued".into(),
            model: "openai/m".into(),
            text: "the text".into(),
            category: "general".into(),
            metadata: BTreeMap::from([("k".to_string(), "v".to_string())]),
            memories: Vec::new(),
            error: None,
            worker: "1:2".into(),
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn jobs_are_kept_updated_until_they_end_and_listed_per_scope() {
        let store = Store::open_in_memory().unwrap();
        store.insert_memory_job(&job("inf-1", None, 1)).unwrap();
        store.insert_memory_job(&job("inf-2", None, 2)).unwrap();
        store
            .insert_memory_job(&job("inf-3", Some("sb-a"), 3))
            .unwrap();
        assert!(matches!(
            store.insert_memory_job(&job("inf-1", None, 4)),
            Err(StoreError::AlreadyExists { .. })
        ));
        assert!(
            store
                .update_memory_job("inf-1", "running", &[], None, 5)
                .unwrap()
        );
        let ids = vec!["mem-a".to_string(), "mem-b".to_string()];
        assert!(
            store
                .update_memory_job("inf-1", "succeeded", &ids, None, 6)
                .unwrap()
        );
        // Ended: final.
        assert!(
            !store
                .update_memory_job("inf-1", "failed", &[], Some("late"), 7)
                .unwrap()
        );
        let got = store.get_memory_job("inf-1").unwrap().unwrap();
        assert_eq!(
            (got.status.as_str(), got.memories, got.error, got.updated_at),
            ("succeeded", ids, None, 6)
        );
        assert_eq!(got.metadata["k"], "v");
        assert!(store.get_memory_job("inf-9").unwrap().is_none());

        let page = store.list_memory_jobs("alice", None, 1, None).unwrap();
        assert_eq!(page.items[0].id, "inf-2");
        let before = page.next_cursor.unwrap().parse().unwrap();
        let rest = store
            .list_memory_jobs("alice", None, 10, Some(before))
            .unwrap();
        assert_eq!(rest.items.len(), 1);
        assert_eq!(rest.items[0].id, "inf-1");
        let sb = store
            .list_memory_jobs("alice", Some("sb-a"), 10, None)
            .unwrap();
        assert_eq!(sb.items.len(), 1);
        assert!(
            store
                .list_memory_jobs("bob", None, 10, None)
                .unwrap()
                .items
                .is_empty()
        );
    }
}
