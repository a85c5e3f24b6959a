//! Tracked processes: every exec's main process, by pid, with ring buffers of its recent
//! stdout and stderr, its stdin queue and terminal, and its exit once it has one; and the
//! requests that use them by pid (stdin, resize, release; attaching is [`crate::attach`]).
//!
//! Nothing here belongs to the request or the connection that started a process: its task
//! writes into the entry, and requests read from the entry. An entry lives from the spawn
//! until it is released: a foreground exec's when its exit is sent on its request; a
//! background exec's on `ReleaseProcess`, when [`EXITED_PROCESSES_KEPT`] later exits push it
//! out, or when its pid is reused.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sandcell_protocol::exec::EXITED_PROCESSES_KEPT;
use sandcell_protocol::{ErrorCode, ExecExit, GuestMessage, ProcessInfo, WireError};
use tokio::sync::{mpsc, oneshot, watch};

use crate::sync::lock;

/// Largest stdout/stderr chunk forwarded in one frame.
pub(crate) const OUTPUT_CHUNK: usize = 64 * 1024;

/// What the host sends to a process's stdin.
#[derive(Debug)]
pub(crate) enum StdinMsg {
    /// Bytes to write.
    Data(Vec<u8>),
    /// End of input.
    Close,
    /// Answered once everything queued before it is written: false when the process closed
    /// its stdin and input was dropped.
    Flush(oneshot::Sender<bool>),
}

/// The last `cap` bytes of a stream, and how many it has had in all.
#[derive(Debug)]
pub(crate) struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
    total: u64,
}

/// Bytes read from a [`Ring`].
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Slice {
    /// Bytes asked for that are no longer buffered (they came before `at`).
    pub lost: u64,
    /// Offset of the first byte of `bytes`.
    pub at: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl Ring {
    /// An empty ring keeping up to `cap` bytes (memory is taken as output arrives).
    pub fn new(cap: usize) -> Self {
        Self {
            buf: VecDeque::new(),
            cap,
            total: 0,
        }
    }

    /// Appends `bytes`, dropping the oldest ones past the capacity.
    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(self.cap)..];
        let over = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        let needed = self.buf.len() + bytes.len();
        if needed > self.buf.capacity() {
            // Grow geometrically but never past the cap, so a 1 MiB ring takes 1 MiB.
            let target = needed.max(self.buf.capacity() * 2).min(self.cap);
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend(bytes);
    }

    /// Bytes the stream has had in all: the offset after its last byte.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Offset of the oldest byte still buffered.
    pub fn start(&self) -> u64 {
        self.total - self.buf.len() as u64
    }

    /// Up to `max` bytes from `offset` (an offset past the end reads nothing).
    pub fn read(&self, offset: u64, max: usize) -> Slice {
        let start = self.start();
        let from = offset.clamp(start, self.total);
        let skip = usize::try_from(from - start).unwrap_or(usize::MAX);
        let n = (self.buf.len() - skip).min(max);
        let mut bytes = Vec::with_capacity(n);
        let (a, b) = self.buf.as_slices();
        if skip < a.len() {
            let end = (skip + n).min(a.len());
            bytes.extend_from_slice(&a[skip..end]);
            bytes.extend_from_slice(&b[..n - (end - skip)]);
        } else {
            let s = skip - a.len();
            bytes.extend_from_slice(&b[s..s + n]);
        }
        Slice {
            lost: start.saturating_sub(offset),
            at: from,
            bytes,
        }
    }
}

/// A process's terminal, as the agent holds it: the master side, non-blocking.
pub(crate) type PtyMaster = Arc<crate::poller::PolledFd>;

/// What changes while a tracked process runs.
#[derive(Debug)]
pub(crate) struct ProcState {
    /// Stdout (0) and stderr (1).
    pub rings: [Ring; 2],
    /// The input queue, until stdin is closed or the process ends.
    pub stdin: Option<mpsc::UnboundedSender<StdinMsg>>,
    /// The process was started with a stdin the host may write (a pipe or a terminal).
    pub has_stdin: bool,
    /// Its terminal, until it ends.
    pub pty: Option<PtyMaster>,
    /// The main process has been collected: its pid may be reused.
    pub reaped: bool,
    /// The host killed the tree (reported as `killed` in the exit).
    pub killed: bool,
    /// How it ended, once its output is drained too; nothing is appended after this is set.
    pub exit: Option<ExecExit>,
}

/// One tracked process.
#[derive(Debug)]
pub(crate) struct Proc {
    /// Pid inside the sandbox (also its process group, and with a pty its session).
    pub pid: i32,
    /// Its tree's tag, never given twice by this agent (also tells entries of one pid apart).
    pub tree: u64,
    /// The exec request that started it.
    pub exec_id: u32,
    /// Its command line, as `/proc/PID/cmdline` shows it (space-joined).
    pub cmdline: String,
    /// Start, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Started as a background exec.
    pub background: bool,
    /// Runs on a terminal.
    pub is_pty: bool,
    /// Its exec timeout, reported to attachments for the exit message.
    pub timeout_ms: Option<u64>,
    state: Mutex<ProcState>,
    /// Bumped on every change, so attachments wake up.
    changed: watch::Sender<u64>,
}

/// What a new [`Proc`] is made from.
pub(crate) struct NewProc {
    pub pid: i32,
    pub tree: u64,
    pub exec_id: u32,
    pub cmdline: String,
    pub background: bool,
    pub timeout_ms: Option<u64>,
    pub buffer_bytes: usize,
    pub stdin: Option<mpsc::UnboundedSender<StdinMsg>>,
    pub pty: Option<PtyMaster>,
}

impl Proc {
    /// A running process.
    pub fn new(p: NewProc) -> Self {
        let started_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self {
            pid: p.pid,
            tree: p.tree,
            exec_id: p.exec_id,
            cmdline: p.cmdline,
            started_at_ms,
            background: p.background,
            is_pty: p.pty.is_some(),
            timeout_ms: p.timeout_ms,
            state: Mutex::new(ProcState {
                rings: [Ring::new(p.buffer_bytes), Ring::new(p.buffer_bytes)],
                has_stdin: p.stdin.is_some(),
                stdin: p.stdin,
                pty: p.pty,
                reaped: false,
                killed: false,
                exit: None,
            }),
            changed: watch::Sender::new(0),
        }
    }

    /// Its mutable state.
    pub fn state(&self) -> std::sync::MutexGuard<'_, ProcState> {
        lock(&self.state)
    }

    /// Appends output of stream `idx` (0 stdout, 1 stderr).
    pub fn append(&self, idx: usize, bytes: &[u8]) {
        self.state().rings[idx].push(bytes);
        self.bump();
    }

    /// Records the exit (after the last output) and lets go of stdin and the terminal.
    pub fn finish(&self, exit: ExecExit) {
        {
            let mut st = self.state();
            st.exit = Some(exit);
            st.stdin = None;
            st.pty = None;
        }
        self.bump();
    }

    /// Wakes up on every change after this call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Whether the ring of stream `idx` has dropped bytes.
    pub fn overflowed(&self, idx: usize) -> bool {
        self.state().rings[idx].start() > 0
    }

    /// This process as `ListProcesses` describes it; `live` is its `/proc` entry, if any.
    pub fn info(&self, live: Option<ProcessInfo>, me: i32) -> ProcessInfo {
        let st = self.state();
        let mut info = live.unwrap_or_else(|| ProcessInfo {
            pid: self.pid,
            ppid: me,
            pgid: self.pid,
            state: "X".into(),
            cmdline: self.cmdline.clone(),
            rss_bytes: 0,
            ..ProcessInfo::default()
        });
        info.exec_id = Some(self.exec_id);
        info.tracked = true;
        info.background = self.background;
        info.pty = self.is_pty;
        info.exited = st.reaped;
        info.exit = st.exit.clone();
        info.stdout_bytes = Some(st.rings[0].total());
        info.stderr_bytes = Some(st.rings[1].total());
        info.started_at_ms = Some(self.started_at_ms);
        info
    }
}

/// Every tracked process, by pid.
#[derive(Debug, Default)]
pub(crate) struct Processes {
    inner: Mutex<Table>,
    next_tree: AtomicU64,
}

#[derive(Debug, Default)]
struct Table {
    by_pid: HashMap<i32, Arc<Proc>>,
    /// Exited background processes kept, oldest exit first: (pid, tree).
    exited: VecDeque<(i32, u64)>,
}

impl Processes {
    /// A tree tag never given before.
    pub fn next_tree(&self) -> u64 {
        self.next_tree.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Tracks a new process; an old entry with the same (reused) pid is dropped.
    pub fn insert(&self, proc: Arc<Proc>) {
        let mut t = lock(&self.inner);
        let pid = proc.pid;
        if t.by_pid.insert(pid, proc).is_some() {
            t.exited.retain(|(p, _)| *p != pid);
        }
    }

    /// The tracked process `pid`.
    pub fn get(&self, pid: i32) -> Option<Arc<Proc>> {
        lock(&self.inner).by_pid.get(&pid).cloned()
    }

    /// The tracked process `pid`, or `NoSuchProcess`.
    pub fn find(&self, pid: i32) -> Result<Arc<Proc>, WireError> {
        self.get(pid).ok_or_else(|| {
            WireError::new(
                ErrorCode::NoSuchProcess,
                format!("no process with pid {pid} is tracked by the agent"),
            )
        })
    }

    /// The tracked process `pid` while its main process has not been collected.
    pub fn live(&self, pid: i32) -> Option<Arc<Proc>> {
        self.get(pid).filter(|p| !p.state().reaped)
    }

    /// Every tracked process.
    pub fn all(&self) -> Vec<Arc<Proc>> {
        lock(&self.inner).by_pid.values().cloned().collect()
    }

    /// Pids of the tracked processes not collected yet.
    pub fn live_pids(&self) -> Vec<i32> {
        self.all()
            .iter()
            .filter(|p| !p.state().reaped)
            .map(|p| p.pid)
            .collect()
    }

    /// Drops `proc`'s entry (unless its pid already belongs to a newer one).
    pub fn remove(&self, proc: &Proc) {
        let mut t = lock(&self.inner);
        if t.by_pid.get(&proc.pid).is_some_and(|p| p.tree == proc.tree) {
            t.by_pid.remove(&proc.pid);
            t.exited.retain(|(_, tree)| *tree != proc.tree);
        }
    }

    /// Keeps an exited background process, dropping the earliest exits past the cap.
    pub fn exited(&self, proc: &Proc) {
        let mut t = lock(&self.inner);
        if t.by_pid.get(&proc.pid).is_none_or(|p| p.tree != proc.tree) {
            return;
        }
        t.exited.push_back((proc.pid, proc.tree));
        while t.exited.len() > EXITED_PROCESSES_KEPT {
            let Some((pid, tree)) = t.exited.pop_front() else {
                break;
            };
            if t.by_pid.get(&pid).is_some_and(|p| p.tree == tree) {
                t.by_pid.remove(&pid);
            }
        }
    }

    /// Forgets an exited process (`ReleaseProcess`).
    pub fn release(&self, pid: i32) -> Result<(), WireError> {
        let proc = self.find(pid)?;
        if proc.state().exit.is_none() {
            return Err(WireError::new(
                ErrorCode::InvalidState,
                format!("pid {pid} is still running; only an exited process can be released"),
            ));
        }
        self.remove(&proc);
        Ok(())
    }
}

/// The stdin queue of `pid`, for `ProcessStdin`.
pub(crate) fn stdin_of(processes: &Processes, pid: i32) -> Result<Arc<Proc>, WireError> {
    let proc = processes.find(pid)?;
    let st = proc.state();
    if !st.has_stdin {
        return Err(WireError::new(
            ErrorCode::InvalidState,
            format!("pid {pid} has no stdin to write (it was started without stdin: true)"),
        ));
    }
    if st.exit.is_some() || st.reaped {
        return Err(WireError::new(
            ErrorCode::InvalidState,
            format!("pid {pid} has exited"),
        ));
    }
    if st.stdin.is_none() {
        return Err(WireError::new(
            ErrorCode::InvalidState,
            format!("the stdin of pid {pid} is closed"),
        ));
    }
    drop(st);
    Ok(proc)
}

/// Queues a message for `proc`'s stdin; false when its stdin is closed or it has ended.
pub(crate) fn send_stdin(proc: &Proc, msg: StdinMsg) -> bool {
    let mut st = proc.state();
    let close = matches!(msg, StdinMsg::Close);
    let sent = st.stdin.as_ref().is_some_and(|tx| tx.send(msg).is_ok());
    if close {
        st.stdin = None;
    }
    sent
}

/// Waits until everything queued for `proc`'s stdin so far is written (with `close`, closes
/// the stdin after it); the error says why not.
pub(crate) async fn flush_stdin(proc: &Proc, close: bool) -> Result<(), WireError> {
    let (tx, rx) = oneshot::channel();
    let pid = proc.pid;
    {
        let mut st = proc.state();
        // When the queue is gone (closed, or the process ended) the marker is dropped here or
        // with the queue, and `rx` says so; it must never outlive this block unsent.
        match &st.stdin {
            Some(q) => {
                let _ = q.send(StdinMsg::Flush(tx));
            }
            None => drop(tx),
        }
        if close && let Some(q) = st.stdin.take() {
            let _ = q.send(StdinMsg::Close);
        }
    }
    match rx.await {
        Ok(true) => Ok(()),
        Ok(false) => Err(WireError::new(
            ErrorCode::InvalidState,
            format!("pid {pid} closed its stdin; the input was dropped"),
        )),
        Err(_) => Err(WireError::new(
            ErrorCode::InvalidState,
            format!(
                "the stdin of pid {pid} was closed, or it ended, before the input was confirmed written"
            ),
        )),
    }
}

/// Serves `ProcessStdinClose`.
pub(crate) fn close_stdin(processes: &Processes, pid: i32) -> Result<GuestMessage, WireError> {
    let proc = processes.find(pid)?;
    if !proc.state().has_stdin {
        return Err(WireError::new(
            ErrorCode::InvalidState,
            format!("pid {pid} has no stdin to close (it was started without stdin: true)"),
        ));
    }
    // Closing twice, or after the end, changes nothing.
    send_stdin(&proc, StdinMsg::Close);
    Ok(GuestMessage::Ok)
}

/// Serves `Resize`.
pub(crate) fn resize(
    processes: &Processes,
    pid: i32,
    rows: u16,
    cols: u16,
) -> Result<GuestMessage, WireError> {
    let proc = processes.find(pid)?;
    if !proc.is_pty {
        return Err(WireError::new(
            ErrorCode::InvalidState,
            format!("pid {pid} does not run on a pty"),
        ));
    }
    let Some(master) = proc.state().pty.clone() else {
        return Err(WireError::new(
            ErrorCode::InvalidState,
            format!("pid {pid} has exited"),
        ));
    };
    sandcell_jail::pty::set_size(master.as_fd(), rows, cols).map_err(|e| {
        WireError::new(
            ErrorCode::Io,
            format!("cannot resize the pty of pid {pid}: {e}"),
        )
    })?;
    Ok(GuestMessage::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_last_bytes_and_counts_them_all() {
        let mut r = Ring::new(8);
        r.push(b"abcde");
        assert_eq!((r.start(), r.total()), (0, 5));
        r.push(b"fghij");
        assert_eq!((r.start(), r.total()), (2, 10));
        let all = r.read(0, 100);
        assert_eq!((all.lost, all.at, all.bytes), (2, 2, b"cdefghij".to_vec()));
        let some = r.read(5, 3);
        assert_eq!((some.lost, some.at, some.bytes), (0, 5, b"fgh".to_vec()));
        let past = r.read(99, 100);
        assert_eq!((past.lost, past.at, past.bytes.len()), (0, 10, 0));
        // One push larger than the ring keeps its own tail.
        r.push(b"0123456789XY");
        assert_eq!(r.read(0, 100).bytes, b"456789XY");
        assert_eq!((r.start(), r.total()), (14, 22));
    }

    #[test]
    fn a_ring_reads_across_its_wrap_point() {
        let mut r = Ring::new(16);
        let mut all = Vec::new();
        for i in 0..50u8 {
            let chunk = [i, i.wrapping_mul(7), i ^ 0x55];
            r.push(&chunk);
            all.extend_from_slice(&chunk);
            let start = usize::try_from(r.start()).unwrap();
            for from in start..all.len() {
                let got = r.read(from as u64, 5);
                let end = (from + 5).min(all.len());
                assert_eq!(got.bytes, &all[from..end], "push {i}, from {from}");
            }
        }
        assert!(r.buf.capacity() <= 32, "capacity {}", r.buf.capacity());
    }

    #[test]
    fn a_zero_sized_ring_keeps_nothing_but_counts() {
        let mut r = Ring::new(0);
        r.push(b"abc");
        let got = r.read(0, 10);
        assert_eq!((got.lost, got.at, got.bytes.len()), (3, 3, 0));
    }
}
