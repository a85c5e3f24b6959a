//! `/v1/sandboxes/{id}/snapshots` and `/v1/snapshots`: take, list, show (with lineage),
//! delete, and fork (restore into new sandboxes).

use std::collections::BTreeMap;
use std::path::PathBuf;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_engine::fleet::{Checkpoint, CreateOptions};
use sandcell_engine::{RestoreReport, SandboxSpec, SnapshotManifest};
use sandcell_store::SnapshotRecord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{ApiJson, ApiPath, check_sandbox_id, query_pairs};
use super::types::{SandboxInfo, create_options, rfc3339, secs_to_ms};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Forks one request may make.
const MAX_FORKS: u32 = 16;
/// Longest name and description.
const MAX_NAME: usize = 200;
const MAX_DESCRIPTION: usize = 4000;

/// `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// A name (default: the sandbox id and the time).
    pub name: Option<String>,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// Tags to find it by.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// A snapshot.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotInfo {
    /// Its id.
    pub id: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The snapshot that sandbox came from (its parent in the lineage).
    pub parent_id: Option<String>,
    /// Its name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// `files`, `language` or `process`: what a restore brings back.
    pub fidelity: String,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// Bytes on disk.
    pub size: u64,
    /// Files carried.
    pub files: u64,
    /// What it holds: the carried files and their checksum, what was skipped, what a
    /// snapshot of this fidelity does not carry.
    pub manifest: serde_json::Value,
    /// Snapshots taken of sandboxes forked from this one (only when shown alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<String>>,
    /// Sandboxes restored or forked from it (only when shown alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<Vec<String>>,
}

/// Snapshots.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    /// Oldest first.
    pub snapshots: Vec<SnapshotInfo>,
}

/// `POST /v1/snapshots/{id}/fork`: how many sandboxes, and what each gets besides the
/// snapshot's own settings.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSnapshot {
    /// How many sandboxes (1 to 16; default 1).
    pub count: Option<u32>,
    /// Labels of the new sandboxes.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Metadata of the new sandboxes.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Lifetime in seconds.
    pub timeout_secs: Option<u64>,
    /// Idle timeout in seconds.
    pub idle_timeout_secs: Option<u64>,
    /// Forget each new sandbox's record when it stops.
    #[serde(default)]
    pub ephemeral: bool,
}

/// One sandbox made from a snapshot, and what came back.
#[derive(Debug, Serialize, ToSchema)]
pub struct Forked {
    /// The new sandbox.
    pub sandbox: SandboxInfo,
    /// What the restore brought back (fidelity, files, what was not carried).
    #[schema(value_type = Object)]
    pub restore: RestoreReport,
}

/// The result of a fork.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkResult {
    /// The sandboxes, in order.
    pub sandboxes: Vec<Forked>,
}

/// What the store keeps in a snapshot's `manifest` column.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    manifest: SnapshotManifest,
    spec: SandboxSpec,
}

fn snapshots_dir(s: &AppState) -> PathBuf {
    s.config.home.join("snapshots")
}

fn new_snapshot_id() -> Result<String, ApiError> {
    super::extract::new_record_id("sn")
}

fn check_snapshot_id(id: &str) -> Result<(), ApiError> {
    super::extract::check_record_id(id, "sn", "a snapshot")
}

fn info(r: &SnapshotRecord) -> SnapshotInfo {
    let manifest = r.manifest.get("manifest").cloned().unwrap_or_default();
    SnapshotInfo {
        id: r.id.clone(),
        sandbox_id: r.sandbox_id.clone(),
        parent_id: r.parent_id.clone(),
        name: r.name.clone(),
        description: r.description.clone(),
        tags: r.tags.clone(),
        fidelity: r.fidelity.clone(),
        created_at: rfc3339(r.created_at),
        size: r.size,
        files: manifest["files"]["files"].as_u64().unwrap_or(0),
        manifest,
        children: None,
        sandboxes: None,
    }
}

/// The caller's snapshot `id` (another owner's is missing).
fn own_snapshot(s: &AppState, caller: &Caller, id: &str) -> ApiResult<SnapshotRecord> {
    check_snapshot_id(id)?;
    s.store
        .get_snapshot(id)?
        .filter(|r| r.owner == caller.owner)
        .ok_or_else(|| ApiError::not_found("snapshot", id))
}

fn corrupt(e: sandcell_engine::EngineError) -> ApiError {
    match e {
        sandcell_engine::EngineError::Corrupt(_) => {
            ApiError::new(StatusCode::CONFLICT, "snapshot_corrupt", e.to_string())
        }
        other => other.into(),
    }
}

/// Takes a snapshot: the sandbox's `/workspace`, `/home/sandbox` and `/tmp` (and its
/// kernels' variables), read while it is paused for that moment, or a process checkpoint
/// where the sandbox has one; checksummed and kept on disk; listed only once whole.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateSnapshot,
    responses(
        (status = 201, body = SnapshotInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running, or cannot be snapshotted here", body = ErrorBody),
        (status = 507, description = "No room on the host's disk", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<CreateSnapshot>,
) -> ApiResult<(StatusCode, Json<SnapshotInfo>)> {
    check_sandbox_id(&id)?;
    let name = req.name.unwrap_or_default();
    if name.len() > MAX_NAME || req.description.len() > MAX_DESCRIPTION {
        return Err(ApiError::invalid(format!(
            "a name is at most {MAX_NAME} bytes and a description {MAX_DESCRIPTION}"
        )));
    }
    check_tags(&req.tags)?;
    let rec = take(&s, &caller.owner, &id, name, req.description, req.tags).await?;
    crate::audit(
        &s,
        &caller,
        "snapshot.create",
        Some(&rec.id),
        serde_json::json!({"sandbox": id, "size": rec.size}),
    );
    Ok((StatusCode::CREATED, Json(info(&rec))))
}

/// At most 64 tags of 1 to 128 bytes without control characters, values up to 1024.
fn check_tags(tags: &BTreeMap<String, String>) -> ApiResult<()> {
    if tags.len() > 64 {
        return Err(ApiError::invalid("at most 64 tags"));
    }
    for (k, v) in tags {
        if k.is_empty() || k.len() > 128 || k.chars().any(char::is_control) || v.len() > 1024 {
            return Err(ApiError::invalid(format!(
                "tag {k:?}: keys are 1 to 128 bytes without control characters, values up to 1024"
            )));
        }
    }
    Ok(())
}

/// Takes a snapshot of `owner`'s sandbox `id` (for a request, or on its own schedule).
pub(crate) async fn take(
    s: &AppState,
    owner: &str,
    id: &str,
    name: String,
    description: String,
    tags: BTreeMap<String, String>,
) -> ApiResult<SnapshotRecord> {
    let record = s.fleet.get(owner, id)?;
    let sandbox = s.fleet.sandbox_as_is(owner, id)?;
    let snapshot_id = new_snapshot_id()?;
    let dir = snapshots_dir(s).join(&snapshot_id);
    std::fs::create_dir_all(&dir).map_err(|e| disk_error("create the snapshot folder", e))?;
    let taken = async {
        let manifest = sandbox.snapshot_to(&dir).await.map_err(|e| match e {
            sandcell_engine::EngineError::Io { op, source } => disk_error(&op, source),
            other => other.into(),
        })?;
        let kept = Kept {
            manifest,
            spec: record.spec.clone(),
        };
        let manifest_json = serde_json::to_value(&kept)
            .map_err(|e| ApiError::internal(format!("the snapshot's manifest: {e}")))?;
        std::fs::write(dir.join("manifest.json"), manifest_json.to_string())
            .map_err(|e| disk_error("write the snapshot's manifest", e))?;
        let now = sandcell_engine::fleet::now_ms();
        let rec = SnapshotRecord {
            id: snapshot_id.clone(),
            owner: owner.to_string(),
            sandbox_id: id.to_string(),
            parent_id: s.store.sandbox_origin(id)?,
            name: if name.is_empty() {
                format!("{id} at {}", rfc3339(now))
            } else {
                name
            },
            description,
            tags,
            fidelity: kept.manifest.fidelity.clone(),
            created_at: now,
            size: kept.manifest.archive_bytes,
            manifest: manifest_json,
            path: dir.display().to_string(),
        };
        s.store.insert_snapshot(&rec)?;
        Ok::<_, ApiError>(rec)
    }
    .await;
    if taken.is_err() {
        // No half snapshot stays behind.
        let _ = std::fs::remove_dir_all(&dir);
    }
    taken
}

/// A host I/O error; a full disk is `507 no_space`.
fn disk_error(what: &str, e: std::io::Error) -> ApiError {
    if e.raw_os_error() == Some(28) || e.to_string().contains("No space left") {
        ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "no_space",
            format!("{what}: the host's disk is full ({e})"),
        )
    } else {
        ApiError::internal(format!("{what}: {e}"))
    }
}

/// Lists the caller's snapshots (`?sandbox=` for one sandbox's).
#[utoipa::path(
    get, path = "/v1/snapshots", tag = "snapshots",
    params(("sandbox" = Option<String>, Query, description = "Only this sandbox's")),
    responses(
        (status = 200, body = SnapshotList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<SnapshotList>> {
    let mut sandbox = None;
    for (k, v) in query_pairs(query.as_deref())? {
        match k.as_str() {
            "sandbox" => {
                check_sandbox_id(&v)?;
                sandbox = Some(v);
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{k}' (this route takes: sandbox)"
                )));
            }
        }
    }
    let list = s
        .store
        .list_snapshots(Some(&caller.owner), sandbox.as_deref())?;
    Ok(Json(SnapshotList {
        snapshots: list.iter().map(info).collect(),
    }))
}

/// Shows a snapshot with its lineage: its parent, its children, the sandboxes made from it.
#[utoipa::path(
    get, path = "/v1/snapshots/{snapshot_id}", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 200, body = SnapshotInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(snapshot_id): ApiPath<String>,
) -> ApiResult<Json<SnapshotInfo>> {
    let rec = own_snapshot(&s, &caller, &snapshot_id)?;
    let mut view = info(&rec);
    view.children = Some(s.store.snapshot_children(&rec.id)?);
    view.sandboxes = Some(s.store.sandboxes_from_snapshot(&rec.id)?);
    Ok(Json(view))
}

/// Deletes a snapshot and its files. One with children (snapshots of sandboxes forked from
/// it) is refused: delete those first.
#[utoipa::path(
    delete, path = "/v1/snapshots/{snapshot_id}", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "It has children", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(snapshot_id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let rec = own_snapshot(&s, &caller, &snapshot_id)?;
    let children = s.store.snapshot_children(&rec.id)?;
    if !children.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "has_children",
            format!(
                "snapshot {} has children ({}): delete them first",
                rec.id,
                children.join(", ")
            ),
        )
        .with_details(serde_json::json!({ "children": children })));
    }
    s.store.delete_snapshot(&rec.id)?;
    let _ = std::fs::remove_dir_all(&rec.path);
    crate::audit(
        &s,
        &caller,
        "snapshot.delete",
        Some(&rec.id),
        serde_json::Value::Null,
    );
    Ok(StatusCode::NO_CONTENT)
}

/// Makes new sandboxes from a snapshot, each independent of the others: the snapshot's
/// settings, its files checked against their checksum and written in, a fresh id.
#[utoipa::path(
    post, path = "/v1/snapshots/{snapshot_id}/fork", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    request_body = ForkSnapshot,
    responses(
        (status = 201, body = ForkResult),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The snapshot is corrupt on disk", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn fork(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(snapshot_id): ApiPath<String>,
    ApiJson(req): ApiJson<ForkSnapshot>,
) -> ApiResult<(StatusCode, Json<ForkResult>)> {
    let rec = own_snapshot(&s, &caller, &snapshot_id)?;
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(ApiError::invalid(format!(
            "'count' must be 1 to {MAX_FORKS}, got {count}"
        )));
    }
    let opts = create_options(
        SandboxSpec::default(),
        req.labels.clone(),
        req.metadata.clone(),
        req.idle_timeout_secs,
        req.timeout_secs,
        req.ephemeral,
    )?;
    let made = make_from(&s, &caller, &rec, count, &opts).await?;
    crate::audit(
        &s,
        &caller,
        "snapshot.fork",
        Some(&rec.id),
        serde_json::json!({"sandboxes": made.iter().map(|f| f.sandbox.id.clone()).collect::<Vec<_>>()}),
    );
    Ok((StatusCode::CREATED, Json(ForkResult { sandboxes: made })))
}

/// Makes `count` sandboxes from snapshot `rec` with `opts` (whose spec is replaced by the
/// snapshot's); all or none: a failure ends the ones made so far.
async fn make_from(
    s: &AppState,
    caller: &Caller,
    rec: &SnapshotRecord,
    count: u32,
    opts: &CreateOptions,
) -> ApiResult<Vec<Forked>> {
    let kept: Kept = serde_json::from_value(rec.manifest.clone()).map_err(|e| {
        ApiError::new(
            StatusCode::CONFLICT,
            "snapshot_corrupt",
            format!("the snapshot's record cannot be read: {e}"),
        )
    })?;
    let dir = PathBuf::from(&rec.path);
    let mut made = Vec::new();
    for _ in 0..count {
        let mut o = opts.clone();
        o.spec = kept.spec.clone();
        // A process checkpoint is where the new sandbox starts from; other snapshots are
        // written into a fresh one.
        let whole = kept.manifest.fidelity == "process";
        if whole {
            o.checkpoint = Some(Checkpoint {
                dir: dir.clone(),
                manifest: kept.manifest.clone(),
            });
        }
        let (record, report) = match s.fleet.create(&caller.owner, o).await {
            Ok(c) => (c.record, c.restore),
            Err(e) => {
                undo(s, caller, &made).await;
                return Err(corrupt(e));
            }
        };
        let restored = match report {
            Some(report) => Ok(report),
            None if whole => Err(ApiError::internal(
                "the checkpoint's restore reported nothing",
            )),
            None => {
                async {
                    let sandbox = s.fleet.sandbox(&caller.owner, &record.id)?;
                    sandbox
                        .restore_from(&dir, &kept.manifest)
                        .await
                        .map_err(corrupt)
                }
                .await
            }
        };
        match restored {
            Ok(report) => {
                s.store.set_sandbox_origin(&record.id, &rec.id)?;
                made.push(Forked {
                    sandbox: SandboxInfo::from(&record),
                    restore: report,
                });
            }
            Err(e) => {
                let _ = s.fleet.delete(&caller.owner, &record.id).await;
                undo(s, caller, &made).await;
                return Err(e);
            }
        }
    }
    Ok(made)
}

/// `POST /v1/sandboxes` with a `snapshot_id`: one sandbox restored from it.
pub(crate) async fn restore_one(
    s: &AppState,
    caller: &Caller,
    snapshot_id: &str,
    opts: &CreateOptions,
) -> ApiResult<Forked> {
    let rec = own_snapshot(s, caller, snapshot_id)?;
    let mut made = make_from(s, caller, &rec, 1, opts).await?;
    made.pop()
        .ok_or_else(|| ApiError::internal("the restore made no sandbox"))
}

/// Ends the sandboxes a failed fork made so far.
async fn undo(s: &AppState, caller: &Caller, made: &[Forked]) {
    for f in made {
        let _ = s.fleet.delete(&caller.owner, &f.sandbox.id).await;
    }
}

/// Automatic snapshots of one sandbox (`auto_snapshot` at creation, or
/// `PUT /v1/sandboxes/{id}/auto-snapshot`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AutoSnapshot {
    /// Take one every this many seconds while it runs (none: no interval snapshots).
    pub interval_secs: Option<u64>,
    /// Take one just before it is stopped for idleness or its lifetime.
    #[serde(default)]
    pub before_reclaim: bool,
    /// Interval snapshots kept (the oldest go; default 3, at most 100).
    pub keep: Option<u32>,
}

/// Interval snapshots kept when `keep` is not given.
const DEFAULT_KEEP: u32 = 3;

impl AutoSnapshot {
    /// The record to keep for `owner`'s sandbox `id`.
    pub(crate) fn record(
        &self,
        owner: &str,
        id: &str,
    ) -> ApiResult<sandcell_store::AutoSnapshotRecord> {
        let keep = self.keep.unwrap_or(DEFAULT_KEEP);
        if !(1..=100).contains(&keep) {
            return Err(ApiError::invalid(format!(
                "'keep' must be 1 to 100, got {keep}"
            )));
        }
        let interval_ms = self
            .interval_secs
            .map(|v| {
                if v == 0 {
                    Err(ApiError::invalid("'interval_secs' must be positive"))
                } else {
                    secs_to_ms("interval_secs", v)
                }
            })
            .transpose()?;
        Ok(sandcell_store::AutoSnapshotRecord {
            sandbox_id: id.to_string(),
            owner: owner.to_string(),
            interval_ms,
            before_reclaim: self.before_reclaim,
            keep,
            last_at: None,
        })
    }

    fn of(r: &sandcell_store::AutoSnapshotRecord) -> Self {
        Self {
            interval_secs: r.interval_ms.map(|ms| ms / 1000),
            before_reclaim: r.before_reclaim,
            keep: Some(r.keep),
        }
    }
}

/// A sandbox's automatic snapshots.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/auto-snapshot", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = AutoSnapshot),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_auto(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<AutoSnapshot>> {
    check_sandbox_id(&id)?;
    s.fleet.get(&caller.owner, &id)?;
    Ok(Json(
        s.store
            .auto_snapshot(&id)?
            .map(|r| AutoSnapshot::of(&r))
            // Never set: nothing automatic, shown as a `PUT {}` would answer it.
            .unwrap_or(AutoSnapshot {
                keep: Some(DEFAULT_KEEP),
                ..AutoSnapshot::default()
            }),
    ))
}

/// Sets a sandbox's automatic snapshots (replacing what it had).
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/auto-snapshot", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = AutoSnapshot,
    responses(
        (status = 200, body = AutoSnapshot),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not active", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_auto(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<AutoSnapshot>,
) -> ApiResult<Json<AutoSnapshot>> {
    check_sandbox_id(&id)?;
    let record = s.fleet.get(&caller.owner, &id)?;
    if !record.state.is_active() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "sandbox_gone",
            format!("sandbox {id} is {}", record.state.as_str()),
        ));
    }
    let auto = req.record(&caller.owner, &id)?;
    s.store.set_auto_snapshot(&auto)?;
    Ok(Json(AutoSnapshot::of(&auto)))
}

/// The tag automatic snapshots carry (`interval` or `before-reclaim`).
pub const AUTO_TAG: &str = "auto";

/// One round of automatic snapshots, run by the lifecycle loop before it stops idle and
/// expired sandboxes as of `now`: the ones it will stop that asked for it, then the
/// interval ones that are due (pruned to their `keep`).
pub(crate) async fn auto_round(s: &AppState, now: i64) {
    for (id, owner, why) in s.fleet.expiring(now) {
        let wanted = s
            .store
            .auto_snapshot(&id)
            .ok()
            .flatten()
            .is_some_and(|a| a.before_reclaim);
        if wanted {
            let tags = BTreeMap::from([(AUTO_TAG.to_string(), "before-reclaim".to_string())]);
            match take(
                s,
                &owner,
                &id,
                format!("before reclaim: {why}"),
                String::new(),
                tags,
            )
            .await
            {
                Ok(rec) => {
                    tracing::info!(sandbox = %id, snapshot = %rec.id, "snapshot before reclaim")
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e.body().message, "snapshot before reclaim failed")
                }
            }
        }
    }
    let Ok(autos) = s.store.auto_snapshots() else {
        return;
    };
    let now = sandcell_engine::fleet::now_ms();
    for mut a in autos {
        let state = s.fleet.get(&a.owner, &a.sandbox_id).map(|r| r.state);
        match state {
            // A paused sandbox does not change: nothing new to keep.
            Ok(sandcell_engine::fleet::SandboxState::Paused) => continue,
            Ok(st) if st.is_active() => {}
            // Gone: its settings go too (its snapshots stay).
            _ => {
                let _ = s.store.delete_auto_snapshot(&a.sandbox_id);
                continue;
            }
        }
        let Some(every) = a.interval_ms else {
            continue;
        };
        let due = a
            .last_at
            .is_none_or(|t| now - t >= i64::try_from(every).unwrap_or(i64::MAX));
        if !due {
            continue;
        }
        let tags = BTreeMap::from([(AUTO_TAG.to_string(), "interval".to_string())]);
        match take(
            s,
            &a.owner,
            &a.sandbox_id,
            "interval".into(),
            String::new(),
            tags,
        )
        .await
        {
            Ok(_) => {
                a.last_at = Some(now);
                let _ = s.store.set_auto_snapshot(&a);
                prune(s, &a);
            }
            Err(e) => {
                tracing::warn!(sandbox = %a.sandbox_id, error = %e.body().message, "interval snapshot failed")
            }
        }
    }
}

/// Deletes the oldest interval snapshots of a sandbox beyond its `keep` (not ones with
/// children).
fn prune(s: &AppState, a: &sandcell_store::AutoSnapshotRecord) {
    let Ok(list) = s.store.list_snapshots(Some(&a.owner), Some(&a.sandbox_id)) else {
        return;
    };
    let interval: Vec<_> = list
        .into_iter()
        .filter(|r| r.tags.get(AUTO_TAG).is_some_and(|v| v == "interval"))
        .collect();
    let extra = interval.len().saturating_sub(a.keep as usize);
    for old in interval.into_iter().take(extra) {
        if s.store
            .snapshot_children(&old.id)
            .is_ok_and(|c| c.is_empty())
            && s.store.delete_snapshot(&old.id).is_ok()
        {
            let _ = std::fs::remove_dir_all(&old.path);
        }
    }
}
