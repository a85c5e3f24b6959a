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
//!
//! Its stdout is the backend's control channel (another socketpair, re-bound by a restore
//! like stdin): one line per command (`<command> <tag>`), one line per answer (`ok <tag>` or
//! `error <tag> <why>`), served by a thread of its own.
//! [`SUSPEND_EGRESS`] closes the egress bridge and the preview connections before a
//! checkpoint (this runsc cannot save them open, see `sandcell_guest::EgressSwitch`),
//! [`RESUME_EGRESS`] opens the bridge again (and lets previews connect) in the restored
//! sandbox. The words stay as they were first named, for images checkpointed since.

use std::os::unix::net::UnixStream;

use sandcell_jail::seccomp::{self, Profile};
use sandcell_jail::{JailError, NetworkMode, caps};

/// The argument after `__gvisor-guest` naming the sandbox's network policy.
pub const NETWORK_LOOPBACK: &str = "--network=loopback";
/// As [`NETWORK_LOOPBACK`], for `network: off` (seccomp refuses all but Unix sockets).
pub const NETWORK_OFF: &str = "--network=off";
/// The argument after the network's when the sandbox's egress folder is bound (every
/// network but `off`): the agent then bridges to the proxy's socket without looking for it.
pub const EGRESS: &str = "--egress";

/// The control command that closes the agent's egress bridge (its listeners and every
/// connection) and its preview connections before a checkpoint; answered [`CONTROL_OK`]
/// once they are closed.
pub const SUSPEND_EGRESS: &str = "suspend-egress";
/// The control command that opens the bridge again; answered [`CONTROL_OK`] once it listens.
pub const RESUME_EGRESS: &str = "resume-egress";
/// The control command that asks whether a checkpoint would end the sandbox: answered
/// [`CONTROL_OK`] when nothing is known to, else [`CONTROL_ERROR`] naming the processes
/// ([`checkpoint_blockers`]). An agent from before it answers "unknown command".
pub const CHECKPOINT_BLOCKERS: &str = "checkpoint-blockers";
/// The answer to a command that was done: `ok <tag>`, the tag the command came with.
pub const CONTROL_OK: &str = "ok";
/// The answer to a command that failed: `error <tag> <why>`.
pub const CONTROL_ERROR: &str = "error";

/// How long the agent gives its bridge to close or open (the backend waits longer).
const SWITCH_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

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
    let control = take_control()?;
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
    if let Some(control) = control {
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || serve_control(control))
            .map_err(|e| JailError::io("start the control channel", e))?;
    }
    Ok(agent)
}

/// The control socket the backend gave as stdout, as a close-on-exec stream of its own, with
/// stdout then writing where stderr does (`None`: stdout is no socket, the agent was started
/// without a control channel).
fn take_control() -> Result<Option<UnixStream>, JailError> {
    use std::os::fd::AsFd;
    let stdout = std::io::stdout();
    let stat =
        rustix::fs::fstat(stdout.as_fd()).map_err(|e| JailError::io("inspect stdout", e.into()))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Socket {
        return Ok(None);
    }
    // Above the standard descriptors, so that nothing started later finds it by number.
    let control = rustix::io::fcntl_dupfd_cloexec(stdout.as_fd(), 3)
        .map_err(|e| JailError::io("take the control channel", e.into()))?;
    rustix::stdio::dup2_stdout(std::io::stderr())
        .map_err(|e| JailError::io("replace stdout", e.into()))?;
    Ok(Some(UnixStream::from(control)))
}

/// Answers the backend's commands until the channel ends. Blocking reads: after a restore
/// this runsc reports no readiness of a host-backed socket, and the read goes on on the
/// socket the restore was given.
pub(crate) fn serve_control(control: UnixStream) {
    use std::io::{BufRead, Write};
    let Ok(mut answers) = control.try_clone() else {
        return;
    };
    let mut lines = std::io::BufReader::new(control).lines();
    while let Some(Ok(line)) = lines.next() {
        // `<command> <tag>`: the answer repeats the tag, so that a late answer to a command
        // the backend gave up on is never taken for the next one's.
        let (command, tag) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let switch = sandcell_guest::egress_switch();
        let done = match command {
            SUSPEND_EGRESS => switch.suspend(SWITCH_LIMIT).map_err(|e| e.to_string()),
            RESUME_EGRESS => switch.resume(SWITCH_LIMIT).map_err(|e| e.to_string()),
            CHECKPOINT_BLOCKERS => {
                checkpoint_blockers(std::path::Path::new("/proc"), std::process::id())
            }
            other => Err(format!("unknown command {other:?}")),
        };
        let answer = match done {
            Ok(()) => format!("{CONTROL_OK} {tag}\n"),
            Err(why) => format!("{CONTROL_ERROR} {tag} {why}\n"),
        };
        if answers.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Processes this runsc cannot checkpoint, named (with `Err`): `runsc checkpoint` panics on a
/// TCP socket an epoll instance watches ("endpoint still has waiters upon save"), and a
/// failed save ends the sandbox. So a process holding both a TCP socket and an epoll
/// instance (an `asyncio` or Node.js server, say) is taken for one: gVisor's fdinfo does not
/// say what an epoll instance watches. `proc` is the procfs to read, `me` the process not to
/// count (the agent, whose own sockets are closed by then).
pub(crate) fn checkpoint_blockers(proc: &std::path::Path, me: u32) -> Result<(), String> {
    let tcp_sockets = tcp_inodes(proc);
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let (mut epoll, mut tcp) = (false, false);
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            if target == "anon_inode:[eventpoll]" {
                epoll = true;
            } else if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
                && tcp_sockets.contains(&inode)
            {
                tcp = true;
            }
        }
        if epoll && tcp {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            found.push(format!("{pid} ({})", comm.trim()));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    found.sort();
    Err(format!(
        "process {} holds TCP sockets and an epoll instance (a server listening with asyncio \
         or Node.js, say), which this gVisor cannot checkpoint without ending the sandbox; \
         stop it (or close its sockets) and snapshot again",
        found.join(", ")
    ))
}

/// The inodes of the TCP sockets in `proc/net/tcp` and `tcp6` (of the reader's network
/// namespace).
fn tcp_inodes(proc: &std::path::Path) -> std::collections::HashSet<u64> {
    ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(proc.join(table)).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| line.split_whitespace().nth(9)?.parse::<u64>().ok())
                .filter(|inode| *inode != 0)
                .collect::<Vec<_>>()
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    /// A Python child running `code`, once it printed its first line.
    fn child(code: &str) -> std::process::Child {
        let mut c = Command::new("python3")
            .args(["-c", code])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("ready");
        c
    }

    fn named(pid: u32) -> bool {
        match checkpoint_blockers(std::path::Path::new("/proc"), std::process::id()) {
            Ok(()) => false,
            Err(why) => why.contains(&format!("{pid} (")),
        }
    }

    #[test]
    fn a_server_with_tcp_sockets_in_epoll_is_named_and_a_plain_socket_is_not() {
        let mut server = child(
            "import asyncio\nasync def m():\n    await asyncio.start_server(lambda r, w: None, '127.0.0.1', 0)\n    print('ready', flush=True)\n    await asyncio.sleep(60)\nasyncio.run(m())",
        );
        let mut plain = child(
            "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\nprint('ready', flush=True)\ntime.sleep(60)",
        );
        let (server_pid, plain_pid) = (server.id(), plain.id());
        assert!(named(server_pid), "the asyncio server was not named");
        assert!(
            !named(plain_pid),
            "a socket no epoll instance has was named"
        );
        let why = checkpoint_blockers(std::path::Path::new("/proc"), std::process::id())
            .expect_err("a blocker");
        assert!(why.contains("python3") && why.contains("epoll"), "{why}");
        for c in [&mut server, &mut plain] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(!named(server_pid));
    }
}
