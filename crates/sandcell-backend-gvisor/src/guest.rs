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

use std::os::unix::net::UnixStream;

use sandcell_jail::seccomp::{self, Profile};
use sandcell_jail::{JailError, NetworkMode, caps};

/// The argument after `__gvisor-guest` naming the sandbox's network policy.
pub const NETWORK_LOOPBACK: &str = "--network=loopback";
/// As [`NETWORK_LOOPBACK`], for `network: off` (seccomp refuses all but Unix sockets).
pub const NETWORK_OFF: &str = "--network=off";
/// The argument after the network's when the sandbox's egress folder is bound: the agent
/// then bridges to the proxy's socket without looking it up first (a looked-up host socket
/// in gVisor's dentry cache makes `runsc checkpoint` fail).
pub const EGRESS: &str = "--egress";

/// Whether the agent was started with [`EGRESS`].
pub fn egress_bound() -> bool {
    std::env::args().skip(3).any(|a| a == EGRESS)
}

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
    let host = sandcell_jail::stdin::take_socket()?;
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
