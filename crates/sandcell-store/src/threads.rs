//! Threads: conversations that persist across agent runs. A thread names the sandbox its
//! runs share and its latest run, whose conversation the next run on the thread continues.

use rusqlite::{OptionalExtension, Row, params};

use crate::error::{StoreError, is_unique_violation};
use crate::store::{Store, page_size};

/// One thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRecord {
    /// `th-…`.
    pub id: String,
    /// Whose it is.
    pub owner: String,
    /// Its name (unique per owner).
    pub name: String,
    /// The sandbox its runs share, once one was made.
    pub sandbox_id: Option<String>,
    /// Its latest run, whose conversation the next run continues.
    pub last_run_id: Option<String>,
    /// Runs started on it.
    pub runs: u32,
    /// When it was made (ms).
    pub created_at: i64,
    /// When it last changed (ms).
    pub updated_at: i64,
}

const COLUMNS: &str = "id, owner, name, sandbox_id, last_run_id, runs, created_at, updated_at";

fn from_row(row: &Row<'_>) -> rusqlite::Result<ThreadRecord> {
    Ok(ThreadRecord {
        id: row.get(0)?,
        owner: row.get(1)?,
        name: row.get(2)?,
        sandbox_id: row.get(3)?,
        last_run_id: row.get(4)?,
        runs: row.get(5)?,
        created_at: row.get(6)?,
        updated_at: row.get(7)?,
    })
}

impl Store {
    /// Records a new thread; its name must be free among its owner's.
    pub fn insert_thread(&self, t: &ThreadRecord) -> Result<(), StoreError> {
        let inserted = self
            .conn()
            .prepare_cached(&format!(
                "INSERT INTO threads ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))?
            .execute(params![
                t.id,
                t.owner,
                t.name,
                t.sandbox_id,
                t.last_run_id,
                t.runs,
                t.created_at,
                t.updated_at
            ]);
        match inserted {
            Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists {
                what: "thread",
                id: t.name.clone(),
            }),
            Err(e) => Err(e.into()),
            Ok(_) => Ok(()),
        }
    }

    /// Saves a thread's name, sandbox, latest run and count.
    pub fn update_thread(&self, t: &ThreadRecord) -> Result<(), StoreError> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE threads SET name = ?2, sandbox_id = ?3, last_run_id = ?4, runs = ?5, \
                 updated_at = ?6 WHERE id = ?1",
            )?
            .execute(params![
                t.id,
                t.name,
                t.sandbox_id,
                t.last_run_id,
                t.runs,
                t.updated_at
            ]);
        match changed {
            Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists {
                what: "thread",
                id: t.name.clone(),
            }),
            Err(e) => Err(e.into()),
            Ok(0) => Err(StoreError::NotFound {
                what: "thread",
                id: t.id.clone(),
            }),
            Ok(_) => Ok(()),
        }
    }

    /// The thread with this id, if any.
    pub fn get_thread(&self, id: &str) -> Result<Option<ThreadRecord>, StoreError> {
        Ok(self
            .conn()
            .prepare_cached(&format!("SELECT {COLUMNS} FROM threads WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?)
    }

    /// `owner`'s thread named `name`, if any.
    pub fn thread_by_name(
        &self,
        owner: &str,
        name: &str,
    ) -> Result<Option<ThreadRecord>, StoreError> {
        Ok(self
            .conn()
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM threads WHERE owner = ?1 AND name = ?2"
            ))?
            .query_row([owner, name], from_row)
            .optional()?)
    }

    /// `owner`'s threads, the most recently changed first, at most `limit` (0: the default
    /// page).
    pub fn list_threads(&self, owner: &str, limit: u32) -> Result<Vec<ThreadRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM threads WHERE owner = ?1 ORDER BY updated_at DESC, id LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![owner, page_size(limit)], from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Deletes a thread (its runs stay); whether it was there.
    pub fn delete_thread(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .prepare_cached("DELETE FROM threads WHERE id = ?1")?
            .execute([id])?
            > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(id: &str, owner: &str, name: &str) -> ThreadRecord {
        ThreadRecord {
            id: id.into(),
            owner: owner.into(),
            name: name.into(),
            sandbox_id: None,
            last_run_id: None,
            runs: 0,
            created_at: 1,
            updated_at: 1,
        }
    }

    #[test]
    fn threads_are_kept_found_by_name_renamed_and_deleted() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(&dir.path().join("s.db")).expect("store");
        store
            .insert_thread(&thread("th-1", "alice", "work"))
            .expect("insert");
        // A name is unique per owner, not across owners.
        assert!(matches!(
            store.insert_thread(&thread("th-2", "alice", "work")),
            Err(StoreError::AlreadyExists { .. })
        ));
        store
            .insert_thread(&thread("th-3", "bob", "work"))
            .expect("bob's");
        let mut t = store
            .thread_by_name("alice", "work")
            .expect("read")
            .expect("found");
        assert_eq!(t.id, "th-1");
        t.name = "play".into();
        t.sandbox_id = Some("sb-1".into());
        t.last_run_id = Some("run-1".into());
        t.runs = 1;
        t.updated_at = 5;
        store.update_thread(&t).expect("update");
        assert_eq!(store.get_thread("th-1").expect("read"), Some(t));
        assert_eq!(store.list_threads("alice", 0).expect("list").len(), 1);
        assert!(store.delete_thread("th-1").expect("delete"));
        assert!(!store.delete_thread("th-1").expect("delete again"));
        assert_eq!(store.get_thread("th-1").expect("read"), None);
    }
}
