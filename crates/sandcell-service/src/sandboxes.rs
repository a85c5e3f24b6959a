//! Sandboxes: create (new or from a snapshot), get, list, delete, timeout, pause, resume;
//! and how a create request becomes the engine's spec.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sandcell_api::sandboxes::{
    CreateSandbox, DEFAULT_TEMPLATE, LimitsInfo, SandboxInfo, SandboxList, Size, template_kernels,
};
use sandcell_api::time::rfc3339;
use sandcell_api::{SandboxId, Seconds, Tags};
use sandcell_engine::fleet::{CreateOptions, RecordQuery, SandboxRecord, SandboxState};
use sandcell_engine::{BackendKind, SandboxLimits, SandboxSpec};

use crate::{Caller, Service, ServiceError, ServiceResult};

const MIB: u64 = 1024 * 1024;

/// The limits a named size stands for.
pub fn size_limits(size: Size) -> SandboxLimits {
    let (memory_mb, cpus, pids, disk_mb) = match size {
        Size::Nano => (256, Some(0.5), 64, 256),
        Size::Small => (512, None, 256, 1024),
        Size::Medium => (2048, Some(2.0), 512, 4096),
        Size::Large => (8192, Some(4.0), 1024, 16384),
    };
    SandboxLimits {
        memory_bytes: Some(memory_mb * MIB),
        cpus,
        pids: Some(pids),
        disk_bytes: disk_mb * MIB,
        ..SandboxLimits::default()
    }
}

/// The engine spec a create request asks for (template, size, limits, env, network,
/// kernels, backend), checked.
pub fn spec_of(req: &CreateSandbox) -> ServiceResult<SandboxSpec> {
    let backend = match req.backend.as_deref() {
        None => BackendKind::Process,
        Some(b) => BackendKind::ALL
            .into_iter()
            .find(|k| k.as_str() == b)
            .ok_or_else(|| {
                let known: Vec<&str> = BackendKind::ALL.iter().map(|k| k.as_str()).collect();
                ServiceError::invalid(format!(
                    "unknown backend '{b}' (Sandcell has: {})",
                    known.join(", ")
                ))
            })?,
    };
    let template = req.template.as_deref().unwrap_or(DEFAULT_TEMPLATE);
    let mut warm_kernels: Vec<sandcell_protocol::Language> = template_kernels(template)
        .ok_or_else(|| ServiceError::not_found("template", template))?
        .iter()
        .map(|&l| l.into())
        .collect();
    for &k in &req.kernels {
        let k = k.into();
        if !warm_kernels.contains(&k) {
            warm_kernels.push(k);
        }
    }
    let mut limits = size_limits(req.size.unwrap_or(Size::Small));
    if let Some(l) = &req.limits {
        let mib = |name: &str, v: u64| {
            v.checked_mul(MIB)
                .ok_or_else(|| ServiceError::invalid(format!("limits.{name} {v} is too large")))
        };
        if let Some(v) = l.memory_mb {
            limits.memory_bytes = Some(mib("memory_mb", v)?);
        }
        if let Some(v) = l.cpus {
            limits.cpus = Some(v);
        }
        if let Some(v) = l.pids {
            limits.pids = Some(v);
        }
        if let Some(v) = l.disk_mb {
            limits.disk_bytes = mib("disk_mb", v)?;
        }
        if let Some(v) = l.tmp_mb {
            limits.tmp_bytes = mib("tmp_mb", v)?;
        }
        if let Some(v) = l.home_mb {
            limits.home_bytes = mib("home_mb", v)?;
        }
        if let Some(v) = l.open_files {
            limits.open_files = v;
        }
        if let Some(v) = l.exec_timeout_secs {
            limits.exec_timeout_ms = Some(v.as_ms());
        }
    }
    let mut spec = SandboxSpec {
        limits,
        network: req.network.clone().unwrap_or_default(),
        env: req.env.clone(),
        warm_kernels,
        template: Some(template.to_string()),
        backend,
        checkpointable: req.checkpointable,
        ..SandboxSpec::default()
    };
    if !req.secrets.is_empty() {
        sandcell_api::sandboxes::SecretInput::check_all(&req.secrets)?;
        if spec.network == sandcell_engine::NetworkPolicy::Off {
            return Err(ServiceError::invalid(
                "secrets are put in by the egress proxy, which a sandbox with network 'off' has \
                 none of",
            ));
        }
        for s in &req.secrets {
            if spec.env.contains_key(&s.name) {
                return Err(ServiceError::invalid(format!(
                    "'{}' is both an env variable and a secret",
                    s.name
                )));
            }
        }
        // Every client's CA setting: the proxy's CA joins the host's roots for them.
        let ca = sandcell_engine::egress::SANDBOX_CA_BUNDLE.to_string();
        for var in crate::packages::CA_FILE_VARIABLES {
            spec.env
                .entry(var.to_string())
                .or_insert_with(|| ca.clone());
        }
    }
    if let Some(p) = &req.packages {
        p.check()?;
        if !p.is_empty() && spec.network == sandcell_engine::NetworkPolicy::Off {
            return Err(ServiceError::invalid(
                "packages are installed through the egress proxy, which a sandbox with network \
                 'off' has none of: use 'loopback' (the default; it reaches nothing once the \
                 install is done)",
            ));
        }
        let home_given = req.limits.as_ref().is_some_and(|l| l.home_mb.is_some());
        crate::packages::apply_to_spec(&mut spec, p, home_given);
    }
    spec.validate()?;
    Ok(spec)
}

/// The fleet's create options from a request's own settings.
pub fn create_options(
    spec: SandboxSpec,
    labels: Tags,
    metadata: Tags,
    idle_timeout: Option<Seconds>,
    lifetime: Option<Seconds>,
    ephemeral: bool,
) -> CreateOptions {
    CreateOptions {
        spec,
        labels: labels.into_inner(),
        metadata: metadata.into_inner(),
        idle_timeout_ms: idle_timeout.map(Seconds::as_ms),
        lifetime_ms: lifetime.map(Seconds::as_ms),
        ephemeral,
        checkpoint: None,
        pool_key: None,
    }
}

/// The label of the one sandbox of a `singleton` template (its value: the template).
pub const SINGLETON_LABEL: &str = "sandcell.singleton";

/// Creates of `singleton` templates take turns on this.
fn singleton_turns() -> &'static tokio::sync::Mutex<()> {
    static TURNS: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();
    TURNS.get_or_init(|| tokio::sync::Mutex::new(()))
}

/// A sandbox's record as the API shows it.
pub fn sandbox_info(r: &SandboxRecord) -> SandboxInfo {
    let l = &r.spec.limits;
    SandboxInfo {
        id: r.id.clone(),
        restore: None,
        packages: None,
        preview_host: format!("{{port}}-{}.localhost", r.id),
        preview_path: format!("/v1/sandboxes/{}/ports/{{port}}/", r.id),
        state: r.state.as_str().to_string(),
        reason: r.reason.clone(),
        created_at: rfc3339(r.created_at_ms),
        last_active_at: rfc3339(r.last_active_ms),
        expires_at: r.expires_at_ms.map(rfc3339),
        idle_timeout_secs: r.idle_timeout_ms.map(|ms| ms / 1000),
        ephemeral: r.ephemeral,
        labels: r.labels.clone(),
        metadata: r.metadata.clone(),
        limits: LimitsInfo {
            memory_mb: l.memory_bytes.map(|b| b / MIB),
            cpus: l.cpus,
            pids: l.pids,
            disk_mb: l.disk_bytes / MIB,
            tmp_mb: l.tmp_bytes / MIB,
            home_mb: l.home_bytes / MIB,
            open_files: l.open_files,
            exec_timeout_secs: l.exec_timeout_ms.map(|ms| ms / 1000),
        },
        network: r.spec.network.clone(),
        backend: r.spec.backend.as_str().to_string(),
        template: r
            .spec
            .template
            .clone()
            .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
    }
}

/// Which sandboxes a list asks for; `states` empty and `all_states` false: the active ones.
#[derive(Debug, Clone, Default)]
pub struct ListSandboxes {
    /// Only these states.
    pub states: Vec<SandboxState>,
    /// Every state (overrides `states`).
    pub all_states: bool,
    /// Labels that must match.
    pub labels: BTreeMap<String, String>,
    /// Metadata that must match.
    pub metadata: BTreeMap<String, String>,
    /// At most this many (1 to 1000; 0: the default, 100).
    pub limit: u32,
    /// The previous page's `next_cursor`.
    pub cursor: Option<String>,
}

impl Service {
    /// Creates a sandbox: new, or restored from `snapshot_id`; with its automatic-snapshot
    /// settings recorded before it is handed out (unrecorded, it is not kept).
    pub async fn create_sandbox(
        &self,
        caller: &Caller,
        req: CreateSandbox,
    ) -> ServiceResult<SandboxInfo> {
        // Checked before anything is made.
        let auto = req
            .auto_snapshot
            .as_ref()
            .map(|a| crate::snapshots::auto_record(a, &caller.owner, ""))
            .transpose()?;
        let info = if let Some(snapshot_id) = &req.snapshot_id {
            self.restore_sandbox(caller, snapshot_id, &req).await?
        } else {
            self.create_new_sandbox(caller, req).await?
        };
        if let Some(mut auto) = auto {
            auto.sandbox_id = info.id.clone();
            if let Err(e) = self.store.set_auto_snapshot(&auto) {
                let _ = self.fleet.delete(&caller.owner, &info.id).await;
                return Err(e.into());
            }
        }
        Ok(info)
    }

    async fn create_new_sandbox(
        &self,
        caller: &Caller,
        req: CreateSandbox,
    ) -> ServiceResult<SandboxInfo> {
        let mut spec = self.spec_for(&req).await?;
        spec.mounts = self.resolve_mounts(caller, &req.mounts)?;
        let secrets = crate::secrets::secrets_of(&req.secrets)?;
        for s in secrets.iter() {
            spec.env
                .insert(s.name().to_string(), s.placeholder().to_string());
        }
        // The proxy gets the values as the sandbox starts; its record, the rest.
        spec.secrets = sandcell_engine::egress::secret_refs(&secrets);
        self.fleet.engine().egress().hold(&secrets);
        let mut opts = create_options(
            spec,
            req.labels,
            req.metadata,
            req.idle_timeout_secs,
            req.timeout_secs,
            req.ephemeral,
        );
        let wanted_packages = req.packages.as_ref().filter(|p| !p.is_empty());
        opts.pool_key = wanted_packages.map(crate::packages::pool_key);
        // An image template's warm strategy, read once: a pool whose sandboxes ran its
        // warm-up (the create takes one), or a singleton.
        let warm = match (&opts.spec.system_root, &opts.spec.template) {
            (Some(_), Some(t)) => {
                crate::images::template_defaults(&self.config.home, t)?.map(|d| (t.clone(), d.warm))
            }
            _ => None,
        };
        let singleton = match warm {
            Some((
                template,
                sandcell_template::WarmStrategy::Pool {
                    warmup: Some(_), ..
                }
                | sandcell_template::WarmStrategy::Snapshot {
                    warmup: Some(_), ..
                },
            )) if opts.pool_key.is_none() => {
                opts.pool_key = Some(crate::images::warmup_key(&template));
                None
            }
            // One sandbox per owner, which every create of that owner naming the template
            // gets (the first makes it). Creates of one take turns, so that two at once do
            // not make two.
            Some((template, sandcell_template::WarmStrategy::Singleton)) => Some(template),
            _ => None,
        };
        let _turn = match &singleton {
            Some(template) => {
                let turn = singleton_turns().lock().await;
                let shared = self.list_sandboxes(
                    caller,
                    ListSandboxes {
                        labels: [(SINGLETON_LABEL.to_string(), template.clone())].into(),
                        ..ListSandboxes::default()
                    },
                )?;
                if let Some(found) = shared.items.into_iter().next() {
                    self.metrics.pool_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(found);
                }
                opts.labels
                    .insert(SINGLETON_LABEL.to_string(), template.clone());
                Some(turn)
            }
            None => None,
        };
        let start = Instant::now();
        let created = self.fleet.create(&caller.owner, opts).await;
        match &created {
            Ok(r) => {
                self.metrics.creates_ok.fetch_add(1, Ordering::Relaxed);
                if r.from_pool {
                    self.metrics.pool_hits.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.metrics.pool_misses.fetch_add(1, Ordering::Relaxed);
                }
                self.metrics.create_latency.observe(start.elapsed());
            }
            Err(_) => {
                self.metrics.creates_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let created = created?;
        let record = created.record;
        // The install report of a pool sandbox whose packages were installed while it
        // waited.
        let pooled = created.prepared.clone().and_then(|v| {
            serde_json::from_value::<sandcell_api::sandboxes::PackagesReport>(v).ok()
        });
        let packages = match wanted_packages {
            // Installed while it waited in its pool.
            Some(_) if pooled.is_some() => pooled.map(|mut report| {
                report.from_pool = true;
                report
            }),
            Some(p) => {
                let sandbox = self.fleet.sandbox(&caller.owner, &record.id)?;
                match self.install_packages(&sandbox, p).await {
                    Ok(report) => Some(report),
                    Err(e) => {
                        // A sandbox without what it asked for is not handed out.
                        let _ = self.fleet.delete(&caller.owner, &record.id).await;
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        self.audit(
            caller,
            "sandbox.create",
            Some(&record.id),
            match &packages {
                Some(p) => serde_json::json!({
                    "packages": req.packages,
                    "cached": p.cached,
                    "from_pool": p.from_pool,
                }),
                None => serde_json::Value::Null,
            },
        );
        let mut info = sandbox_info(&record);
        info.packages = packages;
        Ok(info)
    }

    /// A create with `snapshot_id`: the snapshot's settings and files in a new sandbox; what
    /// the request may add is its own labels, metadata, timeouts, ephemerality.
    async fn restore_sandbox(
        &self,
        caller: &Caller,
        snapshot_id: &str,
        req: &CreateSandbox,
    ) -> ServiceResult<SandboxInfo> {
        if req.template.is_some()
            || req.size.is_some()
            || req.limits.is_some()
            || !req.env.is_empty()
            || req.network.is_some()
            || req.packages.is_some()
            || !req.kernels.is_empty()
            || req.backend.is_some()
            || req.checkpointable
            || !req.mounts.is_empty()
        {
            return Err(ServiceError::invalid(
                "a sandbox restored from a snapshot takes the snapshot's backend, template, size, \
                 limits, env, network and kernels: give only labels, metadata, timeouts, ephemeral \
                 or the values of its secrets with 'snapshot_id'",
            ));
        }
        let opts = create_options(
            SandboxSpec::default(),
            req.labels.clone(),
            req.metadata.clone(),
            req.idle_timeout_secs,
            req.timeout_secs,
            req.ephemeral,
        );
        let made = self
            .restore_snapshot(caller, snapshot_id, &opts, &req.secrets)
            .await?;
        self.audit(
            caller,
            "sandbox.restore",
            Some(&made.sandbox.id),
            serde_json::json!({"snapshot": snapshot_id, "restore": made.restore}),
        );
        let mut info = made.sandbox;
        info.restore = Some(made.restore);
        Ok(info)
    }

    /// One of the caller's sandboxes.
    pub fn get_sandbox(&self, caller: &Caller, id: &SandboxId) -> ServiceResult<SandboxInfo> {
        Ok(sandbox_info(&self.fleet.get(&caller.owner, id)?))
    }

    /// A page of the caller's sandboxes.
    pub fn list_sandboxes(
        &self,
        caller: &Caller,
        req: ListSandboxes,
    ) -> ServiceResult<SandboxList> {
        let mut query = RecordQuery {
            states: req.states,
            labels: req.labels,
            metadata: req.metadata,
            cursor: req.cursor,
            ..RecordQuery::default()
        };
        if req.limit != 0 {
            if !(1..=1000).contains(&req.limit) {
                return Err(ServiceError::invalid(format!(
                    "limit '{}' must be a number from 1 to 1000",
                    req.limit
                )));
            }
            query.limit = req.limit;
        }
        if req.all_states {
            query.states.clear();
        } else if query.states.is_empty() {
            query.states = SandboxState::ACTIVE.to_vec();
        }
        let page = self.fleet.list(&caller.owner, query)?;
        Ok(SandboxList {
            items: page.items.iter().map(sandbox_info).collect(),
            next_cursor: page.next_cursor,
        })
    }

    /// Stops a sandbox and frees everything it holds (its record stays, `stopped`, unless it
    /// is ephemeral).
    pub async fn delete_sandbox(&self, caller: &Caller, id: &SandboxId) -> ServiceResult<()> {
        self.fleet.delete(&caller.owner, id).await?;
        self.audit(caller, "sandbox.delete", Some(id), serde_json::Value::Null);
        Ok(())
    }

    /// Sets how long from now the sandbox may live.
    pub fn set_sandbox_timeout(
        &self,
        caller: &Caller,
        id: &SandboxId,
        timeout: Seconds,
    ) -> ServiceResult<SandboxInfo> {
        Ok(sandbox_info(&self.fleet.set_timeout(
            &caller.owner,
            id,
            timeout.as_ms(),
        )?))
    }

    /// Pauses the sandbox (its processes freeze, its clocks stop).
    pub async fn pause_sandbox(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<SandboxInfo> {
        let record = self.fleet.pause(&caller.owner, id).await?;
        self.audit(caller, "sandbox.pause", Some(id), serde_json::Value::Null);
        Ok(sandbox_info(&record))
    }

    /// Resumes a paused sandbox where it stopped.
    pub async fn resume_sandbox(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<SandboxInfo> {
        let record = self.fleet.resume(&caller.owner, id).await?;
        self.audit(caller, "sandbox.resume", Some(id), serde_json::Value::Null);
        Ok(sandbox_info(&record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcell_api::sandboxes::LimitsInput;

    #[test]
    fn sizes_and_limits_make_specs() {
        let spec = spec_of(&CreateSandbox::default()).unwrap();
        assert_eq!(spec.limits.memory_bytes, Some(512 * MIB));
        let req = CreateSandbox {
            size: Some(Size::Nano),
            limits: Some(LimitsInput {
                memory_mb: Some(128),
                ..LimitsInput::default()
            }),
            ..CreateSandbox::default()
        };
        let spec = spec_of(&req).unwrap();
        assert_eq!(
            (spec.limits.memory_bytes, spec.limits.pids),
            (Some(128 * MIB), Some(64))
        );
        let bad = CreateSandbox {
            limits: Some(LimitsInput {
                memory_mb: Some(1),
                ..LimitsInput::default()
            }),
            ..CreateSandbox::default()
        };
        assert_eq!(spec_of(&bad).unwrap_err().code(), "invalid_argument");
        let unknown = CreateSandbox {
            template: Some("gpu".into()),
            ..CreateSandbox::default()
        };
        assert_eq!(spec_of(&unknown).unwrap_err().code(), "not_found");
        assert!(serde_json::from_str::<CreateSandbox>(r#"{"sise": "nano"}"#).is_err());
        let backend = CreateSandbox {
            backend: Some("vm".into()),
            ..CreateSandbox::default()
        };
        assert!(
            spec_of(&backend)
                .unwrap_err()
                .message
                .contains("process, gvisor")
        );
    }
}
