//! Memories: short texts a sandbox (or its owner) keeps, found again by ranked full-text
//! search (SQLite FTS5, bm25), and copied into a sandbox made from a snapshot as its origin
//! had them at that snapshot.
//!
//! The full-text index is kept in step by the schema's triggers (see `schema.rs`, step 9),
//! so nothing here writes it; the code here only reads it, through [`fts_query`], which turns
//! whatever a user typed into quoted terms: no FTS5 syntax of theirs reaches `MATCH`.
//!
//! A memory may also have a vector (its embedding, `schema.rs` step 11) for hybrid ranking:
//! written with the memory ([`Store::insert_memory_with`]) or later
//! ([`Store::put_memory_vectors`]), copied with it into a fork ([`Store::copy_memories`]),
//! gone with its row (a trigger). [`Store::nearest_memories`] ranks a scope's vectors by
//! cosine similarity to a query's.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};

use crate::error::{StoreError, is_unique_violation};
use crate::records::Page;
use crate::store::{Store, count_from_sql, page_size, parse_json, string_map_json};

const COLUMNS: &str = "seq, id, owner, sandbox_id, text, category, metadata, created_at";

/// The same columns of the table aliased `m` (in joins with the index).
const M_COLUMNS: &str =
    "m.seq, m.id, m.owner, m.sandbox_id, m.text, m.category, m.metadata, m.created_at";

/// At most this many words of a query are looked for (each is one term of an `OR`).
pub const MAX_QUERY_TERMS: usize = 32;

/// One memory as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// Its place in the store's order, assigned by the store (inserts ignore it): listings
    /// go newest first by it, and page on it.
    pub seq: i64,
    /// Unique id (`mem-…`), chosen by the service.
    pub id: String,
    /// Whose memory it is (the sandbox's owner, for a sandbox's memory).
    pub owner: String,
    /// The sandbox it belongs to; `None` for a memory of the owner.
    pub sandbox_id: Option<String>,
    /// What is remembered.
    pub text: String,
    /// A category to filter by.
    pub category: String,
    /// The owner's metadata.
    pub metadata: BTreeMap<String, String>,
    /// When it was remembered (ms); a copy made for a fork keeps its original's.
    pub created_at: i64,
}

/// A memory found by a search, and how well it matched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryHit {
    /// The memory.
    pub memory: MemoryRecord,
    /// Relevance: bm25 negated, so higher is better (bm25 itself is lower for better).
    pub score: f64,
}

/// A memory's embedding: which model made it, and the numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryVector {
    /// The model (`provider/model`) that made it; vectors of other models are not compared.
    pub model: String,
    /// The vector (kept as little-endian f32s).
    pub vector: Vec<f32>,
}

/// Vectors as stored: little-endian f32s, back to back.
fn vector_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The cosine similarity of a stored vector (bytes) with `query` (whose length is
/// `query_norm`); 0 when either is all zeros.
fn cosine_blob(blob: &[u8], query: &[f32], query_norm: f32) -> f32 {
    let (mut dot, mut norm) = (0f32, 0f32);
    for (chunk, q) in blob.chunks_exact(4).zip(query) {
        let x = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        dot += x * q;
        norm += x * x;
    }
    if norm <= 0.0 || query_norm <= 0.0 {
        0.0
    } else {
        dot / (norm.sqrt() * query_norm)
    }
}

/// A row before its metadata is decoded.
struct RawMemory {
    record: MemoryRecord,
    metadata: String,
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<RawMemory> {
    Ok(RawMemory {
        record: MemoryRecord {
            seq: row.get(0)?,
            id: row.get(1)?,
            owner: row.get(2)?,
            sandbox_id: row.get(3)?,
            text: row.get(4)?,
            category: row.get(5)?,
            metadata: BTreeMap::new(),
            created_at: row.get(7)?,
        },
        metadata: row.get(6)?,
    })
}

impl RawMemory {
    fn decode(self) -> Result<MemoryRecord, StoreError> {
        let mut r = self.record;
        r.metadata = parse_json("memory", &r.id, "metadata", &self.metadata)?;
        Ok(r)
    }
}

/// What a user typed as an FTS5 query: each word (a run of letters and digits, as the
/// index's tokenizer splits them) quoted as a string, so that `"`, `*`, `(`, `:`, `^`,
/// `NEAR`, `AND`, `OR` and `NOT` are words or separators, never syntax; joined by `OR`, so
/// bm25 ranks the memories that match more (and rarer) words first. `None` when it has no
/// word at all. Repeated words count once; at most [`MAX_QUERY_TERMS`].
pub fn fts_query(text: &str) -> Option<String> {
    let mut seen: Vec<String> = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        let lower = word.to_lowercase();
        if !seen.contains(&lower) {
            seen.push(lower);
        }
        if seen.len() == MAX_QUERY_TERMS {
            break;
        }
    }
    if seen.is_empty() {
        return None;
    }
    // Words hold no `"` (they are letters and digits), but a string's quotes are doubled
    // anyway, so the quoting holds whatever the split lets through.
    let terms: Vec<String> = seen
        .iter()
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect();
    Some(terms.join(" OR "))
}

impl Store {
    /// Records a new memory, unless its scope (its owner and sandbox) holds `cap` memories
    /// already: then nothing is written and `false` comes back. The count and the insert
    /// are one transaction.
    pub fn insert_memory(&self, m: &MemoryRecord, cap: u64) -> Result<bool, StoreError> {
        Ok(self.insert_memory_with(m, cap, None)?.is_some())
    }

    /// [`Store::insert_memory`] with the memory's vector, if it has one, in the same
    /// transaction; the new memory's `seq`, or `None` when its scope is full.
    pub fn insert_memory_with(
        &self,
        m: &MemoryRecord,
        cap: u64,
        vector: Option<&MemoryVector>,
    ) -> Result<Option<i64>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let held: i64 = tx
            .prepare_cached(
                "SELECT COUNT(*) FROM memories \
                 WHERE owner = ?1 AND sandbox_id IS ?2 AND deleted_at IS NULL",
            )?
            .query_row(params![m.owner, m.sandbox_id], |row| row.get(0))?;
        if count_from_sql(held) >= cap {
            return Ok(None);
        }
        let seq = insert_in(&tx, m)?;
        if let Some(v) = vector {
            put_vector_in(&tx, seq, v)?;
        }
        tx.commit()?;
        Ok(Some(seq))
    }

    /// Records copies of memories (a fork's of its origin's) in one transaction, all or
    /// none, each with its original's vector: each record's `seq` names its original (the
    /// copy gets a `seq` of its own).
    pub fn copy_memories(&self, copies: &[MemoryRecord]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for m in copies {
            let seq = insert_in(&tx, m)?;
            tx.prepare_cached(
                "INSERT INTO memory_vectors (seq, model, dims, vector) \
                 SELECT ?1, model, dims, vector FROM memory_vectors WHERE seq = ?2",
            )?
            .execute(params![seq, m.seq])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Stores (or replaces) the vectors of memories by `seq`, skipping any memory deleted
    /// outright meanwhile (no vector outlives its memory).
    pub fn put_memory_vectors(&self, vectors: &[(i64, MemoryVector)]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for (seq, v) in vectors {
            put_vector_in(&tx, *seq, v)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The vector of memory `seq`, if it has one.
    pub fn memory_vector(&self, seq: i64) -> Result<Option<MemoryVector>, StoreError> {
        let found: Option<(String, Vec<u8>)> = self
            .conn()
            .prepare_cached("SELECT model, vector FROM memory_vectors WHERE seq = ?1")?
            .query_row([seq], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        Ok(found.map(|(model, blob)| MemoryVector {
            model,
            vector: blob
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        }))
    }

    /// Memories of one scope (optionally of one category) without a vector of `model`,
    /// oldest first, at most `limit`; and how many there are in all.
    pub fn memories_without_vector(
        &self,
        owner: &str,
        sandbox_id: Option<&str>,
        category: Option<&str>,
        model: &str,
        limit: u32,
    ) -> Result<(Vec<MemoryRecord>, u64), StoreError> {
        const MISSING: &str = "FROM memories AS m \
             WHERE m.owner = ?1 AND m.sandbox_id IS ?2 AND m.deleted_at IS NULL \
             AND (?3 IS NULL OR m.category = ?3) AND NOT EXISTS (SELECT 1 FROM memory_vectors \
             AS v WHERE v.seq = m.seq AND v.model = ?4)";
        let (raws, total) = {
            let conn = self.conn();
            let total: i64 = conn
                .prepare_cached(&format!("SELECT COUNT(*) {MISSING}"))?
                .query_row(params![owner, sandbox_id, category, model], |row| {
                    row.get(0)
                })?;
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {M_COLUMNS} {MISSING} ORDER BY m.seq LIMIT ?5"
            ))?;
            let rows = stmt.query_map(
                params![owner, sandbox_id, category, model, i64::from(limit)],
                from_row,
            )?;
            (rows.collect::<Result<Vec<_>, _>>()?, total)
        };
        let records = raws
            .into_iter()
            .map(RawMemory::decode)
            .collect::<Result<Vec<_>, _>>()?;
        Ok((records, count_from_sql(total)))
    }

    /// The memories of one scope (optionally of one category) whose vector of `model` is
    /// nearest `query` by cosine similarity, most similar first (ties: newest first), at
    /// most `limit`, none below `min_similarity`. Vectors of another length than the
    /// query's are not compared.
    #[allow(clippy::too_many_arguments)]
    pub fn nearest_memories(
        &self,
        owner: &str,
        sandbox_id: Option<&str>,
        category: Option<&str>,
        model: &str,
        query: &[f32],
        limit: u32,
        min_similarity: f32,
    ) -> Result<Vec<(MemoryRecord, f32)>, StoreError> {
        let query_norm = query.iter().map(|x| x * x).sum::<f32>().sqrt();
        let dims = i64::try_from(query.len()).unwrap_or(i64::MAX);
        let size = page_size(limit) as usize;
        // Every vector of the scope is compared; only the best `size` are kept.
        let mut best: Vec<(i64, f32)> = Vec::with_capacity(size + 1);
        {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(
                "SELECT m.seq, v.vector FROM memory_vectors AS v \
                 JOIN memories AS m ON m.seq = v.seq \
                 WHERE m.owner = ?1 AND m.sandbox_id IS ?2 AND m.deleted_at IS NULL \
                 AND (?3 IS NULL OR m.category = ?3) AND v.model = ?4 AND v.dims = ?5",
            )?;
            let mut rows = stmt.query(params![owner, sandbox_id, category, model, dims])?;
            while let Some(row) = rows.next()? {
                let seq: i64 = row.get(0)?;
                let rusqlite::types::ValueRef::Blob(blob) = row.get_ref(1)? else {
                    continue;
                };
                let sim = cosine_blob(blob, query, query_norm);
                if sim < min_similarity || !sim.is_finite() {
                    continue;
                }
                best.push((seq, sim));
                if best.len() > size {
                    best.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
                    best.truncate(size);
                }
            }
        }
        best.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
        best.truncate(size);
        let mut out = Vec::with_capacity(best.len());
        for (seq, sim) in best {
            let raw = self
                .conn()
                .prepare_cached(&format!("SELECT {COLUMNS} FROM memories WHERE seq = ?1"))?
                .query_row([seq], from_row)
                .optional()?;
            if let Some(raw) = raw {
                out.push((raw.decode()?, sim));
            }
        }
        Ok(out)
    }

    /// Records memories (a fork's copies of its origin's) in one transaction: all or none.
    pub fn insert_memories(&self, memories: &[MemoryRecord]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for m in memories {
            insert_in(&tx, m)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The memory with this id, unless it is deleted.
    pub fn get_memory(&self, id: &str) -> Result<Option<MemoryRecord>, StoreError> {
        self.conn()
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM memories WHERE id = ?1 AND deleted_at IS NULL"
            ))?
            .query_row([id], from_row)
            .optional()?
            .map(RawMemory::decode)
            .transpose()
    }

    /// Memories of one scope (`owner`'s own with `sandbox_id` `None`, else that sandbox's),
    /// newest first, optionally of one category; a page of `limit` (see [`crate::Page`])
    /// starting after the memory at `before` (the previous page's `next_cursor`, a `seq`).
    pub fn list_memories(
        &self,
        owner: &str,
        sandbox_id: Option<&str>,
        category: Option<&str>,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Page<MemoryRecord>, StoreError> {
        let size = page_size(limit);
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM memories \
                 WHERE owner = ?1 AND sandbox_id IS ?2 AND deleted_at IS NULL \
                 AND (?3 IS NULL OR category = ?3) AND (?4 IS NULL OR seq < ?4) \
                 ORDER BY seq DESC LIMIT ?5"
            ))?;
            let rows = stmt.query_map(
                params![owner, sandbox_id, category, before, i64::from(size) + 1],
                from_row,
            )?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let mut items = raws
            .into_iter()
            .map(RawMemory::decode)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() > size as usize {
            items.truncate(size as usize);
            items.last().map(|m| m.seq.to_string())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    /// The memories of one scope that match `query` (see [`fts_query`]), most relevant
    /// first (bm25; ties: newest first), at most `limit`; optionally of one category. A
    /// query without a word finds nothing.
    pub fn search_memories(
        &self,
        owner: &str,
        sandbox_id: Option<&str>,
        query: &str,
        category: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MemoryHit>, StoreError> {
        let Some(fts) = fts_query(query) else {
            return Ok(Vec::new());
        };
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {M_COLUMNS}, bm25(memories_fts) AS rank \
                 FROM memories_fts JOIN memories AS m ON m.seq = memories_fts.rowid \
                 WHERE memories_fts MATCH ?1 AND m.owner = ?2 AND m.sandbox_id IS ?3 \
                 AND m.deleted_at IS NULL AND (?4 IS NULL OR m.category = ?4) \
                 ORDER BY rank, m.seq DESC LIMIT ?5"
            ))?;
            let rows = stmt.query_map(
                params![
                    fts,
                    owner,
                    sandbox_id,
                    category,
                    i64::from(page_size(limit))
                ],
                |row| Ok((from_row(row)?, row.get::<_, f64>(8)?)),
            )?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter()
            .map(|(raw, rank)| {
                Ok(MemoryHit {
                    memory: raw.decode()?,
                    score: -rank,
                })
            })
            .collect()
    }

    /// What sandbox `sandbox_id` of `owner` remembered at time `at` (ms): the memories made
    /// by then and not deleted by then (deleted ones a snapshot needs are kept for this),
    /// oldest first. What a sandbox made from a snapshot taken at `at` starts with.
    pub fn memories_at(
        &self,
        owner: &str,
        sandbox_id: &str,
        at: i64,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM memories \
                 WHERE sandbox_id = ?1 AND owner = ?2 AND created_at <= ?3 \
                 AND (deleted_at IS NULL OR deleted_at > ?3) ORDER BY seq"
            ))?;
            let rows = stmt.query_map(params![sandbox_id, owner, at], from_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(RawMemory::decode).collect()
    }

    /// Deletes memory `id` at time `at` (ms); returns whether it existed (and was not
    /// deleted already). A sandbox's memory that a snapshot of that sandbox taken since it
    /// was made may still hand to a fork ([`Store::memories_at`]) keeps its row, marked
    /// deleted (out of the index, listings and searches); any other is gone at once. The
    /// marked rows of that sandbox that no snapshot needs any more go in the same
    /// transaction.
    pub fn delete_memory(&self, id: &str, at: i64) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let found: Option<(Option<String>, bool)> = tx
            .prepare_cached(
                "SELECT m.sandbox_id, EXISTS (SELECT 1 FROM snapshots AS s \
                 WHERE s.sandbox_id = m.sandbox_id AND s.created_at >= m.created_at) \
                 FROM memories AS m WHERE m.id = ?1 AND m.deleted_at IS NULL",
            )?
            .query_row([id], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let Some((sandbox_id, needed)) = found else {
            return Ok(false);
        };
        if needed {
            tx.prepare_cached("UPDATE memories SET deleted_at = ?2 WHERE id = ?1")?
                .execute(params![id, at])?;
        } else {
            tx.prepare_cached("DELETE FROM memories WHERE id = ?1")?
                .execute([id])?;
        }
        if let Some(sandbox_id) = sandbox_id {
            purge_unneeded_memories(&tx, &sandbox_id)?;
        }
        tx.commit()?;
        Ok(true)
    }
}

/// Deletes sandbox `sandbox_id`'s memory rows kept (marked deleted) for a snapshot that no
/// snapshot of it needs any more: after a memory's delete, and after a snapshot's.
pub(crate) fn purge_unneeded_memories(
    tx: &rusqlite::Transaction<'_>,
    sandbox_id: &str,
) -> Result<usize, StoreError> {
    Ok(tx
        .prepare_cached(
            "DELETE FROM memories WHERE sandbox_id = ?1 AND deleted_at IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM snapshots AS s WHERE s.sandbox_id = ?1 \
             AND s.created_at >= memories.created_at AND s.created_at < memories.deleted_at)",
        )?
        .execute([sandbox_id])?)
}

fn put_vector_in(
    tx: &rusqlite::Transaction<'_>,
    seq: i64,
    v: &MemoryVector,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO memory_vectors (seq, model, dims, vector) \
         SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM memories WHERE seq = ?1)",
    )?
    .execute(params![
        seq,
        v.model,
        i64::try_from(v.vector.len()).unwrap_or(i64::MAX),
        vector_blob(&v.vector)
    ])?;
    Ok(())
}

/// Inserts `m`; its new `seq`.
fn insert_in(tx: &rusqlite::Transaction<'_>, m: &MemoryRecord) -> Result<i64, StoreError> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO memories (id, owner, sandbox_id, text, category, metadata, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            m.id,
            m.owner,
            m.sandbox_id,
            m.text,
            m.category,
            string_map_json(&m.metadata),
            m.created_at,
        ]);
    match inserted {
        Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists {
            what: "memory",
            id: m.id.clone(),
        }),
        other => other
            .map(|_| tx.last_insert_rowid())
            .map_err(StoreError::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SnapshotRecord;

    fn memory(id: &str, owner: &str, sandbox: Option<&str>, text: &str, at: i64) -> MemoryRecord {
        MemoryRecord {
            seq: 0,
            id: id.to_owned(),
            owner: owner.to_owned(),
            sandbox_id: sandbox.map(str::to_owned),
            text: text.to_owned(),
            category: "general".to_owned(),
            metadata: BTreeMap::new(),
            created_at: at,
        }
    }

    fn add(store: &Store, m: &MemoryRecord) {
        assert!(store.insert_memory(m, 1000).unwrap());
    }

    fn ids(hits: &[MemoryHit]) -> Vec<&str> {
        hits.iter().map(|h| h.memory.id.as_str()).collect()
    }

    fn snapshot(store: &Store, id: &str, sandbox: &str, at: i64) {
        store
            .insert_snapshot(&SnapshotRecord {
                id: id.to_owned(),
                owner: "alice".to_owned(),
                sandbox_id: sandbox.to_owned(),
                parent_id: None,
                name: id.to_owned(),
                description: String::new(),
                tags: BTreeMap::new(),
                fidelity: "files".to_owned(),
                created_at: at,
                size: 0,
                manifest: serde_json::json!({}),
                path: "/nowhere".to_owned(),
            })
            .unwrap();
    }

    /// Rows of the full-text index, and whether FTS5 finds it consistent.
    fn index_rows(store: &Store) -> i64 {
        let conn = store.conn();
        conn.execute(
            "INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')",
            [],
        )
        .unwrap();
        conn.query_row("SELECT COUNT(*) FROM memories_fts_docsize", [], |r| {
            r.get(0)
        })
        .unwrap()
    }

    #[test]
    fn the_bundled_sqlite_has_fts5_with_bm25() {
        let store = Store::open_in_memory().unwrap();
        let conn = store.conn();
        let has: bool = conn
            .query_row("SELECT sqlite_compileoption_used('ENABLE_FTS5')", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert!(has);
        conn.execute_batch(
            "CREATE VIRTUAL TABLE t USING fts5(x); \
             INSERT INTO t (x) VALUES ('red apples'), ('green apples and red pears');",
        )
        .unwrap();
        let best: String = conn
            .query_row(
                "SELECT x FROM t WHERE t MATCH 'red OR pears' ORDER BY bm25(t) LIMIT 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(best, "green apples and red pears");
    }

    #[test]
    fn search_ranks_the_relevant_memory_first() {
        let store = Store::open_in_memory().unwrap();
        let texts = [
            ("mem-1", "The user prefers dark mode in every editor"),
            ("mem-2", "Deploys go out on Tuesdays after the standup"),
            ("mem-3", "The user's favourite colour is teal, not blue"),
            ("mem-4", "The database is PostgreSQL 16 on the staging host"),
            ("mem-5", "Blue builds are canaries; green builds are stable"),
        ];
        for (i, (id, text)) in texts.iter().enumerate() {
            add(&store, &memory(id, "alice", Some("sb-a"), text, i as i64));
        }
        let hits = store
            .search_memories(
                "alice",
                Some("sb-a"),
                "what is the favourite colour?",
                None,
                10,
            )
            .unwrap();
        assert_eq!(hits[0].memory.id, "mem-3", "{hits:?}");
        assert!(hits[0].score > 0.0);
        assert!(
            hits.windows(2).all(|w| w[0].score >= w[1].score),
            "{hits:?}"
        );
        // Stemming: "deploying" finds "Deploys".
        let hits = store
            .search_memories("alice", Some("sb-a"), "deploying", None, 10)
            .unwrap();
        assert_eq!(ids(&hits), ["mem-2"]);
        // Accents are folded both ways.
        add(
            &store,
            &memory("mem-6", "alice", Some("sb-a"), "Lunch at the café", 6),
        );
        for q in ["cafe", "CAFÉ"] {
            let hits = store
                .search_memories("alice", Some("sb-a"), q, None, 10)
                .unwrap();
            assert_eq!(ids(&hits), ["mem-6"], "{q}");
        }
        // A rarer word outranks a common one: "postgresql" beats "the".
        let hits = store
            .search_memories("alice", Some("sb-a"), "the PostgreSQL", None, 10)
            .unwrap();
        assert_eq!(hits[0].memory.id, "mem-4", "{hits:?}");
        // The limit.
        let hits = store
            .search_memories("alice", Some("sb-a"), "the", None, 2)
            .unwrap();
        assert_eq!(hits.len(), 2);
    }

    #[test]
    fn search_stays_in_its_scope_and_category() {
        let store = Store::open_in_memory().unwrap();
        add(
            &store,
            &memory("mem-a", "alice", Some("sb-a"), "tea time", 1),
        );
        add(
            &store,
            &memory("mem-b", "alice", Some("sb-b"), "tea time", 2),
        );
        add(&store, &memory("mem-o", "alice", None, "tea time", 3));
        add(&store, &memory("mem-x", "bob", None, "tea time", 4));
        let mut pref = memory("mem-p", "alice", None, "tea with milk", 5);
        pref.category = "preference".to_owned();
        add(&store, &pref);
        let find = |sb: Option<&str>, owner: &str, cat: Option<&str>| {
            let hits = store.search_memories(owner, sb, "tea", cat, 10).unwrap();
            ids(&hits)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(find(Some("sb-a"), "alice", None), ["mem-a"]);
        assert_eq!(find(Some("sb-a"), "bob", None), Vec::<String>::new());
        let mut owner = find(None, "alice", None);
        owner.sort();
        assert_eq!(owner, ["mem-o", "mem-p"]);
        assert_eq!(find(None, "alice", Some("preference")), ["mem-p"]);
        assert_eq!(find(None, "bob", None), ["mem-x"]);
    }

    #[test]
    fn queries_are_words_never_fts_syntax() {
        let store = Store::open_in_memory().unwrap();
        add(&store, &memory("mem-1", "o", None, "near the foo bar", 1));
        add(&store, &memory("mem-2", "o", None, "or and not", 2));
        for q in [
            "\"foo",
            "foo\"",
            "a OR",
            "OR",
            "NEAR(",
            "NEAR(foo bar, 2)",
            "foo*",
            "text:foo",
            "^foo",
            "(foo",
            "foo AND",
            "NOT",
            "-foo",
            "{text}: foo",
            "'; DROP TABLE memories; --",
            "\u{0}foo",
        ] {
            let hits = store.search_memories("o", None, q, None, 10);
            assert!(hits.is_ok(), "{q:?}: {hits:?}");
        }
        // Keywords are plain words.
        let hits = store.search_memories("o", None, "NEAR(", None, 10).unwrap();
        assert_eq!(ids(&hits), ["mem-1"]);
        let hits = store.search_memories("o", None, "OR", None, 10).unwrap();
        assert_eq!(ids(&hits), ["mem-2"]);
        // Nothing to look for: nothing found.
        for q in ["", "   ", "\"", "()*:^", "--"] {
            assert!(
                store
                    .search_memories("o", None, q, None, 10)
                    .unwrap()
                    .is_empty()
            );
        }
        assert_eq!(fts_query("a \"b\" a A"), Some("\"a\" OR \"b\"".to_owned()));
        assert_eq!(fts_query("NEAR(x"), Some("\"near\" OR \"x\"".to_owned()));
        let long: String = (0..100).map(|i| format!("w{i} ")).collect();
        assert_eq!(
            fts_query(&long).unwrap().matches(" OR ").count(),
            MAX_QUERY_TERMS - 1
        );
        // The table survived.
        assert!(store.get_memory("mem-1").unwrap().is_some());
    }

    #[test]
    fn the_index_follows_deletes() {
        let store = Store::open_in_memory().unwrap();
        add(&store, &memory("mem-1", "o", None, "kiwi fruit", 1));
        add(&store, &memory("mem-2", "o", None, "kiwi bird", 2));
        add(&store, &memory("mem-3", "o", Some("sb-a"), "kiwi juice", 3));
        assert_eq!(index_rows(&store), 3);
        // No snapshot needs it: gone outright.
        assert!(store.delete_memory("mem-1", 10).unwrap());
        assert!(!store.delete_memory("mem-1", 11).unwrap());
        assert_eq!(index_rows(&store), 2);
        let hits = store.search_memories("o", None, "kiwi", None, 10).unwrap();
        assert_eq!(ids(&hits), ["mem-2"]);
        assert!(store.get_memory("mem-1").unwrap().is_none());
        // One a snapshot needs: out of the index and the listings, its row kept.
        snapshot(&store, "sn-1", "sb-a", 5);
        assert!(store.delete_memory("mem-3", 12).unwrap());
        assert_eq!(index_rows(&store), 1);
        assert!(
            store
                .search_memories("o", Some("sb-a"), "kiwi", None, 10)
                .unwrap()
                .is_empty()
        );
        assert!(store.get_memory("mem-3").unwrap().is_none());
        assert!(
            store
                .list_memories("o", Some("sb-a"), None, 0, None)
                .unwrap()
                .items
                .is_empty()
        );
        assert!(!store.delete_memory("mem-3", 13).unwrap());
        // A memory of the same words added again is found again.
        add(
            &store,
            &memory("mem-4", "o", Some("sb-a"), "kiwi juice", 14),
        );
        let hits = store
            .search_memories("o", Some("sb-a"), "juice", None, 10)
            .unwrap();
        assert_eq!(ids(&hits), ["mem-4"]);
        assert_eq!(index_rows(&store), 2);
    }

    #[test]
    fn a_snapshot_sees_what_its_sandbox_had_then() {
        let store = Store::open_in_memory().unwrap();
        add(
            &store,
            &memory("mem-1", "alice", Some("sb-a"), "before", 10),
        );
        add(
            &store,
            &memory("mem-2", "alice", Some("sb-a"), "deleted later", 11),
        );
        add(
            &store,
            &memory("mem-3", "alice", Some("sb-a"), "deleted before", 12),
        );
        assert!(store.delete_memory("mem-3", 15).unwrap());
        snapshot(&store, "sn-1", "sb-a", 20);
        add(&store, &memory("mem-4", "alice", Some("sb-a"), "after", 30));
        assert!(store.delete_memory("mem-2", 40).unwrap());
        add(&store, &memory("mem-o", "alice", None, "the owner's", 5));
        add(
            &store,
            &memory("mem-b", "bob", Some("sb-a"), "not alice's", 5),
        );
        let then: Vec<String> = store
            .memories_at("alice", "sb-a", 20)
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(then, ["mem-1", "mem-2"]);
        // mem-3 went before any snapshot needed it: no row left.
        let rows: i64 = store
            .conn()
            .query_row(
                "SELECT COUNT(*) FROM memories WHERE id = 'mem-3'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 0);
        let count = |store: &Store| -> i64 {
            store
                .conn()
                .query_row(
                    "SELECT COUNT(*) FROM memories WHERE sandbox_id = 'sb-a'",
                    [],
                    |r| r.get(0),
                )
                .unwrap()
        };
        let before = count(&store);
        // Deleting the snapshot clears the rows kept only for it, at once.
        store.delete_snapshot("sn-1").unwrap();
        assert!(
            count(&store) < before,
            "the kept rows went with the snapshot"
        );
        assert!(store.delete_memory("mem-4", 50).unwrap());
        assert_eq!(count(&store), 2, "mem-1 and bob's are left");
    }

    #[test]
    fn copies_lists_pages_and_caps() {
        let store = Store::open_in_memory().unwrap();
        for i in 0..5 {
            add(
                &store,
                &memory(
                    &format!("mem-{i}"),
                    "o",
                    Some("sb-a"),
                    &format!("note {i}"),
                    i,
                ),
            );
        }
        let first = store
            .list_memories("o", Some("sb-a"), None, 2, None)
            .unwrap();
        let got: Vec<&str> = first.items.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(got, ["mem-4", "mem-3"]);
        let before = first.next_cursor.unwrap().parse().unwrap();
        let second = store
            .list_memories("o", Some("sb-a"), None, 10, Some(before))
            .unwrap();
        let got: Vec<&str> = second.items.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(got, ["mem-2", "mem-1", "mem-0"]);
        assert!(second.next_cursor.is_none());
        // Full: refused, nothing written.
        assert!(
            !store
                .insert_memory(&memory("mem-x", "o", Some("sb-a"), "x", 9), 5)
                .unwrap()
        );
        assert!(store.get_memory("mem-x").unwrap().is_none());
        // Another scope has its own room.
        assert!(
            store
                .insert_memory(&memory("mem-y", "o", None, "y", 9), 5)
                .unwrap()
        );
        // Copies: all or none (a taken id fails the lot).
        let copies: Vec<MemoryRecord> = store
            .memories_at("o", "sb-a", 100)
            .unwrap()
            .into_iter()
            .map(|mut m| {
                m.id = format!("{}-copy", m.id);
                m.sandbox_id = Some("sb-b".to_owned());
                m
            })
            .collect();
        let mut clash = copies.clone();
        clash.push(memory("mem-y", "o", Some("sb-b"), "taken", 1));
        assert!(matches!(
            store.insert_memories(&clash),
            Err(StoreError::AlreadyExists { .. })
        ));
        assert!(
            store
                .list_memories("o", Some("sb-b"), None, 0, None)
                .unwrap()
                .items
                .is_empty()
        );
        store.insert_memories(&copies).unwrap();
        let hits = store
            .search_memories("o", Some("sb-b"), "note", None, 10)
            .unwrap();
        assert_eq!(hits.len(), 5);
        // The copies keep when their originals were made.
        let mut made: Vec<i64> = hits.iter().map(|h| h.memory.created_at).collect();
        made.sort_unstable();
        assert_eq!(made, [0, 1, 2, 3, 4]);
        let mut with_meta = memory("mem-m", "o", None, "m", 1);
        with_meta.metadata.insert("k".to_owned(), "v".to_owned());
        add(&store, &with_meta);
        assert_eq!(
            store.get_memory("mem-m").unwrap().unwrap().metadata["k"],
            "v"
        );
        assert!(matches!(
            store.insert_memory(&with_meta, 1000),
            Err(StoreError::AlreadyExists { .. })
        ));
    }

    fn vector(model: &str, v: &[f32]) -> MemoryVector {
        MemoryVector {
            model: model.to_owned(),
            vector: v.to_vec(),
        }
    }

    #[test]
    fn vectors_rank_by_cosine_follow_deletes_and_go_with_copies() {
        let store = Store::open_in_memory().unwrap();
        let put = |id: &str, at: i64, v: Option<&[f32]>| {
            let vec = v.map(|v| vector("openai/e", v));
            store
                .insert_memory_with(&memory(id, "o", Some("sb-a"), id, at), 1000, vec.as_ref())
                .unwrap()
                .unwrap()
        };
        let a = put("mem-a", 1, Some(&[1.0, 0.0, 0.0]));
        put("mem-b", 2, Some(&[0.6, 0.8, 0.0]));
        put("mem-c", 3, Some(&[0.0, 0.0, 1.0]));
        let d = put("mem-d", 4, None);
        // Stored as little-endian f32s, read back the same.
        assert_eq!(
            store.memory_vector(a).unwrap().unwrap().vector,
            vec![1.0, 0.0, 0.0]
        );
        let near = |q: &[f32], min: f32| {
            store
                .nearest_memories("o", Some("sb-a"), None, "openai/e", q, 10, min)
                .unwrap()
                .into_iter()
                .map(|(m, s)| (m.id, (s * 100.0).round() / 100.0))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            near(&[2.0, 0.0, 0.0], 0.1),
            [("mem-a".to_string(), 1.0), ("mem-b".to_string(), 0.6)]
        );
        assert_eq!(near(&[1.0, 0.0, 0.0], 0.7), [("mem-a".to_string(), 1.0)]);
        // Another model's vectors, or another length, are not compared.
        assert!(
            store
                .nearest_memories(
                    "o",
                    Some("sb-a"),
                    None,
                    "openai/other",
                    &[1.0, 0.0, 0.0],
                    10,
                    0.0
                )
                .unwrap()
                .is_empty()
        );
        assert!(near(&[1.0, 0.0], 0.0).is_empty());
        // Which lack one: the one added without, until it is put.
        let (missing, total) = store
            .memories_without_vector("o", Some("sb-a"), None, "openai/e", 10)
            .unwrap();
        assert_eq!((missing.len(), total), (1, 1));
        assert_eq!(missing[0].id, "mem-d");
        store
            .put_memory_vectors(&[
                (d, vector("openai/e", &[0.0, 1.0, 0.0])),
                (9999, vector("openai/e", &[1.0])),
            ])
            .unwrap();
        assert_eq!(near(&[0.0, 1.0, 0.0], 0.5)[0].0, "mem-d");
        assert!(
            store.memory_vector(9999).unwrap().is_none(),
            "no memory, no vector"
        );
        let (_, total) = store
            .memories_without_vector("o", Some("sb-a"), None, "openai/other", 10)
            .unwrap();
        assert_eq!(total, 4);

        // A fork's copies carry their originals' vectors.
        snapshot(&store, "sn-1", "sb-a", 10);
        let copies: Vec<MemoryRecord> = store
            .memories_at("o", "sb-a", 10)
            .unwrap()
            .into_iter()
            .map(|m| MemoryRecord {
                id: format!("{}-copy", m.id),
                sandbox_id: Some("sb-b".to_owned()),
                ..m
            })
            .collect();
        store.copy_memories(&copies).unwrap();
        let forked = store
            .nearest_memories(
                "o",
                Some("sb-b"),
                None,
                "openai/e",
                &[1.0, 0.0, 0.0],
                10,
                0.5,
            )
            .unwrap();
        assert_eq!(forked[0].0.id, "mem-a-copy");

        // Deleted outright: its vector goes too; marked deleted: kept for forks, unranked.
        let rows = |s: &Store| -> i64 {
            s.conn()
                .query_row("SELECT COUNT(*) FROM memory_vectors", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(rows(&store), 8);
        assert!(store.delete_memory("mem-a-copy", 20).unwrap());
        assert_eq!(rows(&store), 7);
        assert!(store.delete_memory("mem-a", 21).unwrap());
        assert_eq!(rows(&store), 7, "a snapshot may still hand mem-a to a fork");
        assert!(near(&[1.0, 0.0, 0.0], 0.9).is_empty());
        store.delete_snapshot("sn-1").unwrap();
        assert!(store.delete_memory("mem-b", 22).unwrap());
        assert_eq!(
            rows(&store),
            5,
            "mem-a's row and mem-b's went, with their vectors"
        );
    }
}
