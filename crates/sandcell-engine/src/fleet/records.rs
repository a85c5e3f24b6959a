//! What the fleet remembers of each sandbox, and the [`Ledger`] that keeps it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::lock;
use crate::error::EngineError;
use crate::spec::SandboxSpec;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being started.
    Creating,
    /// Serving requests.
    Running,
    /// Frozen: keeps its memory and processes, uses no CPU.
    Paused,
    /// Ended on request or by its lifecycle rules; the record stays.
    Stopped,
    /// Could not be started (the reason says why).
    Failed,
    /// Found missing after a restart of the service (the reason says what was recovered).
    Lost,
}

impl SandboxState {
    /// The name used on the wire and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
            Self::Lost => "lost",
        }
    }

    /// Parses [`Self::as_str`]'s names.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Creating,
            Self::Running,
            Self::Paused,
            Self::Stopped,
            Self::Failed,
            Self::Lost,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// States in which a sandbox holds resources (and counts against the caps).
    pub const ACTIVE: [SandboxState; 3] = [Self::Creating, Self::Running, Self::Paused];

    /// Whether the sandbox holds resources.
    pub fn is_active(self) -> bool {
        Self::ACTIVE.contains(&self)
    }
}

/// What the fleet remembers of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// The sandbox id.
    pub id: String,
    /// Whose it is: every call is scoped to one owner.
    pub owner: String,
    /// Where it is in its life.
    pub state: SandboxState,
    /// Why it failed, was lost or stopped.
    pub reason: Option<String>,
    /// What it was created with.
    pub spec: SandboxSpec,
    /// Free-form labels (filterable).
    pub labels: BTreeMap<String, String>,
    /// Free-form metadata (filterable).
    pub metadata: BTreeMap<String, String>,
    /// When it was created.
    pub created_at_ms: Millis,
    /// When its record last changed.
    pub updated_at_ms: Millis,
    /// When it was last used.
    pub last_active_ms: Millis,
    /// Stopped after this long without use.
    pub idle_timeout_ms: Option<u64>,
    /// Stopped at this time whatever happens.
    pub expires_at_ms: Option<Millis>,
    /// Its record goes when it stops (instead of staying as `stopped`).
    pub ephemeral: bool,
    /// What the backend needs to reach it again after a restart of the service.
    pub runtime: serde_json::Value,
}

/// Which records a listing returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordQuery {
    /// Only this owner's.
    pub owner: Option<String>,
    /// Only in these states (empty: any).
    pub states: Vec<SandboxState>,
    /// Labels that must all match.
    pub labels: BTreeMap<String, String>,
    /// Metadata that must all match.
    pub metadata: BTreeMap<String, String>,
    /// At most this many (0: the ledger's default).
    pub limit: u32,
    /// Where the previous page ended.
    pub cursor: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass back as the cursor for the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// Where the fleet keeps its records. Every change is written here before the fleet answers.
pub trait Ledger: Send + Sync {
    /// Adds a record.
    fn insert(&self, record: &SandboxRecord) -> Result<(), String>;
    /// Replaces a record's mutable fields.
    fn update(&self, record: &SandboxRecord) -> Result<(), String>;
    /// One record.
    fn get(&self, id: &str) -> Result<Option<SandboxRecord>, String>;
    /// A page of records, ordered by creation.
    fn list(&self, query: &RecordQuery) -> Result<Page<SandboxRecord>, ListError>;
    /// Active sandboxes (all owners, or one).
    fn count_active(&self, owner: Option<&str>) -> Result<u64, String>;
    /// Forgets a record.
    fn remove(&self, id: &str) -> Result<(), String>;
}

/// Why a listing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListError {
    /// The cursor is not one a listing gave.
    InvalidCursor(String),
    /// The records could not be read.
    Failed(String),
}

impl From<ListError> for EngineError {
    fn from(e: ListError) -> Self {
        match e {
            ListError::InvalidCursor(m) => EngineError::InvalidRequest(m),
            ListError::Failed(m) => EngineError::Persistence(m),
        }
    }
}

/// A ledger in memory, for embedded use and tests.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    records: Mutex<BTreeMap<String, SandboxRecord>>,
}

impl Ledger for MemoryLedger {
    fn insert(&self, record: &SandboxRecord) -> Result<(), String> {
        let mut records = lock(&self.records);
        if records.contains_key(&record.id) {
            return Err(format!("sandbox {} exists already", record.id));
        }
        records.insert(record.id.clone(), record.clone());
        Ok(())
    }

    fn update(&self, record: &SandboxRecord) -> Result<(), String> {
        match lock(&self.records).get_mut(&record.id) {
            Some(r) => {
                *r = record.clone();
                Ok(())
            }
            None => Err(format!("no sandbox {}", record.id)),
        }
    }

    fn get(&self, id: &str) -> Result<Option<SandboxRecord>, String> {
        Ok(lock(&self.records).get(id).cloned())
    }

    fn list(&self, q: &RecordQuery) -> Result<Page<SandboxRecord>, ListError> {
        let mut all: Vec<SandboxRecord> = lock(&self.records)
            .values()
            .filter(|r| q.owner.as_ref().is_none_or(|o| *o == r.owner))
            .filter(|r| q.states.is_empty() || q.states.contains(&r.state))
            .filter(|r| q.labels.iter().all(|(k, v)| r.labels.get(k) == Some(v)))
            .filter(|r| q.metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
            .cloned()
            .collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        let start = match &q.cursor {
            Some(c) => all
                .iter()
                .position(|r| r.id == *c)
                .map(|i| i + 1)
                .ok_or_else(|| ListError::InvalidCursor(format!("unknown page cursor {c:?}")))?,
            None => 0,
        };
        let limit = if q.limit == 0 { 100 } else { q.limit as usize };
        let items: Vec<SandboxRecord> = all.iter().skip(start).take(limit).cloned().collect();
        let next_cursor = (start + items.len() < all.len())
            .then(|| items.last().map(|r| r.id.clone()))
            .flatten();
        Ok(Page { items, next_cursor })
    }

    fn count_active(&self, owner: Option<&str>) -> Result<u64, String> {
        Ok(lock(&self.records)
            .values()
            .filter(|r| r.state.is_active() && owner.is_none_or(|o| o == r.owner))
            .count() as u64)
    }

    fn remove(&self, id: &str) -> Result<(), String> {
        lock(&self.records).remove(id);
        Ok(())
    }
}
