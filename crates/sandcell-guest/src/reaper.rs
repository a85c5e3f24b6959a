//! The one place that waits for children.
//!
//! As PID 1 we inherit every orphan of the sandbox, so the reaper collects any child
//! (`waitpid(-1)`) and hands the statuses of tracked exec pids to their exec tasks. When we are
//! not PID 1 (tests, several agents in one process) it waits only for the pids it tracks, so it
//! never steals another waiter's child.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, WaitOptions, WaitStatus, wait, waitpid};
use tokio::signal::unix::Signal;
use tokio::sync::oneshot;

use crate::sync::lock;

/// How a child ended and when the agent noticed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reaped {
    /// Exit code for a normal exit.
    pub exit_code: Option<i32>,
    /// Terminating signal.
    pub signal: Option<i32>,
    /// Whether the signal dumped core.
    pub core_dumped: bool,
    /// When the status was collected.
    pub at: Instant,
}

impl Reaped {
    fn from_status(status: WaitStatus) -> Self {
        Self {
            exit_code: status.exit_status(),
            signal: status.terminating_signal(),
            // WCOREDUMP: bit 0x80 of a signal status.
            core_dumped: status.signaled() && status.as_raw() & 0x80 != 0,
            at: Instant::now(),
        }
    }
}

/// Collects exited children and routes the statuses of tracked pids.
pub(crate) struct Reaper {
    pid1: bool,
    waiting: Mutex<HashMap<i32, oneshot::Sender<Reaped>>>,
}

impl Reaper {
    /// A reaper; `pid1` makes it collect every child, not only tracked ones.
    pub fn new(pid1: bool) -> Self {
        Self {
            pid1,
            waiting: Mutex::new(HashMap::new()),
        }
    }

    /// Tracks `pid`; its status arrives on the returned receiver. Call before yielding to
    /// the runtime after spawning, so the status cannot be collected untracked.
    pub fn watch(&self, pid: i32) -> oneshot::Receiver<Reaped> {
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(pid, tx);
        rx
    }

    /// Pids whose status has not been collected yet.
    pub fn tracked(&self) -> Vec<i32> {
        lock(&self.waiting).keys().copied().collect()
    }

    /// Collects every child that has ended, without blocking.
    /// Returns true when nothing is left to wait for.
    pub fn reap(&self) -> bool {
        if self.pid1 {
            self.reap_any()
        } else {
            for pid in self.tracked() {
                self.reap_one(pid);
            }
            lock(&self.waiting).is_empty()
        }
    }

    fn reap_any(&self) -> bool {
        // __WALL also collects children cloned with an exit signal other than SIGCHLD.
        let opts = WaitOptions::NOHANG | WaitOptions::from_bits_retain(libc::__WALL as u32);
        loop {
            // wait() is wait4(-1): any child. (rustix's waitpid(None) is wait4(0), which only
            // sees children in our own process group, and every exec has its own.)
            match wait(opts) {
                Ok(Some((pid, status))) => self.deliver(pid.as_raw_nonzero().get(), status),
                Ok(None) => return false,
                Err(Errno::INTR) => continue,
                Err(_) => return true,
            }
        }
    }

    fn reap_one(&self, pid: i32) {
        let Some(p) = Pid::from_raw(pid) else {
            lock(&self.waiting).remove(&pid);
            return;
        };
        loop {
            match waitpid(Some(p), WaitOptions::NOHANG) {
                Ok(Some((_, status))) => return self.deliver(pid, status),
                Ok(None) => return,
                Err(Errno::INTR) => continue,
                Err(_) => {
                    // Not our child (any more): stop tracking it rather than wait forever.
                    lock(&self.waiting).remove(&pid);
                    return;
                }
            }
        }
    }

    fn deliver(&self, pid: i32, status: WaitStatus) {
        // Stops and continues are not ends; only exits and kills are reported.
        if !status.exited() && !status.signaled() {
            return;
        }
        if let Some(tx) = lock(&self.waiting).remove(&pid) {
            let _ = tx.send(Reaped::from_status(status));
        }
    }

    /// Reaps on every SIGCHLD until the signal stream ends.
    pub async fn run(self: Arc<Self>, mut sigchld: Signal) {
        loop {
            self.reap();
            if sigchld.recv().await.is_none() {
                return;
            }
        }
    }

    /// Waits (blocking, bounded by `limit`) until every tracked pid has been collected, or
    /// in PID 1 mode until no child is left. Used at shutdown after the kill.
    pub fn reap_all_blocking(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.reap() || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
