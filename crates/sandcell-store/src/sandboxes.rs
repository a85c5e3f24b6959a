//! Sandbox records, their transitions and listings.

use std::collections::BTreeMap;

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, Row, params, params_from_iter};

use crate::error::{StoreError, is_unique_violation};
use crate::records::{Page, SandboxEvent, SandboxQuery, SandboxRecord};
use crate::store::{
    Store, count_from_sql, page_size, parse_json, string_map_json, u64_from_sql, u64_to_sql,
};

const WHAT: &str = "sandbox";

const COLUMNS: &str = "id, owner, state, reason, spec, labels, metadata, created_at, updated_at, \
     last_active_at, idle_timeout_ms, expires_at, ephemeral, runtime";

/// A row as SQLite returns it, before the JSON columns are decoded (which can fail with a
/// [`StoreError::Corrupt`] that a row-mapping closure could not express).
struct RawSandbox {
    id: String,
    owner: String,
    state: String,
    reason: Option<String>,
    spec: String,
    labels: String,
    metadata: String,
    created_at: i64,
    updated_at: i64,
    last_active_at: i64,
    idle_timeout_ms: Option<i64>,
    expires_at: Option<i64>,
    ephemeral: bool,
    runtime: String,
}

impl RawSandbox {
    /// Reads a row selected with [`COLUMNS`].
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawSandbox {
            id: row.get(0)?,
            owner: row.get(1)?,
            state: row.get(2)?,
            reason: row.get(3)?,
            spec: row.get(4)?,
            labels: row.get(5)?,
            metadata: row.get(6)?,
            created_at: row.get(7)?,
            updated_at: row.get(8)?,
            last_active_at: row.get(9)?,
            idle_timeout_ms: row.get(10)?,
            expires_at: row.get(11)?,
            ephemeral: row.get(12)?,
            runtime: row.get(13)?,
        })
    }

    fn decode(self) -> Result<SandboxRecord, StoreError> {
        let t = "sandbox";
        Ok(SandboxRecord {
            spec: parse_json(t, &self.id, "spec", &self.spec)?,
            labels: parse_json(t, &self.id, "labels", &self.labels)?,
            metadata: parse_json(t, &self.id, "metadata", &self.metadata)?,
            runtime: parse_json(t, &self.id, "runtime", &self.runtime)?,
            idle_timeout_ms: u64_from_sql(t, &self.id, "idle_timeout_ms", self.idle_timeout_ms)?,
            id: self.id,
            owner: self.owner,
            state: self.state,
            reason: self.reason,
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_active_at: self.last_active_at,
            expires_at: self.expires_at,
            ephemeral: self.ephemeral,
        })
    }
}

fn select_sandbox(conn: &Connection, id: &str) -> Result<Option<RawSandbox>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1");
    Ok(conn
        .prepare_cached(&sql)?
        .query_row([id], RawSandbox::from_row)
        .optional()?)
}

fn insert_event(
    conn: &Connection,
    sandbox_id: &str,
    at: i64,
    from_state: &str,
    to_state: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO sandbox_events (sandbox_id, at, from_state, to_state, reason) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![sandbox_id, at, from_state, to_state, reason])?;
    Ok(())
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        what: WHAT,
        id: id.to_owned(),
    }
}

/// Encodes a listing position: the last item's sort key.
fn encode_cursor(created_at: i64, id: &str) -> String {
    format!("{created_at}:{id}")
}

fn decode_cursor(cursor: &str) -> Result<(i64, String), StoreError> {
    cursor
        .split_once(':')
        .and_then(|(at, id)| Some((at.parse().ok()?, id.to_owned())))
        .ok_or_else(|| StoreError::InvalidCursor(cursor.to_owned()))
}

/// A WHERE clause under construction, with its bound values in order.
#[derive(Default)]
struct Filter {
    conditions: Vec<String>,
    values: Vec<SqlValue>,
}

impl Filter {
    fn owner_and_states<S: AsRef<str>>(&mut self, owner: Option<&str>, states: &[S]) {
        if let Some(owner) = owner {
            self.conditions.push("owner = ?".into());
            self.values.push(SqlValue::Text(owner.to_owned()));
        }
        if !states.is_empty() {
            let marks = vec!["?"; states.len()].join(", ");
            self.conditions.push(format!("state IN ({marks})"));
            self.values
                .extend(states.iter().map(|s| SqlValue::Text(s.as_ref().to_owned())));
        }
    }

    /// Every entry must be in the JSON object `column`. Keys are compared as values with
    /// `json_each`, never spliced into a JSON path, so dots, quotes or spaces in a key cannot
    /// change what is matched.
    fn string_map(&mut self, column: &str, entries: &BTreeMap<String, String>) {
        for (key, value) in entries {
            self.conditions.push(format!(
                "EXISTS (SELECT 1 FROM json_each(sandboxes.{column}) AS j \
                 WHERE j.key = ? AND j.type = 'text' AND j.value = ?)"
            ));
            self.values.push(SqlValue::Text(key.clone()));
            self.values.push(SqlValue::Text(value.clone()));
        }
    }

    fn where_clause(&self) -> String {
        if self.conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.conditions.join(" AND "))
        }
    }
}

impl Store {
    /// Inserts a new sandbox and records its first event (from `""` to its state, at its
    /// `created_at`), in one transaction.
    pub fn insert_sandbox(&self, record: &SandboxRecord) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let inserted = tx
            .prepare_cached(&format!(
                "INSERT INTO sandboxes ({COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
            ))?
            .execute(params![
                record.id,
                record.owner,
                record.state,
                record.reason,
                record.spec.to_string(),
                string_map_json(&record.labels),
                string_map_json(&record.metadata),
                record.created_at,
                record.updated_at,
                record.last_active_at,
                u64_to_sql(record.idle_timeout_ms)?,
                record.expires_at,
                record.ephemeral,
                record.runtime.to_string(),
            ]);
        match inserted {
            Err(e) if is_unique_violation(&e) => {
                return Err(StoreError::AlreadyExists {
                    what: WHAT,
                    id: record.id.clone(),
                });
            }
            other => other?,
        };
        insert_event(
            &tx,
            &record.id,
            record.created_at,
            "",
            &record.state,
            record.reason.as_deref(),
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The sandbox with this id, if any.
    pub fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
        select_sandbox(&self.conn(), id)?
            .map(RawSandbox::decode)
            .transpose()
    }

    /// Replaces a sandbox's mutable fields with `record`'s: spec, labels, metadata,
    /// updated_at, last_active_at, idle_timeout_ms, expires_at, ephemeral and runtime.
    ///
    /// `id`, `owner` and `created_at` never change, and `state`/`reason` change only through
    /// [`Store::transition`], so that every state change is in the event history.
    pub fn update_sandbox(&self, record: &SandboxRecord) -> Result<(), StoreError> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE sandboxes SET spec = ?2, labels = ?3, metadata = ?4, updated_at = ?5, \
                 last_active_at = ?6, idle_timeout_ms = ?7, expires_at = ?8, ephemeral = ?9, \
                 runtime = ?10 WHERE id = ?1",
            )?
            .execute(params![
                record.id,
                record.spec.to_string(),
                string_map_json(&record.labels),
                string_map_json(&record.metadata),
                record.updated_at,
                record.last_active_at,
                u64_to_sql(record.idle_timeout_ms)?,
                record.expires_at,
                record.ephemeral,
                record.runtime.to_string(),
            ])?;
        if changed == 0 {
            return Err(not_found(&record.id));
        }
        Ok(())
    }

    /// Moves a sandbox to `to_state` with `reason` (replacing the previous reason), sets
    /// `updated_at`, and records the event, all in one transaction: when this returns, the
    /// transition is committed. Returns the updated record.
    pub fn transition(
        &self,
        id: &str,
        to_state: &str,
        reason: Option<&str>,
        at_ms: i64,
    ) -> Result<SandboxRecord, StoreError> {
        let mut conn = self.conn();
        // Immediate (see `Store::finish_open`): no other writer can slip in between the read
        // of the current state and the event that names it.
        let tx = conn.transaction()?;
        let from: String = tx
            .prepare_cached("SELECT state FROM sandboxes WHERE id = ?1")?
            .query_row([id], |row| row.get(0))
            .optional()?
            .ok_or_else(|| not_found(id))?;
        tx.prepare_cached(
            "UPDATE sandboxes SET state = ?2, reason = ?3, updated_at = ?4 WHERE id = ?1",
        )?
        .execute(params![id, to_state, reason, at_ms])?;
        insert_event(&tx, id, at_ms, &from, to_state, reason)?;
        if crate::contexts::ENDED_STATES.contains(&to_state) {
            crate::contexts::end_all(&tx, id, at_ms, &format!("the sandbox is {to_state}"))?;
        }
        // Decoded before the commit so that an error means nothing happened.
        let record = select_sandbox(&tx, id)?
            .ok_or_else(|| not_found(id))?
            .decode()?;
        tx.commit()?;
        Ok(record)
    }

    /// Records activity in a sandbox at `at_ms`; `last_active_at` never moves backwards, so
    /// concurrent touches with slightly out-of-order clocks are harmless.
    pub fn touch(&self, id: &str, at_ms: i64) -> Result<(), StoreError> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE sandboxes SET last_active_at = MAX(last_active_at, ?2) WHERE id = ?1",
            )?
            .execute(params![id, at_ms])?;
        if changed == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }

    /// Replaces a sandbox's backend runtime data (what a restarted daemon re-attaches with).
    pub fn set_runtime(&self, id: &str, runtime: &serde_json::Value) -> Result<(), StoreError> {
        let changed = self
            .conn()
            .prepare_cached("UPDATE sandboxes SET runtime = ?2 WHERE id = ?1")?
            .execute(params![id, runtime.to_string()])?;
        if changed == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }

    /// Deletes a sandbox record and its public ports; its events and contexts stay (those
    /// still open end).
    /// Returns whether it existed.
    pub fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        // The store never reads the clock: its contexts end when the sandbox last changed.
        let last_change: Option<i64> = tx
            .prepare_cached("SELECT updated_at FROM sandboxes WHERE id = ?1")?
            .query_row([id], |row| row.get(0))
            .optional()?;
        let changed = tx
            .prepare_cached("DELETE FROM sandboxes WHERE id = ?1")?
            .execute([id])?;
        tx.prepare_cached("DELETE FROM public_ports WHERE sandbox_id = ?1")?
            .execute([id])?;
        if let Some(at) = last_change {
            crate::contexts::end_all(&tx, id, at, "the sandbox was deleted")?;
        }
        tx.commit()?;
        Ok(changed > 0)
    }

    /// A sandbox's events in the order they were committed (also after the sandbox was
    /// deleted; empty for an id never seen).
    pub fn events(&self, sandbox_id: &str) -> Result<Vec<SandboxEvent>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id, sandbox_id, at, from_state, to_state, reason FROM sandbox_events \
             WHERE sandbox_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([sandbox_id], |row| {
            Ok(SandboxEvent {
                id: row.get(0)?,
                sandbox_id: row.get(1)?,
                at: row.get(2)?,
                from_state: row.get(3)?,
                to_state: row.get(4)?,
                reason: row.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many sandboxes `owner` (or everyone) has in one of `states` (empty: any state).
    pub fn count_sandboxes(&self, owner: Option<&str>, states: &[&str]) -> Result<u64, StoreError> {
        let mut filter = Filter::default();
        filter.owner_and_states(owner, states);
        let sql = format!("SELECT COUNT(*) FROM sandboxes{}", filter.where_clause());
        let n: i64 = self
            .conn()
            .prepare(&sql)?
            .query_row(params_from_iter(filter.values.iter()), |row| row.get(0))?;
        Ok(count_from_sql(n))
    }

    /// One page of the sandboxes matching `query`, ordered by `(created_at, id)`. Rows
    /// inserted or deleted between pages never make a page repeat or skip another row: the
    /// cursor is the last row's sort key, not an offset.
    pub fn list_sandboxes(&self, query: &SandboxQuery) -> Result<Page<SandboxRecord>, StoreError> {
        let size = page_size(query.limit);
        let mut filter = Filter::default();
        filter.owner_and_states(query.owner.as_deref(), &query.states);
        filter.string_map("labels", &query.labels);
        filter.string_map("metadata", &query.metadata);
        if let Some(cursor) = &query.cursor {
            let (created_at, id) = decode_cursor(cursor)?;
            filter.conditions.push("(created_at, id) > (?, ?)".into());
            filter.values.push(SqlValue::Integer(created_at));
            filter.values.push(SqlValue::Text(id));
        }
        // One row more than the page tells whether another page follows.
        filter.values.push(SqlValue::Integer(i64::from(size) + 1));
        let sql = format!(
            "SELECT {COLUMNS} FROM sandboxes{} ORDER BY created_at, id LIMIT ?",
            filter.where_clause()
        );
        let raws = {
            let conn = self.conn();
            // Not cached: the SQL varies with the filters.
            let mut stmt = conn.prepare(&sql)?;
            let rows =
                stmt.query_map(params_from_iter(filter.values.iter()), RawSandbox::from_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let mut items = raws
            .into_iter()
            .map(RawSandbox::decode)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() > size as usize {
            items.truncate(size as usize);
            items
                .last()
                .map(|last| encode_cursor(last.created_at, &last.id))
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}
