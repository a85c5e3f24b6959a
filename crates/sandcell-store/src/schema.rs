//! Versioned schema migrations.
//!
//! The schema version is SQLite's `user_version`. Every step has a `down` so an upgrade can be
//! rolled back; steps are never edited once released, only appended.
//!
//! Tables are STRICT (SQLite enforces the declared column types) and JSON columns are checked
//! with `json_valid`, so a bug cannot store text that a later read would call corrupt.

use rusqlite_migration::{M, Migrations};

/// Step 1: sandboxes and their state history.
///
/// `sandbox_events.sandbox_id` deliberately has no foreign key: history must survive the
/// sandbox row's deletion, and a foreign key without `ON DELETE CASCADE` would make that
/// deletion fail instead. `AUTOINCREMENT` keeps event ids increasing even after deletions, so
/// ordering by id is ordering by commit.
const V1_SANDBOXES: &str = r#"
CREATE TABLE sandboxes (
    id              TEXT    NOT NULL PRIMARY KEY,
    owner           TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    reason          TEXT,
    spec            TEXT    NOT NULL CHECK (json_valid(spec)),
    labels          TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    metadata        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    last_active_at  INTEGER NOT NULL,
    idle_timeout_ms INTEGER CHECK (idle_timeout_ms >= 0),
    expires_at      INTEGER,
    ephemeral       INTEGER NOT NULL DEFAULT 0 CHECK (ephemeral IN (0, 1)),
    runtime         TEXT    NOT NULL DEFAULT 'null' CHECK (json_valid(runtime))
) STRICT;
-- Listing order and cursor seeks, with and without an owner filter.
CREATE INDEX sandboxes_by_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_by_owner ON sandboxes (owner, created_at, id);
-- Counting per owner and state (caps), and the GC/restart scans by state.
CREATE INDEX sandboxes_by_state ON sandboxes (state, owner);

CREATE TABLE sandbox_events (
    id         INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    sandbox_id TEXT    NOT NULL,
    at         INTEGER NOT NULL,
    from_state TEXT    NOT NULL,
    to_state   TEXT    NOT NULL,
    reason     TEXT
) STRICT;
CREATE INDEX sandbox_events_by_sandbox ON sandbox_events (sandbox_id, id);
"#;

const V1_DOWN: &str = r#"
DROP TABLE sandbox_events;
DROP TABLE sandboxes;
"#;

/// Step 2: API keys; only the secret's hash is stored.
const V2_API_KEYS: &str = r#"
CREATE TABLE api_keys (
    id           TEXT    NOT NULL PRIMARY KEY,
    owner        TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    hash         TEXT    NOT NULL UNIQUE,
    prefix       TEXT    NOT NULL,
    admin        INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1)),
    created_at   INTEGER NOT NULL,
    last_used_at INTEGER,
    revoked_at   INTEGER
) STRICT;
CREATE INDEX api_keys_by_owner ON api_keys (owner, created_at, id);
"#;

const V2_DOWN: &str = "DROP TABLE api_keys;";

/// Step 3: exports. No foreign key to `sandboxes`: an export is kept after its sandbox is gone.
const V3_EXPORTS: &str = r#"
CREATE TABLE exports (
    id          TEXT    NOT NULL PRIMARY KEY,
    owner       TEXT    NOT NULL,
    sandbox_id  TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('file', 'dir')),
    created_at  INTEGER NOT NULL,
    size        INTEGER CHECK (size >= 0),
    sha256      TEXT,
    stored_path TEXT
) STRICT;
CREATE INDEX exports_by_owner ON exports (owner, created_at, id);
CREATE INDEX exports_by_sandbox ON exports (sandbox_id, created_at, id);
"#;

const V3_DOWN: &str = "DROP TABLE exports;";

/// Step 4: the audit log.
const V4_AUDIT: &str = r#"
CREATE TABLE audit_events (
    id         INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    owner      TEXT,
    key_id     TEXT,
    action     TEXT    NOT NULL,
    target     TEXT,
    detail     TEXT CHECK (detail IS NULL OR json_valid(detail)),
    request_id TEXT
) STRICT;
CREATE INDEX audit_events_by_owner ON audit_events (owner, id);
"#;

const V4_DOWN: &str = "DROP TABLE audit_events;";

/// Step 5: the contexts (kernels) of sandboxes: when each began and ended, and why. No
/// foreign key to `sandboxes`, like the state history. A context id is unique within its
/// sandbox while it lives; one made again under the same id replaces the ended record.
const V5_CONTEXTS: &str = r#"
CREATE TABLE contexts (
    sandbox_id TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    owner      TEXT    NOT NULL,
    language   TEXT    NOT NULL,
    cwd        TEXT,
    created_at INTEGER NOT NULL,
    ended_at   INTEGER,
    end_reason TEXT,
    PRIMARY KEY (sandbox_id, id)
) STRICT;
"#;

const V5_DOWN: &str = "DROP TABLE contexts;";

/// Step 6: snapshots and where each sandbox came from. A snapshot row is written only once
/// its files are complete and checksummed, so a listed snapshot is a whole one. `parent_id`
/// is the snapshot its source sandbox was restored or forked from (the lineage); no foreign
/// keys, like the rest, so history outlives what it names.
const V6_SNAPSHOTS: &str = r#"
CREATE TABLE snapshots (
    id          TEXT    NOT NULL PRIMARY KEY,
    owner       TEXT    NOT NULL,
    sandbox_id  TEXT    NOT NULL,
    parent_id   TEXT,
    name        TEXT    NOT NULL,
    description TEXT    NOT NULL,
    tags        TEXT    NOT NULL CHECK (json_valid(tags)),
    fidelity    TEXT    NOT NULL CHECK (fidelity IN ('files', 'language', 'process')),
    created_at  INTEGER NOT NULL,
    size        INTEGER NOT NULL CHECK (size >= 0),
    manifest    TEXT    NOT NULL CHECK (json_valid(manifest)),
    path        TEXT    NOT NULL
) STRICT;
CREATE INDEX snapshots_by_owner ON snapshots (owner, created_at, id);
CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id, created_at, id);
CREATE INDEX snapshots_by_parent ON snapshots (parent_id);
CREATE TABLE sandbox_origins (
    sandbox_id  TEXT NOT NULL PRIMARY KEY,
    snapshot_id TEXT NOT NULL
) STRICT;
CREATE INDEX sandbox_origins_by_snapshot ON sandbox_origins (snapshot_id);
"#;

const V6_DOWN: &str = "DROP TABLE sandbox_origins; DROP TABLE snapshots;";

/// Step 7: automatic snapshots per sandbox (on an interval, before it is reclaimed).
const V7_AUTO_SNAPSHOTS: &str = r#"
CREATE TABLE auto_snapshots (
    sandbox_id     TEXT    NOT NULL PRIMARY KEY,
    owner          TEXT    NOT NULL,
    interval_ms    INTEGER CHECK (interval_ms IS NULL OR interval_ms > 0),
    before_reclaim INTEGER NOT NULL CHECK (before_reclaim IN (0, 1)),
    keep           INTEGER NOT NULL CHECK (keep > 0),
    last_at        INTEGER
) STRICT;
"#;

const V7_DOWN: &str = "DROP TABLE auto_snapshots;";

/// Step 8: agent runs and their trajectories. A run's events are numbered from 1 without
/// gaps (the primary key and the insert's check keep them so); the JSON of each event is
/// the trajectory's record, which the store never interprets.
const V8_RUNS: &str = r#"
CREATE TABLE runs (
    id         TEXT    NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL,
    root_id    TEXT    NOT NULL,
    parent_id  TEXT,
    depth      INTEGER NOT NULL CHECK (depth >= 0),
    mode       TEXT    NOT NULL,
    model      TEXT    NOT NULL,
    task       TEXT    NOT NULL,
    sandbox_id TEXT,
    status     TEXT    NOT NULL,
    reason     TEXT,
    answer     TEXT,
    settings   TEXT    NOT NULL CHECK (json_valid(settings)),
    totals     TEXT    NOT NULL CHECK (json_valid(totals)),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    ended_at   INTEGER
) STRICT;
CREATE INDEX runs_by_owner ON runs (owner, created_at, id);
CREATE INDEX runs_by_status ON runs (status);
CREATE INDEX runs_by_root ON runs (root_id, created_at);
CREATE TABLE run_events (
    run_id TEXT    NOT NULL,
    seq    INTEGER NOT NULL CHECK (seq >= 1),
    at     INTEGER NOT NULL,
    kind   TEXT    NOT NULL,
    event  TEXT    NOT NULL CHECK (json_valid(event)),
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;
"#;

const V8_DOWN: &str = "DROP TABLE run_events; DROP TABLE runs;";

/// Step 10: threads, conversations that persist across agent runs (their runs stay in
/// `runs`; a thread names its shared sandbox and its latest run).
const V10_THREADS: &str = r#"
CREATE TABLE threads (
    id          TEXT    NOT NULL PRIMARY KEY,
    owner       TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    sandbox_id  TEXT,
    last_run_id TEXT,
    runs        INTEGER NOT NULL DEFAULT 0 CHECK (runs >= 0),
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (owner, name)
) STRICT;
CREATE INDEX threads_by_owner ON threads (owner, updated_at);
"#;

const V10_DOWN: &str = "DROP TABLE threads;";

/// Step 9: memories, of a sandbox (`sandbox_id`) or of their owner (`sandbox_id` NULL), and
/// their full-text index.
///
/// `seq` is the row's rowid (an `INTEGER PRIMARY KEY` alias, so `VACUUM` never renumbers it)
/// and the index's rowid; `id` is what the API shows. A deleted memory that a snapshot taken
/// since it was made may still hand to a fork keeps its row with `deleted_at` set (its
/// text is what that fork will see); any other is deleted outright (the store decides, see
/// `Store::delete_memory`).
///
/// The index is contentless (it keeps only the tokens; the text stays in `memories`) with
/// `contentless_delete`, and holds exactly the memories not deleted: the triggers keep it
/// in step with every insert, delete and change of `text` or `deleted_at`, so no code path
/// can forget to. (An external-content index would have to mirror the whole table,
/// tombstones included, for its own integrity check and `rebuild` to hold.) Porter stemming
/// over unicode61 with diacritics folded: "running" finds "run", "café" finds "cafe".
const V9_MEMORIES: &str = r#"
CREATE TABLE memories (
    seq        INTEGER NOT NULL PRIMARY KEY,
    id         TEXT    NOT NULL UNIQUE,
    owner      TEXT    NOT NULL,
    sandbox_id TEXT,
    text       TEXT    NOT NULL,
    category   TEXT    NOT NULL,
    metadata   TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    created_at INTEGER NOT NULL,
    deleted_at INTEGER
) STRICT;
-- Listing and counting one scope, newest first (`sandbox_id IS ?` uses it, NULL included).
CREATE INDEX memories_by_scope ON memories (owner, sandbox_id, seq);
-- A fork copying what its origin sandbox had at the snapshot.
CREATE INDEX memories_by_sandbox ON memories (sandbox_id, created_at);
CREATE VIRTUAL TABLE memories_fts USING fts5(
    text,
    content = '',
    contentless_delete = 1,
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories
WHEN new.deleted_at IS NULL BEGIN
    INSERT INTO memories_fts (rowid, text) VALUES (new.seq, new.text);
END;
CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories
WHEN old.deleted_at IS NULL BEGIN
    DELETE FROM memories_fts WHERE rowid = old.seq;
END;
CREATE TRIGGER memories_fts_update AFTER UPDATE OF text, deleted_at ON memories BEGIN
    DELETE FROM memories_fts WHERE rowid = old.seq AND old.deleted_at IS NULL;
    INSERT INTO memories_fts (rowid, text) SELECT new.seq, new.text WHERE new.deleted_at IS NULL;
END;
"#;

const V9_DOWN: &str = "DROP TABLE memories_fts; DROP TABLE memories;";

/// Step 11: memories' vectors (for hybrid ranking) and the jobs that extract memories from
/// a text with a model (`infer`).
///
/// A vector is the memory's embedding from `model` (`provider/model`): `dims` little-endian
/// f32s. Its `seq` is its memory's; the trigger removes it with the memory's row, so a
/// vector never outlives its memory (a memory marked deleted keeps its row, and its vector,
/// for the forks that may still copy it). One vector per memory: a memory embedded again
/// (another model) has it replaced.
///
/// A job's `memories` is the JSON list of the ids it added; `worker` names the process that
/// runs it (a job still `queued` or `running` whose worker is gone was interrupted).
const V11_MEMORY_VECTORS_AND_JOBS: &str = r#"
CREATE TABLE memory_vectors (
    seq    INTEGER NOT NULL PRIMARY KEY,
    model  TEXT    NOT NULL,
    dims   INTEGER NOT NULL CHECK (dims > 0),
    vector BLOB    NOT NULL CHECK (length(vector) = 4 * dims)
) STRICT;
CREATE TRIGGER memory_vectors_follow AFTER DELETE ON memories BEGIN
    DELETE FROM memory_vectors WHERE seq = old.seq;
END;
CREATE TABLE memory_jobs (
    seq        INTEGER NOT NULL PRIMARY KEY,
    id         TEXT    NOT NULL UNIQUE,
    owner      TEXT    NOT NULL,
    sandbox_id TEXT,
    status     TEXT    NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    model      TEXT    NOT NULL,
    text       TEXT    NOT NULL,
    category   TEXT    NOT NULL,
    metadata   TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    memories   TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(memories)),
    error      TEXT,
    worker     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX memory_jobs_by_scope ON memory_jobs (owner, sandbox_id, seq);
"#;

const V11_DOWN: &str =
    "DROP TABLE memory_jobs; DROP TRIGGER memory_vectors_follow; DROP TABLE memory_vectors;";

/// Step 12: the audit log by target (a sandbox's egress events).
const V12_AUDIT_BY_TARGET: &str =
    "CREATE INDEX audit_events_by_target ON audit_events (target, action, id);";

const V12_DOWN: &str = "DROP INDEX audit_events_by_target;";

/// Step 13: ports whose owners made their previews public (no key or token needed), so a
/// restart of the daemon keeps them public. Removed with their sandbox's record.
const V13_PUBLIC_PORTS: &str = r#"
CREATE TABLE public_ports (
    sandbox_id TEXT    NOT NULL,
    port       INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    owner      TEXT    NOT NULL,
    PRIMARY KEY (sandbox_id, port)
) STRICT;
"#;

const V13_DOWN: &str = "DROP TABLE public_ports;";

const STEPS: &[M<'static>] = &[
    M::up(V1_SANDBOXES).down(V1_DOWN),
    M::up(V2_API_KEYS).down(V2_DOWN),
    M::up(V3_EXPORTS).down(V3_DOWN),
    M::up(V4_AUDIT).down(V4_DOWN),
    M::up(V5_CONTEXTS).down(V5_DOWN),
    M::up(V6_SNAPSHOTS).down(V6_DOWN),
    M::up(V7_AUTO_SNAPSHOTS).down(V7_DOWN),
    M::up(V8_RUNS).down(V8_DOWN),
    M::up(V9_MEMORIES).down(V9_DOWN),
    M::up(V10_THREADS).down(V10_DOWN),
    M::up(V11_MEMORY_VECTORS_AND_JOBS).down(V11_DOWN),
    M::up(V12_AUDIT_BY_TARGET).down(V12_DOWN),
    M::up(V13_PUBLIC_PORTS).down(V13_DOWN),
];

/// The store's migrations, oldest first; version N is the schema after step N.
pub fn migrations() -> Migrations<'static> {
    Migrations::from_slice(STEPS)
}

/// The schema version this build migrates to.
pub const LATEST_SCHEMA_VERSION: usize = STEPS.len();
