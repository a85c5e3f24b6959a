//! The audit log.

use rusqlite::{Row, params};

use crate::error::StoreError;
use crate::records::AuditEvent;
use crate::store::{Store, page_size, parse_json};

const COLUMNS: &str = "id, at, owner, key_id, action, target, detail, request_id";

/// A row before `detail` is decoded.
struct RawAudit {
    event: AuditEvent,
    detail: Option<String>,
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<RawAudit> {
    Ok(RawAudit {
        event: AuditEvent {
            id: row.get(0)?,
            at: row.get(1)?,
            owner: row.get(2)?,
            key_id: row.get(3)?,
            action: row.get(4)?,
            target: row.get(5)?,
            detail: None,
            request_id: row.get(7)?,
        },
        detail: row.get(6)?,
    })
}

impl RawAudit {
    fn decode(self) -> Result<AuditEvent, StoreError> {
        let mut event = self.event;
        event.detail = self
            .detail
            .map(|text| parse_json("audit event", &event.id.to_string(), "detail", &text))
            .transpose()?;
        Ok(event)
    }
}

impl Store {
    /// Appends an event to the audit log (its `id` is ignored) and returns the id it got.
    pub fn audit(&self, event: &AuditEvent) -> Result<i64, StoreError> {
        let conn = self.conn();
        conn.prepare_cached(
            "INSERT INTO audit_events (at, owner, key_id, action, target, detail, request_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            event.at,
            event.owner,
            event.key_id,
            event.action,
            event.target,
            event.detail.as_ref().map(|d| d.to_string()),
            event.request_id,
        ])?;
        // Same connection, still locked: the rowid is this insert's.
        Ok(conn.last_insert_rowid())
    }

    /// The latest `limit` audit events of `owner` (or everyone's), newest first; `limit` 0
    /// means [`crate::DEFAULT_PAGE_SIZE`] and is capped at [`crate::MAX_PAGE_SIZE`].
    pub fn list_audit(
        &self,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let limit = i64::from(page_size(limit));
        // The lock is released before decoding.
        let raws: Vec<RawAudit> = {
            let conn = self.conn();
            match owner {
                Some(owner) => conn
                    .prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM audit_events WHERE owner = ?1 \
                         ORDER BY id DESC LIMIT ?2"
                    ))?
                    .query_map(params![owner, limit], from_row)?
                    .collect::<Result<_, _>>()?,
                None => conn
                    .prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM audit_events ORDER BY id DESC LIMIT ?1"
                    ))?
                    .query_map([limit], from_row)?
                    .collect::<Result<_, _>>()?,
            }
        };
        raws.into_iter().map(RawAudit::decode).collect()
    }

    /// Appends events in one transaction (their `id`s are ignored).
    pub fn audit_many(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO audit_events (at, owner, key_id, action, target, detail, request_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for event in events {
                insert.execute(params![
                    event.at,
                    event.owner,
                    event.key_id,
                    event.action,
                    event.target,
                    event.detail.as_ref().map(|d| d.to_string()),
                    event.request_id,
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The latest `limit` events about `target` whose action starts with `action_prefix`,
    /// newest first, older than event `before` when given; `limit` as [`Self::list_audit`].
    pub fn list_audit_of(
        &self,
        target: &str,
        action_prefix: &str,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let limit = i64::from(page_size(limit));
        // A prefix range the index answers (`LIKE` would need escaping and a scan).
        let upper = format!("{action_prefix}\u{10ffff}");
        let raws: Vec<RawAudit> = {
            let conn = self.conn();
            conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM audit_events \
                 WHERE target = ?1 AND action >= ?2 AND action < ?3 AND id < ?4 \
                 ORDER BY id DESC LIMIT ?5"
            ))?
            .query_map(
                params![
                    target,
                    action_prefix,
                    upper,
                    before.unwrap_or(i64::MAX),
                    limit
                ],
                from_row,
            )?
            .collect::<Result<_, _>>()?
        };
        raws.into_iter().map(RawAudit::decode).collect()
    }
}
