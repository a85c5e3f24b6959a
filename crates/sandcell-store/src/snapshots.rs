//! Snapshots, their lineage, and the snapshot each sandbox came from.

use rusqlite::{OptionalExtension, Row, params, params_from_iter};

use crate::error::{StoreError, is_unique_violation};
use crate::records::{AutoSnapshotRecord, SnapshotRecord};
use crate::store::{
    Store, owner_and_sandbox, parse_json, string_map_json, u64_from_sql, u64_to_sql,
};

const COLUMNS: &str = "id, owner, sandbox_id, parent_id, name, description, tags, fidelity, \
                       created_at, size, manifest, path";

/// A row before its JSON columns and size are checked.
struct RawSnapshot {
    record: SnapshotRecord,
    tags: String,
    size: i64,
    manifest: String,
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<RawSnapshot> {
    Ok(RawSnapshot {
        record: SnapshotRecord {
            id: row.get(0)?,
            owner: row.get(1)?,
            sandbox_id: row.get(2)?,
            parent_id: row.get(3)?,
            name: row.get(4)?,
            description: row.get(5)?,
            tags: Default::default(),
            fidelity: row.get(7)?,
            created_at: row.get(8)?,
            size: 0,
            manifest: serde_json::Value::Null,
            path: row.get(11)?,
        },
        tags: row.get(6)?,
        size: row.get(9)?,
        manifest: row.get(10)?,
    })
}

impl RawSnapshot {
    fn decode(self) -> Result<SnapshotRecord, StoreError> {
        let mut r = self.record;
        r.tags = parse_json("snapshot", &r.id, "tags", &self.tags)?;
        r.manifest = parse_json("snapshot", &r.id, "manifest", &self.manifest)?;
        r.size = u64_from_sql("snapshot", &r.id, "size", Some(self.size))?.unwrap_or(0);
        Ok(r)
    }
}

impl Store {
    /// Records a whole snapshot.
    pub fn insert_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        let inserted = self
            .conn()
            .prepare_cached(&format!(
                "INSERT INTO snapshots ({COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            ))?
            .execute(params![
                s.id,
                s.owner,
                s.sandbox_id,
                s.parent_id,
                s.name,
                s.description,
                string_map_json(&s.tags),
                s.fidelity,
                s.created_at,
                u64_to_sql(Some(s.size))?,
                s.manifest.to_string(),
                s.path,
            ]);
        match inserted {
            Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists {
                what: "snapshot",
                id: s.id.clone(),
            }),
            other => other.map(drop).map_err(StoreError::from),
        }
    }

    /// The snapshot with this id, if any.
    pub fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        self.conn()
            .prepare_cached(&format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?
            .map(RawSnapshot::decode)
            .transpose()
    }

    /// Snapshots of `owner` (or everyone's), of `sandbox_id` (or any sandbox), oldest first.
    pub fn list_snapshots(
        &self,
        owner: Option<&str>,
        sandbox_id: Option<&str>,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let (where_clause, values) = owner_and_sandbox(owner, sandbox_id);
        let sql = format!("SELECT {COLUMNS} FROM snapshots{where_clause} ORDER BY created_at, id");
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params_from_iter(values.iter()), from_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(RawSnapshot::decode).collect()
    }

    /// Ids of the snapshots taken of sandboxes that came from snapshot `id` (its children).
    pub fn snapshot_children(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id FROM snapshots WHERE parent_id = ?1 ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([id], |row| row.get(0))?;
        Ok(rows.collect::<Result<Vec<String>, _>>()?)
    }

    /// Ids of the sandboxes restored or forked from snapshot `id`.
    pub fn sandboxes_from_snapshot(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT sandbox_id FROM sandbox_origins WHERE snapshot_id = ?1 ORDER BY sandbox_id",
        )?;
        let rows = stmt.query_map([id], |row| row.get(0))?;
        Ok(rows.collect::<Result<Vec<String>, _>>()?)
    }

    /// Deletes a snapshot record (not its files). Returns whether it existed.
    pub fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let sandbox: Option<String> = tx
            .prepare_cached("SELECT sandbox_id FROM snapshots WHERE id = ?1")?
            .query_row([id], |row| row.get(0))
            .optional()?;
        let changed = tx
            .prepare_cached("DELETE FROM snapshots WHERE id = ?1")?
            .execute([id])?;
        // Memory rows kept only for this snapshot go with it.
        if let Some(sandbox) = sandbox {
            crate::memories::purge_unneeded_memories(&tx, &sandbox)?;
        }
        tx.commit()?;
        Ok(changed > 0)
    }

    /// Records that sandbox `sandbox_id` was restored or forked from snapshot `snapshot_id`.
    pub fn set_sandbox_origin(
        &self,
        sandbox_id: &str,
        snapshot_id: &str,
    ) -> Result<(), StoreError> {
        self.conn()
            .prepare_cached(
                "INSERT OR REPLACE INTO sandbox_origins (sandbox_id, snapshot_id) VALUES (?1, ?2)",
            )?
            .execute([sandbox_id, snapshot_id])?;
        Ok(())
    }

    /// The snapshot sandbox `sandbox_id` came from, if any.
    pub fn sandbox_origin(&self, sandbox_id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn()
            .prepare_cached("SELECT snapshot_id FROM sandbox_origins WHERE sandbox_id = ?1")?
            .query_row([sandbox_id], |row| row.get(0))
            .optional()?)
    }

    /// Sets (replaces) a sandbox's automatic snapshots.
    pub fn set_auto_snapshot(&self, a: &AutoSnapshotRecord) -> Result<(), StoreError> {
        self.conn()
            .prepare_cached(
                "INSERT OR REPLACE INTO auto_snapshots \
                 (sandbox_id, owner, interval_ms, before_reclaim, keep, last_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                a.sandbox_id,
                a.owner,
                u64_to_sql(a.interval_ms)?,
                a.before_reclaim,
                a.keep,
                a.last_at,
            ])?;
        Ok(())
    }

    /// A sandbox's automatic snapshots, if it has any.
    pub fn auto_snapshot(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<AutoSnapshotRecord>, StoreError> {
        Ok(self
            .conn()
            .prepare_cached(
                "SELECT sandbox_id, owner, interval_ms, before_reclaim, keep, last_at \
                 FROM auto_snapshots WHERE sandbox_id = ?1",
            )?
            .query_row([sandbox_id], auto_from_row)
            .optional()?)
    }

    /// Every sandbox's automatic snapshots.
    pub fn auto_snapshots(&self) -> Result<Vec<AutoSnapshotRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT sandbox_id, owner, interval_ms, before_reclaim, keep, last_at \
             FROM auto_snapshots ORDER BY sandbox_id",
        )?;
        let rows = stmt.query_map([], auto_from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Forgets a sandbox's automatic snapshots (not the snapshots).
    pub fn delete_auto_snapshot(&self, sandbox_id: &str) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached("DELETE FROM auto_snapshots WHERE sandbox_id = ?1")?
            .execute([sandbox_id])?;
        Ok(changed > 0)
    }
}

fn auto_from_row(row: &Row<'_>) -> rusqlite::Result<AutoSnapshotRecord> {
    let interval: Option<i64> = row.get(2)?;
    Ok(AutoSnapshotRecord {
        sandbox_id: row.get(0)?,
        owner: row.get(1)?,
        interval_ms: interval.and_then(|v| u64::try_from(v).ok()),
        before_reclaim: row.get(3)?,
        keep: row.get(4)?,
        last_at: row.get(5)?,
    })
}
