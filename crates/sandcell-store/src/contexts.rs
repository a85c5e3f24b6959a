//! The contexts (kernels) of sandboxes: when each began and ended, and why.

use rusqlite::{Connection, Row, params};

use crate::error::StoreError;
use crate::records::ContextRecord;
use crate::store::Store;

const COLUMNS: &str = "sandbox_id, id, owner, language, cwd, created_at, ended_at, end_reason";

/// Sandbox states after which no context runs: a transition into one ends them all.
pub(crate) const ENDED_STATES: [&str; 3] = ["stopped", "failed", "lost"];

fn from_row(row: &Row<'_>) -> rusqlite::Result<ContextRecord> {
    Ok(ContextRecord {
        sandbox_id: row.get(0)?,
        id: row.get(1)?,
        owner: row.get(2)?,
        language: row.get(3)?,
        cwd: row.get(4)?,
        created_at: row.get(5)?,
        ended_at: row.get(6)?,
        end_reason: row.get(7)?,
    })
}

/// Ends every open context of `sandbox_id` (within the caller's transaction).
pub(crate) fn end_all(
    conn: &Connection,
    sandbox_id: &str,
    at_ms: i64,
    reason: &str,
) -> Result<usize, StoreError> {
    Ok(conn
        .prepare_cached(
            "UPDATE contexts SET ended_at = ?2, end_reason = ?3 \
             WHERE sandbox_id = ?1 AND ended_at IS NULL",
        )?
        .execute(params![sandbox_id, at_ms, reason])?)
}

impl Store {
    /// Records a new context; one of the same id in that sandbox is replaced (a context
    /// made again after the first ended, or a sandbox's default context seen again).
    pub fn insert_context(&self, context: &ContextRecord) -> Result<(), StoreError> {
        self.conn()
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO contexts ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))?
            .execute(params![
                context.sandbox_id,
                context.id,
                context.owner,
                context.language,
                context.cwd,
                context.created_at,
                context.ended_at,
                context.end_reason,
            ])?;
        Ok(())
    }

    /// Records a context unless its sandbox already has an open one of that id; true when
    /// it did.
    pub fn insert_context_if_absent(&self, context: &ContextRecord) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached(&format!(
                "INSERT INTO contexts ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                 ON CONFLICT (sandbox_id, id) DO UPDATE SET owner = excluded.owner, \
                 language = excluded.language, cwd = excluded.cwd, \
                 created_at = excluded.created_at, ended_at = NULL, end_reason = NULL \
                 WHERE contexts.ended_at IS NOT NULL"
            ))?
            .execute(params![
                context.sandbox_id,
                context.id,
                context.owner,
                context.language,
                context.cwd,
                context.created_at,
                context.ended_at,
                context.end_reason,
            ])?;
        Ok(changed > 0)
    }

    /// Marks a context ended at `at_ms` with `reason`; false when no open one had that id.
    pub fn end_context(
        &self,
        sandbox_id: &str,
        id: &str,
        at_ms: i64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE contexts SET ended_at = ?3, end_reason = ?4 \
                 WHERE sandbox_id = ?1 AND id = ?2 AND ended_at IS NULL",
            )?
            .execute(params![sandbox_id, id, at_ms, reason])?;
        Ok(changed > 0)
    }

    /// The contexts of `sandbox_id`, oldest first.
    pub fn list_contexts(&self, sandbox_id: &str) -> Result<Vec<ContextRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM contexts WHERE sandbox_id = ?1 ORDER BY created_at, id"
        ))?;
        let rows = stmt.query_map([sandbox_id], from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
