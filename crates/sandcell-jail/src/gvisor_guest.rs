//! What the guest agent does first when it starts as PID 1 of a gVisor sandbox: take its
//! host connection from stdin.
//!
//! The `gvisor` backend starts `sandcell __gvisor-guest` with one end of a socketpair as its
//! stdin (gVisor imports it as a connected Unix socket, and re-binds it to the new one a
//! restore is given, which is what lets a checkpoint be restored many times).
//!
//! Before anything else it confines itself the way the `process` backend's sandbox does:
//! `no_new_privs` and the seccomp filter (gVisor's kernel runs it on every syscall of the
//! agent and of everything it starts; a checkpoint carries it).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::caps;
use crate::config::NetworkMode;
use crate::error::JailError;
use crate::seccomp::{self, Profile};

/// The argument after `__gvisor-guest` naming the sandbox's network policy.
pub const NETWORK_LOOPBACK: &str = "--network=loopback";
/// As [`NETWORK_LOOPBACK`], for `network: off` (seccomp refuses all but Unix sockets).
pub const NETWORK_OFF: &str = "--network=off";

/// Confines the agent, takes the host connection (stdin), leaves `/dev/null` as stdin
/// (children must not inherit the connection) and returns the agent's end of a relay to it.
///
/// The agent does not use the host socket itself: after a restore this gVisor build no
/// longer reports readiness of a host-backed socket to epoll (blocking reads and writes
/// still work), so two threads copy between it and a socketpair inside gVisor, whose
/// readiness survives a restore like everything else in the sandbox's memory.
pub fn enter() -> Result<UnixStream, JailError> {
    // First, while this is the only thread: every thread and process after inherits it.
    confine(network_of(std::env::args().nth(2).as_deref())?)?;
    let host = take_stdin()?;
    let (agent, relay) =
        UnixStream::pair().map_err(|e| JailError::io("create the agent's relay", e))?;
    let clone = |s: &UnixStream| {
        s.try_clone()
            .map_err(|e| JailError::io("create the agent's relay", e))
    };
    let (host_in, relay_out) = (clone(&host)?, clone(&relay)?);
    std::thread::Builder::new()
        .name("host-in".into())
        .spawn(move || copy_until_end(host_in, relay_out))
        .map_err(|e| JailError::io("start the relay", e))?;
    std::thread::Builder::new()
        .name("host-out".into())
        .spawn(move || copy_until_end(relay, host))
        .map_err(|e| JailError::io("start the relay", e))?;
    Ok(agent)
}

/// The network policy named on the command line (none: loopback).
fn network_of(arg: Option<&str>) -> Result<NetworkMode, JailError> {
    match arg {
        None | Some(NETWORK_LOOPBACK) => Ok(NetworkMode::Loopback),
        Some(NETWORK_OFF) => Ok(NetworkMode::Off),
        Some(other) => Err(JailError::Config(format!("unknown argument {other:?}"))),
    }
}

/// `no_new_privs` (the bundle asks runsc for it too) and the `process` backend's seccomp
/// filter with gVisor's additions. The agent keeps `CAP_SYS_ADMIN` in gVisor's kernel for
/// `sethostname` after a restore, which the filter allows; with it gone from the bounding
/// set, nothing the agent starts has it.
fn confine(network: NetworkMode) -> Result<(), JailError> {
    caps::set_no_new_privs()?;
    let program = seccomp::build_profile(network, Profile::Gvisor)?;
    seccomp::apply_filter(&program)
}

/// Copies `from` to `to` with blocking calls until `from` ends, then ends `to`'s writing side
/// (the agent, or the host, sees the end).
fn copy_until_end(mut from: UnixStream, mut to: UnixStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// The host connection, from stdin.
fn take_stdin() -> Result<UnixStream, JailError> {
    let stdin = std::io::stdin().as_raw_fd();
    // Close-on-exec: without it every process the agent starts held the host connection
    // (fd 3 in every exec) and could talk to the host past the agent.
    // SAFETY: fd 0 is open (the backend always passes the socket there) and nothing else in
    // this process owns it: the agent has not started; the duplicate is the stream's own fd.
    let dup = unsafe { libc::fcntl(stdin, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(JailError::last_os("take the host connection from stdin"));
    }
    // SAFETY: `dup` was just returned by fcntl(F_DUPFD_CLOEXEC) and is owned by nobody else.
    let socket = UnixStream::from(unsafe { OwnedFd::from_raw_fd(dup) });
    let null = std::fs::File::open("/dev/null").map_err(|e| JailError::io("open /dev/null", e))?;
    // SAFETY: both fds are open; dup2 only replaces fd 0, which nothing else uses now.
    if unsafe { libc::dup2(null.as_raw_fd(), stdin) } < 0 {
        return Err(JailError::last_os("replace stdin"));
    }
    Ok(socket)
}
