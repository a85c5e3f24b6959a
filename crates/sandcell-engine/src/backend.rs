//! The `Backend` trait: how a sandbox's world is started and torn down.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};

use sandcell_protocol::IsolationReport;

use crate::error::EngineError;
use crate::spec::{BackendKind, SandboxSpec};

/// A byte stream to a guest agent: a Unix socket today, anything that reads and writes
/// (a vsock, a pipe pair, an in-memory duplex) for the next backend.
pub trait GuestIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> GuestIo for T {}

/// The guest agent's connection as the engine holds it.
pub type GuestStream = Box<dyn GuestIo>;

/// Strength of the boundary a backend puts around a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IsolationLevel {
    /// None at all: the guest runs as the service's own user (test backends).
    #[serde(rename = "none")]
    None,
    /// Namespaces, seccomp, Landlock and cgroups on the host's kernel.
    #[serde(rename = "container")]
    Container,
    /// A kernel in user space between the sandbox and the host's (gVisor).
    #[serde(rename = "user-space kernel")]
    UserSpaceKernel,
    /// A virtual machine with its own kernel.
    #[serde(rename = "hardware vm")]
    HardwareVm,
}

impl IsolationLevel {
    /// The name used in reports (and on the wire).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Container => "container",
            Self::UserSpaceKernel => "user-space kernel",
            Self::HardwareVm => "hardware vm",
        }
    }
}

impl fmt::Display for IsolationLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a snapshot carries, from least to most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fidelity {
    /// Nothing: the backend cannot snapshot.
    None,
    /// The sandbox's folders.
    Files,
    /// The folders and the kernels' variables.
    Language,
    /// Every process with its memory.
    Process,
}

impl Fidelity {
    /// The name used in manifests and reports (and on the wire).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Files => "files",
            Self::Language => "language",
            Self::Process => "process",
        }
    }

    /// The fidelity named `name` (as [`Self::as_str`] writes it).
    pub fn parse(name: &str) -> Option<Self> {
        [Self::None, Self::Files, Self::Language, Self::Process]
            .into_iter()
            .find(|f| f.as_str() == name)
    }
}

impl fmt::Display for Fidelity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which sandboxes of a backend can have their processes checkpointed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointSupport {
    /// None.
    #[default]
    Never,
    /// Those whose spec asks for it ([`SandboxSpec::checkpointable`]).
    OnRequest,
    /// Every sandbox: its snapshots are process checkpoints.
    Always,
}

/// What the engine may count on from a backend, instead of knowing backends by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendFeatures {
    /// A later process of the service can reach its sandboxes again
    /// ([`Backend::reattach`]).
    pub reattach: bool,
    /// Which sandboxes can be checkpointed ([`BackendInstance::checkpoint`]).
    pub checkpoint: CheckpointSupport,
    /// A checkpoint restores the sandbox in place and hands the agent a new connection
    /// (the client must expect its stream to be replaced while it runs).
    pub checkpoint_rehomes: bool,
    /// [`BackendInstance::capture_files`] works: snapshots of `files` (or `language`)
    /// fidelity when a sandbox cannot be checkpointed.
    pub capture_files: bool,
    /// Resource limits (memory, CPU, processes, disk) are enforced.
    pub limits: bool,
}

/// What a backend can do on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendCapabilities {
    /// Which backend.
    pub kind: BackendKind,
    /// Whether it can run at all here.
    pub available: bool,
    /// Strength of the boundary.
    pub isolation_level: IsolationLevel,
    /// Whether `pause`/`resume` keep memory.
    pub supports_pause: bool,
    /// Best snapshot fidelity.
    pub checkpoint_fidelity: Fidelity,
    /// Feature-by-feature: what a sandbox would get on this host, and why not.
    pub host: IsolationReport,
    /// What the engine may count on (not reported: the fields above say it for users).
    #[serde(skip)]
    pub features: BackendFeatures,
}

/// Resource counters of a running sandbox, for telling why an exec died.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceCounters {
    /// OOM kills so far (None when the backend cannot tell).
    pub oom_kills: Option<u64>,
    /// Forks refused by the process limit so far (None when the backend cannot tell).
    pub pids_limit_hits: Option<u64>,
    /// Memory in use.
    pub memory_bytes: Option<u64>,
    /// Highest memory use seen (filled by [`BackendInstance::usage`] only).
    pub memory_peak_bytes: Option<u64>,
    /// CPU time used, in microseconds (filled by [`BackendInstance::usage`] only).
    pub cpu_usage_us: Option<u64>,
    /// Processes and threads now (filled by [`BackendInstance::usage`] only).
    pub pids_current: Option<u64>,
}

/// A freshly started sandbox: the stream its guest agent speaks on, plus its handle.
pub struct LaunchedSandbox {
    /// The guest agent's connection, before the handshake.
    pub stream: GuestStream,
    /// Backend-specific handle.
    pub instance: Box<dyn BackendInstance>,
    /// Isolation set up outside the guest (namespaces, cgroups, id maps).
    pub isolation: IsolationReport,
}

/// An isolation backend.
#[async_trait]
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// What it offers on this host.
    fn capabilities(&self) -> BackendCapabilities;
    /// What the engine may count on from it (a cheap call, made for every sandbox).
    fn features(&self) -> BackendFeatures {
        BackendFeatures::default()
    }
    /// Why it cannot start sandboxes on this host now (a cheap check, made before each
    /// create); `None` when it can.
    fn unavailable(&self) -> Option<String> {
        None
    }
    /// Creates the host folder that sandbox `id` will see at
    /// [`crate::egress::SANDBOX_EGRESS_DIR`] (the engine puts its egress proxy's socket
    /// there before the launch) and returns it; `None`: the sandbox gets no egress folder
    /// (its network is `off`, or this backend cannot bind one). Called before
    /// [`Self::launch`], [`Self::reattach`] and [`Self::restore`].
    fn egress_dir(
        &self,
        id: &str,
        spec: &SandboxSpec,
    ) -> Result<Option<std::path::PathBuf>, EngineError> {
        let _ = (id, spec);
        Ok(None)
    }
    /// Starts a sandbox running the guest agent.
    async fn launch(&self, id: &str, spec: &SandboxSpec) -> Result<LaunchedSandbox, EngineError>;
    /// Reaches a sandbox a previous process launched, from its [`BackendInstance::runtime`]
    /// record (after a restart of the service). The stream still needs a handshake.
    async fn reattach(
        &self,
        id: &str,
        runtime: &serde_json::Value,
    ) -> Result<LaunchedSandbox, EngineError> {
        let _ = runtime;
        Err(EngineError::Launch {
            stage: "reattach".into(),
            message: format!(
                "the {} backend cannot reach sandbox {id} again",
                self.kind().as_str()
            ),
        })
    }
    /// Starts sandbox `id` from the process checkpoint in `image` (written by
    /// [`BackendInstance::checkpoint`]): its processes continue where they were. The stream
    /// needs a handshake; the agent already had one, so the client must not reuse its
    /// request ids (as after a reattach).
    async fn restore(
        &self,
        id: &str,
        spec: &SandboxSpec,
        image: &std::path::Path,
    ) -> Result<LaunchedSandbox, EngineError> {
        let _ = (id, spec, image);
        Err(EngineError::Unsupported(format!(
            "the {} backend cannot restore process checkpoints",
            self.kind().as_str()
        )))
    }
    /// Ends whatever is left of a sandbox that cannot be reattached, from its runtime
    /// record, so that nothing is orphaned; returns what it found.
    fn kill_orphan(&self, runtime: &serde_json::Value) -> String {
        let _ = runtime;
        "nothing to end".into()
    }
}

/// One running sandbox, as its backend sees it.
#[async_trait]
pub trait BackendInstance: Send + Sync {
    /// Current resource counters.
    fn counters(&self) -> ResourceCounters;
    /// Forks refused by the process limit so far (a cheaper read than all of `counters`).
    fn pids_limit_hits(&self) -> Option<u64> {
        self.counters().pids_limit_hits
    }
    /// Everything the backend can tell about the sandbox's resource use (more reads than
    /// [`Self::counters`], which explains an exec's end).
    fn usage(&self) -> ResourceCounters {
        self.counters()
    }
    /// OOM kills so far (a cheaper read than all of `counters`).
    fn oom_kills(&self) -> Option<u64> {
        self.counters().oom_kills
    }
    /// The pid of the sandbox's first process on the host, if it has one.
    fn host_pid(&self) -> Option<i32>;
    /// Kills everything in the sandbox and waits until it is gone.
    async fn destroy(&self) -> Result<(), EngineError>;
    /// Starts killing everything in the sandbox and returns at once.
    fn kill(&self);
    /// What another process needs to reach this sandbox again (see [`Backend::reattach`]);
    /// `Null` when it cannot.
    fn runtime(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Lets the sandbox outlive this handle: dropping it no longer kills it (for a service
    /// that stops and will reattach on its next start).
    fn detach(&self) {}
    /// Freezes every process of the sandbox (no CPU; memory and processes kept), waiting
    /// until the last has stopped.
    async fn pause(&self) -> Result<(), EngineError> {
        Err(EngineError::Unsupported(
            "this backend cannot pause a sandbox".into(),
        ))
    }
    /// Lets a paused sandbox's processes run again.
    async fn resume(&self) -> Result<(), EngineError> {
        Ok(())
    }
    /// Whether the sandbox is frozen now (`None`: the backend cannot tell).
    fn frozen(&self) -> Option<bool> {
        None
    }
    /// Whether [`Self::checkpoint`] works for this sandbox (see
    /// [`BackendFeatures::checkpoint`]): its snapshots are then of `process` fidelity.
    fn checkpoints(&self) -> bool {
        false
    }
    /// Writes a checkpoint of every process and the sandbox's memory-backed folders into the
    /// empty folder `image`; the sandbox runs on after. Returns the agent's new connection
    /// when the backend had to give it one (it restored the sandbox from `image` in place,
    /// see [`BackendFeatures::checkpoint_rehomes`]).
    async fn checkpoint(
        &self,
        image: &std::path::Path,
    ) -> Result<Option<GuestStream>, EngineError> {
        let _ = image;
        Err(EngineError::Unsupported(
            "this backend cannot checkpoint processes".into(),
        ))
    }
    /// Writes the sandbox's folders `dirs` (relative to its root, e.g. `workspace`) to `out`
    /// as a tar archive. The caller has paused the sandbox.
    fn capture_files(
        &self,
        _dirs: &[&str],
        _out: &mut dyn std::io::Write,
    ) -> Result<crate::snapshot::FilesCapture, EngineError> {
        Err(EngineError::Unsupported(
            "this backend cannot snapshot a sandbox's files".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_fidelities_keep_their_wire_names() {
        for (level, name) in [
            (IsolationLevel::None, "none"),
            (IsolationLevel::Container, "container"),
            (IsolationLevel::UserSpaceKernel, "user-space kernel"),
            (IsolationLevel::HardwareVm, "hardware vm"),
        ] {
            assert_eq!(serde_json::to_value(level).unwrap(), name);
            assert_eq!(level.to_string(), name);
            let back: IsolationLevel = serde_json::from_value(name.into()).unwrap();
            assert_eq!(back, level);
        }
        for (fidelity, name) in [
            (Fidelity::None, "none"),
            (Fidelity::Files, "files"),
            (Fidelity::Language, "language"),
            (Fidelity::Process, "process"),
        ] {
            assert_eq!(serde_json::to_value(fidelity).unwrap(), name);
            assert_eq!(Fidelity::parse(name), Some(fidelity));
        }
        assert!(Fidelity::Files < Fidelity::Process);
        for kind in BackendKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }

    #[test]
    fn engine_only_features_stay_off_the_wire() {
        let caps = BackendCapabilities {
            kind: BackendKind::Process,
            available: true,
            isolation_level: IsolationLevel::Container,
            supports_pause: true,
            checkpoint_fidelity: Fidelity::Language,
            host: IsolationReport::default(),
            features: BackendFeatures {
                reattach: true,
                ..BackendFeatures::default()
            },
        };
        let json = serde_json::to_value(&caps).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "available",
                "checkpoint_fidelity",
                "host",
                "isolation_level",
                "kind",
                "supports_pause"
            ]
        );
    }
}
