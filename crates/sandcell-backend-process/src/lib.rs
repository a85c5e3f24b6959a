//! The `process` backend: the guest agent inside Linux namespaces, a read-only root built
//! from the host's system directories, seccomp, Landlock, dropped capabilities and cgroups.
//!
//! The host never forks itself: it spawns `sandcell __jail` (a single-threaded re-exec of
//! the Sandcell binary), hands it the [`JailConfig`] over a socketpair, and after the
//! launcher's `Launched` report the same socket carries the guest protocol.

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

mod criu;
mod files_snapshot;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
use sandcell_engine::backend::{CheckpointSupport, Fidelity, GuestStream, IsolationLevel};
use sandcell_engine::{
    Backend, BackendCapabilities, BackendFeatures, BackendInstance, BackendKind, EngineError,
    LaunchedSandbox, MountMode, NetworkPolicy, ResourceCounters, SandboxSpec,
};
use sandcell_jail::cgroup::{CgroupVersion, SandboxCgroup};
use sandcell_jail::config::{HostMount, HostMountMode, SparesConfig};
use sandcell_jail::rootfs::skeleton::{self, RootLayout};
use sandcell_jail::{JailConfig, JailError, Limits, NetworkMode, TmpfsMount};
use sandcell_protocol::{
    Feature, FeatureState, Frame, FrameDecoder, GuestMessage, HEADER_LEN, encode_message,
};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

pub use sandcell_jail::rootfs::skeleton::DEFAULT_SYSTEM_PATHS;

/// How long the launcher may take to report.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a pause may wait for the sandbox's last task to stop (typically well under
/// 1 ms; a task in uninterruptible sleep can hold it up).
const PAUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Settings of the process backend.
#[derive(Debug, Clone)]
pub struct ProcessBackendConfig {
    /// The Sandcell binary, re-executed as `sandcell __jail`.
    pub launcher: PathBuf,
    /// Parent cgroup (relative to each hierarchy's root) for sandbox cgroups.
    pub cgroup_parent: String,
    /// Host paths bound read-only into the sandbox.
    pub system_paths: Vec<String>,
    /// Apply Landlock where the kernel has it.
    pub landlock: bool,
    /// Where host-side state shared by sandboxes lives (root skeletons); see
    /// [`default_runtime_dir`].
    pub runtime_dir: PathBuf,
    /// Let the launcher and agent write diagnostics to this process's stderr.
    pub debug: bool,
    /// Give each agent a listening socket under `<runtime_dir>/agents`, so that sandboxes
    /// outlive this process and a later one can [`Backend::reattach`] to them (the daemon);
    /// off, a sandbox ends when its host connection does (one-shot runs).
    pub agent_sockets: bool,
    /// Give `loopback` sandboxes an egress proxy too (refusing everything until their policy
    /// is changed live): for services, where a policy can change; a one-shot run, whose
    /// policy cannot, saves its start-up cost (a folder, a bind, the agent's bridge).
    pub loopback_egress: bool,
}

/// `$SANDCELL_RUNTIME_DIR`, else `/run/sandcell` as root, else `$XDG_RUNTIME_DIR/sandcell`,
/// else `/tmp/sandcell-<uid>`. Sandboxes read from it (their root skeleton), so as root it
/// must be reachable by unprivileged ids.
pub fn default_runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SANDCELL_RUNTIME_DIR") {
        return PathBuf::from(dir);
    }
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        return PathBuf::from("/run/sandcell");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("sandcell"),
        _ => PathBuf::from(format!("/tmp/sandcell-{}", uid.as_raw())),
    }
}

/// Serves the guest agent on the socket in a freshly confined sandbox; returns its exit code.
pub type GuestEntry = fn(std::os::unix::net::UnixStream, sandcell_protocol::IsolationReport) -> i32;

impl ProcessBackendConfig {
    /// Defaults, with `launcher` as the Sandcell binary.
    pub fn new(launcher: impl Into<PathBuf>) -> Self {
        Self {
            launcher: launcher.into(),
            cgroup_parent: std::env::var("SANDCELL_CGROUP_PARENT")
                .unwrap_or_else(|_| "sandcell".into()),
            system_paths: DEFAULT_SYSTEM_PATHS.iter().map(|s| s.to_string()).collect(),
            landlock: true,
            runtime_dir: default_runtime_dir(),
            debug: std::env::var_os("SANDCELL_DEBUG").is_some(),
            agent_sockets: false,
            loopback_egress: false,
        }
    }
}

/// The `process` backend.
#[derive(Debug, Clone)]
pub struct ProcessBackend {
    config: ProcessBackendConfig,
    preforked: Arc<Mutex<Option<Preforked>>>,
    /// A working CRIU, looked for on first need.
    criu: Arc<std::sync::OnceLock<Result<criu::Criu, String>>>,
}

/// A launcher forked ahead of time for one sandbox, already building it.
#[derive(Debug)]
struct Preforked {
    pid: i32,
    socket: std::os::unix::net::UnixStream,
    id: String,
    spec: SandboxSpec,
}

impl ProcessBackend {
    /// A backend with these settings.
    pub fn new(config: ProcessBackendConfig) -> Self {
        Self {
            config,
            preforked: Arc::default(),
            criu: Arc::default(),
        }
    }

    /// Forks the launcher of sandbox `id` now, instead of executing `sandcell __jail` when
    /// the engine creates it: it starts building the sandbox at once, from a config it holds
    /// in memory (about 1.5 ms faster in all). For one-shot programs such as `sandcell run`:
    /// this process must still be single-threaded and must not have built an async runtime yet
    /// (a forked copy of its signal state would be dead). `entry` serves the guest agent in the
    /// sandbox. Used when the engine creates a sandbox with the same id and spec; on failure
    /// nothing changes and creation executes the launcher as usual.
    pub fn prefork(
        &self,
        entry: GuestEntry,
        id: &str,
        spec: &SandboxSpec,
    ) -> Result<(), EngineError> {
        let (host, child) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| EngineError::io("create the sandbox socketpair", e))?;
        let config = self.jail_config(id, spec)?;
        let pid = sandcell_jail::launch::fork_launcher(OwnedFd::from(child), Some(config), entry)
            .map_err(|e| EngineError::io("fork the launcher", std::io::Error::other(e)))?;
        if let Ok(mut slot) = self.preforked.lock() {
            *slot = Some(Preforked {
                pid,
                socket: host,
                id: id.to_string(),
                spec: spec.clone(),
            });
        }
        Ok(())
    }

    /// Checks what sandboxes share on this host, for `sandcell doctor`: the root skeleton
    /// (and remounts whatever of it is missing) and the pools of spare network namespaces
    /// and cgroups.
    pub fn check_runtime(&self) -> Vec<Feature> {
        let root = rustix::process::geteuid().is_root();
        let cache = self.config.runtime_dir.join("rootfs");
        let tmpfs = [
            "/workspace",
            "/home/sandbox",
            "/tmp",
            sandcell_protocol::EGRESS_DIR,
        ];
        let layout = RootLayout {
            system_root: Path::new("/"),
            system_paths: &self.config.system_paths,
            etc_files: &skeleton::sandbox_etc_files(HOSTNAME),
            tmpfs_paths: &tmpfs,
        };
        let feature = |name: &str, state, detail: String| Feature {
            name: name.into(),
            state,
            detail,
        };
        let skeleton = match skeleton::prepare(&cache, &layout, root) {
            Err(e) => feature("root_skeleton", FeatureState::Unavailable, e.to_string()),
            Ok(s) if !s.mounted => feature(
                "root_skeleton",
                FeatureState::Active,
                format!(
                    "{} (not root: each sandbox binds the system directories itself)",
                    s.dir.display()
                ),
            ),
            Ok(s) => {
                let missing = skeleton::missing_mounts(&s);
                if missing.is_empty() {
                    feature(
                        "root_skeleton",
                        FeatureState::Active,
                        format!(
                            "{} with its {} binds mounted",
                            s.dir.display(),
                            s.binds.len()
                        ),
                    )
                } else {
                    let list: Vec<String> =
                        missing.iter().map(|p| p.display().to_string()).collect();
                    let repaired = skeleton::repair(&cache, &s).map_or_else(
                        |e| format!("remounting failed: {e}"),
                        |()| "remounted".to_string(),
                    );
                    feature(
                        "root_skeleton",
                        FeatureState::Degraded,
                        format!(
                            "{}: {} were not mounted; {repaired}",
                            s.dir.display(),
                            list.join(", ")
                        ),
                    )
                }
            }
        };
        let spares = if root {
            let pools = SparesConfig {
                dir: self.config.runtime_dir.display().to_string(),
                count: SPARES,
            };
            let netns = sandcell_jail::netns_pool::NetnsPool::new(pools.netns_dir()).spares();
            let cgroups = sandcell_jail::cgroup::spares::CgroupSpares::new(
                pools.cgroups_dir(&self.config.cgroup_parent),
            )
            .spares();
            feature(
                "spares",
                FeatureState::Active,
                format!(
                    "{netns} network namespaces and {cgroups} cgroups ready in {} (each launcher tops them up to {SPARES})",
                    pools.dir
                ),
            )
        } else {
            feature(
                "spares",
                FeatureState::Disabled,
                "not root: each sandbox makes its own network namespace and cgroup".into(),
            )
        };
        vec![skeleton, spares, self.criu_feature()]
    }

    /// The jail's limits for `spec`.
    fn jail_limits(&self, spec: &SandboxSpec) -> Limits {
        let l = &spec.limits;
        Limits {
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            cpu_millis: l.cpus.map(|c| (c * 1000.0).round() as u64),
            nofile: l.open_files,
            fsize_bytes: None,
        }
    }

    /// The CRIU checkpointable sandboxes need, or why there is none.
    fn criu(&self) -> Result<&criu::Criu, EngineError> {
        self.criu
            .get_or_init(criu::Criu::find)
            .as_ref()
            .map_err(|why| {
                EngineError::InvalidRequest(format!(
                    "a checkpointable sandbox needs a working criu: {why}"
                ))
            })
    }

    /// The launcher configuration for one sandbox (its root skeleton is built on first use).
    pub fn jail_config(&self, id: &str, spec: &SandboxSpec) -> Result<JailConfig, EngineError> {
        let l = &spec.limits;
        let (outside_uid, outside_gid) = outside_ids();
        let tmpfs = vec![
            TmpfsMount {
                path: "/workspace".into(),
                size_bytes: l.disk_bytes,
                mode: 0o755,
            },
            TmpfsMount {
                path: "/home/sandbox".into(),
                size_bytes: l.home_bytes,
                mode: 0o755,
            },
            TmpfsMount {
                path: "/tmp".into(),
                size_bytes: l.tmp_bytes,
                mode: 0o1777,
            },
        ];
        let mut tmpfs_paths: Vec<&str> = tmpfs.iter().map(|t| t.path.as_str()).collect();
        // Every skeleton has the egress folder's mount point: one skeleton for every policy.
        tmpfs_paths.push(sandcell_protocol::EGRESS_DIR);
        // A checkpointable sandbox runs its agent from a binary it can see, and has a root
        // without submounts on the host (CRIU binds it as the restored root).
        let guest_dir = if spec.checkpointable {
            self.criu()?;
            tmpfs_paths.push(criu::GUEST_MOUNT);
            Some(criu::guest_dir(
                &self.config.launcher,
                &self.config.runtime_dir,
            )?)
        } else {
            None
        };
        let system_root = spec
            .system_root
            .as_deref()
            .map_or(Path::new("/"), Path::new);
        let etc_files = skeleton::sandbox_etc_files(HOSTNAME);
        // An image brings its own folders (a build's `/app`, `/opt`, …) besides the system.
        let system_paths = skeleton::system_paths_of(
            spec.system_root.as_deref(),
            &self.config.system_paths,
            &etc_files,
            &tmpfs_paths,
        );
        let skeleton = skeleton::prepare(
            &self.config.runtime_dir.join("rootfs"),
            &RootLayout {
                system_root,
                system_paths: &system_paths,
                etc_files: &etc_files,
                tmpfs_paths: &tmpfs_paths,
            },
            // Only root can mount in the host's mount namespace.
            rustix::process::geteuid().is_root() && !spec.checkpointable,
        )
        .map_err(|e| EngineError::Launch {
            stage: "root skeleton".into(),
            message: e.to_string(),
        })?;
        Ok(JailConfig {
            sandbox_id: id.to_string(),
            // Each sandbox is its own host: its id (a restored or forked one gets a new one).
            hostname: id.to_string(),
            root_skeleton: skeleton.dir.display().to_string(),
            root_premounted: skeleton.mounted,
            ro_binds: if skeleton.mounted {
                Vec::new()
            } else {
                skeleton.binds
            },
            system_root: spec.system_root.clone(),
            tmpfs,
            mounts: host_mounts(spec),
            network: match spec.network {
                NetworkPolicy::Off => NetworkMode::Off,
                // Egress leaves through the proxy, never through the namespace.
                NetworkPolicy::Loopback | NetworkPolicy::Full | NetworkPolicy::Allow(_) => {
                    NetworkMode::Loopback
                }
            },
            // Only root can keep namespaces in the host's mount namespace.
            spares: rustix::process::geteuid().is_root().then(|| SparesConfig {
                dir: self.config.runtime_dir.display().to_string(),
                count: SPARES,
            }),
            limits: self.jail_limits(spec),
            outside_uid,
            outside_gid,
            cgroup_parent: self.config.cgroup_parent.clone(),
            // CRIU cannot carry a Landlock domain; the report says so.
            landlock: self.config.landlock && !spec.checkpointable,
            agent_socket: if spec.checkpointable {
                None
            } else {
                self.agent_socket(id)?.map(|p| p.display().to_string())
            },
            guest_dir: guest_dir.map(|d| d.display().to_string()),
            egress_dir: self
                .egress_folder(id, spec)?
                .map(|d| d.display().to_string()),
        })
    }

    /// Sandbox `id`'s egress folder (created), when it gets one: `full` and `allow`, and
    /// `loopback` with [`ProcessBackendConfig::loopback_egress`]; never a checkpointable
    /// sandbox (CRIU cannot carry a connection to the host's proxy).
    fn egress_folder(&self, id: &str, spec: &SandboxSpec) -> Result<Option<PathBuf>, EngineError> {
        let wanted = spec.network.has_egress()
            || (spec.network == NetworkPolicy::Loopback && self.config.loopback_egress);
        if !wanted {
            return Ok(None);
        }
        if spec.checkpointable {
            if spec.network.has_egress() {
                return Err(EngineError::InvalidSpec(format!(
                    "network '{}': a checkpointable sandbox has no egress (CRIU cannot carry a \
                     connection to the host's egress proxy); use 'loopback' or 'off'",
                    spec.network.kind()
                )));
            }
            return Ok(None);
        }
        sandcell_engine::egress::make_sandbox_dir(&self.config.runtime_dir, id).map(Some)
    }

    /// Where sandbox `id`'s agent listens, when agents listen (its directory is created).
    fn agent_socket(&self, id: &str) -> Result<Option<PathBuf>, EngineError> {
        if !self.config.agent_sockets {
            return Ok(None);
        }
        let dir = self.config.runtime_dir.join("agents");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| EngineError::io(format!("create {}", dir.display()), e))?;
        Ok(Some(dir.join(format!("{id}.sock"))))
    }
}

/// What a restarted service needs to reach a sandbox again, or to end what is left of it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RuntimeRecord {
    /// The sandbox's PID 1 on the host.
    host_pid: i32,
    /// Its start time (clock ticks after boot), telling it from a later process with the
    /// same pid.
    start_time: Option<u64>,
    /// Where its agent listens.
    agent_socket: Option<PathBuf>,
    /// Its cgroup.
    cgroup: Option<serde_json::Value>,
    /// The isolation it got from the launcher (the agent adds its own at the handshake).
    isolation: sandcell_protocol::IsolationReport,
}

impl RuntimeRecord {
    fn parse(v: &serde_json::Value) -> Result<Self, String> {
        serde_json::from_value(v.clone()).map_err(|e| format!("unreadable runtime record: {e}"))
    }

    /// A pidfd on the sandbox's PID 1 if it is still the same process.
    fn pidfd(&self) -> Result<OwnedFd, String> {
        let pid =
            Pid::from_raw(self.host_pid).ok_or_else(|| format!("bad pid {}", self.host_pid))?;
        let fd = pidfd_open(pid, PidfdFlags::empty())
            .map_err(|e| format!("its process {} is gone ({e})", self.host_pid))?;
        // Opened first, compared second: the pidfd pins the process the comparison is about.
        if self.start_time.is_some() && process_start_time(self.host_pid) != self.start_time {
            return Err(format!(
                "its process {} is gone (the pid belongs to another process now)",
                self.host_pid
            ));
        }
        Ok(fd)
    }
}

/// Field 22 of /proc/<pid>/stat: when the process started, in clock ticks after boot.
fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; it ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// The name in the shared `/etc/hostname` and `/etc/hosts` (each sandbox's own hostname,
/// from `uname`, is its id).
const HOSTNAME: &str = "sandcell";
/// Spare network namespaces and cgroups each launcher keeps ready for the next sandboxes.
const SPARES: usize = 2;

/// The jail's mounts of `spec` (none lies inside another: the spec's rules).
fn host_mounts(spec: &SandboxSpec) -> Vec<HostMount> {
    spec.mounts
        .iter()
        .map(|m| HostMount {
            source: m.source.clone(),
            target: m.target.trim_end_matches('/').to_string(),
            mode: match m.mode {
                MountMode::Ro => HostMountMode::ReadOnly,
                MountMode::Rw => HostMountMode::ReadWrite,
                MountMode::Overlay => HostMountMode::Overlay,
            },
            owner_uid: m.owner_uid,
            owner_gid: m.owner_gid,
        })
        .collect()
}

/// Host ids for the sandbox user when running as root: an unprivileged id of its own per
/// sandbox (2^30 + random), so sandboxes share no id with each other or the host.
fn outside_ids() -> (u32, u32) {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let id = (1u32 << 30) + (h.finish() as u32 & 0xf_ffff);
    (id, id)
}

/// Whether a working CRIU is on this host (`criu check`), for process-fidelity snapshots
/// (not used yet: see docs/snapshots.md).
impl ProcessBackend {
    /// Whether checkpointable sandboxes can be made here (a working CRIU), and why not.
    fn criu_feature(&self) -> Feature {
        let (state, detail) = match self.criu.get_or_init(criu::Criu::find) {
            Ok(c) => (
                FeatureState::Active,
                format!(
                    "{} passes criu check: sandboxes created with checkpointable: true get process-fidelity snapshots (and run without Landlock)",
                    c.path().display()
                ),
            ),
            Err(why) => (
                FeatureState::Unavailable,
                format!("{why}; snapshots on this backend are of language fidelity"),
            ),
        };
        Feature {
            name: "criu".into(),
            state,
            detail,
        }
    }
}

#[async_trait]
impl Backend for ProcessBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Process
    }

    fn capabilities(&self) -> BackendCapabilities {
        let mut host = sandcell_jail::probe::host_report(
            Path::new("/sys/fs/cgroup"),
            &self.config.cgroup_parent,
        );
        let criu = self.criu_feature();
        host.set(&criu.name, criu.state, criu.detail);
        let available = self.config.launcher.exists() && host.is_active("user_ns");
        // Pausing freezes the sandbox's cgroup: v1 needs the freezer hierarchy.
        let cgroups = sandcell_jail::cgroup::detect(Path::new("/sys/fs/cgroup"));
        let supports_pause = cgroups.writable
            && match cgroups.version {
                Some(CgroupVersion::V1) => cgroups.controllers.iter().any(|c| c == "freezer"),
                Some(CgroupVersion::V2) => true,
                None => false,
            };
        BackendCapabilities {
            kind: BackendKind::Process,
            available,
            isolation_level: IsolationLevel::Container,
            supports_pause,
            // Files and each kernel's variables (see sandcell_engine::snapshot); every
            // process of a sandbox made checkpointable, with CRIU (the `criu` line).
            checkpoint_fidelity: Fidelity::Language,
            host,
            features: self.features(),
        }
    }

    fn features(&self) -> BackendFeatures {
        BackendFeatures {
            reattach: true,
            checkpoint: CheckpointSupport::OnRequest,
            // CRIU dumps and leaves the sandbox running on its connection.
            checkpoint_rehomes: false,
            capture_files: true,
            limits: true,
        }
    }

    fn egress_dir(&self, id: &str, spec: &SandboxSpec) -> Result<Option<PathBuf>, EngineError> {
        self.egress_folder(id, spec)
    }

    async fn launch(&self, id: &str, spec: &SandboxSpec) -> Result<LaunchedSandbox, EngineError> {
        let preforked = self.preforked.lock().ok().and_then(|mut p| p.take());
        // Another sandbox's preforked launcher is dropped: its agent sees EOF and exits.
        let preforked = preforked.filter(|p| p.id == id && p.spec == *spec);
        let (host, launcher, config) = match preforked {
            Some(p) => (p.socket, Launcher(p.pid), None),
            None => {
                let config = self.jail_config(id, spec)?;
                let (host, child) = std::os::unix::net::UnixStream::pair()
                    .map_err(|e| EngineError::io("create the sandbox socketpair", e))?;
                (host, self.start_launcher(child)?, Some(config))
            }
        };
        host.set_nonblocking(true)
            .map_err(|e| EngineError::io("set the socket non-blocking", e))?;
        let mut stream =
            UnixStream::from_std(host).map_err(|e| EngineError::io("register the socket", e))?;
        // A checkpointable sandbox is dumped by CRIU, its root skeleton noted for the restore.
        let checkpoint = match config.as_ref().filter(|c| c.is_checkpointable()) {
            Some(c) => Some(Checkpointing {
                criu: self.criu()?.clone(),
                root: c.root_skeleton.clone(),
                agent_inode: None,
            }),
            None => None,
        };
        if let Some(jail) = config {
            stream
                .write_all(&encode_message(0, &jail))
                .await
                .map_err(|e| EngineError::io("send the jail config", e))?;
        }

        let mut handed_over = Vec::new();
        let first = tokio::time::timeout(
            LAUNCH_TIMEOUT,
            read_one_message(&mut stream, &mut handed_over),
        )
        .await;
        let report = match first {
            Ok(Ok(Some(msg))) => msg,
            Ok(Ok(None)) | Ok(Err(_)) => {
                return Err(EngineError::Launch {
                    stage: "launcher".into(),
                    message: format!(
                        "the launcher exited before reporting ({})",
                        launcher.reap_now()
                    ),
                });
            }
            Err(_) => {
                launcher.kill();
                return Err(EngineError::Launch {
                    stage: "launcher".into(),
                    message: format!("no report within {LAUNCH_TIMEOUT:?}"),
                });
            }
        };
        let (host_pid, isolation, cgroup) = match report {
            GuestMessage::Launched {
                host_pid,
                report,
                cgroup,
            } => (host_pid, report, cgroup),
            GuestMessage::LaunchFailed { stage, message } => {
                return Err(EngineError::Launch { stage, message });
            }
            other => {
                return Err(EngineError::Launch {
                    stage: "launcher".into(),
                    message: format!("unexpected first message {other:?}"),
                });
            }
        };
        // A checkpointable sandbox's agent talks on the connection it made inside; the
        // launcher's ends here.
        if let Some(fd) = handed_over.pop() {
            let std_stream = std::os::unix::net::UnixStream::from(fd);
            std_stream
                .set_nonblocking(true)
                .map_err(|e| EngineError::io("set the socket non-blocking", e))?;
            stream = UnixStream::from_std(std_stream)
                .map_err(|e| EngineError::io("register the socket", e))?;
        }
        let pid = Pid::from_raw(host_pid).ok_or_else(|| EngineError::Launch {
            stage: "launcher".into(),
            message: format!("invalid pid {host_pid}"),
        })?;
        let pidfd = pidfd_open(pid, PidfdFlags::empty()).map_err(|e| {
            EngineError::io(
                format!("open a pidfd for the sandbox (pid {host_pid})"),
                e.into(),
            )
        })?;
        let runtime = RuntimeRecord {
            host_pid,
            start_time: process_start_time(host_pid),
            agent_socket: match checkpoint {
                Some(_) => None,
                None => self.agent_socket(id)?,
            },
            cgroup: cgroup.clone(),
            isolation: isolation.clone(),
        };
        let cgroup = cgroup
            .and_then(|record| SandboxCgroup::from_record(record).ok())
            .map(Arc::new);
        let instance = ProcessInstance {
            host_pid,
            pidfd,
            cgroup,
            launcher,
            destroyed: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            runtime,
            checkpoint,
            owns_cgroup: false,
        };
        Ok(LaunchedSandbox {
            stream: Box::new(stream),
            instance: Box::new(instance),
            isolation,
        })
    }

    async fn restore(
        &self,
        id: &str,
        spec: &SandboxSpec,
        image: &Path,
    ) -> Result<LaunchedSandbox, EngineError> {
        let criu = self.criu()?.clone();
        let limits = self.jail_limits(spec);
        let (cgroup, features) = SandboxCgroup::create(
            Path::new("/sys/fs/cgroup"),
            &self.config.cgroup_parent,
            id,
            &limits,
        )
        .map_err(|e| EngineError::Launch {
            stage: "cgroup".into(),
            message: format!("a CRIU restore needs its own cgroup: {e}"),
        })?;
        let (host, agent) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| EngineError::io("create the sandbox socketpair", e))?;
        let roots = cgroup.criu_roots();
        let image_dir = image.to_path_buf();
        let hostname = id.to_string();
        let dumper = criu.clone();
        // Restored, the agent is moved to a connection made inside its network namespace,
        // so that CRIU can dump this sandbox again.
        let restored = tokio::task::spawn_blocking(move || {
            let (pid, root) =
                dumper.restore(&image_dir, &hostname, &roots, OwnedFd::from(agent))?;
            let (host, inode) = criu::rehome(host)?;
            Ok::<_, EngineError>((pid, host, inode, root))
        })
        .await
        .map_err(|e| EngineError::io("criu restore", std::io::Error::other(e)))
        .and_then(|r| r);
        let (host_pid, host, agent_inode, root) = match restored {
            Ok(r) => r,
            Err(e) => {
                let _ = cgroup.kill_all();
                let _ = cgroup.remove();
                return Err(e);
            }
        };
        let pidfd = Pid::from_raw(host_pid)
            .ok_or_else(|| EngineError::io("criu restore", std::io::Error::other("bad pid")))
            .and_then(|pid| {
                pidfd_open(pid, PidfdFlags::empty())
                    .map_err(|e| EngineError::io("open a pidfd for the restored sandbox", e.into()))
            })?;
        let mut isolation = sandcell_protocol::IsolationReport::default();
        for f in features {
            isolation.set(&f.name, f.state, f.detail);
        }
        isolation.set(
            "criu_restore",
            FeatureState::Active,
            "restored by CRIU: namespaces, id maps, seccomp filters, no_new_privs and dropped capabilities come back as dumped; a new cgroup with this sandbox's limits",
        );
        isolation.set(
            "landlock",
            FeatureState::Disabled,
            "a checkpointable sandbox runs without Landlock (CRIU cannot carry a Landlock domain)",
        );
        host.set_nonblocking(true)
            .map_err(|e| EngineError::io("set the socket non-blocking", e))?;
        let stream =
            UnixStream::from_std(host).map_err(|e| EngineError::io("register the socket", e))?;
        let runtime = RuntimeRecord {
            host_pid,
            start_time: process_start_time(host_pid),
            agent_socket: None,
            cgroup: Some(cgroup.record()),
            isolation: isolation.clone(),
        };
        let instance = ProcessInstance {
            host_pid,
            pidfd,
            cgroup: Some(Arc::new(cgroup)),
            // CRIU detached it: init reaps it.
            launcher: Launcher(0),
            destroyed: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            runtime,
            checkpoint: Some(Checkpointing {
                criu,
                root,
                agent_inode: Some(agent_inode),
            }),
            owns_cgroup: true,
        };
        Ok(LaunchedSandbox {
            stream: Box::new(stream),
            instance: Box::new(instance),
            isolation,
        })
    }

    async fn reattach(
        &self,
        id: &str,
        runtime: &serde_json::Value,
    ) -> Result<LaunchedSandbox, EngineError> {
        let fail = |message: String| EngineError::Launch {
            stage: "reattach".into(),
            message,
        };
        let record = RuntimeRecord::parse(runtime).map_err(fail)?;
        let socket = record
            .agent_socket
            .clone()
            .ok_or_else(|| fail(format!("sandbox {id} was started without an agent socket")))?;
        let pidfd = record.pidfd().map_err(fail)?;
        let stream = tokio::time::timeout(LAUNCH_TIMEOUT, UnixStream::connect(&socket))
            .await
            .map_err(|_| fail(format!("its agent did not answer on {}", socket.display())))?
            .map_err(|e| {
                fail(format!(
                    "its agent is not listening on {} ({e})",
                    socket.display()
                ))
            })?;
        let cgroup = record
            .cgroup
            .clone()
            .and_then(|r| SandboxCgroup::from_record(r).ok())
            .map(Arc::new);
        let instance = ProcessInstance {
            host_pid: record.host_pid,
            pidfd,
            cgroup,
            // Not our child: init reaps it.
            launcher: Launcher(0),
            destroyed: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            runtime: record.clone(),
            checkpoint: None,
            owns_cgroup: false,
        };
        Ok(LaunchedSandbox {
            stream: Box::new(stream),
            instance: Box::new(instance),
            isolation: record.isolation,
        })
    }

    fn kill_orphan(&self, runtime: &serde_json::Value) -> String {
        let record = match RuntimeRecord::parse(runtime) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let mut found = Vec::new();
        if let Ok(fd) = record.pidfd() {
            let _ = pidfd_send_signal(&fd, Signal::KILL);
            found.push(format!("killed its processes (pid {})", record.host_pid));
        }
        if let Some(cg) = record
            .cgroup
            .and_then(|r| SandboxCgroup::from_record(r).ok())
        {
            // Stragglers outside the pid namespace's reach, then the cgroup itself (its
            // launcher normally removes it, but that launcher may be gone too).
            let _ = cg.kill_all();
            for _ in 0..50 {
                if cg.remove().is_ok() {
                    found.push("removed its cgroup".into());
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(path) = record.agent_socket
            && std::fs::remove_file(&path).is_ok()
        {
            found.push("removed its socket".into());
        }
        if found.is_empty() {
            "nothing of it was left".into()
        } else {
            found.join(", ")
        }
    }
}

impl ProcessBackend {
    /// Starts `sandcell __jail` with `socket` as its end of the socketpair.
    fn start_launcher(
        &self,
        socket: std::os::unix::net::UnixStream,
    ) -> Result<Launcher, EngineError> {
        let stderr = if self.config.debug {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let mut cmd = std::process::Command::new(&self.config.launcher);
        cmd.arg("__jail")
            .env_clear()
            .stdin(Stdio::from(OwnedFd::from(socket)))
            .stdout(Stdio::null())
            .stderr(stderr);
        if self.config.debug {
            cmd.env("SANDCELL_DEBUG", "1");
        }
        let child = cmd.spawn().map_err(|e| {
            EngineError::io(
                format!("start the launcher {}", self.config.launcher.display()),
                e,
            )
        })?;
        // Dropping the Child neither waits nor kills: the pid is all we keep.
        Ok(Launcher(child.id() as i32))
    }
}

/// The launcher process (its pid): it outlives the sandbox's PID 1 by the cgroup clean-up.
struct Launcher(i32);

impl Launcher {
    fn pid(&self) -> Option<Pid> {
        Pid::from_raw(self.0)
    }

    fn kill(&self) {
        if let Some(pid) = self.pid() {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }

    /// Waits for an already-failed launcher and says how it ended.
    fn reap_now(&self) -> String {
        match self.pid() {
            Some(pid) => {
                match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
                    Ok(Some((_, status))) => format!("{status:?}"),
                    _ => "status unknown".into(),
                }
            }
            None => "status unknown".into(),
        }
    }

    /// Reaps it if it has already ended.
    fn reap_if_done(&self) {
        if let Some(pid) = self.pid() {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
        }
    }

    /// Reaps it in the background once it ends (it removes the cgroups first).
    fn reap_later(&self) {
        let Some(pid) = self.pid() else {
            return;
        };
        tokio::task::spawn_blocking(move || {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        });
    }
}

/// Reads exactly one message frame (never more bytes than it holds, so everything after
/// it stays in the socket for the guest client). `None` on EOF.
/// Reads the launcher's one message, and the descriptor sent with it when the agent's
/// connection was made inside the sandbox (a checkpointable one).
async fn read_one_message(
    stream: &mut UnixStream,
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<Option<GuestMessage>> {
    let mut header = [0u8; HEADER_LEN];
    if !read_exact_with_fds(stream, &mut header, fds).await? {
        return Ok(None);
    }
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    if !(5..=sandcell_protocol::MAX_FRAME_LEN).contains(&len) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bad launcher frame length",
        ));
    }
    let mut frame = header.to_vec();
    frame.resize(4 + len as usize, 0);
    if !read_exact_with_fds(stream, &mut frame[HEADER_LEN..], fds).await? {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let mut decoder = FrameDecoder::default();
    decoder.feed(&frame);
    match decoder.next_frame::<GuestMessage>() {
        Some(Ok(Frame::Message { msg, .. })) => Ok(Some(msg)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bad launcher frame",
        )),
    }
}

/// Fills `buf` with `recvmsg` (a plain read would drop descriptors sent along), collecting
/// any descriptors into `fds`. False when the socket ended before the first byte.
async fn read_exact_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<bool> {
    use std::os::fd::AsFd;
    let mut filled = 0;
    while filled < buf.len() {
        stream.readable().await?;
        let read = stream.try_io(tokio::io::Interest::READABLE, || {
            sandcell_jail::fdpass::recv_with_fds(stream.as_fd(), &mut buf[filled..])
        });
        match read {
            Ok((0, _)) if filled == 0 => return Ok(false),
            Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((n, got)) => {
                filled += n;
                fds.extend(got);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// What dumping a checkpointable sandbox takes.
#[derive(Debug, Clone)]
struct Checkpointing {
    criu: criu::Criu,
    /// Its root skeleton (the restored root).
    root: String,
    /// The inode of the agent's end of its connection, when it is not on
    /// [`sandcell_jail::launch::SOCKET_FD`] (after a `Rehome`).
    agent_inode: Option<u64>,
}

/// One running process-backend sandbox.
struct ProcessInstance {
    /// Set for a sandbox made checkpointable, and for one restored from a checkpoint (its
    /// agent moved to a connection made inside it).
    checkpoint: Option<Checkpointing>,
    /// No launcher removes its cgroup when it ends (a CRIU restore): destroy does.
    owns_cgroup: bool,
    host_pid: i32,
    pidfd: OwnedFd,
    /// Shared with the blocking tasks that freeze it.
    cgroup: Option<Arc<SandboxCgroup>>,
    launcher: Launcher,
    destroyed: AtomicBool,
    /// Left running for a later process to reattach (not killed on drop).
    detached: AtomicBool,
    runtime: RuntimeRecord,
}

impl Drop for ProcessInstance {
    fn drop(&mut self) {
        if self.detached.load(Ordering::SeqCst) {
            return;
        }
        if !self.destroyed.load(Ordering::SeqCst) {
            self.kill();
        }
        // Never block here: a runtime shutting down would wait for a blocking reap, and the
        // launcher outlives the sandbox by its cgroup clean-up.
        self.launcher.reap_if_done();
    }
}

/// Freezes `cg`, waiting (blocking) until its last task has stopped.
fn freeze(cg: &SandboxCgroup) -> Result<(), EngineError> {
    cg.pause(PAUSE_TIMEOUT).map_err(|e| match e {
        JailError::Unsupported(why) => EngineError::Unsupported(format!("cannot pause: {why}")),
        other => EngineError::io("pause the sandbox", std::io::Error::other(other)),
    })
}

impl ProcessInstance {
    /// The sandbox's root as the host reaches it (its first process's root).
    fn fs_root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.host_pid))
    }
}

#[async_trait]
impl BackendInstance for ProcessInstance {
    fn counters(&self) -> ResourceCounters {
        let Some(cg) = &self.cgroup else {
            return ResourceCounters::default();
        };
        let c = cg.limit_counters();
        ResourceCounters {
            oom_kills: Some(c.oom_kills),
            pids_limit_hits: Some(c.pids_limit_hits),
            memory_bytes: c.memory_bytes,
            ..ResourceCounters::default()
        }
    }

    fn usage(&self) -> ResourceCounters {
        let Some(cg) = &self.cgroup else {
            return ResourceCounters::default();
        };
        let c = cg.counters();
        ResourceCounters {
            oom_kills: Some(c.oom_kills),
            pids_limit_hits: Some(c.pids_limit_hits),
            memory_bytes: c.memory_bytes,
            memory_peak_bytes: c.memory_peak_bytes,
            cpu_usage_us: c.cpu_usage_us,
            pids_current: c.pids_current,
        }
    }

    fn pids_limit_hits(&self) -> Option<u64> {
        self.cgroup.as_ref().map(|cg| cg.pids_limit_hits())
    }

    fn oom_kills(&self) -> Option<u64> {
        self.cgroup.as_ref().map(|cg| cg.oom_kills())
    }

    fn host_pid(&self) -> Option<i32> {
        Some(self.host_pid)
    }

    fn runtime(&self) -> serde_json::Value {
        if self.runtime.agent_socket.is_none() {
            return serde_json::Value::Null;
        }
        serde_json::to_value(&self.runtime).unwrap_or(serde_json::Value::Null)
    }

    fn detach(&self) {
        self.detached.store(true, Ordering::SeqCst);
    }

    fn kill(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
        // Killing PID 1 of the pid namespace makes the kernel kill every process in it.
        // ESRCH: already gone, which is what we want.
        let _ = pidfd_send_signal(&self.pidfd, Signal::KILL);
        // A frozen task dies only once thawed.
        if let Some(cg) = &self.cgroup
            && cg.paused() == Some(true)
        {
            cg.resume();
        }
    }

    async fn pause(&self) -> Result<(), EngineError> {
        let Some(cg) = self.cgroup.clone() else {
            return Err(EngineError::Unsupported(
                "this sandbox has no cgroup (cgroups are not writable here), so it cannot be paused"
                    .into(),
            ));
        };
        // Freezing waits (briefly) for the last task to stop.
        tokio::task::spawn_blocking(move || freeze(&cg))
            .await
            .map_err(|e| EngineError::io("pause the sandbox", std::io::Error::other(e)))?
    }

    async fn resume(&self) -> Result<(), EngineError> {
        if let Some(cg) = &self.cgroup {
            cg.resume();
        }
        Ok(())
    }

    fn frozen(&self) -> Option<bool> {
        self.cgroup.as_ref().and_then(|cg| cg.paused())
    }

    fn checkpoints(&self) -> bool {
        self.checkpoint.is_some()
    }

    async fn checkpoint(&self, image: &Path) -> Result<Option<GuestStream>, EngineError> {
        let Some(c) = self.checkpoint.clone() else {
            return Err(EngineError::Unsupported(
                "this sandbox cannot be checkpointed (it was not made checkpointable)".into(),
            ));
        };
        let ino = c
            .agent_inode
            .or_else(|| criu::socket_inode(self.host_pid, sandcell_jail::launch::SOCKET_FD))
            .ok_or_else(|| EngineError::Launch {
                stage: "criu dump".into(),
                message: "cannot find the agent's connection".into(),
            })?;
        let (host_pid, cgroup, image) = (self.host_pid, self.cgroup.clone(), image.to_path_buf());
        tokio::task::spawn_blocking(move || {
            // CRIU stops the tasks itself; frozen ones would never answer it.
            let frozen = cgroup.as_ref().filter(|cg| cg.paused() == Some(true));
            if let Some(cg) = frozen {
                cg.resume();
            }
            let dumped = c.criu.dump(host_pid, ino, &c.root, &image);
            if let Some(cg) = frozen {
                freeze(cg)?;
            }
            // The agent keeps its connection: CRIU dumps and leaves the sandbox running.
            dumped.map(|()| None)
        })
        .await
        .map_err(|e| EngineError::io("criu dump", std::io::Error::other(e)))?
    }

    fn capture_files(
        &self,
        dirs: &[&str],
        out: &mut dyn std::io::Write,
    ) -> Result<sandcell_engine::FilesCapture, EngineError> {
        files_snapshot::capture(&self.fs_root(), dirs, out)
            .map_err(|e| EngineError::io("read the sandbox's files", e))
    }

    async fn destroy(&self) -> Result<(), EngineError> {
        self.kill();
        let fd = self
            .pidfd
            .try_clone()
            .map_err(|e| EngineError::io("duplicate the pidfd", e))?;
        // A pidfd turns readable when the process exits.
        let waited = tokio::task::spawn_blocking(move || {
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            poll(
                &mut fds,
                Some(&Timespec {
                    tv_sec: 10,
                    tv_nsec: 0,
                }),
            )
        })
        .await
        .map_err(|e| EngineError::io("wait for the sandbox to exit", std::io::Error::other(e)))?;
        match waited {
            Ok(n) if n > 0 => {
                self.launcher.reap_later();
                if self.owns_cgroup
                    && let Some(cg) = &self.cgroup
                {
                    let _ = cg.kill_all();
                    let _ = cg.remove();
                }
                if let Some(path) = &self.runtime.agent_socket {
                    let _ = std::fs::remove_file(path);
                }
                Ok(())
            }
            Ok(_) => Err(EngineError::Unresponsive(format!(
                "sandbox pid {} still alive 10 s after SIGKILL",
                self.host_pid
            ))),
            Err(e) => Err(EngineError::io("wait for the sandbox to exit", e.into())),
        }
    }
}
