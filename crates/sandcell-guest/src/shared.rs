//! The state every request handler and task of the agent shares: configuration, file roots,
//! the writer queue, the reaper, the tables of processes, kernels and requests in flight.
//! It outlives connections: a host that connects again finds it as it was.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::GuestConfig;
use crate::files::Roots;
use crate::kernels::{HostNews, Kernels};
use crate::out::Out;
use crate::process::{Proc, Processes};
use crate::procs::{self, Tree};
use crate::reads::ReadWindows;
use crate::reaper::Reaper;
use crate::workers::Workers;

/// Worker threads for file operations and process listings (kills have their own).
const GENERAL_WORKERS: usize = 2;

/// One running foreground exec, as the dispatcher and signal handling see it.
#[derive(Debug)]
pub(crate) struct ExecSlot {
    /// Its tracked process (pid, stdin queue, kill flag).
    pub proc: Arc<Proc>,
}

/// Requests in flight that tasks other than the dispatcher finish.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    /// Running foreground execs by request id.
    pub execs: HashMap<u32, ExecSlot>,
    /// Ids of other requests still being answered on a worker thread.
    pub busy: HashSet<u32>,
    /// Attachments by request id: their tasks, for `Detach`.
    pub attachments: HashMap<u32, tokio::task::AbortHandle>,
    /// Executions that may get host-call answers, by their `RunCode` request id: where the
    /// host's `HostCallReply`s for them go.
    pub host_calls: HashMap<u32, mpsc::UnboundedSender<HostNews>>,
}

/// State shared by the dispatcher and every task of one connection.
pub(crate) struct Shared {
    /// Threads for blocking work.
    pub workers: Workers,
    /// The agent's configuration.
    pub config: GuestConfig,
    /// Really PID 1 of a pid namespace (config asked for it and getpid() agrees).
    pub pid1: bool,
    /// The file roots.
    pub roots: Roots,
    /// Token in every exec's environment (`SANDCELL_SESSION`).
    pub session: String,
    /// The agent's pid.
    pub me: i32,
    /// The agent's process group (0 when it lies outside our pid namespace).
    pub my_pgid: i32,
    /// The writer queue.
    pub out: Out,
    /// The reaper.
    pub reaper: Arc<Reaper>,
    /// Requests in flight.
    pub tables: Mutex<Tables>,
    /// Every process started by an exec, by pid (outlives requests and connections).
    pub processes: Processes,
    /// Language kernels, by context.
    pub kernels: Kernels,
    /// Windows of the windowed file reads in flight.
    pub reads: ReadWindows,
    /// The protocol version the host greeted with (0 before a hello): host calls go to a
    /// host of version 2 or later only.
    pub protocol: AtomicU32,
}

impl Shared {
    /// The state of an agent with pid `me` (`pid1`: really PID 1 of a pid namespace), whose
    /// replies go to `out`.
    pub fn new(config: GuestConfig, me: i32, pid1: bool, reaper: Arc<Reaper>, out: Out) -> Self {
        // As PID 1 our group usually lies outside the pid namespace: getpgid says 0 then, as
        // /proc does (nix, unlike rustix, does not assert against it).
        let my_pgid = nix::unistd::getpgid(None).map_or(0, |p| p.as_raw());
        Self {
            workers: Workers::new(GENERAL_WORKERS),
            roots: Roots::new(&config.file_roots),
            kernels: Kernels::new(&config.default_cwd),
            config,
            pid1,
            session: session_token(me),
            me,
            my_pgid,
            out,
            reaper,
            tables: Mutex::new(Tables::default()),
            processes: Processes::default(),
            reads: ReadWindows::default(),
            protocol: AtomicU32::new(0),
        }
    }

    /// The process tree of a tracked process.
    pub fn proc_tree(&self, proc: &Proc) -> Tree {
        // Once the main process is collected its pid may be reused: only the environment
        // tag still identifies the tree then.
        let live = if proc.state().reaped {
            Vec::new()
        } else {
            vec![proc.pid]
        };
        Tree {
            roots: live.clone(),
            groups: live,
            session: self.session.clone(),
            tag: Some(proc.tree),
            any_exec: false,
            me: self.me,
            my_pgid: self.my_pgid,
        }
    }

    /// Every process this session started, for the final kill.
    pub fn everything(&self) -> Tree {
        let live = self.processes.live_pids();
        Tree {
            roots: live.clone(),
            groups: live,
            session: self.session.clone(),
            tag: None,
            any_exec: true,
            me: self.me,
            my_pgid: self.my_pgid,
        }
    }

    /// Whether `pid` was started by this session (directly or as a descendant).
    pub fn owns(&self, pid: i32) -> bool {
        let mains: HashSet<i32> = self.processes.live_pids().into_iter().collect();
        if procs::environ_exec_id(pid, &self.session).is_some() {
            return true;
        }
        let mut cur = pid;
        // Bounded walk up the parent chain.
        for _ in 0..256 {
            if mains.contains(&cur) {
                return true;
            }
            match procs::read_stat(cur) {
                Some(p) if p.ppid > 1 && p.ppid != self.me => cur = p.ppid,
                _ => return false,
            }
        }
        false
    }
}

fn session_token(me: i32) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{me}-{n}-{nanos}")
}
