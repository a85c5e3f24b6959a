//! The `gvisor` backend: the guest agent as PID 1 of an OCI bundle run by gVisor's `runsc`
//! (a user-space kernel between the sandbox and the host), with full process checkpoints.
//!
//! Each sandbox is one `runsc` container over the same root skeleton the `process` backend
//! builds (read-only system binds, synthesized `/etc`), tmpfs for `/workspace`,
//! `/home/sandbox` and `/tmp` (in gVisor's memory, so a checkpoint holds them), and the
//! Sandcell binary bound read-only. The agent's connection is one end of a socketpair given
//! to `runsc` as the container's stdin; a restore is given a new one, which is how one
//! checkpoint becomes many sandboxes.

#![forbid(unsafe_code)]

mod bundle;
pub mod guest;
mod runsc;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sandcell_engine::backend::{CheckpointSupport, Fidelity, GuestStream, IsolationLevel};
use sandcell_engine::{
    Backend, BackendCapabilities, BackendFeatures, BackendInstance, BackendKind, EngineError,
    LaunchedSandbox, MountMode, NetworkPolicy, ResourceCounters, SandboxSpec,
};
use sandcell_jail::cgroup::{CgroupVersion, SandboxCgroup};
use sandcell_jail::rootfs::skeleton::{self, RootLayout};
use sandcell_jail::{NetworkMode, seccomp};
use sandcell_protocol::{Feature, FeatureState, IsolationReport};

pub use bundle::{GUEST_DIR, MEMORY_OVERHEAD, PIDS_OVERHEAD};
use runsc::Runsc;

/// The name in the shared `/etc/hostname` and `/etc/hosts` (each sandbox's own hostname is
/// its id).
const HOSTNAME: &str = "sandcell";

/// Settings of the gvisor backend.
#[derive(Debug, Clone)]
pub struct GvisorBackendConfig {
    /// The `runsc` executable (`None`: not found; the backend is then unavailable).
    pub runsc: Option<PathBuf>,
    /// The Sandcell binary (copied next to the bundles and run inside as the agent).
    pub binary: PathBuf,
    /// Where bundles, runsc's state and the root skeleton live.
    pub runtime_dir: PathBuf,
    /// Host paths bound read-only into the sandbox.
    pub system_paths: Vec<String>,
    /// Parent cgroup (relative to each hierarchy's root) for sandbox cgroups.
    pub cgroup_parent: String,
    /// runsc's `--platform`: `ptrace` (works everywhere) or `kvm`.
    pub platform: String,
    /// Keep runsc's debug logs (in each bundle's folder).
    pub debug: bool,
}

impl GvisorBackendConfig {
    /// Defaults: `runsc` from `$PATH`, `binary` as the agent, the shared runtime folder.
    pub fn new(binary: impl Into<PathBuf>, runtime_dir: impl Into<PathBuf>) -> Self {
        Self {
            runsc: find_on_path("runsc"),
            binary: binary.into(),
            runtime_dir: runtime_dir.into(),
            system_paths: skeleton::DEFAULT_SYSTEM_PATHS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            cgroup_parent: std::env::var("SANDCELL_CGROUP_PARENT")
                .unwrap_or_else(|_| "sandcell".into()),
            platform: std::env::var("SANDCELL_GVISOR_PLATFORM").unwrap_or_else(|_| "ptrace".into()),
            debug: std::env::var_os("SANDCELL_DEBUG").is_some(),
        }
    }
}

/// The agent folder the checkpoint in `image` was made with (`current` for a checkpoint
/// that does not say: made before checkpoints named it).
fn checkpoint_agent_dir(image: &Path, current: &str) -> Result<String, String> {
    let dir = match std::fs::read_to_string(image.join(AGENT_DIR_FILE)) {
        Ok(dir) => dir.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(current.to_string()),
        Err(e) => return Err(format!("read the checkpoint's agent folder: {e}")),
    };
    if Path::new(&dir).join("sandcell").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "the Sandcell binary this checkpoint was made with ({dir}) is no longer installed"
        ))
    }
}

/// The first `name` in `$PATH` that is a file.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// What every sandbox shares, made on first use.
#[derive(Debug, Clone)]
struct Shared {
    /// The root skeleton.
    root: String,
    /// System paths bound into it.
    binds: Vec<String>,
    /// The folder holding this binary as the agent (see [`skeleton::binary_dir`]).
    guest_dir: String,
}

/// The file in a checkpoint image naming the agent folder its sandbox ran from.
const AGENT_DIR_FILE: &str = "sandcell-agent-dir";

/// The file in a checkpoint image saying its agent serves the control channel (and was
/// checkpointed with its egress bridge closed): a restore opens the bridge again.
const CONTROL_FILE: &str = "sandcell-control";

/// How long the backend waits for the agent to answer a control command (the agent gives
/// its bridge 10 s).
const CONTROL_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Why a control command was not done.
#[derive(Debug)]
enum Refusal {
    /// The channel failed (closed, no answer in time).
    Channel(String),
    /// The agent answered with an error: its words.
    Said(String),
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Self::Channel(why)
    }
}

/// The host's end of a container's control channel (its agent's stdout; see [`guest`]).
struct Control {
    stream: Mutex<std::io::BufReader<UnixStream>>,
    /// The tag of the last command sent.
    tag: std::sync::atomic::AtomicU64,
}

impl Control {
    fn new(stream: UnixStream) -> Self {
        Self {
            stream: Mutex::new(std::io::BufReader::new(stream)),
            tag: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// [`Self::request`], with the agent's refusal as a message like the channel's failures.
    fn ask(&self, command: &str) -> Result<(), String> {
        self.request(command).map_err(|e| match e {
            Refusal::Channel(why) => why,
            Refusal::Said(why) => format!("the agent answered {command:?} with {why:?}"),
        })
    }

    /// Sends `command` and waits (at most [`CONTROL_LIMIT`]) for the agent to say it is done.
    /// Answers to earlier commands (late, after their wait ended) are skipped by their tag.
    fn request(&self, command: &str) -> Result<(), Refusal> {
        use std::io::{BufRead, Write};
        let mut stream = self
            .stream
            .lock()
            .map_err(|_| "the control channel is poisoned".to_string())?;
        let closed = || format!("the agent closed its control channel ({command:?})");
        let io = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("the agent did not answer {command:?} within {CONTROL_LIMIT:?}")
            }
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => closed(),
            _ => format!("{command:?} on the control channel: {e}"),
        };
        let tag = (self.tag.fetch_add(1, Ordering::Relaxed) + 1).to_string();
        let deadline = std::time::Instant::now() + CONTROL_LIMIT;
        let socket = stream.get_mut();
        socket.set_write_timeout(Some(CONTROL_LIMIT)).map_err(io)?;
        socket
            .write_all(format!("{command} {tag}\n").as_bytes())
            .map_err(io)?;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io(std::io::ErrorKind::TimedOut.into()).into());
            }
            stream.get_mut().set_read_timeout(Some(left)).map_err(io)?;
            let mut answer = String::new();
            if stream.read_line(&mut answer).map_err(io)? == 0 {
                return Err(closed().into());
            }
            let mut words = answer.trim().splitn(3, ' ');
            let (status, answered) = (words.next(), words.next());
            if answered != Some(tag.as_str()) {
                continue;
            }
            return match status {
                Some(guest::CONTROL_OK) => Ok(()),
                _ => Err(Refusal::Said(words.next().unwrap_or_default().to_string())),
            };
        }
    }
}

/// The `gvisor` backend.
#[derive(Debug, Clone)]
pub struct GvisorBackend {
    config: GvisorBackendConfig,
    shared: Arc<Mutex<Option<Shared>>>,
    version: Arc<std::sync::OnceLock<Option<String>>>,
}

impl GvisorBackend {
    /// A backend with these settings.
    pub fn new(config: GvisorBackendConfig) -> Self {
        Self {
            config,
            shared: Arc::default(),
            version: Arc::default(),
        }
    }

    /// `runsc --version`'s first line (asked once, when first needed).
    fn version(&self) -> Option<&str> {
        self.version
            .get_or_init(|| {
                let program = self.config.runsc.as_ref()?;
                let out = std::process::Command::new(program)
                    .arg("--version")
                    .stdin(std::process::Stdio::null())
                    .output()
                    .ok()
                    .filter(|o| o.status.success())?;
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .next()
                    .map(str::to_string)
            })
            .as_deref()
    }

    fn dir(&self) -> PathBuf {
        self.config.runtime_dir.join("gvisor")
    }

    /// Why this backend cannot run here, if it cannot.
    fn unavailable(&self) -> Option<String> {
        if self.config.runsc.is_none() {
            return Some("runsc is not installed (Debian package `runsc`)".into());
        }
        if self.version().is_none() {
            return Some("runsc --version fails".into());
        }
        if !rustix::process::geteuid().is_root() {
            return Some("runsc needs root here".into());
        }
        if !self.config.binary.is_file() {
            return Some(format!(
                "the agent binary {} is missing",
                self.config.binary.display()
            ));
        }
        None
    }

    fn runsc(&self, bundle: Option<&Path>, host_uds: bool) -> Result<Runsc, EngineError> {
        let program = self
            .config
            .runsc
            .clone()
            .ok_or_else(|| EngineError::BackendUnavailable("runsc is not installed".into()))?;
        Ok(Runsc {
            program,
            root: self.dir().join("state"),
            platform: self.config.platform.clone(),
            debug_log: if self.config.debug {
                bundle.map(|b| b.join("debug"))
            } else {
                None
            },
            host_uds,
        })
    }

    /// The root skeleton and the agent binary's folder (made once).
    fn shared(&self) -> Result<Shared, EngineError> {
        let mut slot = self.shared.lock().map_err(|_| {
            EngineError::io(
                "prepare the gvisor backend",
                std::io::Error::other("its state is poisoned"),
            )
        })?;
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let launch_err = |stage: &str, message: String| EngineError::Launch {
            stage: stage.into(),
            message,
        };
        let skeleton = self
            .skeleton(None)
            .map_err(|e| launch_err("root skeleton", e))?;
        let guest_dir = skeleton::binary_dir(&self.dir().join("bin"), &self.config.binary)
            .map_err(|e| launch_err("agent binary", e.to_string()))?;
        install_binary(&self.config.binary, &guest_dir)
            .map_err(|e| launch_err("agent binary", e))?;
        for d in ["state", "bundles"] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(self.dir().join(d))
                .map_err(|e| {
                    EngineError::io(format!("create {}", self.dir().join(d).display()), e)
                })?;
        }
        let shared = Shared {
            root: skeleton.dir.display().to_string(),
            binds: skeleton.binds,
            guest_dir: guest_dir.display().to_string(),
        };
        *slot = Some(shared.clone());
        Ok(shared)
    }

    /// The root skeleton of sandboxes whose system comes from `system_root` (`None`: the
    /// host's), as the process backend makes it: an image brings its own top-level folders
    /// besides the system ones.
    fn skeleton(&self, system_root: Option<&str>) -> Result<skeleton::Skeleton, String> {
        let tmpfs: Vec<&str> = bundle::TMPFS
            .iter()
            .map(|(p, _)| *p)
            .chain([GUEST_DIR, sandcell_protocol::EGRESS_DIR])
            .collect();
        let etc_files = etc_files();
        let system_paths =
            skeleton::system_paths_of(system_root, &self.config.system_paths, &etc_files, &tmpfs);
        skeleton::prepare(
            &self.config.runtime_dir.join("rootfs"),
            &RootLayout {
                system_root: Path::new(system_root.unwrap_or("/")),
                system_paths: &system_paths,
                etc_files: &etc_files,
                tmpfs_paths: &tmpfs,
            },
            // runsc binds each system path itself: nothing mounted in the host's namespace.
            false,
        )
        .map_err(|e| e.to_string())
    }

    /// Sandbox `id`'s egress folder (created) unless its network is `off`: a `loopback`
    /// sandbox has the proxy too (it refuses everything), so that its policy can change
    /// live. The agent's bridge is closed around each checkpoint (see [`guest`]).
    fn egress_folder(&self, id: &str, spec: &SandboxSpec) -> Result<Option<PathBuf>, EngineError> {
        if spec.network == NetworkPolicy::Off {
            return Ok(None);
        }
        sandcell_engine::egress::make_sandbox_dir(&self.config.runtime_dir, id).map(Some)
    }

    fn cgroup_path(&self, id: &str) -> String {
        format!("/{}/{id}", self.config.cgroup_parent.trim_matches('/'))
    }

    /// Writes the bundle of container `container` of sandbox `id` with the agent from
    /// `guest_dir`; returns its folder.
    fn write_bundle(
        &self,
        id: &str,
        container: &str,
        spec: &SandboxSpec,
        guest_dir: &str,
    ) -> Result<PathBuf, String> {
        let shared = self.shared().map_err(|e| e.to_string())?;
        let image_skeleton;
        let (root, system_root, binds) = match spec.system_root.as_deref() {
            Some(system_root) => {
                image_skeleton = self
                    .skeleton(Some(system_root))
                    .map_err(|e| format!("the root skeleton of {system_root}: {e}"))?;
                (
                    image_skeleton.dir.display().to_string(),
                    system_root,
                    &image_skeleton.binds,
                )
            }
            None => (shared.root.clone(), "/", &shared.binds),
        };
        let dir = self.dir().join("bundles").join(container);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let egress = self
            .egress_folder(id, spec)
            .map_err(|e| e.to_string())?
            .map(|d| d.display().to_string());
        let config = bundle::config(
            spec,
            &bundle::BundleInputs {
                root: &root,
                system_root,
                binds,
                guest_dir,
                egress_dir: egress.as_deref(),
                cgroup_path: &self.cgroup_path(container),
                hostname: id,
            },
        );
        std::fs::write(dir.join("config.json"), config.to_string())
            .map_err(|e| format!("write the bundle's config.json: {e}"))?;
        Ok(dir)
    }

    /// Starts (or restores from `image`) container `container` of sandbox `id` with `agent`
    /// as its connection and the agent from `guest_dir`, and waits until it runs (a restored
    /// agent's egress bridge open again, when its image says it has a control channel).
    /// Blocking; on failure nothing is left.
    fn run_container(
        &self,
        id: &str,
        container: &str,
        spec: &SandboxSpec,
        image: Option<&Path>,
        agent: UnixStream,
        guest_dir: &str,
    ) -> Result<Container, String> {
        let bundle = self.write_bundle(id, container, spec, guest_dir)?;
        let runsc = self
            .runsc(Some(&bundle), spec.network != NetworkPolicy::Off)
            .map_err(|e| e.to_string())?;
        let (control, child) =
            UnixStream::pair().map_err(|e| format!("create the control channel: {e}"))?;
        // An agent restored from a checkpoint older than the control channel never reads it
        // (and had no bridge to close).
        let controlled = image.is_none_or(|image| image.join(CONTROL_FILE).is_file());
        // Names are never reused (sandbox ids are random, checkpoints count up): no leftover
        // of that name can be in the way.
        let started = runsc
            .start(
                container,
                &bundle,
                image,
                agent,
                child,
                &bundle.join("console.log"),
            )
            .and_then(|()| runsc.state(container))
            .and_then(|state| {
                let control = controlled.then(|| Arc::new(Control::new(control)));
                // The checkpoint was taken with the bridge closed.
                if let (Some(control), Some(_)) = (&control, image) {
                    control
                        .ask(guest::RESUME_EGRESS)
                        .map_err(|e| format!("open the restored agent's egress bridge: {e}"))?;
                }
                Ok((state, control))
            });
        match started {
            Ok((state, control)) => Ok(Container {
                name: container.to_string(),
                guest_dir: guest_dir.to_string(),
                cgroup: open_cgroup(&self.cgroup_path(container)),
                cgroup_path: self.cgroup_path(container),
                bundle,
                pid: state.pid,
                control,
            }),
            Err(e) => {
                let _ = runsc.delete(container);
                let _ = std::fs::remove_dir_all(&bundle);
                Err(e)
            }
        }
    }

    /// Starts (or restores from `image`) sandbox `id` and connects to its agent.
    async fn start(
        &self,
        id: &str,
        spec: &SandboxSpec,
        image: Option<&Path>,
    ) -> Result<LaunchedSandbox, EngineError> {
        if let Some(m) = spec.mounts.iter().find(|m| m.mode == MountMode::Overlay) {
            return Err(EngineError::InvalidSpec(format!(
                "the overlay mount at '{}' is the process backend's (gvisor mounts folders ro or rw)",
                m.target
            )));
        }
        if let Some(why) = self.unavailable() {
            return Err(EngineError::BackendUnavailable(format!(
                "the gvisor backend cannot run here: {why}"
            )));
        }
        let shared = self.shared()?;
        let (host, child) =
            UnixStream::pair().map_err(|e| EngineError::io("create the agent socketpair", e))?;
        let stage = if image.is_some() {
            "runsc restore"
        } else {
            "runsc run"
        };
        // A checkpoint goes on with the agent binary it was made with.
        let guest_dir = match image {
            Some(image) => checkpoint_agent_dir(image, &shared.guest_dir).map_err(|message| {
                EngineError::Launch {
                    stage: stage.into(),
                    message,
                }
            })?,
            None => shared.guest_dir.clone(),
        };
        let started = {
            let (backend, id, spec) = (self.clone(), id.to_string(), spec.clone());
            let image = image.map(Path::to_path_buf);
            tokio::task::spawn_blocking(move || {
                backend.run_container(
                    &id,
                    &container_name(&id, 0),
                    &spec,
                    image.as_deref(),
                    child,
                    &guest_dir,
                )
            })
            .await
            .map_err(|e| EngineError::io(stage, std::io::Error::other(e)))?
        };
        let container = started.map_err(|message| EngineError::Launch {
            stage: stage.into(),
            message,
        })?;
        let instance = GvisorState {
            backend: self.clone(),
            runsc: self.runsc(None, false)?,
            id: id.to_string(),
            spec: spec.clone(),
            current: Mutex::new(container),
            restores: AtomicU32::new(0),
            paused_by_runsc: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
        };
        host.set_nonblocking(true)
            .map_err(|e| EngineError::io("use the agent socket", e))?;
        let stream = tokio::net::UnixStream::from_std(host)
            .map_err(|e| EngineError::io("use the agent socket", e))?;
        Ok(LaunchedSandbox {
            stream: Box::new(stream),
            instance: Box::new(GvisorInstance(Arc::new(instance))),
            isolation: self.isolation(spec),
        })
    }

    /// The isolation a sandbox of `spec` gets outside the agent.
    fn isolation(&self, spec: &SandboxSpec) -> IsolationReport {
        let mut r = IsolationReport::default();
        r.set(
            "gvisor",
            FeatureState::Active,
            format!(
                "{} ({} platform): the sandbox's syscalls are served by gVisor's kernel, not the host's",
                self.version().unwrap_or("runsc"),
                self.config.platform
            ),
        );
        let network = match spec.network {
            NetworkPolicy::Off => NetworkMode::Off,
            _ => NetworkMode::Loopback,
        };
        r.set(
            "network",
            FeatureState::Active,
            match network {
                NetworkMode::Loopback => {
                    "loopback only (runsc --network=none); egress only through the host's proxy"
                }
                NetworkMode::Off => {
                    "none (runsc --network=none; seccomp refuses all but Unix sockets)"
                }
            },
        );
        // The agent installs both before it serves and exits if it cannot: a sandbox that
        // answers the handshake has them (see guest).
        let filter = seccomp::feature_of(network, seccomp::Profile::Gvisor);
        r.set(&filter.name, filter.state, filter.detail);
        r.set(
            "no_new_privs",
            FeatureState::Active,
            "set for the agent and everything it starts",
        );
        let limits = &spec.limits;
        r.set(
            "cgroup_limits",
            FeatureState::Active,
            format!(
                "memory {} + {} MiB for gVisor's kernel, pids {} + {} for its threads, on the \
                 host cgroup of the whole sandbox",
                limits
                    .memory_bytes
                    .map_or("unlimited".into(), |m| format!("{} MiB", m >> 20)),
                MEMORY_OVERHEAD >> 20,
                limits.pids.map_or("unlimited".into(), |p| p.to_string()),
                PIDS_OVERHEAD
            ),
        );
        r
    }

    /// What this backend cannot do that the `process` backend can (for `GET /v1/system`).
    fn limitations() -> Vec<Feature> {
        let line = |name: &str, detail: &str| Feature {
            name: name.into(),
            state: FeatureState::Unavailable,
            detail: detail.into(),
        };
        vec![
            line(
                "survive_service_restart",
                "a sandbox ends when the service that started it stops (its agent's \
                 connection is the container's stdin); after a restart it is recorded lost",
            ),
            line(
                "oom_per_process",
                "memory is limited for the whole sandbox: going over ends the sandbox (the \
                 host kills gVisor's kernel), not one process",
            ),
            line(
                "exact_pids_limit",
                "the pids limit counts host tasks, gVisor's own threads included (the spec's \
                 limit + 256)",
            ),
            line(
                "terminal_control_characters",
                "this runsc's terminals ignore control characters typed into them: ^C (VINTR) \
                 sends no SIGINT and ^D (VEOF) ends no read, so closing a terminal's stdin \
                 does not end a program reading it (cat); interrupt with a signal instead. \
                 Everything else on terminals works (echo, size, resize, output)",
            ),
            line(
                "statx_no_automount",
                "this runsc refuses statx/fstatat with AT_NO_AUTOMOUNT: dynamically linked \
                 programs get a preloaded library that drops the flag (/etc/ld.so.preload); \
                 static binaries that pass it get EINVAL",
            ),
        ]
    }
}

/// The preload library that drops `AT_NO_AUTOMOUNT` from `statx`/`fstatat` (this runsc
/// refuses it; see shim/gvisor_compat.c), built by build.rs.
const COMPAT_LIBRARY: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/libsandcell-gvisor-compat.so"));

/// Its file name in [`GUEST_DIR`].
const COMPAT_NAME: &str = "libsandcell-gvisor-compat.so";

/// The skeleton's `/etc` for gVisor: the process backend's, plus the preload.
fn etc_files() -> Vec<(String, String)> {
    let mut files = skeleton::sandbox_etc_files(HOSTNAME);
    files.push((
        "ld.so.preload".into(),
        format!("{GUEST_DIR}/{COMPAT_NAME}\n"),
    ));
    files
}

/// Writes `bytes` to `path` (mode 0755) unless it holds them already; written beside and
/// renamed, so that running sandboxes keep the file they started with.
fn install_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    if std::fs::read(path).is_ok_and(|have| have == bytes) {
        return Ok(());
    }
    let tmp = path.with_extension(unique_suffix());
    std::fs::write(&tmp, bytes).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("install {}: {e}", path.display()))
}

/// Copies the agent binary to `dir/sandcell` (readable and executable by the sandbox user)
/// unless an identical-looking copy is there, and the preload library beside it.
fn install_binary(binary: &Path, dir: &Path) -> Result<(), String> {
    skeleton::install_binary(binary, dir).map_err(|e| e.to_string())?;
    install_file(&dir.join(COMPAT_NAME), COMPAT_LIBRARY)
}

/// A name part no other writer (process, or backend in this process) uses at once.
fn unique_suffix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "tmp{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The cgroup runsc made for a sandbox at `path` (under each v1 hierarchy, or v2), if found.
fn open_cgroup(path: &str) -> Option<SandboxCgroup> {
    let root = Path::new("/sys/fs/cgroup");
    let rel = path.trim_start_matches('/');
    let support = sandcell_jail::cgroup::detect(root);
    let paths: Vec<PathBuf> = match support.version? {
        CgroupVersion::V2 => vec![root.join(rel)],
        CgroupVersion::V1 => std::fs::read_dir(root)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path().join(rel))
            .filter(|p| p.join("tasks").is_file())
            .collect(),
    };
    SandboxCgroup::open(&paths).ok()
}

#[async_trait]
impl Backend for GvisorBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Gvisor
    }

    fn capabilities(&self) -> BackendCapabilities {
        let why = self.unavailable();
        let mut host = IsolationReport::default();
        match &why {
            None => host.set(
                "runsc",
                FeatureState::Active,
                format!(
                    "{} ({} platform)",
                    self.version().unwrap_or("runsc"),
                    self.config.platform
                ),
            ),
            Some(why) => host.set("runsc", FeatureState::Unavailable, why.clone()),
        }
        host.features.extend(Self::limitations());
        BackendCapabilities {
            kind: BackendKind::Gvisor,
            available: why.is_none(),
            isolation_level: IsolationLevel::UserSpaceKernel,
            supports_pause: true,
            checkpoint_fidelity: Fidelity::Process,
            host,
            features: self.features(),
        }
    }

    fn features(&self) -> BackendFeatures {
        BackendFeatures {
            // Its containers outlive the service, but nothing finds them again yet.
            reattach: false,
            checkpoint: CheckpointSupport::Always,
            // `runsc checkpoint` stops the container; the sandbox goes on in a new one.
            checkpoint_rehomes: true,
            capture_files: false,
            limits: true,
        }
    }

    fn egress_dir(&self, id: &str, spec: &SandboxSpec) -> Result<Option<PathBuf>, EngineError> {
        self.egress_folder(id, spec)
    }

    async fn launch(&self, id: &str, spec: &SandboxSpec) -> Result<LaunchedSandbox, EngineError> {
        self.start(id, spec, None).await
    }

    async fn restore(
        &self,
        id: &str,
        spec: &SandboxSpec,
        image: &Path,
    ) -> Result<LaunchedSandbox, EngineError> {
        self.start(id, spec, Some(image)).await
    }

    fn unavailable(&self) -> Option<String> {
        GvisorBackend::unavailable(self)
            .map(|why| format!("the gvisor backend cannot run here: {why}"))
    }

    fn kill_orphan(&self, runtime: &serde_json::Value) -> String {
        let Some(id) = runtime.get("container").and_then(|v| v.as_str()) else {
            return "no container recorded".into();
        };
        let Ok(runsc) = self.runsc(None, false) else {
            return "runsc is not installed".into();
        };
        let found = runsc.state(id).map(|s| s.status);
        let _ = runsc.delete(id);
        if let Some(bundle) = runtime.get("bundle").and_then(|v| v.as_str()) {
            let _ = std::fs::remove_dir_all(bundle);
        }
        match found {
            Ok(status) => format!("its gVisor container was {status}; deleted"),
            Err(_) => "its gVisor container was gone".into(),
        }
    }
}

/// runsc's name for the container of sandbox `id` after its `n`-th checkpoint: `<id>.<n>.`.
/// runsc finds containers by prefix and refuses an ambiguous one, so no name may be the
/// prefix of another (the closing dot sees to it: `.1.` is no prefix of `.10.`).
fn container_name(id: &str, n: u32) -> String {
    format!("{id}.{n}.")
}

/// One gVisor container: a sandbox runs in one at a time (a checkpoint moves it to the next).
struct Container {
    /// runsc's name for it (see [`container_name`]).
    name: String,
    /// The agent folder bound at [`GUEST_DIR`].
    guest_dir: String,
    bundle: PathBuf,
    cgroup_path: String,
    cgroup: Option<SandboxCgroup>,
    /// The sandbox process on the host (gVisor's kernel).
    pid: i32,
    /// Its agent's control channel (`None`: an agent restored from a checkpoint made before
    /// there was one).
    control: Option<Arc<Control>>,
}

/// How long a freeze may take before `runsc pause` is used instead.
const FREEZE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(100);

/// One running gVisor sandbox, shared with the blocking tasks that run `runsc` for it.
struct GvisorInstance(Arc<GvisorState>);

/// What a running gVisor sandbox is.
struct GvisorState {
    backend: GvisorBackend,
    runsc: Runsc,
    id: String,
    spec: SandboxSpec,
    current: Mutex<Container>,
    /// Checkpoints taken so far (each moves the sandbox to a new container).
    restores: AtomicU32,
    /// Paused by `runsc pause` (not the freezer).
    paused_by_runsc: AtomicBool,
    destroyed: AtomicBool,
}

impl GvisorState {
    fn with_current<T>(&self, f: impl FnOnce(&Container) -> T) -> Option<T> {
        self.current.lock().ok().map(|c| f(&c))
    }

    fn with_cgroup<T>(&self, f: impl FnOnce(&SandboxCgroup) -> T) -> Option<T> {
        self.with_current(|c| c.cgroup.as_ref().map(f)).flatten()
    }

    fn name(&self) -> String {
        self.with_current(|c| c.name.clone())
            .unwrap_or_else(|| self.id.clone())
    }

    fn failed(op: &str, e: String) -> EngineError {
        EngineError::io(op, std::io::Error::other(e))
    }

    /// Deletes the current container and its bundle (blocking).
    fn end(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
        if let Some((name, bundle)) = self.with_current(|c| (c.name.clone(), c.bundle.clone())) {
            let _ = self.runsc.delete(&name);
            let _ = std::fs::remove_dir_all(bundle);
        }
    }
}

impl Drop for GvisorState {
    fn drop(&mut self) {
        // Synchronously (a few tens of ms): a thread could be cut short by the process
        // exiting, leaving the container behind.
        if !self.destroyed.load(Ordering::SeqCst) {
            self.end();
        }
    }
}

impl GvisorState {
    fn counters(&self) -> ResourceCounters {
        self.with_cgroup(|cg| {
            let c = cg.limit_counters();
            ResourceCounters {
                oom_kills: Some(c.oom_kills),
                pids_limit_hits: Some(c.pids_limit_hits),
                memory_bytes: c.memory_bytes,
                ..ResourceCounters::default()
            }
        })
        .unwrap_or_default()
    }

    fn usage(&self) -> ResourceCounters {
        self.with_cgroup(|cg| {
            let c = cg.counters();
            ResourceCounters {
                oom_kills: Some(c.oom_kills),
                pids_limit_hits: Some(c.pids_limit_hits),
                memory_bytes: c.memory_bytes,
                memory_peak_bytes: c.memory_peak_bytes,
                cpu_usage_us: c.cpu_usage_us,
                pids_current: c.pids_current,
            }
        })
        .unwrap_or_default()
    }

    fn host_pid(&self) -> Option<i32> {
        self.with_current(|c| c.pid).filter(|p| *p > 0)
    }

    async fn destroy(&self) -> Result<(), EngineError> {
        self.destroyed.store(true, Ordering::SeqCst);
        let runsc = self.runsc.clone();
        let Some((name, bundle)) = self.with_current(|c| (c.name.clone(), c.bundle.clone())) else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || {
            let r = runsc.delete(&name);
            let _ = std::fs::remove_dir_all(&bundle);
            r
        })
        .await
        .map_err(|e| EngineError::io("runsc delete", std::io::Error::other(e)))?
        .map_err(|e| Self::failed("runsc delete", e))
    }

    fn kill(&self) {
        if self.destroyed.swap(true, Ordering::SeqCst) {
            return;
        }
        // The sandbox's processes go at once (its kernel is one host process); runsc's
        // record of it is deleted on a thread.
        if let Some(pid) = self.host_pid().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let runsc = self.runsc.clone();
        if let Some((name, bundle)) = self.with_current(|c| (c.name.clone(), c.bundle.clone())) {
            std::thread::spawn(move || {
                let _ = runsc.delete(&name);
                let _ = std::fs::remove_dir_all(&bundle);
            });
        }
    }

    fn runtime(&self) -> serde_json::Value {
        self.with_current(|c| {
            serde_json::json!({
                "container": c.name,
                "bundle": c.bundle,
                "cgroup": c.cgroup_path,
            })
        })
        .unwrap_or(serde_json::Value::Null)
    }

    /// The freezer of the sandbox's cgroup (as on `process`, ~1 ms); `runsc pause` (~25 ms)
    /// where there is none or it does not settle quickly (a task of gVisor's kernel caught
    /// in a ptrace stop can hold a v1 freeze up).
    fn pause_now(&self) -> Result<(), EngineError> {
        if let Some(Ok(())) = self.with_cgroup(|cg| cg.pause(FREEZE_TIMEOUT)) {
            return Ok(());
        }
        self.runsc
            .run(&["pause", &self.name()])
            .map_err(|e| Self::failed("runsc pause", e))?;
        self.paused_by_runsc.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn resume_now(&self) -> Result<(), EngineError> {
        if self.paused_by_runsc.swap(false, Ordering::SeqCst) {
            return self
                .runsc
                .run(&["resume", &self.name()])
                .map(|_| ())
                .map_err(|e| Self::failed("runsc resume", e));
        }
        self.with_cgroup(SandboxCgroup::resume);
        Ok(())
    }

    fn frozen(&self) -> Option<bool> {
        if self.paused_by_runsc.load(Ordering::SeqCst) {
            return Some(true);
        }
        self.with_cgroup(SandboxCgroup::paused).flatten()
    }

    /// `runsc checkpoint` stops the container; the sandbox goes on in a new container
    /// restored from the same image with a new connection (`--leave-running` would restore
    /// it with runsc's own stdio and then wait for it to end). The old container is deleted
    /// on a thread: that takes runsc about 2 s.
    fn checkpoint_now(&self, image: &Path) -> Result<Option<UnixStream>, EngineError> {
        // runsc cannot checkpoint a paused container (it crashes): let it run for this.
        let was_frozen = self.frozen() == Some(true);
        if was_frozen {
            self.resume_now()?;
        }
        let old = self.name();
        let (guest_dir, control) = self
            .with_current(|c| (c.guest_dir.clone(), c.control.clone()))
            .ok_or_else(|| {
                Self::failed("runsc checkpoint", "the sandbox's state is lost".into())
            })?;
        // This runsc cannot save the egress bridge open (a TCP socket an epoll instance
        // watches, a connection to the host's proxy socket), and a failed save ends the
        // sandbox: the agent closes it first, and every restore of the image (told so by
        // the image) opens it again.
        let closed = control.as_ref().map(|control| {
            std::fs::write(image.join(CONTROL_FILE), "1\n")
                .map_err(|e| format!("mark the checkpoint's control channel: {e}"))
                .and_then(|()| control.ask(guest::SUSPEND_EGRESS))
        });
        if let (Some(control), Some(Err(e))) = (&control, closed) {
            // Nothing was checkpointed: the sandbox goes on as it was.
            let _ = control.ask(guest::RESUME_EGRESS);
            if was_frozen {
                let _ = self.pause_now();
            }
            return Err(Self::failed(
                "close the agent's egress bridge for the checkpoint",
                e,
            ));
        }
        // A save this runsc would fail ends the sandbox: refused instead, the sandbox going
        // on as it was. An agent from before the question does not know it.
        if let Some(control) = &control
            && let Err(Refusal::Said(why)) = control.request(guest::CHECKPOINT_BLOCKERS)
            && !why.starts_with("unknown command")
        {
            let _ = control.ask(guest::RESUME_EGRESS);
            if was_frozen {
                let _ = self.pause_now();
            }
            return Err(EngineError::Unsupported(format!(
                "a process snapshot of this gVisor sandbox would end it: {why}"
            )));
        }
        let image_arg = image.display().to_string();
        if let Err(e) = self
            .runsc
            .run(&["checkpoint", "--image-path", &image_arg, &old])
        {
            // Should the sandbox have outlived it, its egress works again.
            if let Some(control) = &control {
                let _ = control.ask(guest::RESUME_EGRESS);
            }
            return Err(Self::failed("runsc checkpoint", e));
        }
        // Restores of this image need the same agent binary (see skeleton::binary_dir). Unwritten, they
        // take the current one, as before checkpoints named theirs.
        let _ = std::fs::write(image.join(AGENT_DIR_FILE), &guest_dir);
        let (host, child) =
            UnixStream::pair().map_err(|e| EngineError::io("create the agent socketpair", e))?;
        let n = self.restores.fetch_add(1, Ordering::SeqCst) + 1;
        let next = container_name(&self.id, n);
        let restored =
            self.backend
                .run_container(&self.id, &next, &self.spec, Some(image), child, &guest_dir);
        let old_bundle = self.with_current(|c| c.bundle.clone());
        let runsc = self.runsc.clone();
        std::thread::spawn(move || {
            let _ = runsc.delete(&old);
            if let Some(b) = old_bundle {
                let _ = std::fs::remove_dir_all(b);
            }
        });
        match restored {
            Ok(container) => {
                if let Ok(mut current) = self.current.lock() {
                    *current = container;
                }
                Ok(Some(host))
            }
            Err(e) => {
                self.destroyed.store(true, Ordering::SeqCst);
                Err(EngineError::Launch {
                    stage: "runsc restore (after its checkpoint)".into(),
                    message: e,
                })
            }
        }
    }
}

/// Runs `f` on the sandbox's state on a blocking thread (`runsc` and the freezer wait).
async fn blocking<T: Send + 'static>(
    state: &Arc<GvisorState>,
    what: &'static str,
    f: impl FnOnce(&GvisorState) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, EngineError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || f(&state))
        .await
        .map_err(|e| EngineError::io(what, std::io::Error::other(e)))?
}

#[async_trait]
impl BackendInstance for GvisorInstance {
    fn counters(&self) -> ResourceCounters {
        self.0.counters()
    }

    fn usage(&self) -> ResourceCounters {
        self.0.usage()
    }

    fn host_pid(&self) -> Option<i32> {
        self.0.host_pid()
    }

    async fn destroy(&self) -> Result<(), EngineError> {
        self.0.destroy().await
    }

    fn kill(&self) {
        self.0.kill();
    }

    fn runtime(&self) -> serde_json::Value {
        self.0.runtime()
    }

    async fn pause(&self) -> Result<(), EngineError> {
        blocking(&self.0, "pause the sandbox", GvisorState::pause_now).await
    }

    async fn resume(&self) -> Result<(), EngineError> {
        blocking(&self.0, "resume the sandbox", GvisorState::resume_now).await
    }

    fn frozen(&self) -> Option<bool> {
        self.0.frozen()
    }

    fn checkpoints(&self) -> bool {
        true
    }

    async fn checkpoint(&self, image: &Path) -> Result<Option<GuestStream>, EngineError> {
        let image = image.to_path_buf();
        let rehomed = blocking(&self.0, "checkpoint the sandbox", move |s| {
            s.checkpoint_now(&image)
        })
        .await?;
        let Some(stream) = rehomed else {
            return Ok(None);
        };
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(stream))
            .map_err(|e| EngineError::io("use the restored agent's connection", e))?;
        Ok(Some(Box::new(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_finds_the_agent_it_was_made_with() {
        let tmp = tempfile::tempdir().unwrap();
        let (image, agent) = (tmp.path().join("image"), tmp.path().join("bin-a"));
        std::fs::create_dir_all(&image).unwrap();
        // A checkpoint that names none (made before they did): the current agent.
        assert_eq!(checkpoint_agent_dir(&image, "/cur").unwrap(), "/cur");
        std::fs::write(image.join(AGENT_DIR_FILE), agent.display().to_string()).unwrap();
        let err = checkpoint_agent_dir(&image, "/cur").unwrap_err();
        assert!(err.contains("no longer installed"), "{err}");
        std::fs::create_dir_all(&agent).unwrap();
        std::fs::write(agent.join("sandcell"), b"x").unwrap();
        assert_eq!(
            checkpoint_agent_dir(&image, "/cur").unwrap(),
            agent.display().to_string()
        );
        // Two builds of the binary get two folders.
        let bin = tmp.path().join("sandcell");
        std::fs::write(&bin, b"one").unwrap();
        let first = skeleton::binary_dir(tmp.path(), &bin).unwrap();
        std::fs::remove_file(&bin).unwrap();
        std::fs::write(&bin, b"other").unwrap();
        assert_ne!(first, skeleton::binary_dir(tmp.path(), &bin).unwrap());
    }

    #[test]
    fn the_control_channel_asks_and_says_what_the_agent_answered() {
        let (host, agent) = UnixStream::pair().unwrap();
        let served = std::thread::spawn(move || guest::serve_control(agent));
        let control = Control::new(host);
        // No bridge in this process: closing and opening it is done at once.
        control.ask(guest::SUSPEND_EGRESS).unwrap();
        control.ask(guest::RESUME_EGRESS).unwrap();
        let err = control.ask("reboot").unwrap_err();
        assert!(err.contains("unknown command"), "{err}");
        // An answer with an earlier command's tag (as a late one would come) is skipped: a
        // line the agent refuses under tag 1 comes before the next command's answer.
        {
            let mut stream = control.stream.lock().unwrap();
            let late = format!("{} 1\n", guest::CONTROL_ERROR);
            std::io::Write::write_all(stream.get_mut(), late.as_bytes()).unwrap();
        }
        // The channel goes on after refusals; its end is said.
        control.ask(guest::SUSPEND_EGRESS).unwrap();
        drop(control);
        served.join().unwrap();
        let (host, agent) = UnixStream::pair().unwrap();
        drop(agent);
        let err = Control::new(host).ask(guest::SUSPEND_EGRESS).unwrap_err();
        assert!(err.contains("closed"), "{err}");
    }

    #[test]
    fn no_container_name_is_the_prefix_of_another() {
        let names: Vec<String> = (0..200)
            .flat_map(|n| [container_name("sb-aaaa", n), container_name("sb-aaaab", n)])
            .collect();
        for a in &names {
            for b in &names {
                assert!(
                    a == b || !b.starts_with(a.as_str()),
                    "{a} is a prefix of {b}"
                );
            }
        }
    }
}
