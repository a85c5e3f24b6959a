//! A backend for tests: the real guest agent, without any isolation.
//!
//! [`LocalBackend`] implements the engine's [`Backend`] by running
//! [`sandcell_guest::serve`] on a thread of the calling process, over a socketpair, with
//! three temporary folders (`workspace`, `home`, `tmp`) as the agent's file roots and
//! `workspace` as the working directory of execs. Everything above the backend (the engine's
//! client, sandboxes, the fleet, the service) then runs as in production, on any machine and
//! without root.
//!
//! What it does not have, it says in its [`BackendCapabilities`] and [`BackendFeatures`]:
//!
//! - no isolation: commands run as the test's own user, on the host's file system and
//!   network (isolation level `none`); a test must run nothing it would not run itself;
//! - no limits (memory, CPU, processes, disk are not enforced; no resource counters);
//! - no pause, no checkpoint, no file snapshot (snapshots fail as unsupported);
//! - paths: absolute paths name the host's files, not `/workspace`; give paths relative to
//!   the workspace, or under [`LocalBackend::roots_of`].
//!
//! It can reattach: each agent also listens on a Unix socket in its folder, so that a new
//! engine over a clone of the same backend (a "restarted service" in the same test process)
//! finds its sandboxes again through [`sandcell_engine::fleet::Fleet::recover`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), sandcell_engine::EngineError> {
//! use sandcell_engine::{Engine, SandboxSpec};
//! use sandcell_testkit::local::LocalBackend;
//!
//! let engine = Engine::builder().backend(LocalBackend::new()).build();
//! let sandbox = engine.create(SandboxSpec::default()).await?;
//! let out = sandbox.exec(sandcell_protocol::ExecRequest::shell("echo hi")).await?;
//! assert_eq!(out.stdout, b"hi\n");
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandcell_engine::{
    Backend, BackendCapabilities, BackendFeatures, BackendInstance, BackendKind, CheckpointSupport,
    EngineError, Fidelity, IsolationLevel, LaunchedSandbox, ResourceCounters, SandboxSpec,
};
use sandcell_guest::GuestConfig;
use sandcell_protocol::{FeatureState, HostMessage, IsolationReport, PROTOCOL_VERSION};

/// The agent's file roots, in the order the agent resolves relative paths (first one).
const ROOTS: [&str; 3] = ["workspace", "home", "tmp"];
/// Where each agent listens for a host coming back (in its folder).
const SOCKET: &str = "agent.sock";
/// How long ending an agent may take before it is left to itself.
const END_TIMEOUT: Duration = Duration::from_secs(10);

/// The test backend (see the module's documentation). Cheap to clone; clones share their
/// sandboxes, as one host does.
#[derive(Clone)]
pub struct LocalBackend {
    shared: Arc<Shared>,
}

struct Shared {
    kind: BackendKind,
    /// Every sandbox's folder lives here; removed when the last clone is dropped.
    base: tempfile::TempDir,
    /// Sandboxes whose agent has not ended, by id: what a reattach finds.
    agents: Mutex<HashMap<String, Arc<Agent>>>,
}

/// One agent thread.
struct Agent {
    dir: PathBuf,
    /// Reports once when `serve` has returned.
    ended: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Default for LocalBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalBackend {
    /// A backend standing in for the `process` kind (the kind a default spec names).
    ///
    /// # Panics
    /// When no temporary folder can be made (a test cannot go on without one).
    pub fn new() -> Self {
        Self::of_kind(BackendKind::Process)
    }

    /// A backend standing in for `kind`: specs naming it run here.
    ///
    /// # Panics
    /// When no temporary folder can be made.
    pub fn of_kind(kind: BackendKind) -> Self {
        #[allow(clippy::expect_used)] // Documented: a test kit without a temp folder is moot.
        let base = tempfile::Builder::new()
            .prefix("sandcell-local-")
            .tempdir()
            .expect("create a temporary folder for the local backend");
        Self {
            shared: Arc::new(Shared {
                kind,
                base,
                agents: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The folders sandbox `id` has as `workspace`, `home` and `tmp` (they exist while its
    /// agent runs).
    pub fn roots_of(&self, id: &str) -> [PathBuf; 3] {
        let dir = self.shared.base.path().join(id);
        ROOTS.map(|r| dir.join(r))
    }

    /// How many agents are running now (ended ones are not counted).
    pub fn running(&self) -> usize {
        let mut agents = lock(&self.shared.agents);
        agents.retain(|_, a| !a.has_ended());
        agents.len()
    }

    fn isolation() -> IsolationReport {
        let mut report = IsolationReport::default();
        report.set(
            "isolation",
            FeatureState::Unavailable,
            "the local test backend runs the agent on a thread of the test process, as its user",
        );
        report
    }

    fn fail(stage: &str, e: impl std::fmt::Display) -> EngineError {
        EngineError::Launch {
            stage: stage.into(),
            message: e.to_string(),
        }
    }

    /// Starts an agent for `id` in a fresh folder; returns the host's end of its connection.
    fn start(&self, id: &str) -> Result<(UnixStream, Arc<Agent>), EngineError> {
        let dir = self.shared.base.path().join(id);
        let roots = self.roots_of(id);
        for root in &roots {
            std::fs::create_dir_all(root).map_err(|e| Self::fail("create the roots", e))?;
        }
        let listener = UnixListener::bind(dir.join(SOCKET)).map_err(|e| Self::fail("listen", e))?;
        let (host, guest) = UnixStream::pair().map_err(|e| Self::fail("socketpair", e))?;
        let mut config = GuestConfig {
            default_cwd: roots[0].clone(),
            file_roots: roots.to_vec(),
            isolation: Self::isolation(),
            // Never: PID 1 mode reaps and kills everything in the (test's) pid namespace.
            pid1: false,
            listener: Some(Arc::new(listener)),
            ..GuestConfig::default()
        };
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        for (name, value) in &mut config.base_env {
            match name.as_str() {
                "HOME" => *value = roots[1].display().to_string(),
                "TMPDIR" => *value = roots[2].display().to_string(),
                "PATH" => value.clone_from(&path),
                _ => {}
            }
        }
        let (tx, ended) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("agent-{id}"))
            .spawn(move || {
                let _ = sandcell_guest::serve(guest, config);
                let _ = tx.send(());
            })
            .map_err(|e| Self::fail("start the agent's thread", e))?;
        let agent = Arc::new(Agent {
            dir,
            ended: Mutex::new(Some(ended)),
        });
        lock(&self.shared.agents).insert(id.to_string(), agent.clone());
        Ok((host, agent))
    }

    fn launched(
        &self,
        id: &str,
        host: UnixStream,
        agent: Arc<Agent>,
    ) -> Result<LaunchedSandbox, EngineError> {
        let control = host
            .try_clone()
            .map_err(|e| Self::fail("keep the connection", e))?;
        host.set_nonblocking(true)
            .map_err(|e| Self::fail("use the connection", e))?;
        let stream = tokio::net::UnixStream::from_std(host)
            .map_err(|e| Self::fail("use the connection", e))?;
        Ok(LaunchedSandbox {
            stream: Box::new(stream),
            instance: Box::new(LocalInstance {
                id: id.to_string(),
                agent,
                control,
                backend: self.clone(),
                ended: AtomicBool::new(false),
                detached: AtomicBool::new(false),
            }),
            isolation: Self::isolation(),
        })
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn kind(&self) -> BackendKind {
        self.shared.kind
    }

    fn capabilities(&self) -> BackendCapabilities {
        BackendCapabilities {
            kind: self.shared.kind,
            available: true,
            isolation_level: IsolationLevel::None,
            supports_pause: false,
            checkpoint_fidelity: Fidelity::None,
            host: Self::isolation(),
            features: self.features(),
        }
    }

    fn features(&self) -> BackendFeatures {
        BackendFeatures {
            reattach: true,
            checkpoint: CheckpointSupport::Never,
            checkpoint_rehomes: false,
            capture_files: false,
            limits: false,
        }
    }

    async fn launch(&self, id: &str, _spec: &SandboxSpec) -> Result<LaunchedSandbox, EngineError> {
        let (host, agent) = self.start(id)?;
        self.launched(id, host, agent)
    }

    async fn reattach(
        &self,
        id: &str,
        runtime: &serde_json::Value,
    ) -> Result<LaunchedSandbox, EngineError> {
        let fail = |m: String| Self::fail("reattach", m);
        let agent = lock(&self.shared.agents)
            .get(id)
            .filter(|a| !a.has_ended())
            .cloned()
            .ok_or_else(|| fail(format!("sandbox {id}'s agent has ended")))?;
        if runtime.get("dir").and_then(|d| d.as_str()) != agent.dir.to_str() {
            return Err(fail(format!(
                "sandbox {id} was not started by this backend"
            )));
        }
        let host = UnixStream::connect(agent.dir.join(SOCKET))
            .map_err(|e| fail(format!("its agent is not listening: {e}")))?;
        self.launched(id, host, agent)
    }

    fn kill_orphan(&self, runtime: &serde_json::Value) -> String {
        let found = lock(&self.shared.agents)
            .iter()
            .find(|(_, a)| runtime.get("dir").and_then(|d| d.as_str()) == a.dir.to_str())
            .map(|(id, a)| (id.clone(), a.clone()));
        match found {
            Some((id, agent)) => {
                // On a thread: the agent may still be on a connection whose end the caller's
                // runtime has yet to process.
                let backend = self.clone();
                let ended = id.clone();
                std::thread::spawn(move || {
                    end_agent(None, &agent);
                    lock(&backend.shared.agents).remove(&ended);
                });
                format!("ending the agent of {id}")
            }
            None => "nothing to end".into(),
        }
    }
}

/// One sandbox of the local backend.
struct LocalInstance {
    id: String,
    agent: Arc<Agent>,
    /// A second handle on the host's end of the connection, to end it from here.
    control: UnixStream,
    backend: LocalBackend,
    ended: AtomicBool,
    detached: AtomicBool,
}

impl Agent {
    fn has_ended(&self) -> bool {
        match lock(&self.ended).as_ref() {
            Some(rx) => !matches!(rx.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)),
            None => true,
        }
    }

    /// Waits (blocking) up to `limit` for the agent's thread to return.
    fn wait_ended(&self, limit: Duration) -> bool {
        let rx = lock(&self.ended).take();
        match rx {
            Some(rx) => !matches!(
                rx.recv_timeout(limit),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            ),
            None => true,
        }
    }
}

/// Ends an agent: its current connection is shut down (if given), then a connection of our
/// own asks it to shut down (it would otherwise wait for a host to come back); it kills what
/// it started on its way out. Blocking.
fn end_agent(current: Option<&UnixStream>, agent: &Agent) {
    if let Some(current) = current {
        let _ = current.shutdown(std::net::Shutdown::Both);
    }
    if let Ok(mut conn) = UnixStream::connect(agent.dir.join(SOCKET)) {
        let hello = HostMessage::Hello {
            protocol: PROTOCOL_VERSION,
            client: "sandcell-testkit".into(),
        };
        let mut bytes = sandcell_protocol::encode_message(1, &hello);
        bytes.extend(sandcell_protocol::encode_message(2, &HostMessage::Shutdown));
        let _ = conn.set_read_timeout(Some(END_TIMEOUT));
        if conn.write_all(&bytes).is_ok() {
            // Whatever it answers, until it closes.
            let _ = std::io::copy(
                &mut Read::by_ref(&mut conn).take(1 << 20),
                &mut std::io::sink(),
            );
        }
    }
    agent.wait_ended(END_TIMEOUT);
}

impl LocalInstance {
    fn end_now(&self) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        end_agent(Some(&self.control), &self.agent);
        lock(&self.backend.shared.agents).remove(&self.id);
    }
}

impl Drop for LocalInstance {
    fn drop(&mut self) {
        if !self.detached.load(Ordering::SeqCst) {
            self.end_now();
        }
    }
}

#[async_trait]
impl BackendInstance for LocalInstance {
    fn counters(&self) -> ResourceCounters {
        ResourceCounters::default()
    }

    fn host_pid(&self) -> Option<i32> {
        None
    }

    async fn destroy(&self) -> Result<(), EngineError> {
        if self.ended.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let (control, agent) = (
            self.control
                .try_clone()
                .map_err(|e| EngineError::io("end the agent", e))?,
            self.agent.clone(),
        );
        tokio::task::spawn_blocking(move || end_agent(Some(&control), &agent))
            .await
            .map_err(|e| EngineError::io("end the agent", std::io::Error::other(e)))?;
        lock(&self.backend.shared.agents).remove(&self.id);
        Ok(())
    }

    fn kill(&self) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.control.shutdown(std::net::Shutdown::Both);
        let agent = self.agent.clone();
        let backend = self.backend.clone();
        let id = self.id.clone();
        std::thread::spawn(move || {
            end_agent(None, &agent);
            lock(&backend.shared.agents).remove(&id);
        });
    }

    fn runtime(&self) -> serde_json::Value {
        serde_json::json!({ "dir": self.agent.dir })
    }

    fn detach(&self) {
        self.detached.store(true, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
