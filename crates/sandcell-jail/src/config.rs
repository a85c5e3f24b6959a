//! The launch configuration the host hands the `sandcell __jail` helper.

use serde::{Deserialize, Serialize};

/// Network policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// A private network namespace with only `lo` (up): nothing outside the sandbox is
    /// reachable, but programs may use TCP/UDP on loopback among themselves.
    #[default]
    Loopback,
    /// No network at all: as `Loopback`, and seccomp also refuses inet, inet6, netlink and
    /// packet sockets (only Unix sockets work).
    Off,
}

/// Resource limits. `None` means not limited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory for the whole sandbox in bytes, swap excluded (cgroup), or per process
    /// (`RLIMIT_DATA`) when cgroups are not available.
    pub memory_bytes: Option<u64>,
    /// Processes and threads in the whole sandbox (cgroup `pids.max`), or `RLIMIT_NPROC` for
    /// the sandbox user when cgroups are not available.
    pub pids: Option<u64>,
    /// CPU quota in thousandths of a CPU (1500 = 1.5 CPUs).
    pub cpu_millis: Option<u64>,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub nofile: u64,
    /// Largest file a process may write (`RLIMIT_FSIZE`).
    pub fsize_bytes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: Some(512 * 1024 * 1024),
            pids: Some(256),
            cpu_millis: None,
            nofile: 1024,
            fsize_bytes: None,
        }
    }
}

/// A size-limited writable tmpfs inside the sandbox, owned by the sandbox user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsMount {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size limit in bytes.
    pub size_bytes: u64,
    /// Permission bits of its root, e.g. `0o755` (`0o1777` for /tmp).
    pub mode: u32,
}

/// How a sandbox sees a [`HostMount`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostMountMode {
    /// Read-only.
    ReadOnly,
    /// Read and write.
    ReadWrite,
    /// Read-only below an overlay whose upper layer lies in the tmpfs holding the target.
    Overlay,
}

/// A host folder mounted into the sandbox, below one of its tmpfs mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMount {
    /// The host folder (absolute).
    pub source: String,
    /// Where inside: a tmpfs mount's path or a folder below one (made when missing).
    pub target: String,
    /// How the sandbox sees it.
    pub mode: HostMountMode,
    /// The host uid shown as the sandbox user's, when the launcher is root (an idmapped
    /// mount); otherwise the host's ids show through.
    pub owner_uid: u32,
    /// The host gid shown as the sandbox group's, as `owner_uid`.
    pub owner_gid: u32,
}

/// Where the launcher finds things made ahead of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparesConfig {
    /// The directory holding the pools (`netns/`, `cgroups/`), root-owned.
    pub dir: String,
    /// How many of each a launcher keeps ready while its sandbox runs.
    pub count: usize,
}

impl SparesConfig {
    /// The pool of network namespaces.
    pub fn netns_dir(&self) -> std::path::PathBuf {
        std::path::Path::new(&self.dir).join("netns")
    }

    /// The pool of cgroups made under the cgroup parent `parent`.
    pub fn cgroups_dir(&self, parent: &str) -> std::path::PathBuf {
        let name: String = parent
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        std::path::Path::new(&self.dir).join("cgroups").join(name)
    }
}

impl JailConfig {
    /// Whether CRIU can checkpoint this sandbox (see [`JailConfig::guest_dir`]).
    pub fn is_checkpointable(&self) -> bool {
        self.guest_dir.is_some()
    }
}

/// Everything the launcher needs to build one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailConfig {
    /// The sandbox id (names its cgroups).
    pub sandbox_id: String,
    /// Hostname inside the sandbox.
    pub hostname: String,
    /// The host directory bound read-only as the sandbox's root: a skeleton built by
    /// [`crate::rootfs::skeleton::prepare`] with the mount points of everything below.
    pub root_skeleton: String,
    /// The skeleton holds its binds and devices already (mounted by the host, see
    /// [`crate::rootfs::skeleton`]): the sandbox binds it recursively and `ro_binds` is empty.
    #[serde(default)]
    pub root_premounted: bool,
    /// Paths (files or directories) bound read-only at the same path inside, from under
    /// `system_root`; their mount points exist in the skeleton.
    pub ro_binds: Vec<String>,
    /// Where `ro_binds` come from: a template's root filesystem; `None`: the host's `/`.
    #[serde(default)]
    pub system_root: Option<String>,
    /// Writable tmpfs mounts (their mount points exist in the skeleton).
    pub tmpfs: Vec<TmpfsMount>,
    /// Host folders mounted below the tmpfs mounts (none inside another).
    #[serde(default)]
    pub mounts: Vec<HostMount>,
    /// Network policy.
    pub network: NetworkMode,
    /// Where spare network namespaces and cgroups are kept (root only; see
    /// [`crate::spares`]); `None`: the launcher makes its own.
    #[serde(default)]
    pub spares: Option<SparesConfig>,
    /// Resource limits.
    pub limits: Limits,
    /// Host uid that the sandbox user maps to, when the launcher runs as root; ignored (the
    /// launcher's own uid is used) when it does not.
    pub outside_uid: u32,
    /// Host gid that the sandbox group maps to, as `outside_uid`.
    pub outside_gid: u32,
    /// Parent cgroup path relative to each hierarchy's root (e.g. `sandcell`).
    pub cgroup_parent: String,
    /// Apply Landlock when the kernel has it.
    pub landlock: bool,
    /// A host path where the agent listens for the host to connect again after its first
    /// connection ends (a restarted daemon re-attaching); `None`: the sandbox ends with its
    /// first connection. The launcher binds it on the host before the namespaces are made.
    #[serde(default)]
    pub agent_socket: Option<String>,
    /// A host folder holding the Sandcell binary, bound read-only at `/.sandcell`; the
    /// sandbox's PID 1 then executes the agent from there instead of running it in the
    /// launcher's copy (a checkpointable sandbox: CRIU can only dump what its namespace sees).
    #[serde(default)]
    pub guest_dir: Option<String>,
    /// A host folder bound read-only at [`sandcell_protocol::EGRESS_DIR`], holding the
    /// socket of the sandbox's egress proxy (`None`: no egress, the network is `off`).
    #[serde(default)]
    pub egress_dir: Option<String>,
}
