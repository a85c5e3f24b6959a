//! The fleet's records kept in the SQLite store: every state change goes through
//! [`Store::transition`], so it is committed (with its event) before the caller acknowledges it.

use std::sync::Arc;

use sandcell_engine::fleet::{Ledger, ListError, Page, RecordQuery, SandboxRecord, SandboxState};
use sandcell_store::{SandboxQuery, Store, StoreError};

/// A [`Ledger`] over a [`Store`].
pub struct StoreLedger {
    store: Arc<Store>,
}

impl StoreLedger {
    /// Keeps the fleet's records in `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Self { store }
    }
}

fn text(e: StoreError) -> String {
    e.to_string()
}

fn to_row(r: &SandboxRecord) -> Result<sandcell_store::SandboxRecord, String> {
    Ok(sandcell_store::SandboxRecord {
        id: r.id.clone(),
        owner: r.owner.clone(),
        state: r.state.as_str().to_string(),
        reason: r.reason.clone(),
        spec: serde_json::to_value(&r.spec).map_err(|e| format!("encode the spec: {e}"))?,
        labels: r.labels.clone(),
        metadata: r.metadata.clone(),
        created_at: r.created_at_ms,
        updated_at: r.updated_at_ms,
        last_active_at: r.last_active_ms,
        idle_timeout_ms: r.idle_timeout_ms,
        expires_at: r.expires_at_ms,
        ephemeral: r.ephemeral,
        runtime: r.runtime.clone(),
    })
}

fn from_row(r: sandcell_store::SandboxRecord) -> Result<SandboxRecord, String> {
    let state = SandboxState::parse(&r.state)
        .ok_or_else(|| format!("sandbox {} has an unknown state '{}'", r.id, r.state))?;
    let spec = serde_json::from_value(r.spec)
        .map_err(|e| format!("sandbox {} has an unreadable spec: {e}", r.id))?;
    Ok(SandboxRecord {
        id: r.id,
        owner: r.owner,
        state,
        reason: r.reason,
        spec,
        labels: r.labels,
        metadata: r.metadata,
        created_at_ms: r.created_at,
        updated_at_ms: r.updated_at,
        last_active_ms: r.last_active_at,
        idle_timeout_ms: r.idle_timeout_ms,
        expires_at_ms: r.expires_at,
        ephemeral: r.ephemeral,
        runtime: r.runtime,
    })
}

impl Ledger for StoreLedger {
    fn insert(&self, record: &SandboxRecord) -> Result<(), String> {
        self.store.insert_sandbox(&to_row(record)?).map_err(text)
    }

    fn update(&self, record: &SandboxRecord) -> Result<(), String> {
        let row = to_row(record)?;
        let before = self.store.get_sandbox(&record.id).map_err(text)?;
        let changed = before
            .as_ref()
            .is_none_or(|b| b.state != row.state || b.reason != row.reason);
        if changed {
            self.store
                .transition(&row.id, &row.state, row.reason.as_deref(), row.updated_at)
                .map_err(text)?;
        }
        self.store.update_sandbox(&row).map_err(text)
    }

    fn get(&self, id: &str) -> Result<Option<SandboxRecord>, String> {
        self.store
            .get_sandbox(id)
            .map_err(text)?
            .map(from_row)
            .transpose()
    }

    fn list(&self, q: &RecordQuery) -> Result<Page<SandboxRecord>, ListError> {
        let page = self
            .store
            .list_sandboxes(&SandboxQuery {
                owner: q.owner.clone(),
                states: q.states.iter().map(|s| s.as_str().to_string()).collect(),
                labels: q.labels.clone(),
                metadata: q.metadata.clone(),
                limit: q.limit,
                cursor: q.cursor.clone(),
            })
            .map_err(|e| match e {
                StoreError::InvalidCursor(m) => ListError::InvalidCursor(m),
                other => ListError::Failed(other.to_string()),
            })?;
        Ok(Page {
            items: page
                .items
                .into_iter()
                .map(from_row)
                .collect::<Result<_, _>>()
                .map_err(ListError::Failed)?,
            next_cursor: page.next_cursor,
        })
    }

    fn count_active(&self, owner: Option<&str>) -> Result<u64, String> {
        let states: Vec<&str> = SandboxState::ACTIVE.iter().map(|s| s.as_str()).collect();
        self.store.count_sandboxes(owner, &states).map_err(text)
    }

    fn remove(&self, id: &str) -> Result<(), String> {
        self.store.delete_sandbox(id).map(|_| ()).map_err(text)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sandcell_engine::SandboxSpec;

    use super::*;

    fn record(id: &str, owner: &str) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            owner: owner.into(),
            state: SandboxState::Creating,
            reason: None,
            spec: SandboxSpec::default(),
            labels: BTreeMap::from([("team".into(), "a".into())]),
            metadata: BTreeMap::new(),
            created_at_ms: 1,
            updated_at_ms: 1,
            last_active_ms: 1,
            idle_timeout_ms: Some(60_000),
            expires_at_ms: None,
            ephemeral: false,
            runtime: serde_json::Value::Null,
        }
    }

    #[test]
    fn state_changes_are_recorded_as_events() {
        let store = Arc::new(Store::open_in_memory().unwrap());
        let ledger = StoreLedger::new(store.clone());
        let mut r = record("sb-aaaaaaaaaaaa", "alice");
        ledger.insert(&r).unwrap();
        r.state = SandboxState::Running;
        r.updated_at_ms = 2;
        ledger.update(&r).unwrap();
        r.expires_at_ms = Some(99);
        ledger.update(&r).unwrap();
        r.state = SandboxState::Stopped;
        r.reason = Some("deleted".into());
        r.updated_at_ms = 3;
        ledger.update(&r).unwrap();
        let events: Vec<(String, String)> = store
            .events(&r.id)
            .unwrap()
            .into_iter()
            .map(|e| (e.from_state, e.to_state))
            .collect();
        assert_eq!(
            events,
            [
                ("".into(), "creating".into()),
                ("creating".into(), "running".into()),
                ("running".into(), "stopped".into())
            ]
        );
        let back = ledger.get(&r.id).unwrap().unwrap();
        assert_eq!(back, r);
        assert_eq!(ledger.count_active(Some("alice")).unwrap(), 0);
    }

    #[test]
    fn listing_filters_and_counts() {
        let store = Arc::new(Store::open_in_memory().unwrap());
        let ledger = StoreLedger::new(store);
        ledger.insert(&record("sb-aaaaaaaaaaa1", "alice")).unwrap();
        ledger.insert(&record("sb-aaaaaaaaaaa2", "bob")).unwrap();
        let page = ledger
            .list(&RecordQuery {
                owner: Some("alice".into()),
                labels: BTreeMap::from([("team".into(), "a".into())]),
                ..RecordQuery::default()
            })
            .unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].owner, "alice");
        assert_eq!(ledger.count_active(None).unwrap(), 2);
        ledger.remove("sb-aaaaaaaaaaa2").unwrap();
        assert!(ledger.get("sb-aaaaaaaaaaa2").unwrap().is_none());
    }
}
