//! Snapshots: take (on request or on a schedule), list, show with lineage, delete, fork
//! (all or nothing), restore into a new sandbox, automatic-snapshot settings and their
//! retention.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sandcell_api::rules::check_record_id;
use sandcell_api::sandboxes::SecretInput;
use sandcell_api::snapshots::{
    AUTO_TAG, AutoSnapshot, CreateSnapshot, DEFAULT_KEEP, ForkResult, ForkSnapshot, Forked,
    MAX_DESCRIPTION, MAX_FORKS, MAX_NAME, SnapshotInfo, SnapshotList, VolumeCarry, VolumeCopyInfo,
};
use sandcell_api::time::rfc3339;
use sandcell_api::{SandboxId, Seconds};
use sandcell_engine::fleet::{Checkpoint, CreateOptions, SandboxState};
use sandcell_engine::{EngineError, SandboxSpec, SnapshotManifest};
use sandcell_store::{AutoSnapshotRecord, SnapshotRecord};
use serde::{Deserialize, Serialize};

use crate::caller::new_record_id;
use crate::sandboxes::{create_options, sandbox_info};
use crate::volumes::{VolumeCopy, copy_volume, volume_from_copy};
use crate::{Caller, ErrorKind, Service, ServiceError, ServiceResult};

/// What the store keeps in a snapshot's `manifest` column.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    manifest: SnapshotManifest,
    spec: SandboxSpec,
    /// Copies of its named volumes, when asked for ([`VolumeCarry::Copy`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    volumes: Vec<VolumeCopy>,
}

fn check_snapshot_id(id: &str) -> ServiceResult<()> {
    Ok(check_record_id(id, "sn", "a snapshot")?)
}

/// A snapshot's record as the API shows it.
pub fn snapshot_info(r: &SnapshotRecord) -> SnapshotInfo {
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
        volumes: r
            .manifest
            .get("volumes")
            .and_then(|v| serde_json::from_value::<Vec<VolumeCopy>>(v.clone()).ok())
            .unwrap_or_default()
            .into_iter()
            .map(|c| VolumeCopyInfo {
                volume: c.volume,
                path: c.path,
                bytes: c.bytes,
            })
            .collect(),
        children: None,
        sandboxes: None,
    }
}

/// A corrupt snapshot is its own kind; other engine errors keep theirs.
fn corrupt(e: EngineError) -> ServiceError {
    match e {
        EngineError::Corrupt(_) => ServiceError::new(ErrorKind::SnapshotCorrupt, e.to_string()),
        other => other.into(),
    }
}

/// A host I/O error; a full disk is `no_space`.
fn disk_error(what: &str, e: std::io::Error) -> ServiceError {
    if e.raw_os_error() == Some(28) || e.to_string().contains("No space left") {
        ServiceError::new(
            ErrorKind::NoSpace,
            format!("{what}: the host's disk is full ({e})"),
        )
    } else {
        ServiceError::internal(format!("{what}: {e}"))
    }
}

/// The record to keep for `owner`'s sandbox `id` from its automatic-snapshot settings,
/// checked.
pub fn auto_record(a: &AutoSnapshot, owner: &str, id: &str) -> ServiceResult<AutoSnapshotRecord> {
    let keep = a.keep.unwrap_or(DEFAULT_KEEP);
    if !(1..=100).contains(&keep) {
        return Err(ServiceError::invalid(format!(
            "'keep' must be 1 to 100, got {keep}"
        )));
    }
    let interval_ms = a
        .interval_secs
        .map(|v| {
            if v.get() == 0 {
                Err(ServiceError::invalid("'interval_secs' must be positive"))
            } else {
                Ok(v.as_ms())
            }
        })
        .transpose()?;
    Ok(AutoSnapshotRecord {
        sandbox_id: id.to_string(),
        owner: owner.to_string(),
        interval_ms,
        before_reclaim: a.before_reclaim,
        keep,
        last_at: None,
    })
}

fn auto_settings(r: &AutoSnapshotRecord) -> AutoSnapshot {
    AutoSnapshot {
        interval_secs: r.interval_ms.map(Seconds::from_ms),
        before_reclaim: r.before_reclaim,
        keep: Some(r.keep),
    }
}

impl Service {
    /// The caller's snapshot `id` (another owner's is missing).
    fn own_snapshot(&self, caller: &Caller, id: &str) -> ServiceResult<SnapshotRecord> {
        check_snapshot_id(id)?;
        self.store
            .get_snapshot(id)?
            .filter(|r| r.owner == caller.owner)
            .ok_or_else(|| ServiceError::not_found("snapshot", id))
    }

    /// Takes a snapshot of the caller's sandbox `id`: its file roots (and its kernels'
    /// variables), read while it is paused for that moment, or a process checkpoint where
    /// the sandbox has one; checksummed and kept on disk; listed only once whole.
    pub async fn create_snapshot(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: CreateSnapshot,
    ) -> ServiceResult<SnapshotInfo> {
        let name = req.name.unwrap_or_default();
        if name.len() > MAX_NAME || req.description.len() > MAX_DESCRIPTION {
            return Err(ServiceError::invalid(format!(
                "a name is at most {MAX_NAME} bytes and a description {MAX_DESCRIPTION}"
            )));
        }
        let rec = self
            .take_snapshot(
                &caller.owner,
                id,
                name,
                req.description,
                req.tags.into_inner(),
                req.volumes,
            )
            .await?;
        self.audit(
            caller,
            "snapshot.create",
            Some(&rec.id),
            serde_json::json!({"sandbox": id, "size": rec.size}),
        );
        Ok(snapshot_info(&rec))
    }

    /// Takes a snapshot of `owner`'s sandbox `id` (for a request, or on its own schedule,
    /// or for an agent's step), with copies of its volumes when `volumes` says so; no half
    /// snapshot stays behind on failure.
    pub async fn take_snapshot(
        &self,
        owner: &str,
        id: &str,
        name: String,
        description: String,
        tags: BTreeMap<String, String>,
        volumes: VolumeCarry,
    ) -> ServiceResult<SnapshotRecord> {
        let record = self.fleet.get(owner, id)?;
        let sandbox = self.fleet.sandbox_as_is(owner, id)?;
        let snapshot_id = new_record_id("sn")?;
        let dir = self.snapshots_dir().join(&snapshot_id);
        std::fs::create_dir_all(&dir).map_err(|e| disk_error("create the snapshot folder", e))?;
        let to_copy: Vec<(String, String, PathBuf)> = match volumes {
            VolumeCarry::Mount => Vec::new(),
            VolumeCarry::Copy => record
                .spec
                .mounts
                .iter()
                .filter_map(|m| {
                    let name = m.volume.clone()?;
                    Some((name, m.target.clone(), PathBuf::from(&m.source)))
                })
                .collect(),
        };
        let taken = async {
            // The volumes and the rest are of one moment: the sandbox stays paused from the
            // first copy until the snapshot is taken.
            let paused_here = !to_copy.is_empty() && !sandbox.is_paused();
            if paused_here {
                sandbox.pause().await?;
            }
            let copied = async {
                let copies = {
                    let dir = dir.clone();
                    tokio::task::spawn_blocking(move || {
                        to_copy
                            .iter()
                            .map(|(name, path, data)| copy_volume(data, &dir, name, path))
                            .collect::<ServiceResult<Vec<_>>>()
                    })
                    .await
                    .map_err(|e| ServiceError::internal(format!("copying volumes: {e}")))??
                };
                let manifest = sandbox.snapshot_to(&dir).await.map_err(|e| match e {
                    EngineError::Io { op, source } => disk_error(&op, source),
                    other => other.into(),
                })?;
                Ok::<_, ServiceError>((manifest, copies))
            }
            .await;
            if paused_here {
                let _ = sandbox.resume().await;
            }
            let (mut manifest, copies) = copied?;
            for copy in &copies {
                let mounted = format!("{}: a mounted folder", copy.path);
                for note in &mut manifest.files.skipped {
                    if note.starts_with(&mounted) {
                        *note = format!(
                            "{}: volume '{}', copied beside the snapshot (each sandbox made from it gets a new volume from the copy)",
                            copy.path, copy.volume
                        );
                    }
                }
            }
            let kept = Kept {
                manifest,
                spec: record.spec.clone(),
                volumes: copies,
            };
            let manifest_json = serde_json::to_value(&kept)
                .map_err(|e| ServiceError::internal(format!("the snapshot's manifest: {e}")))?;
            std::fs::write(dir.join("manifest.json"), manifest_json.to_string())
                .map_err(|e| disk_error("write the snapshot's manifest", e))?;
            let now = sandcell_engine::fleet::now_ms();
            let rec = SnapshotRecord {
                id: snapshot_id.clone(),
                owner: owner.to_string(),
                sandbox_id: id.to_string(),
                parent_id: self.store.sandbox_origin(id)?,
                name: if name.is_empty() {
                    format!("{id} at {}", rfc3339(now))
                } else {
                    name
                },
                description,
                tags,
                fidelity: kept.manifest.fidelity.to_string(),
                created_at: now,
                size: kept.manifest.archive_bytes
                    + kept.volumes.iter().map(|v| v.bytes).sum::<u64>(),
                manifest: manifest_json,
                path: dir.display().to_string(),
            };
            self.store.insert_snapshot(&rec)?;
            Ok::<_, ServiceError>(rec)
        }
        .await;
        if let Err(e) = &taken {
            let _ = std::fs::remove_dir_all(&dir);
            if sandbox.is_gone() {
                self.fleet
                    .settle_if_gone(id, &format!("it ended during a snapshot: {}", e.message))
                    .await;
            }
        }
        taken
    }

    /// The caller's snapshots, oldest first (`sandbox`: only that sandbox's).
    pub fn list_snapshots(
        &self,
        caller: &Caller,
        sandbox: Option<&SandboxId>,
    ) -> ServiceResult<SnapshotList> {
        let list = self
            .store
            .list_snapshots(Some(&caller.owner), sandbox.map(|s| s.as_str()))?;
        Ok(SnapshotList {
            snapshots: list.iter().map(snapshot_info).collect(),
        })
    }

    /// A snapshot with its lineage: its parent, its children, the sandboxes made from it.
    pub fn get_snapshot(&self, caller: &Caller, snapshot_id: &str) -> ServiceResult<SnapshotInfo> {
        let rec = self.own_snapshot(caller, snapshot_id)?;
        let mut view = snapshot_info(&rec);
        view.children = Some(self.store.snapshot_children(&rec.id)?);
        view.sandboxes = Some(self.store.sandboxes_from_snapshot(&rec.id)?);
        Ok(view)
    }

    /// Deletes a snapshot and its files; one with children is refused.
    pub fn delete_snapshot(&self, caller: &Caller, snapshot_id: &str) -> ServiceResult<()> {
        let rec = self.own_snapshot(caller, snapshot_id)?;
        let children = self.store.snapshot_children(&rec.id)?;
        if !children.is_empty() {
            return Err(ServiceError::new(
                ErrorKind::HasChildren,
                format!(
                    "snapshot {} has children ({}): delete them first",
                    rec.id,
                    children.join(", ")
                ),
            )
            .with_details(serde_json::json!({ "children": children })));
        }
        self.store.delete_snapshot(&rec.id)?;
        let _ = std::fs::remove_dir_all(&rec.path);
        self.audit(
            caller,
            "snapshot.delete",
            Some(&rec.id),
            serde_json::Value::Null,
        );
        Ok(())
    }

    /// Makes new sandboxes from a snapshot, each independent of the others; all or none.
    pub async fn fork_snapshot(
        &self,
        caller: &Caller,
        snapshot_id: &str,
        req: ForkSnapshot,
    ) -> ServiceResult<ForkResult> {
        let rec = self.own_snapshot(caller, snapshot_id)?;
        let count = req.count.unwrap_or(1);
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(ServiceError::invalid(format!(
                "'count' must be 1 to {MAX_FORKS}, got {count}"
            )));
        }
        let opts = create_options(
            SandboxSpec::default(),
            req.labels,
            req.metadata,
            req.idle_timeout_secs,
            req.timeout_secs,
            req.ephemeral,
        );
        let made = self
            .make_from(caller, &rec, count, &opts, &req.secrets)
            .await?;
        self.audit(
            caller,
            "snapshot.fork",
            Some(&rec.id),
            serde_json::json!({"sandboxes": made.iter().map(|f| f.sandbox.id.clone()).collect::<Vec<_>>()}),
        );
        Ok(ForkResult { sandboxes: made })
    }

    /// One sandbox restored from the caller's snapshot, with `opts` (whose spec is replaced
    /// by the snapshot's) and values for the snapshot's `secrets` (see [`Self::make_from`]).
    pub async fn restore_snapshot(
        &self,
        caller: &Caller,
        snapshot_id: &str,
        opts: &CreateOptions,
        secrets: &[SecretInput],
    ) -> ServiceResult<Forked> {
        let rec = self.own_snapshot(caller, snapshot_id)?;
        let mut made = self.make_from(caller, &rec, 1, opts, secrets).await?;
        made.pop()
            .ok_or_else(|| ServiceError::internal("the restore made no sandbox"))
    }

    /// Makes `count` sandboxes from snapshot `rec`; a failure ends the ones made so far.
    /// They hold the snapshot's secret placeholders, and get the values this process holds
    /// for them, or those in `given` (by name; they also replace the hosts).
    async fn make_from(
        &self,
        caller: &Caller,
        rec: &SnapshotRecord,
        count: u32,
        opts: &CreateOptions,
        given: &[SecretInput],
    ) -> ServiceResult<Vec<Forked>> {
        let mut kept: Kept = serde_json::from_value(rec.manifest.clone()).map_err(|e| {
            ServiceError::new(
                ErrorKind::SnapshotCorrupt,
                format!("the snapshot's record cannot be read: {e}"),
            )
        })?;
        if !given.is_empty() {
            let secrets = crate::secrets::rebind(&kept.spec.secrets, given)?;
            kept.spec.secrets = sandcell_engine::egress::secret_refs(&secrets);
            self.fleet.engine().egress().hold(&secrets);
        }
        let dir = PathBuf::from(&rec.path);
        let mut made = Vec::new();
        let mut new_volumes = Vec::new();
        for _ in 0..count {
            let mut o = opts.clone();
            o.spec = kept.spec.clone();
            // Each sandbox gets its own volume filled from each copy, mounted where the
            // volume was.
            let mut volumes_made = Vec::new();
            for copy in &kept.volumes {
                let made_one = {
                    let (home, owner) = (self.config.home.clone(), caller.owner.clone());
                    let (copy, dir) = (copy.clone(), dir.clone());
                    tokio::task::spawn_blocking(move || {
                        volume_from_copy(&home, &owner, &copy, &dir)
                    })
                    .await
                    .map_err(|e| ServiceError::internal(format!("restoring a volume: {e}")))
                    .and_then(|r| r)
                };
                let (name, data) = match made_one {
                    Ok(v) => v,
                    Err(e) => {
                        self.undo(caller, &made).await;
                        self.drop_volumes(caller, &new_volumes);
                        return Err(e);
                    }
                };
                if let Some(m) = o.spec.mounts.iter_mut().find(|m| m.target == copy.path) {
                    m.source = data.display().to_string();
                    m.volume = Some(name.clone());
                }
                volumes_made.push(serde_json::json!({
                    "volume": name, "from": copy.volume, "path": copy.path,
                }));
                new_volumes.push(name);
            }
            // A process checkpoint is where the new sandbox starts from; other snapshots
            // are written into a fresh one.
            let whole = kept.manifest.fidelity == "process";
            if whole {
                o.checkpoint = Some(Checkpoint {
                    dir: dir.clone(),
                    manifest: kept.manifest.clone(),
                });
            }
            let (record, report) = match self.fleet.create(&caller.owner, o).await {
                Ok(c) => (c.record, c.restore),
                Err(e) => {
                    self.undo(caller, &made).await;
                    self.drop_volumes(caller, &new_volumes);
                    return Err(corrupt(e));
                }
            };
            let restored = match report {
                Some(report) => Ok(report),
                None if whole => Err(ServiceError::internal(
                    "the checkpoint's restore reported nothing",
                )),
                None => {
                    async {
                        let sandbox = self.fleet.sandbox(&caller.owner, &record.id)?;
                        sandbox
                            .restore_from(&dir, &kept.manifest)
                            .await
                            .map_err(corrupt)
                    }
                    .await
                }
            };
            // It remembers what its origin did when the snapshot was taken.
            let restored =
                restored.and_then(|report| self.inherit_memories(rec, &record.id).map(|_| report));
            match restored {
                Ok(report) => {
                    self.store.set_sandbox_origin(&record.id, &rec.id)?;
                    let mut restore = serde_json::to_value(&report).unwrap_or_default();
                    if !volumes_made.is_empty() {
                        restore["volumes"] = serde_json::Value::Array(volumes_made);
                    }
                    made.push(Forked {
                        sandbox: sandbox_info(&record),
                        restore,
                    });
                }
                Err(e) => {
                    let _ = self.fleet.delete(&caller.owner, &record.id).await;
                    self.undo(caller, &made).await;
                    self.drop_volumes(caller, &new_volumes);
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    /// Ends the sandboxes a failed fork made so far.
    async fn undo(&self, caller: &Caller, made: &[Forked]) {
        for f in made {
            let _ = self.fleet.delete(&caller.owner, &f.sandbox.id).await;
        }
    }

    /// Deletes the volumes a failed restore made from copies (their sandboxes ended first).
    fn drop_volumes(&self, caller: &Caller, names: &[String]) {
        for name in names {
            let _ = self.volumes(caller).delete(name);
        }
    }

    /// A sandbox's automatic-snapshot settings (never set: nothing automatic).
    pub fn get_auto_snapshot(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<AutoSnapshot> {
        self.fleet.get(&caller.owner, id)?;
        Ok(self
            .store
            .auto_snapshot(id)?
            .map(|r| auto_settings(&r))
            .unwrap_or(AutoSnapshot {
                keep: Some(DEFAULT_KEEP),
                ..AutoSnapshot::default()
            }))
    }

    /// Sets a sandbox's automatic snapshots (replacing what it had).
    pub fn set_auto_snapshot(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: AutoSnapshot,
    ) -> ServiceResult<AutoSnapshot> {
        let record = self.fleet.get(&caller.owner, id)?;
        if !record.state.is_active() {
            return Err(ServiceError::new(
                ErrorKind::SandboxGone,
                format!("sandbox {id} is {}", record.state.as_str()),
            ));
        }
        let auto = auto_record(&req, &caller.owner, id)?;
        self.store.set_auto_snapshot(&auto)?;
        Ok(auto_settings(&auto))
    }

    /// One round of automatic snapshots as of `now`: before-reclaim ones of the sandboxes
    /// about to be stopped, then the interval ones that are due (pruned to their `keep`).
    pub async fn auto_snapshot_round(&self, now: i64) {
        for (id, owner, why) in self.fleet.expiring(now) {
            let wanted = self
                .store
                .auto_snapshot(&id)
                .ok()
                .flatten()
                .is_some_and(|a| a.before_reclaim);
            if wanted {
                let tags = BTreeMap::from([(AUTO_TAG.to_string(), "before-reclaim".to_string())]);
                match self
                    .take_snapshot(
                        &owner,
                        &id,
                        format!("before reclaim: {why}"),
                        String::new(),
                        tags,
                        sandcell_api::snapshots::VolumeCarry::Mount,
                    )
                    .await
                {
                    Ok(rec) => {
                        tracing::info!(sandbox = %id, snapshot = %rec.id, "snapshot before reclaim")
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "snapshot before reclaim failed")
                    }
                }
            }
        }
        let Ok(autos) = self.store.auto_snapshots() else {
            return;
        };
        for mut a in autos {
            let state = self.fleet.get(&a.owner, &a.sandbox_id).map(|r| r.state);
            match state {
                // A paused sandbox does not change: nothing new to keep.
                Ok(SandboxState::Paused) => continue,
                Ok(st) if st.is_active() => {}
                // Gone: its settings go too (its snapshots stay).
                _ => {
                    let _ = self.store.delete_auto_snapshot(&a.sandbox_id);
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
            match self
                .take_snapshot(
                    &a.owner,
                    &a.sandbox_id,
                    "interval".into(),
                    String::new(),
                    tags,
                    sandcell_api::snapshots::VolumeCarry::Mount,
                )
                .await
            {
                Ok(_) => {
                    a.last_at = Some(now);
                    let _ = self.store.set_auto_snapshot(&a);
                    self.prune_auto_snapshots(&a);
                }
                Err(e) => {
                    tracing::warn!(sandbox = %a.sandbox_id, error = %e, "interval snapshot failed")
                }
            }
        }
    }

    /// Deletes the oldest interval snapshots of a sandbox beyond its `keep` (not ones with
    /// children).
    fn prune_auto_snapshots(&self, a: &AutoSnapshotRecord) {
        let Ok(list) = self
            .store
            .list_snapshots(Some(&a.owner), Some(&a.sandbox_id))
        else {
            return;
        };
        let interval: Vec<_> = list
            .into_iter()
            .filter(|r| r.tags.get(AUTO_TAG).is_some_and(|v| v == "interval"))
            .collect();
        let extra = interval.len().saturating_sub(a.keep as usize);
        for old in interval.into_iter().take(extra) {
            if self
                .store
                .snapshot_children(&old.id)
                .is_ok_and(|c| c.is_empty())
                && self.store.delete_snapshot(&old.id).is_ok()
            {
                let _ = std::fs::remove_dir_all(&old.path);
            }
        }
    }
}
