//! One step of a template build (`RUN`), in a build sandbox: a profile of its own, unlike a
//! run sandbox's.
//!
//! - **Ids:** the step runs as uid 0 of a private range of 65 536 ids (`id_base…`), mapped
//!   by the host (root) without `/etc/subuid`; package managers chown to their own users
//!   (`_apt`, …), which needs the whole range, and may call `setgroups` (allowed: every
//!   group the namespace can name is private to it).
//! - **Root:** an overlay whose lowest layer is the base's unpacked root (stored with ids
//!   0…, shown shifted into the range by an idmapped mount, never copied), above it the upper
//!   folders of this build's earlier steps, and a fresh upper folder that the caller turns
//!   into the step's layer. The overlay is made by the helper in a mount namespace of its
//!   own (as root of the host: overlayfs then writes whiteouts the standard way), before the
//!   step's namespaces are cloned from it.
//! - **Capabilities:** Docker's default set for build steps (chown, dac_override, fowner,
//!   fsetid, kill, setgid, setuid, setpcap, net_bind_service, sys_chroot, mknod, audit_write,
//!   setfcap), each over the namespace's own ids only; the seccomp deny-list of run
//!   sandboxes stays (mount, unshare of user namespaces, ptrace, bpf, keyctl, …), with
//!   `no_new_privs`.
//! - **Network:** a namespace of its own with only `lo`, made by the helper (so the step's
//!   root cannot reconfigure it). With an egress socket, the helper listens on
//!   `127.0.0.1:3128` inside it and relays each connection to the host's egress proxy, which
//!   decides; the step's environment names that proxy.
//! - **Limits:** a cgroup (memory, pids) when one can be made, else rlimits; `RLIMIT_NPROC`
//!   counts per uid of the namespace anyway.
//!
//! The helper (`sandcell __build-step`) is single-threaded until the step's first process
//! is cloned; it then relays, waits, and writes what happened to `status_file`.

use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, umount2};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use rustix::thread::{self, CapabilitySet, CapabilitySets};
use serde::{Deserialize, Serialize};

use crate::cgroup::SandboxCgroup;
use crate::config::{Limits, NetworkMode};
use crate::error::JailError;

/// How many ids a build's range maps.
pub const ID_RANGE_SIZE: u32 = 65_536;

/// Where the helper listens for the step's HTTP(S) proxy traffic, inside the step's network
/// namespace.
pub const PROXY_ADDR: &str = "127.0.0.1:3128";

/// The exit code a step gets when the build sandbox could not be made (as `docker run`'s
/// own failures); the status file tells it apart from a command that exits 125.
pub const SETUP_FAILED: i32 = 125;

/// Everything the helper needs to run one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildStepConfig {
    /// Names the step's cgroup.
    pub id: String,
    /// The base's unpacked root, stored with ids 0… (read-only, shown shifted).
    pub lower_root: String,
    /// Upper folders of this build's earlier steps, oldest first (stored shifted).
    pub layers: Vec<String>,
    /// The step's upper folder (empty), its overlay work folder and the mount point of the
    /// merged root; all on one file system.
    pub upper: String,
    /// overlayfs' work folder, beside `upper`.
    pub work: String,
    /// Where the merged root is mounted (in the helper's namespace only).
    pub merged: String,
    /// Where the idmapped base is mounted (in the helper's namespace only).
    pub lower_mount: String,
    /// The host id of id 0 of the step's range.
    pub id_base: u32,
    /// The command (no shell is added here); ignored when `copy` is given.
    pub argv: Vec<String>,
    /// Instead of a command: merge staged files into the root (`COPY`, `ADD`, `WORKDIR`).
    #[serde(default)]
    pub copy: Option<CopyInto>,
    /// Its environment.
    pub env: Vec<(String, String)>,
    /// Its working directory (absolute, inside the root).
    pub workdir: String,
    /// `USER`: a name in the root's `/etc/passwd`, or `uid[:gid]`.
    pub user: String,
    /// Host folders bound read-write into the step, outside its layer:
    /// `RUN --mount=type=cache` (host folder, absolute target).
    pub caches: Vec<(String, String)>,
    /// The host egress proxy's socket; `None`: no network beyond `lo`.
    pub egress_socket: Option<String>,
    /// The host's CA bundle, shown to the step at [`CA_BUNDLE`] (outside the layer) and named
    /// by the variables TLS clients read: a registry is then trusted as the host's own
    /// package managers trust it (some networks re-sign TLS with a CA only the host knows).
    #[serde(default)]
    pub ca_bundle: Option<String>,
    /// Limits of the step (memory and pids for the whole step).
    pub limits: Limits,
    /// The parent cgroup (as run sandboxes').
    pub cgroup_parent: String,
    /// Where the helper writes a [`BuildStepStatus`] as JSON when it is done.
    pub status_file: String,
}

/// Files staged on the host (the folder stands for `/`) merged into the step's root by the
/// step's first process, after the pivot: symbolic links of the image resolve inside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyInto {
    /// The staging folder (owned by the range's id 0).
    pub staging: String,
    /// `--chown` (`user[:group]`, names from the image); default `0:0`.
    pub chown: Option<String>,
    /// `--chmod` (octal), for every copied entry; default: the source's mode.
    pub chmod: Option<u32>,
}

/// Where the host's CA bundle appears in a step: inside `/dev`, a tmpfs outside the layer.
pub const CA_BUNDLE: &str = "/dev/sandcell-ca.crt";

/// The variables that point TLS clients at [`CA_BUNDLE`] (OpenSSL, pip, requests, curl,
/// Node.js, git, cargo).
const CA_VARIABLES: &[&str] = &[
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
];

/// Where the staging folder is bound during a copy: inside `/dev`, a tmpfs outside the layer.
const STAGING_POINT: &str = "/dev/.sandcell-copy";

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildStepStatus {
    /// The command's exit code (128 + the signal when one ended it), or [`SETUP_FAILED`].
    pub exit_code: i32,
    /// Why the build sandbox could not be made, when it could not.
    pub setup_error: Option<String>,
    /// The step ran out of memory (the cgroup's OOM killer acted).
    pub oom_killed: bool,
}

/// Docker's default capabilities for containers and build steps.
const BUILD_CAPS: &[u32] = &[
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    18, // CAP_SYS_CHROOT
    27, // CAP_MKNOD
    29, // CAP_AUDIT_WRITE
    31, // CAP_SETFCAP
];

/// Devices bound into the step's `/dev` (a tmpfs, outside the layer).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Runs the step described on stdin and exits with its code; the `sandcell __build-step`
/// entry point. The step's output is this process's stdout and stderr.
pub fn main_from_stdin() -> i32 {
    let mut text = String::new();
    let config: Result<BuildStepConfig, String> = io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("read the step's configuration: {e}"))
        .and_then(|_| {
            serde_json::from_str(&text).map_err(|e| format!("the step's configuration: {e}"))
        });
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandcell build: {e}");
            return SETUP_FAILED;
        }
    };
    let status = run_step(&config);
    let written = serde_json::to_vec(&status)
        .map_err(io::Error::other)
        .and_then(|bytes| fs::write(&config.status_file, bytes));
    if let Err(e) = written {
        eprintln!("sandcell build: write {}: {e}", config.status_file);
    }
    status.exit_code
}

/// Runs one step; never panics on a bad configuration or host, it says why in the status.
pub fn run_step(config: &BuildStepConfig) -> BuildStepStatus {
    match try_run(config) {
        Ok(status) => status,
        Err(e) => BuildStepStatus {
            exit_code: SETUP_FAILED,
            setup_error: Some(e.to_string()),
            oom_killed: false,
        },
    }
}

fn try_run(config: &BuildStepConfig) -> Result<BuildStepStatus, JailError> {
    validate(config)?;
    // The step dies with whoever runs the helper (a cancelled build, a daemon that exits).
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let threads = crate::caps::thread_count()?;
    if threads != 1 {
        return Err(JailError::Config(format!(
            "the build helper must be single-threaded, it has {threads} threads"
        )));
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS | nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| {
            JailError::io(
                "unshare the helper's mount and network namespaces",
                e.into(),
            )
        })?;
    crate::rootfs::do_mount(
        None,
        "/",
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
        "make / private",
    )?;
    crate::net::loopback_up()?;
    let listener = match &config.egress_socket {
        Some(_) => Some(
            TcpListener::bind(PROXY_ADDR)
                .map_err(|e| JailError::io(format!("listen on {PROXY_ADDR}"), e))?,
        ),
        None => None,
    };
    mount_root(config)?;
    prepare_root(config)?;

    let cgroup = SandboxCgroup::create(
        Path::new("/sys/fs/cgroup"),
        &config.cgroup_parent,
        &config.id,
        &config.limits,
    )
    .ok()
    .map(|(cg, _)| cg);

    let (ready_read, ready_write) = pipe()?;
    let (error_read, error_write) = pipe()?;
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    let child = crate::launch::raw_clone(flags)
        .map_err(|e| JailError::io("clone the build step's namespaces", e))?;
    let Some(child) = child else {
        drop(ready_write);
        drop(error_read);
        let mut byte = [0u8; 1];
        let mut ready = fs::File::from(ready_read);
        let err = match ready.read(&mut byte) {
            Ok(1) => step_side(config, cgroup.is_some()),
            _ => JailError::Config("the helper went away before the step started".into()),
        };
        let mut out = fs::File::from(error_write);
        let _ = out.write_all(err.to_string().as_bytes());
        // SAFETY: _exit ends this process at once, without running the parent's handlers.
        unsafe { libc::_exit(SETUP_FAILED) };
    };
    drop(ready_read);
    drop(error_write);

    let started = write_maps(child, config.id_base).and_then(|()| match &cgroup {
        Some(cg) => cg.join(child.as_raw() as u32),
        None => Ok(()),
    });
    if let Err(e) = started {
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(child, None);
        remove_cgroup(cgroup.as_ref());
        return Err(e);
    }
    let mut go = fs::File::from(ready_write);
    let _ = go.write_all(b"g");
    drop(go);

    if let (Some(listener), Some(socket)) = (listener, config.egress_socket.clone()) {
        std::thread::spawn(move || relay(listener, socket));
    }

    let exit_code = wait_exit(child);
    let mut setup_error = String::new();
    let _ = fs::File::from(error_read).read_to_string(&mut setup_error);
    let oom_killed = cgroup.as_ref().is_some_and(|cg| cg.oom_kills() > 0);
    remove_cgroup(cgroup.as_ref());
    Ok(BuildStepStatus {
        exit_code,
        setup_error: (!setup_error.is_empty()).then_some(setup_error),
        oom_killed,
    })
}

fn validate(config: &BuildStepConfig) -> Result<(), JailError> {
    if config.argv.is_empty() && config.copy.is_none() {
        return Err(JailError::Config("the step has no command".into()));
    }
    for (what, path) in [
        ("lower root", &config.lower_root),
        ("upper folder", &config.upper),
        ("work folder", &config.work),
        ("merged root", &config.merged),
        ("lower mount point", &config.lower_mount),
        ("working directory", &config.workdir),
    ] {
        if !path.starts_with('/') || path.contains(',') || path.contains(':') {
            return Err(JailError::Config(format!(
                "the {what} '{path}' must be an absolute path without ',' or ':'"
            )));
        }
    }
    for layer in &config.layers {
        if !layer.starts_with('/') || layer.contains(',') || layer.contains(':') {
            return Err(JailError::Config(format!(
                "the layer '{layer}' must be an absolute path without ',' or ':'"
            )));
        }
    }
    for (_, target) in &config.caches {
        if !target.starts_with('/') || target.split('/').any(|c| c == "..") {
            return Err(JailError::Config(format!(
                "the cache target '{target}' must be an absolute path without '..'"
            )));
        }
    }
    if config.id_base == 0 || config.id_base.checked_add(ID_RANGE_SIZE).is_none() {
        return Err(JailError::Config(format!(
            "the id range at {} is not a private range",
            config.id_base
        )));
    }
    Ok(())
}

/// The overlay: the idmapped base at the bottom, this build's earlier uppers above it.
fn mount_root(config: &BuildStepConfig) -> Result<(), JailError> {
    let userns = mapping_namespace(config.id_base)?;
    crate::mount_attr::bind_idmapped(&config.lower_root, &config.lower_mount, &userns)
        .map_err(|e| JailError::io(format!("mount {} idmapped", config.lower_root), e))?;
    let mut lowers: Vec<&str> = config.layers.iter().rev().map(String::as_str).collect();
    lowers.push(&config.lower_mount);
    // No redirects, metacopy or index: the upper folder must hold whole files and plain
    // whiteouts, so that it reads as a standard layer.
    let options = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,metacopy=off,index=off,xino=off",
        lowers.join(":"),
        config.upper,
        config.work
    );
    crate::rootfs::do_mount(
        Some("overlay"),
        &config.merged,
        Some("overlay"),
        MsFlags::empty(),
        Some(&options),
        "mount the build step's overlay",
    )
}

/// What the helper adds to the merged root before the step's namespaces are cloned (as the
/// host's root, in its own mount namespace): `/dev` (a tmpfs outside the layer, with the
/// harmless devices), the caches and the staged files. Folders it makes in the root are
/// given to the range's root, as the step would have made them.
fn prepare_root(config: &BuildStepConfig) -> Result<(), JailError> {
    let root = config.merged.as_str();
    let owner = Some(config.id_base);
    for (host, target) in &config.caches {
        let point = mount_point(root, target, owner)?;
        crate::rootfs::do_mount(
            Some(host),
            &point,
            None,
            MsFlags::MS_BIND,
            None,
            &format!("bind the cache at {target}"),
        )?;
    }
    mount_point(root, "/proc", owner)?;
    let dev = mount_point(root, "/dev", owner)?;
    crate::rootfs::do_mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(&format!("size=1m,mode=755,uid={0},gid={0}", config.id_base)),
        "mount /dev",
    )?;
    for name in DEVICES {
        let target = format!("{dev}/{name}");
        fs::write(&target, b"").map_err(|e| JailError::io(format!("make {target}"), e))?;
        crate::rootfs::do_mount(
            Some(&format!("/dev/{name}")),
            &target,
            None,
            MsFlags::MS_BIND,
            None,
            &format!("bind /dev/{name}"),
        )?;
    }
    for dir in ["pts", "shm"] {
        fs::create_dir(format!("{dev}/{dir}"))
            .map_err(|e| JailError::io(format!("make /dev/{dir}"), e))?;
    }
    for (name, target) in crate::rootfs::DEV_SYMLINKS {
        std::os::unix::fs::symlink(target, format!("{dev}/{name}"))
            .map_err(|e| JailError::io(format!("link /dev/{name}"), e))?;
    }
    if let Some(bundle) = &config.ca_bundle {
        let target = format!("{root}{CA_BUNDLE}");
        fs::write(&target, b"").map_err(|e| JailError::io(format!("make {CA_BUNDLE}"), e))?;
        crate::rootfs::do_mount(
            Some(bundle),
            &target,
            None,
            MsFlags::MS_BIND,
            None,
            "bind the host's CA bundle",
        )?;
        crate::mount_attr::set(&target, crate::mount_attr::RDONLY, false)
            .map_err(|e| JailError::io("make the CA bundle read-only", e))?;
    }
    if let Some(copy) = &config.copy {
        let point = format!("{root}{STAGING_POINT}");
        fs::create_dir(&point).map_err(|e| JailError::io(format!("make {STAGING_POINT}"), e))?;
        crate::rootfs::do_mount(
            Some(&copy.staging),
            &point,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
            "bind the staged files",
        )?;
    }
    Ok(())
}

/// A user namespace with the build's id mapping, for the idmapped mount to take its mapping
/// from.
fn mapping_namespace(id_base: u32) -> Result<fs::File, JailError> {
    let map = format!("0 {id_base} {ID_RANGE_SIZE}\n");
    crate::mount_attr::mapping_namespace(&map, &map)
}

fn write_maps(pid: Pid, id_base: u32) -> Result<(), JailError> {
    let map = format!("0 {id_base} {ID_RANGE_SIZE}\n");
    crate::mount_attr::write_id_maps(pid, &map, &map, "the build step")
}

fn pipe() -> Result<(OwnedFd, OwnedFd), JailError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| JailError::io("make a pipe", e.into()))
}

fn wait_exit(child: Pid) -> i32 {
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return 128 + signal as i32,
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return SETUP_FAILED,
        }
    }
}

fn remove_cgroup(cgroup: Option<&SandboxCgroup>) {
    if let Some(cg) = cgroup {
        let _ = cg.kill_all();
        let _ = cg.remove();
    }
}

/// Relays each connection to the proxy port to the host's egress proxy.
fn relay(listener: TcpListener, socket: String) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let socket = socket.clone();
        std::thread::spawn(move || {
            let Ok(upstream) = UnixStream::connect(&socket) else {
                return;
            };
            pump(conn, upstream);
        });
    }
}

fn pump(conn: TcpStream, upstream: UnixStream) {
    let (Ok(mut conn_read), Ok(mut up_write)) = (conn.try_clone(), upstream.try_clone()) else {
        return;
    };
    let outward = std::thread::spawn(move || {
        let _ = io::copy(&mut conn_read, &mut up_write);
        let _ = up_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut up_read, mut conn_write) = (upstream, conn);
    let _ = io::copy(&mut up_read, &mut conn_write);
    let _ = conn_write.shutdown(std::net::Shutdown::Write);
    let _ = outward.join();
}

/// In the step's first process (uid 0 of its namespaces, every capability there): the root,
/// the profile, then the command. Returns only on failure.
fn step_side(config: &BuildStepConfig, limited_by_cgroup: bool) -> JailError {
    match prepare_step(config, limited_by_cgroup) {
        Ok(()) => match &config.copy {
            Some(copy) => match merge_staged(copy) {
                // SAFETY: _exit ends this process at once; nothing is left to flush.
                Ok(()) => unsafe { libc::_exit(0) },
                Err(e) => e,
            },
            None => exec(config),
        },
        Err(e) => e,
    }
}

fn prepare_step(config: &BuildStepConfig, limited_by_cgroup: bool) -> Result<(), JailError> {
    // Still the host's root by id (unmapped here), which reaches the step's root through a
    // home only root may enter; files are made only after the switch below, so that they
    // belong to the range.
    let root = config.merged.as_str();
    crate::rootfs::do_mount(
        None,
        "/",
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
        "make / private",
    )?;
    // The overlay came from the helper's namespace, so it is locked here and pivot_root
    // refuses it: a bind of it made here is not.
    crate::rootfs::do_mount(
        Some(root),
        root,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
        "bind the step's root",
    )?;
    crate::rootfs::mount_proc(root)?;
    crate::rootfs::mount_dev_filesystems(root)?;
    std::env::set_current_dir(root).map_err(|e| JailError::io("chdir into the step's root", e))?;
    nix::unistd::pivot_root(".", ".")
        .map_err(|e| JailError::io("pivot_root into the step's root", e.into()))?;
    umount2(".", MntFlags::MNT_DETACH)
        .map_err(|e| JailError::io("detach the host's root", e.into()))?;
    std::env::set_current_dir("/").map_err(|e| JailError::io("chdir /", e))?;
    // Become the namespace's root; capabilities stay (the namespace gave them all).
    switch_user(0, 0)?;
    let _ = nix::unistd::sethostname("build");

    crate::rlimits::apply(&config.limits, limited_by_cgroup, limited_by_cgroup)?;
    keep_build_capabilities()?;
    crate::caps::set_no_new_privs()?;
    let program = crate::seccomp::build_filter(NetworkMode::Loopback)?;
    crate::seccomp::apply_filter(&program)?;
    let (uid, gid) = resolve_user(&config.user)?;
    if uid != 0 || gid != 0 {
        switch_user(uid, gid)?;
    }
    // After the switch: changing credentials clears it.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    std::env::set_current_dir(&config.workdir)
        .map_err(|e| JailError::io(format!("chdir {}", config.workdir), e))?;
    Ok(())
}

/// Merges the staging folder into `/`: folders that exist are kept as they are, new ones made;
/// files and links replace what is there.
fn merge_staged(copy: &CopyInto) -> Result<(), JailError> {
    let (uid, gid) = match &copy.chown {
        Some(user) => resolve_user(user)?,
        None => (0, 0),
    };
    merge_dir(
        Path::new(STAGING_POINT),
        Path::new("/"),
        uid,
        gid,
        copy.chmod,
    )
}

fn merge_dir(
    from: &Path,
    to: &Path,
    uid: u32,
    gid: u32,
    chmod: Option<u32>,
) -> Result<(), JailError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let entries =
        fs::read_dir(from).map_err(|e| JailError::io(format!("list {}", from.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| JailError::io(format!("list {}", from.display()), e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let meta = fs::symlink_metadata(&src)
            .map_err(|e| JailError::io(format!("stat {}", src.display()), e))?;
        let mode = chmod.unwrap_or(meta.mode() & 0o7777);
        let io = |what: &str| {
            let op = format!("{what} {}", dst.display());
            move |e: io::Error| JailError::io(op, e)
        };
        if meta.is_dir() {
            // A folder (or a link to one) that exists keeps its owner and mode.
            if fs::metadata(&dst).map(|m| m.is_dir()).unwrap_or(false) {
                merge_dir(&src, &dst, uid, gid, chmod)?;
                continue;
            }
            if fs::symlink_metadata(&dst).is_ok() {
                fs::remove_file(&dst).map_err(io("replace"))?;
            }
            fs::create_dir(&dst).map_err(io("make"))?;
            // Made here (a copied folder or a parent of the destination): `--chown`'s owner,
            // as BuildKit does; `--chmod` with search rights wherever it grants reading, so
            // that `--chmod=644` does not make a folder no one can enter.
            let folder_mode = match chmod {
                Some(m) => m | ((m & 0o444) >> 2),
                None => mode,
            };
            std::os::unix::fs::lchown(&dst, Some(uid), Some(gid)).map_err(io("chown"))?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(folder_mode))
                .map_err(io("chmod"))?;
            merge_dir(&src, &dst, uid, gid, chmod)?;
            continue;
        }
        match fs::symlink_metadata(&dst) {
            Ok(m) if m.is_dir() => {
                return Err(JailError::Config(format!(
                    "cannot copy a file over the folder {}",
                    dst.display()
                )));
            }
            Ok(_) => fs::remove_file(&dst).map_err(io("replace"))?,
            Err(_) => {}
        }
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&src).map_err(io("read the link for"))?;
            std::os::unix::fs::symlink(&target, &dst).map_err(io("link"))?;
            std::os::unix::fs::lchown(&dst, Some(uid), Some(gid)).map_err(io("chown"))?;
        } else {
            fs::copy(&src, &dst).map_err(io("copy to"))?;
            std::os::unix::fs::lchown(&dst, Some(uid), Some(gid)).map_err(io("chown"))?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(mode)).map_err(io("chmod"))?;
        }
    }
    Ok(())
}

/// Makes `target` (absolute) under `root` as a folder, refusing any symbolic link on the way,
/// so that a cache cannot be bound over a path outside the root.
fn mount_point(root: &str, target: &str, owner: Option<u32>) -> Result<String, JailError> {
    let mut path = std::path::PathBuf::from(root);
    for part in target.split('/').filter(|p| !p.is_empty() && *p != ".") {
        path.push(part);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(JailError::Config(format!(
                    "the cache target {target} passes through {} which is not a folder",
                    path.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&path)
                    .map_err(|e| JailError::io(format!("make {}", path.display()), e))?;
                if let Some(id) = owner {
                    std::os::unix::fs::lchown(&path, Some(id), Some(id))
                        .map_err(|e| JailError::io(format!("chown {}", path.display()), e))?;
                }
            }
            Err(e) => return Err(JailError::io(format!("inspect {}", path.display()), e)),
        }
    }
    Ok(path.to_string_lossy().into_owned())
}

/// Keeps only [`BUILD_CAPS`] in every set, the bounding set included.
fn keep_build_capabilities() -> Result<(), JailError> {
    let keep = BUILD_CAPS
        .iter()
        .fold(0u64, |bits, cap| bits | (1u64 << cap));
    for cap in 0..64u32 {
        if keep & (1 << cap) != 0 {
            continue;
        }
        match thread::remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1 << cap))
        {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL) if cap > 0 => break,
            Err(e) => {
                return Err(JailError::io(
                    format!("drop capability {cap} from the bounding set"),
                    e.into(),
                ));
            }
        }
    }
    let set = CapabilitySet::from_bits_retain(keep);
    thread::set_capabilities(
        None,
        CapabilitySets {
            effective: set,
            permitted: set,
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| JailError::io("capset to the build set", e.into()))
}

/// `USER` as ids: `uid[:gid]`, or names looked up in the root's `/etc/passwd` and
/// `/etc/group`.
fn resolve_user(user: &str) -> Result<(u32, u32), JailError> {
    let (name, group) = match user.split_once(':') {
        Some((n, g)) => (n, Some(g)),
        None => (user, None),
    };
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    // `root` is uid 0 even in an image without /etc/passwd.
    let name = if name == "root" && lookup(&passwd, |f| f[0] == "root").is_none() {
        "0"
    } else {
        name
    };
    let (uid, primary) = match name.parse::<u32>() {
        Ok(uid) => (
            uid,
            lookup(&passwd, |f| f[2] == name).map_or(uid, |f| f[3].parse().unwrap_or(uid)),
        ),
        Err(_) => {
            let fields = lookup(&passwd, |f| f[0] == name).ok_or_else(|| {
                JailError::Config(format!(
                    "USER {name}: no such user in the image's /etc/passwd"
                ))
            })?;
            (
                fields[2].parse().unwrap_or(u32::MAX),
                fields[3].parse().unwrap_or(u32::MAX),
            )
        }
    };
    let gid = match group {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = fs::read_to_string("/etc/group").unwrap_or_default();
                lookup(&groups, |f| f[0] == g)
                    .and_then(|f| f[2].parse().ok())
                    .ok_or_else(|| {
                        JailError::Config(format!(
                            "USER {user}: no such group in the image's /etc/group"
                        ))
                    })?
            }
        },
    };
    if uid >= ID_RANGE_SIZE || gid >= ID_RANGE_SIZE {
        return Err(JailError::Config(format!(
            "USER {user}: ids must be below {ID_RANGE_SIZE}"
        )));
    }
    Ok((uid, gid))
}

fn lookup(table: &str, matches: impl Fn(&[&str]) -> bool) -> Option<Vec<&str>> {
    table
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && matches(f))
}

fn switch_user(uid: u32, gid: u32) -> Result<(), JailError> {
    let g = rustix::thread::Gid::from_raw_unchecked(gid);
    rustix::thread::set_thread_groups(&[]).map_err(|e| JailError::io("setgroups([])", e.into()))?;
    thread::set_thread_res_gid(g, g, g)
        .map_err(|e| JailError::io(format!("setresgid({gid})"), e.into()))?;
    let u = rustix::thread::Uid::from_raw_unchecked(uid);
    thread::set_thread_res_uid(u, u, u)
        .map_err(|e| JailError::io(format!("setresuid({uid})"), e.into()))
}

fn exec(config: &BuildStepConfig) -> JailError {
    let to_c = |s: &str| CString::new(s).map_err(|_| JailError::Config(format!("'{s}' has a NUL")));
    let argv: Result<Vec<CString>, _> = config.argv.iter().map(|a| to_c(a)).collect();
    let mut env: Vec<(String, String)> = config.env.clone();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push((
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ));
    }
    if config.ca_bundle.is_some() {
        for name in CA_VARIABLES {
            if !env.iter().any(|(k, _)| k == name) {
                env.push((name.to_string(), CA_BUNDLE.into()));
            }
        }
    }
    if config.egress_socket.is_some() {
        let proxy = format!("http://{PROXY_ADDR}");
        for name in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"] {
            if !env.iter().any(|(k, _)| k == name) {
                env.push((name.into(), proxy.clone()));
            }
        }
    }
    let envp: Result<Vec<CString>, _> =
        env.iter().map(|(k, v)| to_c(&format!("{k}={v}"))).collect();
    let (argv, envp) = match (argv, envp) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let program = &config.argv[0];
    // A bare name is looked up in the step's PATH, as a shell would.
    let err = if program.contains('/') {
        nix::unistd::execve(&argv[0], &argv, &envp)
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let found = path
            .split(':')
            .map(|dir| format!("{dir}/{program}"))
            .find(|p| Path::new(p).is_file());
        match found.map(|p| to_c(&p)) {
            Some(Ok(p)) => nix::unistd::execve(&p, &argv, &envp),
            Some(Err(e)) => return e,
            None => {
                return JailError::Config(format!("{program}: not found in PATH ({path})"));
            }
        }
    };
    match err {
        Err(e) => JailError::io(format!("execute {program}"), e.into()),
        Ok(never) => match never {},
    }
}
