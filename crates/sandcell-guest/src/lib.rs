//! The Sandcell guest agent: runs as PID 1 inside a sandbox and serves the host over one
//! inherited Unix stream socket (handshake, exec with streaming and tree kill, background
//! processes with buffered output to reattach to, pseudo-terminals, reaping, process listing
//! and file operations confined to the sandbox's file roots).
//!
//! Everything runs on one single-threaded tokio runtime; blocking file and `/proc` work goes
//! to a few worker threads started up front. Children are spawned with
//! `std::process::Command` and reaped by one reaper task, never by tokio's process driver,
//! because as PID 1 we also inherit orphans.

// Policy: unsafe code lives only in sandcell-jail.
#![forbid(unsafe_code)]

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use sandcell_protocol::{FILE_ROOTS, FrameError, IsolationReport};

mod attach;
mod egress;
mod exec;
mod files;
mod kernels;
mod out;
mod poller;
mod ports;
mod process;
mod procs;
mod reads;
mod reaper;
mod server;
mod shared;
mod sync;
mod workers;

pub use egress::{
    EgressBridge, EgressSwitch, SwitchError, egress_switch, relay_listener as egress_relay,
};

/// How the agent behaves: where files may be touched, how processes start, what to report.
#[derive(Debug, Clone)]
pub struct GuestConfig {
    /// Directories the file API may touch; relative request paths resolve against the first.
    pub file_roots: Vec<PathBuf>,
    /// Working directory of execs that do not name one; relative `cwd`s resolve against it.
    pub default_cwd: PathBuf,
    /// Environment every exec starts from, before the request's own variables.
    pub base_env: Vec<(String, String)>,
    /// The isolation report returned in `HelloOk`.
    pub isolation: IsolationReport,
    /// True only when the agent really is PID 1 of a pid namespace: it then reaps every
    /// orphan and, on exit, kills every process in the namespace.
    pub pid1: bool,
    /// Where the host connects again after a connection ends (a restarted daemon): the
    /// agent then keeps its kernels and processes and waits for the next connection instead
    /// of ending the sandbox. `None`: the first connection's end is the sandbox's end.
    pub listener: Option<std::sync::Arc<std::os::unix::net::UnixListener>>,
    /// The sandbox's egress: loopback ports relayed to the host's egress proxy (`None`: no
    /// egress proxy is bound, e.g. the network is `off`). [`Self::switch`] closes and opens
    /// it (gVisor checkpoints).
    pub egress: Option<EgressBridge>,
    /// What closes the agent's egress bridge and preview connections before a gVisor
    /// checkpoint and opens them after (this runsc cannot save a TCP socket an epoll set
    /// watches): the process's [`egress_switch`], which the gVisor entry point drives. Tests
    /// give each agent its own, so that closing one leaves the others alone.
    pub switch: &'static EgressSwitch,
}

impl Default for GuestConfig {
    fn default() -> Self {
        let env = [
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("HOME", "/home/sandbox"),
            ("USER", "sandbox"),
            ("LOGNAME", "sandbox"),
            ("SHELL", "/bin/bash"),
            ("LANG", "C.UTF-8"),
            ("TERM", "xterm-256color"),
            ("TMPDIR", "/tmp"),
        ];
        Self {
            file_roots: FILE_ROOTS.iter().map(PathBuf::from).collect(),
            default_cwd: PathBuf::from("/workspace"),
            base_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            isolation: IsolationReport::default(),
            pid1: false,
            listener: None,
            egress: None,
            switch: egress_switch(),
        }
    }
}

impl GuestConfig {
    /// With the egress bridge to [`sandcell_protocol::EGRESS_SOCKET`] and the proxy variables,
    /// without looking the socket up first (the gVisor agent is told by its `--egress`
    /// argument).
    pub fn with_egress(mut self) -> Self {
        self.base_env.extend(
            egress::proxy_env()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        self.egress = Some(EgressBridge::standard(std::path::PathBuf::from(
            sandcell_protocol::EGRESS_SOCKET,
        )));
        self
    }

    /// With the egress bridge, and the proxy variables in every exec's environment, when the
    /// host bound its egress proxy's socket into the sandbox (every network but `off`).
    pub fn with_egress_if_bound(self) -> Self {
        let socket = std::path::Path::new(sandcell_protocol::EGRESS_SOCKET);
        // The folder is bound only for sandboxes with egress; a launcher forked ahead of
        // time can start the agent before the host listens in it (gVisor may not report
        // mount roots, but binds the folder after the host listens).
        let bound = sandcell_jail::rootfs::skeleton::is_mount_root(std::path::Path::new(
            sandcell_protocol::EGRESS_DIR,
        ));
        if bound || socket.exists() {
            let mut config = self.with_egress();
            // The process backend's proxy shares this kernel: it takes the sockets.
            if let Some(bridge) = &mut config.egress {
                bridge.hand_over = true;
            }
            config
        } else {
            self
        }
    }
}

/// Why the agent stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The tokio runtime could not be built.
    #[error("cannot start the agent's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The host socket could not be set up.
    #[error("cannot use the host socket: {0}")]
    Socket(#[source] std::io::Error),
    /// SIGCHLD could not be watched, so children could not be reaped.
    #[error("cannot watch for exited children: {0}")]
    Reaper(#[source] std::io::Error),
    /// Reading from the host failed (other than a clean end of stream).
    #[error("reading from the host failed: {0}")]
    Read(#[source] std::io::Error),
    /// The host sent a frame after which the stream cannot be trusted.
    #[error("the host sent a frame that breaks the stream: {0}")]
    Frame(#[source] FrameError),
}

/// Serves the host on `stream` until it closes the stream or sends `Shutdown`, then kills
/// every process the agent started (whole trees) and returns.
pub fn serve(stream: UnixStream, config: GuestConfig) -> Result<(), GuestError> {
    // The socket was inherited without close-on-exec; children must never get it.
    let flags =
        rustix::io::fcntl_getfd(stream.as_fd()).map_err(|e| GuestError::Socket(e.into()))?;
    rustix::io::fcntl_setfd(stream.as_fd(), flags | rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| GuestError::Socket(e.into()))?;
    stream.set_nonblocking(true).map_err(GuestError::Socket)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(GuestError::Runtime)?;
    runtime.block_on(server::run(stream, config))
}
