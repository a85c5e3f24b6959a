//! The engine: backends in, sandboxes out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandcell_protocol::{ExecRequest, HostMessage, IsolationReport};

use crate::backend::{
    Backend, BackendCapabilities, BackendFeatures, BackendInstance, CheckpointSupport,
    LaunchedSandbox,
};
use crate::client::{Call, GuestClient};
use crate::egress::{EgressHandle, EgressHub};
use crate::error::EngineError;
use crate::sandbox::{ExecStream, Sandbox, Timings, prepare_exec};
use crate::snapshot::{RestoreReport, SnapshotManifest};
use crate::spec::{BackendKind, SandboxSpec};

/// How long a fresh agent may take to answer the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// Builds an [`Engine`] from the backends it may use.
#[derive(Default)]
pub struct EngineBuilder {
    backends: Vec<Arc<dyn Backend>>,
    egress: Option<EgressHub>,
}

impl EngineBuilder {
    /// Grants the engine a backend.
    pub fn backend(mut self, backend: impl Backend + 'static) -> Self {
        self.backends.push(Arc::new(backend));
        self
    }

    /// Sets how sandboxes' egress proxies resolve names and what they may use (default: the
    /// host's resolver, [`sandcell_egress::Limits::default`]).
    pub fn egress(mut self, hub: EgressHub) -> Self {
        self.egress = Some(hub);
        self
    }

    /// Builds the engine.
    pub fn build(self) -> Engine {
        let backends = self.backends.into_iter().map(|b| (b.kind(), b)).collect();
        Engine {
            backends,
            egress: Arc::new(self.egress.unwrap_or_default()),
        }
    }
}

/// Creates and runs sandboxes.
pub struct Engine {
    backends: HashMap<crate::spec::BackendKind, Arc<dyn Backend>>,
    egress: Arc<EgressHub>,
}

impl Engine {
    /// Starts building an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// The sandboxes' egress proxies (set where their events go with
    /// [`EgressHub::set_sink`]).
    pub fn egress(&self) -> &Arc<EgressHub> {
        &self.egress
    }

    /// Starts sandbox `id`'s egress proxy in the folder its backend binds into it.
    fn open_egress(
        &self,
        backend: &Arc<dyn Backend>,
        id: &str,
        spec: &SandboxSpec,
    ) -> Result<Option<EgressHandle>, EngineError> {
        match backend.egress_dir(id, spec)? {
            Some(dir) => Ok(Some(self.egress.open(
                id,
                &dir,
                spec.network.clone(),
                &spec.secrets,
            )?)),
            None if spec.network.has_egress() => Err(EngineError::InvalidSpec(format!(
                "network '{}': the {} backend cannot give this sandbox egress",
                spec.network.kind(),
                spec.backend.as_str()
            ))),
            None => Ok(None),
        }
    }

    /// What each backend offers on this host.
    pub fn capabilities(&self) -> Vec<BackendCapabilities> {
        let mut caps: Vec<_> = self.backends.values().map(|b| b.capabilities()).collect();
        caps.sort_by_key(|c| c.kind.as_str());
        caps
    }

    /// The kinds of backend this engine was given, in [`BackendKind::ALL`]'s order: what a
    /// spec may name.
    pub fn backend_kinds(&self) -> Vec<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .filter(|k| self.backends.contains_key(k))
            .collect()
    }

    /// What the backend of `kind` lets the engine count on (`None`: no such backend here).
    pub fn features(&self, kind: BackendKind) -> Option<BackendFeatures> {
        self.backends.get(&kind).map(|b| b.features())
    }

    /// Creates a sandbox and waits until its agent answers.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Sandbox, EngineError> {
        self.create_with_id(new_sandbox_id(), spec).await
    }

    /// Creates a sandbox with an id the caller chose (from [`new_sandbox_id`], e.g. to
    /// prepare a backend for it ahead of time).
    pub async fn create_with_id(
        &self,
        id: String,
        spec: SandboxSpec,
    ) -> Result<Sandbox, EngineError> {
        let launch = self.launch(id, spec).await?;
        let hello = launch.client.send_hello().await;
        launch.prepare().await;
        launch.finish(hello).await
    }

    /// Creates a sandbox and starts `req` in it, the request travelling right behind the
    /// handshake instead of after its answer (one round trip less: what one-shot runs want).
    pub async fn create_and_exec(
        &self,
        id: String,
        spec: SandboxSpec,
        req: ExecRequest,
    ) -> Result<(Sandbox, ExecStream), EngineError> {
        // Checked before anything starts.
        let req = prepare_exec(&spec, req)?;
        let launch = self.launch(id, spec).await?;
        let hello = launch.client.send_hello().await;
        launch.prepare().await;
        let exec = launch.client.request(&HostMessage::Exec(req.clone())).await;
        let sandbox = launch.finish(hello).await?;
        let started = match exec {
            Ok(call) => sandbox.exec_started(call, &req).await,
            Err(e) => Err(e),
        };
        match started {
            Ok(stream) => Ok((sandbox, stream)),
            Err(e) => {
                let _ = sandbox.destroy().await;
                Err(e)
            }
        }
    }

    /// Reaches again a sandbox that a previous process created (from the record of
    /// [`Sandbox::runtime`]) and greets its agent: its kernels and processes are as they were.
    pub async fn reattach(
        &self,
        id: String,
        spec: SandboxSpec,
        runtime: &serde_json::Value,
    ) -> Result<Sandbox, EngineError> {
        validate_id(&id)?;
        let backend = self.backend(&spec)?;
        let start = Instant::now();
        let egress = self.open_egress(backend, &id, &spec)?;
        let launched = backend.reattach(&id, runtime).await?;
        // A paused sandbox's agent cannot answer the handshake: it runs for that moment
        // and is paused again.
        let was_paused = launched.instance.frozen() == Some(true);
        if was_paused {
            launched.instance.resume().await?;
        }
        let launch = Launch::greeted_before(id, spec, launched, backend.features(), egress, start);
        let hello = launch.client.send_hello().await;
        let sandbox = launch.finish_keeping(hello).await?;
        if was_paused {
            sandbox.pause().await?;
        }
        Ok(sandbox)
    }

    /// Creates sandbox `id` from the process checkpoint of the snapshot in `dir` (checked
    /// against its checksum first): its processes and kernels continue where the source's
    /// were, with new random streams. Returns it and what came back.
    pub async fn restore_checkpoint(
        &self,
        id: String,
        spec: SandboxSpec,
        dir: &std::path::Path,
        manifest: &SnapshotManifest,
    ) -> Result<(Sandbox, RestoreReport), EngineError> {
        validate_id(&id)?;
        spec.validate()?;
        let backend = self.backend(&spec)?;
        let archive = crate::snapshot::verify(dir, manifest).await?;
        let start = Instant::now();
        let image = dir.join(format!("restore-{id}"));
        let unpacked = {
            let (archive, image) = (archive.clone(), image.clone());
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir(&image)
                    .map_err(|e| EngineError::io("create the restore folder", e))?;
                crate::snapshot::unpack_checkpoint(&archive, &image)
            })
            .await
            .map_err(|e| EngineError::io("restore", std::io::Error::other(e)))
        };
        let egress = match unpacked {
            Ok(Ok(())) => self.open_egress(backend, &id, &spec).map_err(|e| (e, None)),
            Ok(Err(e)) | Err(e) => Err((e, None)),
        };
        let launched = match egress {
            Ok(egress) => match backend.restore(&id, &spec, &image).await {
                Ok(l) => Ok((l, egress)),
                Err(e) => Err((e, egress)),
            },
            Err(e) => Err(e),
        };
        // The backend has read the image into the new sandbox (or failed): not needed again.
        let _ = std::fs::remove_dir_all(&image);
        let (launched, egress) = launched.map_err(|(e, egress)| {
            if let Some(h) = egress {
                h.remove();
            }
            e
        })?;
        // The restored agent may still hold requests of its source's host.
        let launch = Launch::greeted_before(id, spec, launched, backend.features(), egress, start);
        let hello = launch.client.send_hello().await;
        let sandbox = launch.finish(hello).await?;
        match sandbox.after_checkpoint_restore(manifest).await {
            Ok(report) => Ok((sandbox, report)),
            Err(e) => {
                let _ = sandbox.destroy().await;
                Err(e)
            }
        }
    }

    /// Ends whatever is left of a sandbox that cannot be reattached; says what it found.
    pub fn kill_orphan(&self, spec: &SandboxSpec, runtime: &serde_json::Value) -> String {
        match self.backend(spec) {
            Ok(b) => b.kill_orphan(runtime),
            Err(e) => e.to_string(),
        }
    }

    fn backend(&self, spec: &SandboxSpec) -> Result<&Arc<dyn Backend>, EngineError> {
        self.backends.get(&spec.backend).ok_or_else(|| {
            let mut have: Vec<&str> = self.backends.keys().map(|k| k.as_str()).collect();
            have.sort_unstable();
            EngineError::BackendUnavailable(format!(
                "backend '{}' is not available in this service (available: {})",
                spec.backend.as_str(),
                have.join(", ")
            ))
        })
    }

    /// Fails as creating a sandbox of `spec` would if its backend is not here, or cannot
    /// make what `spec` asks for.
    pub fn check_backend(&self, spec: &SandboxSpec) -> Result<(), EngineError> {
        let backend = self.backend(spec)?;
        check_features(spec, backend.features())?;
        match backend.unavailable() {
            Some(why) => Err(EngineError::BackendUnavailable(why)),
            None => Ok(()),
        }
    }

    /// Starts the backend's sandbox and the client on its agent's stream.
    async fn launch(&self, id: String, spec: SandboxSpec) -> Result<Launch, EngineError> {
        validate_id(&id)?;
        spec.validate()?;
        let backend = self.backend(&spec)?;
        let features = backend.features();
        check_features(&spec, features)?;
        let start = Instant::now();
        let egress = self.open_egress(backend, &id, &spec)?;
        let launched = match backend.launch(&id, &spec).await {
            Ok(l) => l,
            Err(e) => {
                if let Some(h) = egress {
                    h.remove();
                }
                return Err(e);
            }
        };
        let launched_at = start.elapsed();
        Ok(Launch {
            id,
            spec,
            client: GuestClient::start(launched.stream),
            instance: launched.instance,
            features,
            isolation: launched.isolation,
            egress,
            start,
            launched_at,
        })
    }
}

/// A sandbox whose agent has been reached but not yet greeted.
struct Launch {
    id: String,
    spec: SandboxSpec,
    client: GuestClient,
    instance: Box<dyn BackendInstance>,
    features: BackendFeatures,
    isolation: IsolationReport,
    egress: Option<EgressHandle>,
    start: Instant,
    launched_at: Duration,
}

impl Launch {
    /// A sandbox whose agent already served a host (reattached, or restored from a
    /// checkpoint): the client numbers its requests away from that host's, whose late
    /// replies must match none of them.
    fn greeted_before(
        id: String,
        spec: SandboxSpec,
        launched: LaunchedSandbox,
        features: BackendFeatures,
        egress: Option<EgressHandle>,
        start: Instant,
    ) -> Self {
        Self {
            id,
            spec,
            client: GuestClient::start_at(launched.stream, reattach_first_id()),
            instance: launched.instance,
            features,
            isolation: launched.isolation,
            egress,
            launched_at: start.elapsed(),
            start,
        }
    }

    /// Sends the kernels' settings right behind the handshake, without waiting: kernels
    /// asked for start while the rest of creation goes on. A failure there shows on the
    /// first execution.
    async fn prepare(&self) {
        if self.spec.env.is_empty()
            && self.spec.warm_kernels.is_empty()
            && self.spec.workdir.is_none()
        {
            return;
        }
        let msg = HostMessage::Prepare {
            env: self.spec.env.clone(),
            kernels: self.spec.warm_kernels.clone(),
            cwd: self.spec.workdir.clone(),
        };
        // The reply is not awaited; dropping the call discards it when it comes.
        drop(self.client.request(&msg).await);
    }

    /// Completes the handshake sent on `hello`; on failure the sandbox is destroyed.
    async fn finish(self, hello: Result<Call, EngineError>) -> Result<Sandbox, EngineError> {
        self.complete(hello, true).await
    }

    /// As [`Self::finish`], but a failure leaves the sandbox alone (a reattach that failed
    /// decides itself what to do with it).
    async fn finish_keeping(
        self,
        hello: Result<Call, EngineError>,
    ) -> Result<Sandbox, EngineError> {
        self.complete(hello, false).await
    }

    async fn complete(
        self,
        hello: Result<Call, EngineError>,
        destroy_on_failure: bool,
    ) -> Result<Sandbox, EngineError> {
        let answered = match hello {
            Ok(call) => {
                self.client
                    .await_hello_or_older(call, HANDSHAKE_TIMEOUT)
                    .await
            }
            Err(e) => Err(e),
        };
        let hello = match answered {
            Ok(hello) => hello,
            Err(e) => {
                if destroy_on_failure {
                    let _ = self.instance.destroy().await;
                    if let Some(h) = &self.egress {
                        h.remove();
                    }
                } else {
                    self.instance.detach();
                }
                return Err(e);
            }
        };
        let mut isolation = self.isolation;
        isolation.merge(&hello.isolation);
        let timings = Timings {
            launch_ms: ms(self.launched_at),
            handshake_ms: ms(self.start.elapsed() - self.launched_at),
            create_ms: ms(self.start.elapsed()),
        };
        Ok(Sandbox::new(
            self.id,
            self.spec,
            self.client,
            self.instance,
            self.features,
            isolation,
            self.egress,
            hello.agent_version,
            timings,
        ))
    }
}

/// Fails when `spec` asks for what a backend with `features` cannot do.
fn check_features(spec: &SandboxSpec, features: BackendFeatures) -> Result<(), EngineError> {
    match features.checkpoint {
        CheckpointSupport::OnRequest => Ok(()),
        CheckpointSupport::Always if spec.checkpointable => Err(EngineError::InvalidSpec(format!(
            "checkpointable is for the process backend ({} checkpoints every sandbox)",
            spec.backend.as_str()
        ))),
        CheckpointSupport::Never if spec.checkpointable => Err(EngineError::InvalidSpec(format!(
            "checkpointable: the {} backend cannot checkpoint sandboxes",
            spec.backend.as_str()
        ))),
        _ => Ok(()),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Checks a caller-chosen sandbox id (the one rule: `sandcell_api::rules::check_sandbox_id`).
fn validate_id(id: &str) -> Result<(), EngineError> {
    sandcell_api::rules::check_sandbox_id(id).map_err(|e| EngineError::InvalidRequest(e.0))
}

/// Where a reattaching client starts numbering its requests: somewhere in the upper half,
/// far from the ids a previous client used (which start at 1).
fn reattach_first_id() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (1u32 << 31) | (h.finish() as u32 & 0x3fff_ffff)
}

/// A new unique sandbox id: `sb-` and 12 hex digits from the clock, the pid and a counter.
pub fn new_sandbox_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("sb-{:012x}", h.finish() & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(validate_id(&new_sandbox_id()).is_ok());
        assert!(validate_id("sb-abc-123").is_ok());
        for bad in ["", "sb-", "abc", "sb-../x", "sb-A", "sb-a/b"] {
            assert!(validate_id(bad).is_err(), "{bad}");
        }
        assert_ne!(new_sandbox_id(), new_sandbox_id());
    }
}
