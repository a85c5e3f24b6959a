//! The launcher: `sandcell __jail`, a single-threaded helper the host spawns per sandbox.
//!
//! Protocol with the host, over the one socket it receives as stdin:
//! 1. the host sends a [`JailConfig`] as a message frame on id 0;
//! 2. the launcher sets up cgroups, clones the sandbox's first process into new user, pid,
//!    mount, net, ipc, uts (and cgroup) namespaces, writes its id maps, and sends
//!    `Launched { host_pid, report, cgroup }` on id 0;
//! 3. it releases the child, closes its copy of the socket and waits: when the sandbox's
//!    PID 1 exits (the whole pid namespace dies with it) it removes the cgroups and exits.
//!
//! The child finishes the setup from inside (rootfs, loopback, rlimits, Landlock,
//! capabilities, seccomp) and returns [`Outcome::Sandbox`] so the caller can run the guest
//! agent in it. Any failure is sent as `LaunchFailed { stage, message }` before exiting.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use sandcell_protocol::{
    FeatureState, Frame, FrameDecoder, GuestMessage, IsolationReport, SANDBOX_UID, encode_message,
};

use crate::cgroup::SandboxCgroup;
use crate::cgroup::spares::CgroupSpares;
use crate::config::{JailConfig, NetworkMode, SparesConfig};
use crate::error::JailError;
use crate::netns_pool::{NetnsPool, TakenNetns};
use crate::{caps, landlock_policy, net, rlimits, rootfs, seccomp};

/// The fd the socket to the host is moved to in the launcher and the sandbox.
pub const SOCKET_FD: RawFd = 3;

/// What the caller should do after [`run`] returns.
pub enum Outcome {
    /// This process is the sandbox's PID 1, fully confined: serve the guest agent on
    /// `socket`. `isolation` lists what the inside setup achieved.
    Sandbox {
        socket: UnixStream,
        isolation: IsolationReport,
        config: Box<JailConfig>,
        /// Where the host connects again after `socket` ends (see
        /// [`JailConfig::agent_socket`]).
        listener: Option<UnixListener>,
    },
    /// This process is the launcher and its sandbox is gone: exit with this code.
    Exit(i32),
}

/// Runs the launcher on the socket inherited as stdin. Must be called first thing in `main`,
/// while the process has one thread.
pub fn run() -> Outcome {
    run_on(0, None, false)
}

/// Whether this process has exactly one thread (so it may fork safely).
pub fn is_single_threaded() -> bool {
    ensure_single_threaded().is_ok()
}

/// Starts a launcher without an exec: forks this process and runs the launcher in the child
/// on `socket`, with `config` when given (else it reads one from the socket). Saves a process
/// start (about 1 ms). The child never returns: when it becomes the sandbox it calls
/// `on_sandbox` (which must not need this process's async runtime or signal handlers: the
/// copy of them is dead), then exits. Returns the launcher's pid.
///
/// Fails unless this process has exactly one thread.
pub fn fork_launcher(
    socket: OwnedFd,
    config: Option<JailConfig>,
    on_sandbox: fn(UnixStream, IsolationReport) -> i32,
) -> Result<i32, JailError> {
    ensure_single_threaded()?;
    match raw_clone(0).map_err(|e| JailError::io("fork the launcher", e))? {
        Some(pid) => Ok(pid.as_raw()),
        None => {
            // The host's environment may hold secrets; the sandbox gets none of it (but the
            // debugging switch, which take_socket reads).
            for (key, _) in std::env::vars_os().filter(|(k, _)| k != "SANDCELL_DEBUG") {
                // SAFETY: this forked child has a single thread, so nothing reads the
                // environment concurrently.
                unsafe { std::env::remove_var(key) };
            }
            // A forked child has the one thread that called fork, checked above.
            let code = match run_on(socket.as_raw_fd(), config, true) {
                Outcome::Exit(code) => code,
                Outcome::Sandbox {
                    socket, isolation, ..
                } => on_sandbox(socket, isolation),
            };
            // SAFETY: _exit ends this process without running the parent's atexit handlers or
            // flushing its copied stdio buffers, which belong to the parent.
            unsafe { libc::_exit(code) }
        }
    }
}

/// `config`, when given, is used instead of reading one from the socket; `single_threaded`
/// says the caller already knows this process has one thread.
fn run_on(from: RawFd, config: Option<JailConfig>, single_threaded: bool) -> Outcome {
    let mut socket = match take_socket(from) {
        Ok(s) => s,
        // Without the socket nobody can hear us; stderr is all we have.
        Err(e) => {
            eprintln!("sandcell jail: {e}");
            return Outcome::Exit(1);
        }
    };
    match launch(&mut socket, config, single_threaded) {
        Ok(Side::Sandbox {
            isolation,
            config,
            listener,
        }) => Outcome::Sandbox {
            socket,
            isolation,
            config,
            listener,
        },
        Ok(Side::Launcher {
            handover,
            pid,
            report,
            cgroup,
            netns,
            spares,
        }) => {
            let launched = GuestMessage::Launched {
                host_pid: pid.as_raw(),
                report,
                cgroup: cgroup.as_ref().map(SandboxCgroup::record),
            };
            match &handover {
                // If the host is gone there is nobody to tell; the exit code says the rest.
                Some(fd) => drop(send_with_fd(&socket, &launched, fd)),
                None => send(&mut socket, &launched),
            }
            drop(handover);
            // Close our copy: the socket is the agent's alone, and the host must see EOF as
            // soon as the agent is gone.
            drop(socket);
            // While the sandbox runs: drop the taken namespace's pool entry and make spares
            // for later sandboxes, at the lowest priority so that neither this sandbox's nor
            // the next one's start waits for it.
            lower_priority();
            if let Some(taken) = netns {
                taken.remove_entry();
            }
            if let Some((spares, parent)) = spares {
                let _ = NetnsPool::new(spares.netns_dir()).refill(spares.count);
                let _ = CgroupSpares::new(spares.cgroups_dir(&parent)).refill(
                    Path::new(CGROUP_ROOT),
                    &parent,
                    spares.count,
                );
            }
            let code = wait_for(pid);
            if let Some(cg) = &cgroup {
                // Normally empty already: the pid namespace died with its PID 1.
                let _ = cg.kill_all();
                let _ = cg.remove();
            }
            Outcome::Exit(code)
        }
        Err((stage, e)) => {
            send(
                &mut socket,
                &GuestMessage::LaunchFailed {
                    stage,
                    message: e.to_string(),
                },
            );
            Outcome::Exit(1)
        }
    }
}

/// Which side of the clone this process is on.
enum Side {
    Sandbox {
        isolation: IsolationReport,
        config: Box<JailConfig>,
        listener: Option<UnixListener>,
    },
    Launcher {
        /// The host's end of the agent's connection, made inside the sandbox (checkpointable).
        handover: Option<File>,
        pid: Pid,
        report: IsolationReport,
        cgroup: Option<SandboxCgroup>,
        /// The pooled network namespace the sandbox got, whose entry is still to remove.
        netns: Option<TakenNetns>,
        /// The pools to top up, and the cgroup parent.
        spares: Option<(SparesConfig, String)>,
    },
}

type StageResult<T> = Result<T, (String, JailError)>;

fn at<T>(stage: &str, r: Result<T, JailError>) -> StageResult<T> {
    r.map_err(|e| (stage.to_string(), e))
}

/// Moves the socket from `from` to [`SOCKET_FD`], points 0..2 at /dev/null (keeping stderr
/// when debugging) and closes every other inherited descriptor.
fn take_socket(from: RawFd) -> Result<UnixStream, JailError> {
    // Move the socket first: /dev/null opened before it could land on SOCKET_FD itself.
    if from != SOCKET_FD {
        dup_onto(from, SOCKET_FD)?;
    }
    let devnull = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| JailError::io("open /dev/null", e))?;
    dup_onto(devnull.as_raw_fd(), 0)?;
    dup_onto(devnull.as_raw_fd(), 1)?;
    if std::env::var_os("SANDCELL_DEBUG").is_none() {
        dup_onto(devnull.as_raw_fd(), 2)?;
    }
    drop(devnull);
    close_fds_from(SOCKET_FD + 1);
    set_cloexec(SOCKET_FD)?;
    // SAFETY: SOCKET_FD was just made a duplicate of the socket we inherited as stdin; nothing
    // else owns it, so this becomes its single owner.
    Ok(unsafe { UnixStream::from_raw_fd(SOCKET_FD) })
}

fn dup_onto(from: RawFd, to: RawFd) -> Result<(), JailError> {
    // SAFETY: dup2 only manipulates the descriptor table; `to` is one of our fixed slots
    // (0..=3), which no Rust object owns at this point of start-up.
    if unsafe { libc::dup2(from, to) } < 0 {
        return Err(JailError::last_os(format!("dup2 {from} -> {to}")));
    }
    Ok(())
}

fn set_cloexec(fd: RawFd) -> Result<(), JailError> {
    // SAFETY: fcntl F_SETFD on a descriptor we own; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(JailError::last_os("set close-on-exec on the host socket"));
    }
    Ok(())
}

/// Closes every descriptor numbered `first` or above (leaked ones from the host's shell too).
pub fn close_fds_from(first: RawFd) {
    // SAFETY: close_range only closes descriptors. Callers own no Rust objects wrapping fds
    // at or above `first` (start-up code, before any are created).
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    if r < 0 {
        // Kernels before 5.9: close them one by one.
        for fd in first..4096 {
            // SAFETY: as above; EBADF for unused slots is harmless.
            unsafe { libc::close(fd) };
        }
    }
}

fn read_config(socket: &mut UnixStream) -> Result<JailConfig, JailError> {
    let mut decoder = FrameDecoder::default();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(frame) = decoder.next_frame::<JailConfig>() {
            return match frame {
                Ok(Frame::Message { msg, .. }) => Ok(msg),
                Ok(Frame::Data { .. }) => {
                    Err(JailError::Config("expected a config message".into()))
                }
                Err(e) => Err(JailError::Config(e.to_string())),
            };
        }
        let n = socket
            .read(&mut buf)
            .map_err(|e| JailError::io("read the jail config", e))?;
        if n == 0 {
            return Err(JailError::Config(
                "the host closed the socket before sending a config".into(),
            ));
        }
        decoder.feed(&buf[..n]);
    }
}

fn send(socket: &mut UnixStream, msg: &GuestMessage) {
    // If the host is gone there is nobody to tell; the exit code says the rest.
    let _ = socket.write_all(&encode_message(0, msg));
}

fn launch(
    socket: &mut UnixStream,
    preset: Option<JailConfig>,
    single_threaded: bool,
) -> StageResult<Side> {
    if !single_threaded {
        at("threads", ensure_single_threaded())?;
    }
    let config = match preset {
        Some(config) => config,
        None => at("config", read_config(socket))?,
    };
    // A new session: no controlling terminal, and the host's terminal signals don't reach us.
    let _ = nix::unistd::setsid();

    let mut report = IsolationReport::default();
    let root = nix::unistd::geteuid().is_root();
    let (outside_uid, outside_gid) = if root {
        // Host root's supplementary groups (gid 0, …) would still grant group access to host
        // files from inside; drop them before the child inherits them.
        at(
            "setgroups",
            nix::unistd::setgroups(&[]).map_err(JailError::from),
        )?;
        (config.outside_uid, config.outside_gid)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    };
    report.set(
        "uid_map",
        FeatureState::Active,
        format!("uid/gid {SANDBOX_UID} inside -> {outside_uid}/{outside_gid} outside (no other ids mapped)"),
    );

    // The go channel: a datagram socket pair, so the cgroup's files can travel with the flags.
    let (go_child, go_launcher) = at("go channel", go_channel())?;
    let spares = config.spares.as_ref().filter(|_| root);
    let checkpointable = config.is_checkpointable();
    // CRIU dumps only namespaces owned by the sandbox's user namespace: no pooled one.
    let pooled_netns = spares
        .filter(|_| !checkpointable)
        .and_then(enter_pooled_netns);
    // Bound here, on the host, before the namespaces: the host can reach it by its path.
    let listener = at(
        "agent socket",
        config
            .agent_socket
            .as_deref()
            .map(bind_agent_socket)
            .transpose(),
    )?;
    // Host folders are opened here, as host root (a folder only root may enter still
    // mounts), their owner shown as the sandbox user; the child attaches them.
    let trees = if root {
        at(
            "mounts",
            rootfs::mounts::detach_all(&config.mounts, outside_uid, outside_gid),
        )?
    } else {
        Vec::new()
    };
    let (child, ns_lines) = at("clone", clone_sandbox(pooled_netns.is_none()))?;
    for (name, detail) in ns_lines {
        report.set(name, FeatureState::Active, detail);
    }
    let Some(pid) = child else {
        drop(go_launcher);
        let isolation = sandbox_side(go_child, &config, trees, pooled_netns.is_some())?;
        report.merge(&isolation);
        if checkpointable {
            return Err(("exec the agent".into(), exec_agent(&report)));
        }
        return Ok(Side::Sandbox {
            isolation: report,
            config: Box::new(config),
            listener,
        });
    };
    drop(go_child);
    drop(trees);
    // The agent's alone: the launcher never accepts on it.
    drop(listener);
    if let Err(e) = write_id_maps(pid, outside_uid, outside_gid, checkpointable) {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(pid, None);
        return Err(("id maps".into(), e));
    }
    // Released: the child builds its root while we make its cgroup.
    let _ = go_send(&go_launcher, GO, &[]);
    let cgroup = create_cgroup(&config, spares, &mut report);
    // v1: the child moves itself in with files we open (writing "0" to `tasks` skips the
    // RCU grace period a move from outside waits for). v2: we move it from here.
    let self_join = cgroup.as_ref().and_then(SandboxCgroup::self_join_files);
    let cgroup = match cgroup {
        Some(cg) if self_join.is_none() => match cg.join(pid.as_raw() as u32) {
            Ok(()) => Some(cg),
            Err(e) => {
                let _ = cg.remove();
                cgroup_unavailable(&mut report, e);
                None
            }
        },
        other => other,
    };
    let mut flags = 0u8;
    if report.is_active("memory_limit") {
        flags |= MEMORY_BY_CGROUP;
    }
    if report.is_active("pids_limit") {
        flags |= PIDS_BY_CGROUP;
    }
    let fds: Vec<RawFd> = self_join.iter().flatten().map(AsRawFd::as_raw_fd).collect();
    let _ = go_send(&go_launcher, flags, &fds);
    let handover = if checkpointable {
        match go_receive(&go_launcher) {
            Some((HANDOVER, mut files)) if files.len() == 1 => files.pop(),
            _ => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(pid, None);
                if let Some(cg) = &cgroup {
                    let _ = cg.remove();
                }
                let e = JailError::Config("the sandbox did not hand over its connection".into());
                return Err(("host connection".into(), e));
            }
        }
    } else {
        None
    };
    Ok(Side::Launcher {
        handover,
        pid,
        report,
        cgroup,
        netns: pooled_netns,
        spares: config
            .spares
            .filter(|_| root)
            .map(|s| (s, config.cgroup_parent)),
    })
}

/// First thing in the agent [`exec_agent`] started (`sandcell __guest`): makes it
/// non-dumpable again (exec made it dumpable, which would let the sandbox's processes, of the
/// same uid, read its memory), and takes its host socket and isolation report.
pub fn executed_agent() -> Result<(UnixStream, IsolationReport), JailError> {
    nix::sys::prctl::set_dumpable(false)?;
    let isolation = std::env::var(ISOLATION_ENV)
        .ok()
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default();
    // SAFETY: this process has one thread (nothing has started any), so nothing reads the
    // environment concurrently.
    unsafe { std::env::remove_var(ISOLATION_ENV) };
    set_cloexec(SOCKET_FD)?;
    // SAFETY: exec_agent left the host socket open on SOCKET_FD across exec, and nothing else
    // in this fresh process owns it.
    Ok((unsafe { UnixStream::from_raw_fd(SOCKET_FD) }, isolation))
}

/// The environment variable carrying the isolation report across [`exec_agent`].
const ISOLATION_ENV: &str = "SANDCELL_ISOLATION";

/// Replaces this process with the agent from `/.sandcell`, the host socket kept on
/// [`SOCKET_FD`] and the isolation report in `SANDCELL_ISOLATION`. Returns only on failure.
fn exec_agent(report: &IsolationReport) -> JailError {
    use std::ffi::CString;
    let json = match serde_json::to_string(report) {
        Ok(j) => j,
        Err(e) => return JailError::Config(format!("encode the isolation report: {e}")),
    };
    // SAFETY: fcntl F_SETFD on the socket we own; no memory is passed.
    if unsafe { libc::fcntl(SOCKET_FD, libc::F_SETFD, 0) } < 0 {
        return JailError::last_os("keep the host socket across exec");
    }
    let (Ok(path), Ok(entry), Ok(env)) = (
        CString::new("/.sandcell/sandcell"),
        CString::new("__guest"),
        CString::new(format!("{ISOLATION_ENV}={json}")),
    ) else {
        return JailError::Config("a nul byte in the agent's arguments".into());
    };
    let argv = [path.as_ptr(), entry.as_ptr(), std::ptr::null()];
    let envp = [env.as_ptr(), std::ptr::null()];
    // SAFETY: both arrays are NULL-terminated and point at CStrings alive for the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    JailError::last_os("exec /.sandcell/sandcell")
}

/// Binds the agent's listening socket at `path` (replacing a stale one), readable and
/// writable by its owner only.
fn bind_agent_socket(path: &str) -> Result<UnixListener, JailError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(JailError::io(format!("remove the stale socket {path}"), e)),
    }
    let listener =
        UnixListener::bind(path).map_err(|e| JailError::io(format!("bind {path}"), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| JailError::io(format!("restrict {path}"), e))?;
    Ok(listener)
}

/// Moves this process into a spare network namespace from the pool, for the sandbox to
/// inherit; `None` (nothing changed) when the pool has none or entering it fails.
fn enter_pooled_netns(spares: &SparesConfig) -> Option<TakenNetns> {
    let taken = NetnsPool::new(spares.netns_dir()).take()?;
    match nix::sched::setns(&taken.fd, nix::sched::CloneFlags::CLONE_NEWNET) {
        Ok(()) => Some(taken),
        Err(_) => {
            taken.remove_entry();
            None
        }
    }
}

/// A connected pair of close-on-exec datagram sockets: (child's end, launcher's end).
fn go_channel() -> Result<(OwnedFd, OwnedFd), JailError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(JailError::from)
}

/// Sends one byte, with `fds` attached when there are any.
fn go_send(socket: &OwnedFd, byte: u8, fds: &[RawFd]) -> Result<(), JailError> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let payload = [byte];
    let iov = [io::IoSlice::new(&payload)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(|_| ())
    .map_err(JailError::from)
}

/// Receives one byte and any descriptors sent with it; `None` when the launcher is gone.
fn go_receive(socket: &OwnedFd) -> Option<(u8, Vec<File>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    let mut files = Vec::new();
    for cmsg in msg.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: SCM_RIGHTS just installed these descriptors in our table; nothing else
            // owns them.
            files.extend(fds.into_iter().map(|fd| unsafe { File::from_raw_fd(fd) }));
        }
    }
    (msg.bytes == 1).then_some((byte[0], files))
}

/// First message on the go channel: the id maps are written.
const GO: u8 = b'g';
/// From the child: the host's end of the agent's new connection (a checkpointable sandbox).
const HANDOVER: u8 = b'h';

/// Makes the agent's connection anew inside the sandbox's network namespace, its host end
/// going to the launcher (which passes it on with `Launched`) and its own end replacing
/// [`SOCKET_FD`]. CRIU can dump a socket only from the namespaces it dumps; the one the
/// host made lives in the host's.
fn hand_over_connection(go: &OwnedFd) -> Result<(), JailError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (agent, host) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    go_send(go, HANDOVER, &[host.as_raw_fd()])?;
    dup_onto(agent.as_raw_fd(), SOCKET_FD)?;
    set_cloexec(SOCKET_FD)
}

/// Sends `msg` with `fd` attached: the host's end of a checkpointable sandbox's connection.
fn send_with_fd(socket: &UnixStream, msg: &GuestMessage, fd: &File) -> Result<(), JailError> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let bytes = encode_message(0, msg);
    let fds = [fd.as_raw_fd()];
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [io::IoSlice::new(&bytes[sent..])];
        // The descriptor rides on the first byte only.
        let rights = [ControlMessage::ScmRights(&fds)];
        let cmsgs: &[ControlMessage] = if sent == 0 { &rights } else { &[] };
        sent += sendmsg::<()>(
            socket.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
    }
    Ok(())
}
/// Bits of the second message: which limits the cgroup enforces (the rest falls to rlimits).
const MEMORY_BY_CGROUP: u8 = 1;
const PIDS_BY_CGROUP: u8 = 2;

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The sandbox's cgroup with its limits: a spare made ahead of time when there is one (and
/// no cpu quota is asked, which spares are made without), else a new one. Failure is not
/// fatal: the report says why, and rlimits stand in.
fn create_cgroup(
    config: &JailConfig,
    spares: Option<&SparesConfig>,
    report: &mut IsolationReport,
) -> Option<SandboxCgroup> {
    let spare = spares
        .filter(|_| config.limits.cpu_millis.is_none())
        .and_then(|s| CgroupSpares::new(s.cgroups_dir(&config.cgroup_parent)).take());
    let created = match spare {
        Some(mut cg) => {
            cg.rename(&config.sandbox_id);
            match cg.limit(&config.limits) {
                Ok(features) => Ok((cg, features)),
                Err(e) => {
                    let _ = cg.remove();
                    Err(e)
                }
            }
        }
        None => SandboxCgroup::create(
            Path::new(CGROUP_ROOT),
            &config.cgroup_parent,
            &config.sandbox_id,
            &config.limits,
        ),
    };
    match created {
        Ok((cg, features)) => {
            for f in features {
                report.set(&f.name, f.state, f.detail);
            }
            Some(cg)
        }
        Err(e) => {
            cgroup_unavailable(report, e);
            None
        }
    }
}

fn cgroup_unavailable(report: &mut IsolationReport, e: JailError) {
    let why = format!("{e}; falling back to rlimits");
    report.set("cgroups", FeatureState::Unavailable, why);
    for name in ["memory_limit", "pids_limit", "cpu_limit"] {
        if report.is_active(name) {
            report.set(
                name,
                FeatureState::Unavailable,
                "the cgroup could not be joined",
            );
        }
    }
}

fn ensure_single_threaded() -> Result<(), JailError> {
    let threads = caps::thread_count()?;
    if threads != 1 {
        return Err(JailError::Config(format!(
            "the launcher must be single-threaded to clone safely, it has {threads} threads"
        )));
    }
    Ok(())
}

type NsLines = Vec<(&'static str, String)>;

/// Clones the sandbox's first process into fresh namespaces (a fresh network namespace too
/// unless `new_net` is false: the launcher entered a pooled one). Returns `None` in the child.
fn clone_sandbox(new_net: bool) -> Result<(Option<Pid>, NsLines), JailError> {
    let mut base = libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    if new_net {
        base |= libc::CLONE_NEWNET;
    }
    let net = if new_net {
        "own network namespace"
    } else {
        "own network namespace, made ahead of time by the host (the sandbox cannot reconfigure it)"
    };
    let lines: NsLines = vec![
        ("user_ns", "own user namespace".into()),
        ("pid_ns", "own pid namespace; the agent is PID 1".into()),
        ("mount_ns", "own mount namespace".into()),
        ("net_ns", net.into()),
        ("ipc_ns", "own ipc namespace".into()),
        ("uts_ns", "own uts namespace".into()),
    ];
    // The cgroup namespace is made by the child once it is in its own cgroup, so that
    // cgroup is the root of its view.
    let pid = raw_clone(base).map_err(|e| JailError::io("clone into new namespaces", e))?;
    Ok((pid, lines))
}

pub(crate) fn raw_clone(flags: libc::c_int) -> io::Result<Option<Pid>> {
    // SAFETY: the launcher is single-threaded (checked by ensure_single_threaded), so a
    // fork-style clone — no CLONE_VM, a NULL stack meaning "continue on a copy-on-write copy
    // of the current stack", SIGCHLD on exit — duplicates the process exactly like fork(2).
    // No locks can be held by another thread. The pointer arguments are NULL and unused.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(Pid::from_raw(pid as i32))),
    }
}

/// Maps the sandbox user to `uid`/`gid`. A checkpointable sandbox also maps ids 0 and 1 to
/// the two unprivileged host ids after them: CRIU acts as the namespace's root, and the
/// default `ping_group_range` ("1 0") it restores names both.
fn write_id_maps(pid: Pid, uid: u32, gid: u32, checkpointable: bool) -> Result<(), JailError> {
    let proc = format!("/proc/{pid}");
    let write = |file: &str, contents: String| {
        std::fs::write(format!("{proc}/{file}"), contents)
            .map_err(|e| JailError::io(format!("write {file} of the sandbox"), e))
    };
    write("setgroups", "deny".into())?;
    let map = |outside: u32| {
        let mut lines = format!("{SANDBOX_UID} {outside} 1\n");
        if checkpointable {
            lines.push_str(&format!("0 {} 2\n", outside + 1));
        }
        lines
    };
    write("uid_map", map(uid))?;
    write("gid_map", map(gid))?;
    Ok(())
}

/// Gives this process the lowest priority (nice 19). Not the idle class: this process takes
/// kernel locks (cgroup and mount creation) that sandbox starts wait for, and an idle-class
/// holder could be starved on a busy host.
fn lower_priority() {
    // Failure just leaves the priority as it was.
    let _ = rustix::process::setpriority_process(None, 19);
}

fn wait_for(pid: Pid) -> i32 {
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}

fn switch_ids(uid: u32, gid: u32) -> Result<(), JailError> {
    // SAFETY: raw setresgid/setresuid take plain integers. Raw syscalls (not glibc's
    // wrappers) because only this one thread exists and no broadcast is wanted.
    if unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) } < 0 {
        return Err(JailError::last_os("setresgid"));
    }
    // SAFETY: as above.
    if unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) } < 0 {
        return Err(JailError::last_os("setresuid"));
    }
    Ok(())
}

/// Inside the new namespaces: wait for the id maps, then confine this process. `net_ready`:
/// the network namespace came from the pool with `lo` up already.
fn sandbox_side(
    go: OwnedFd,
    config: &JailConfig,
    trees: Vec<rootfs::mounts::DetachedMount>,
    net_ready: bool,
) -> StageResult<IsolationReport> {
    // The launcher died or failed to map us: there is nothing to serve.
    let gone = || {
        let e = JailError::Config("the launcher went away".into());
        ("wait for the launcher".to_string(), e)
    };
    match go_receive(&go) {
        Some((GO, _)) => {}
        _ => return Err(gone()),
    }
    if config.is_checkpointable() {
        at("host connection", hand_over_connection(&go))?;
    }
    // Files we create must be owned by a mapped id (else EOVERFLOW). Uid 0 is not mapped
    // in this namespace, so the kernel keeps our capabilities across this switch.
    at(
        "become the sandbox user",
        switch_ids(SANDBOX_UID, SANDBOX_UID),
    )?;

    let mut report = IsolationReport::default();
    for f in at("rootfs", rootfs::setup(config, trees))? {
        report.set(&f.name, f.state, f.detail);
    }
    let _ = nix::unistd::setsid();
    if let Ok(devnull) = File::options().read(true).write(true).open("/dev/null") {
        let _ = dup_onto(devnull.as_raw_fd(), 0);
        let _ = dup_onto(devnull.as_raw_fd(), 1);
        if std::env::var_os("SANDCELL_DEBUG").is_none() {
            let _ = dup_onto(devnull.as_raw_fd(), 2);
        }
    }
    at(
        "hostname",
        nix::unistd::sethostname(&config.hostname).map_err(JailError::from),
    )?;
    match config.network {
        NetworkMode::Loopback => {
            if !net_ready {
                at("loopback", net::loopback_up())?;
            }
            report.set(
                "network",
                FeatureState::Active,
                "loopback only: private network namespace with lo up",
            );
        }
        NetworkMode::Off => {
            report.set(
                "network",
                FeatureState::Active,
                "off: private network namespace, inet/inet6/netlink/packet sockets refused",
            );
        }
    }
    let filter = at("seccomp", seccomp::build_filter(config.network))?;
    // Nothing of the user's may run before we are in the cgroup. What the sandbox allocated
    // so far (its root's few files) stays charged to the host's cgroup.
    let Some((flags, self_join)) = go_receive(&go) else {
        return Err(gone());
    };
    drop(go);
    if !self_join.is_empty() {
        at("cgroup", crate::cgroup::join_self(self_join))?;
    }
    // In its cgroup now (moved by itself or by the launcher): make that the root of its view.
    let cgroup_ns = if config.is_checkpointable() {
        Err(nix::errno::Errno::ENOTSUP)
    } else {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
    };
    match cgroup_ns {
        Ok(()) => report.set(
            "cgroup_ns",
            FeatureState::Active,
            "own cgroup namespace, rooted at the sandbox's cgroup",
        ),
        Err(e) => report.set(
            "cgroup_ns",
            FeatureState::Unavailable,
            format!("unshare(CLONE_NEWCGROUP): {e}"),
        ),
    }
    let limits = rlimits::apply(
        &config.limits,
        flags & MEMORY_BY_CGROUP != 0,
        flags & PIDS_BY_CGROUP != 0,
    );
    for f in at("rlimits", limits)? {
        report.set(&f.name, f.state, f.detail);
    }
    at("no_new_privs", caps::set_no_new_privs())?;
    let nnp = caps::no_new_privs_feature();
    report.set(&nnp.name, nnp.state, nnp.detail);
    if config.landlock {
        let writable: Vec<&str> = config
            .tmpfs
            .iter()
            .map(|t| t.path.as_str())
            .chain(rootfs::WRITABLE_DEVICES.iter().copied())
            .collect();
        let f = at(
            "landlock",
            landlock_policy::restrict(rootfs::READABLE_TREES, &writable),
        )?;
        report.set(&f.name, f.state, f.detail);
    } else {
        report.set(
            "landlock",
            FeatureState::Disabled,
            if config.is_checkpointable() {
                "off in a checkpointable sandbox: CRIU cannot carry a Landlock domain"
            } else {
                "turned off by the sandbox's policy"
            },
        );
    }
    let f = at(
        "capabilities",
        caps::drop_privileges(SANDBOX_UID, SANDBOX_UID),
    )?;
    report.set(&f.name, f.state, f.detail);
    // Sandbox processes share our uid: without this they could open /proc/1/mem of the agent.
    let _ = nix::sys::prctl::set_dumpable(false);
    at("seccomp", seccomp::apply_filter(&filter))?;
    let f = seccomp::feature(config.network);
    report.set(&f.name, f.state, f.detail);
    Ok(report)
}
