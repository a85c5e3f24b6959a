//! Language kernels: one interpreter process per context, started and supervised here.
//!
//! A kernel speaks the protocol in `crates/sandcell-kernels/PROTOCOL.md` over two pipes
//! (requests in, events out); its fds 1 and 2 are pipes too, for output written below the
//! language (subprocesses, C code). One reader task per kernel merges the three into one
//! queue; the request being served consumes it. A context serves one request at a time;
//! interrupts are signals and need no turn.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sandcell_kernels::{
    CTL_FD_VAR, DEFAULT_OUTPUTS_DIR, DEFAULT_STREAM_LIMIT, EVENT_FD_VAR, OUTPUTS_DIR_VAR,
    PROTOCOL_VAR, STREAM_LIMIT_VAR,
};
use sandcell_protocol::code::{RestoreReport, StateReport};
use sandcell_protocol::{
    Artifact, CodeDone, CodeError, CodeStatus, Completeness, ContextInfo, ErrorCode, GuestMessage,
    Language, RunCodeRequest, Unrepresentable, VariableInfo, Variables, WireError, signal_name,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

mod events;

use events::{EventLines, MAX_EVENT_LINE, belongs_to, event_message, read_done};

use crate::procs::SESSION_VAR;
use crate::reaper::Reaped;
use crate::shared::Shared;
use crate::sync::lock;

/// How long a kernel may take to say it is ready (R is the slowest).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a kernel may take to answer a request other than `execute`.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a kernel may take to write or read a state file (large values take seconds).
const STATE_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest context id a restore may create.
const MAX_CONTEXT_ID: usize = 128;
/// After an interrupt for a timeout, how long the kernel has to yield before it is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// Files of the outputs folder looked at for artifacts, at most.
const ARTIFACT_SCAN_LIMIT: usize = 10_000;
/// Bytes read from a kernel's fd 1 or 2 at a time.
const FD_CHUNK: usize = 64 * 1024;

fn error(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

/// Everything a kernel sends, merged.
enum KernelOutput {
    /// A protocol line.
    Event(Value),
    /// Bytes from its fd 1.
    Stdout(Vec<u8>),
    /// Bytes from its fd 2.
    Stderr(Vec<u8>),
    /// The process ended.
    Exited(Reaped),
}

/// A running kernel process.
struct Kernel {
    ctl: pipe::Sender,
    out: mpsc::UnboundedReceiver<KernelOutput>,
    next_request: u64,
    execution_count: u64,
    /// Output of fd 1/2 that arrived between requests, for the next execution.
    early: Vec<KernelOutput>,
}

/// What a context holds between requests.
#[derive(Default)]
struct Slot {
    kernel: Option<Kernel>,
    /// Why the previous kernel died, until the next execution reports it.
    died: Option<String>,
}

/// One context.
struct Context {
    id: String,
    language: Language,
    cwd: String,
    env: BTreeMap<String, String>,
    slot: tokio::sync::Mutex<Slot>,
    busy: AtomicBool,
    /// The kernel's pid (0 without one), for signals that must not wait for the slot.
    pid: AtomicI32,
    execution_count: AtomicU64,
    /// Set when a restart or destroy kills the kernel under a running execution.
    killing: Mutex<Option<&'static str>>,
}

impl Context {
    fn info(&self) -> ContextInfo {
        let pid = self.pid.load(Ordering::SeqCst);
        ContextInfo {
            id: self.id.clone(),
            language: self.language,
            pid: (pid > 0).then_some(pid),
            execution_count: self.execution_count.load(Ordering::SeqCst),
            busy: self.busy.load(Ordering::SeqCst),
        }
    }

    /// Sends `signal` to the kernel and its process group.
    fn signal(&self, signal: i32) -> bool {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid <= 1 {
            return false;
        }
        let sig = nix::sys::signal::Signal::try_from(signal).ok();
        // The kernel leads its own group; its children (a shell's foreground command) are in it.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pid), sig);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).is_ok()
    }
}

/// Marks a context busy for the life of a request.
struct BusyGuard<'a>(&'a AtomicBool);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// The contexts of one connection.
#[derive(Default)]
pub(crate) struct Kernels {
    contexts: Mutex<BTreeMap<String, Arc<Context>>>,
    created: AtomicU64,
    /// Environment of every kernel (from `Prepare`); a context's own variables win.
    env: Mutex<BTreeMap<String, String>>,
    /// Files in the outputs folder at the last look.
    outputs_seen: std::sync::atomic::AtomicUsize,
    /// The outputs folder's stamp when the last look found it empty (see [`DirStamp`]).
    outputs_empty: Mutex<Option<DirStamp>>,
    /// Kernels being started now, and a wake-up when one is ready (or failed).
    starting: std::sync::atomic::AtomicUsize,
    started: tokio::sync::Notify,
}

/// Counts a kernel start while it lasts (from when it is decided, not only while it runs).
struct StartingGuard(Arc<Shared>);

impl StartingGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.kernels.starting.fetch_add(1, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for StartingGuard {
    fn drop(&mut self) {
        self.0.kernels.starting.fetch_sub(1, Ordering::SeqCst);
        self.0.kernels.started.notify_waiters();
    }
}

/// Waits (at most a kernel's start timeout) until no kernel is starting. On gVisor an exec
/// waits so (`GuestConfig::exec_waits_for_kernel_starts`): a checkpoint taken after an
/// exec overlapped a kernel's start restores, about one time in four with this runsc, an
/// agent that never answers (docs/gvisor.md).
pub(crate) async fn no_kernel_starting(shared: &Shared) {
    let k = &shared.kernels;
    let _ = tokio::time::timeout(START_TIMEOUT, async {
        loop {
            // Registered before the check, so a start ending in between still wakes us.
            let woken = k.started.notified();
            if k.starting.load(Ordering::SeqCst) == 0 {
                return;
            }
            woken.await;
        }
    })
    .await;
}

/// A directory's inode, size and modification time. While it is unchanged, an empty
/// directory is still empty: an entry added changes its size on tmpfs (where `/workspace`
/// is), and its mtime elsewhere. One `statx` instead of a listing, twice per execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirStamp {
    ino: u64,
    size: u64,
    mtime: (i64, u32),
}

fn dir_stamp(dir: &Path) -> Option<DirStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    Some(DirStamp {
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), u32::try_from(m.mtime_nsec()).unwrap_or(0)),
    })
}

impl Kernels {
    /// The context `id`, or the default context of `language` (created on first use).
    fn resolve(
        &self,
        id: Option<&str>,
        language: Option<Language>,
    ) -> Result<Arc<Context>, WireError> {
        let mut contexts = lock(&self.contexts);
        match (id, language) {
            (Some(id), lang) => {
                let ctx = match contexts.get(id) {
                    Some(c) => c.clone(),
                    None => match Language::parse(id).filter(|l| l.as_str() == id) {
                        // A default context may be named before its first use.
                        Some(l) => insert_default(&mut contexts, l),
                        None => {
                            return Err(error(
                                ErrorCode::NotFound,
                                format!("no context '{id}' in this sandbox"),
                            ));
                        }
                    },
                };
                if let Some(l) = lang.filter(|l| *l != ctx.language) {
                    return Err(error(
                        ErrorCode::InvalidArgument,
                        format!("context '{id}' runs {}, not {l}", ctx.language.as_str()),
                    ));
                }
                Ok(ctx)
            }
            (None, Some(l)) => Ok(match contexts.get(l.as_str()) {
                Some(c) => c.clone(),
                None => insert_default(&mut contexts, l),
            }),
            (None, None) => Err(error(
                ErrorCode::InvalidArgument,
                "name a context or a language",
            )),
        }
    }

    fn existing(&self, id: &str) -> Result<Arc<Context>, WireError> {
        self.resolve(Some(id), None)
    }

    fn all(&self) -> Vec<Arc<Context>> {
        lock(&self.contexts).values().cloned().collect()
    }
}

fn insert_default(
    contexts: &mut BTreeMap<String, Arc<Context>>,
    language: Language,
) -> Arc<Context> {
    let ctx = Arc::new(new_context(
        language.as_str().to_string(),
        language,
        None,
        BTreeMap::new(),
    ));
    contexts.insert(ctx.id.clone(), ctx.clone());
    ctx
}

fn new_context(
    id: String,
    language: Language,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
) -> Context {
    Context {
        id,
        language,
        cwd: cwd.unwrap_or_else(|| "/workspace".into()),
        env,
        slot: tokio::sync::Mutex::new(Slot::default()),
        busy: AtomicBool::new(false),
        pid: AtomicI32::new(0),
        execution_count: AtomicU64::new(0),
        killing: Mutex::new(None),
    }
}

// ------------------------------------------------------------------------------------------
// Starting a kernel

/// A pipe whose two ends are close-on-exec; the caller clears it on the child's end.
fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), WireError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| error(ErrorCode::Io, format!("create a kernel pipe: {e}")))
}

fn inheritable(fd: &OwnedFd) -> Result<(), WireError> {
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())
        .map_err(|e| error(ErrorCode::Io, format!("pass a pipe to the kernel: {e}")))
}

/// Starts the kernel of `ctx` and waits until it is ready.
async fn start_kernel(shared: &Arc<Shared>, ctx: &Context) -> Result<Kernel, WireError> {
    let _starting = StartingGuard::new(shared);
    let outputs = outputs_dir();
    // Best effort: a kernel without the folder still runs; it just has no artifacts.
    let _ = std::fs::create_dir_all(&outputs);
    let argv = sandcell_kernels::command(ctx.language);
    // The child's ends must be inheritable only while this (single-threaded) runtime spawns
    // this one process: no await between here and the drop below.
    let (ctl_read, ctl_write) = cloexec_pipe()?;
    let (event_read, event_write) = cloexec_pipe()?;
    inheritable(&ctl_read)?;
    inheritable(&event_write)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(shared.config.base_env.iter().map(|(k, v)| (k, v)))
        .envs(lock(&shared.kernels.env).iter())
        .envs(&ctx.env)
        .envs(sandcell_kernels::extra_env(ctx.language))
        .env(PROTOCOL_VAR, sandcell_kernels::PROTOCOL_VERSION.to_string())
        .env(CTL_FD_VAR, ctl_read.as_raw_fd().to_string())
        .env(EVENT_FD_VAR, event_write.as_raw_fd().to_string())
        .env(OUTPUTS_DIR_VAR, &outputs)
        .env(STREAM_LIMIT_VAR, DEFAULT_STREAM_LIMIT.to_string())
        .env(SESSION_VAR, &shared.session)
        .current_dir(&ctx.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so an interrupt or a kill reaches what it started.
        .process_group(0);
    let spawned = cmd.spawn();
    drop(ctl_read);
    drop(event_write);
    let mut child = spawned.map_err(|e| {
        error(
            ErrorCode::SpawnFailed,
            format!(
                "cannot start the {} kernel ({}): {e}",
                ctx.language, argv[0]
            ),
        )
    })?;
    let pid = i32::try_from(child.id())
        .map_err(|_| error(ErrorCode::Internal, "kernel pid out of range"))?;
    let exited = shared.reaper.watch(pid);
    // While the kernel starts: the kill thread must exist before user code can fork much.
    shared.workers.start_killer();
    let stdout = child.stdout.take().map(OwnedFd::from);
    let stderr = child.stderr.take().map(OwnedFd::from);
    // Dropping a std Child neither waits nor kills: the reaper collects it.
    drop(child);
    let to_pipe = |fd: Option<OwnedFd>| -> Result<pipe::Receiver, WireError> {
        let fd = fd.ok_or_else(|| error(ErrorCode::Internal, "kernel output pipe missing"))?;
        pipe::Receiver::from_owned_fd(fd)
            .map_err(|e| error(ErrorCode::Io, format!("watch the kernel's output: {e}")))
    };
    let (stdout, stderr) = (to_pipe(stdout)?, to_pipe(stderr)?);
    let events = pipe::Receiver::from_owned_fd(event_read)
        .map_err(|e| error(ErrorCode::Io, format!("watch the kernel's events: {e}")))?;
    let ctl = pipe::Sender::from_owned_fd(ctl_write)
        .map_err(|e| error(ErrorCode::Io, format!("talk to the kernel: {e}")))?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(read_kernel(events, stdout, stderr, exited, tx));
    let mut kernel = Kernel {
        ctl,
        out: rx,
        next_request: 1,
        execution_count: 0,
        early: Vec::new(),
    };
    let mut stderr_text = Vec::new();
    let ready = tokio::time::timeout(START_TIMEOUT, async {
        loop {
            match kernel.out.recv().await {
                Some(KernelOutput::Event(v)) if v["type"] == "ready" => return Ok(()),
                Some(KernelOutput::Event(_)) => {}
                Some(KernelOutput::Stderr(b)) => stderr_text.extend_from_slice(&b),
                Some(o @ KernelOutput::Stdout(_)) => kernel.early.push(o),
                Some(KernelOutput::Exited(r)) => return Err(describe_death(&r)),
                None => return Err("its output closed".to_string()),
            }
        }
    })
    .await;
    let failed = match ready {
        Ok(Ok(())) => None,
        Ok(Err(why)) => Some(why),
        Err(_) => Some(format!("not ready within {}s", START_TIMEOUT.as_secs())),
    };
    if let Some(why) = failed {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(-pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let tail = String::from_utf8_lossy(&stderr_text);
        let tail = tail.trim();
        let tail: String = tail
            .char_indices()
            .rev()
            .nth(2000)
            .map_or(tail, |(i, _)| &tail[i..])
            .to_string();
        let detail = if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr: {tail}")
        };
        return Err(error(
            ErrorCode::SpawnFailed,
            format!("the {} kernel failed to start: {why}{detail}", ctx.language),
        ));
    }
    if !stderr_text.is_empty() {
        kernel.early.push(KernelOutput::Stderr(stderr_text));
    }
    ctx.pid.store(pid, Ordering::SeqCst);
    ctx.execution_count.store(0, Ordering::SeqCst);
    Ok(kernel)
}

/// Merges a kernel's events, fd output and exit into one queue. Before a `done` event goes
/// out, whatever the kernel wrote to fds 1/2 so far is drained, so it lands in its execution.
async fn read_kernel(
    mut events: pipe::Receiver,
    mut stdout: pipe::Receiver,
    mut stderr: pipe::Receiver,
    mut exited: oneshot::Receiver<Reaped>,
    tx: mpsc::UnboundedSender<KernelOutput>,
) {
    let mut lines = EventLines::new(MAX_EVENT_LINE);
    let (mut out_open, mut err_open, mut events_open) = (true, true, true);
    let mut out_buf = Vec::with_capacity(FD_CHUNK);
    let mut err_buf = Vec::with_capacity(FD_CHUNK);
    let mut ev_buf = Vec::with_capacity(FD_CHUNK);
    loop {
        out_buf.clear();
        err_buf.clear();
        ev_buf.clear();
        let item = tokio::select! {
            biased;
            n = stdout.read_buf(&mut out_buf), if out_open => match n {
                Ok(n) if n > 0 => KernelOutput::Stdout(out_buf.clone()),
                _ => { out_open = false; continue; }
            },
            n = stderr.read_buf(&mut err_buf), if err_open => match n {
                Ok(n) if n > 0 => KernelOutput::Stderr(err_buf.clone()),
                _ => { err_open = false; continue; }
            },
            n = events.read_buf(&mut ev_buf), if events_open => {
                let parsed = match n {
                    Ok(n) if n > 0 => lines.feed(&ev_buf),
                    _ => {
                        events_open = false;
                        lines.finish().into_iter().collect()
                    }
                };
                for v in parsed {
                    if v["type"] == "done" {
                        for (fd, make) in [
                            (stdout.as_fd(), KernelOutput::Stdout as fn(Vec<u8>) -> KernelOutput),
                            (stderr.as_fd(), KernelOutput::Stderr),
                        ] {
                            let pending = drain_now(fd);
                            if !pending.is_empty() && tx.send(make(pending)).is_err() {
                                return;
                            }
                        }
                    }
                    if tx.send(KernelOutput::Event(v)).is_err() {
                        return;
                    }
                }
                continue;
            },
            r = &mut exited => {
                let r = r.unwrap_or(Reaped { exit_code: None, signal: None, core_dumped: false, at: Instant::now() });
                // What it wrote before dying; a child still holding the pipes may write on,
                // which nobody reads any more.
                for (fd, make) in [
                    (stdout.as_fd(), KernelOutput::Stdout as fn(Vec<u8>) -> KernelOutput),
                    (stderr.as_fd(), KernelOutput::Stderr),
                ] {
                    let pending = drain_now(fd);
                    if !pending.is_empty() {
                        let _ = tx.send(make(pending));
                    }
                }
                let _ = tx.send(KernelOutput::Exited(r));
                return;
            }
        };
        if tx.send(item).is_err() {
            return;
        }
    }
}

/// Reads what a non-blocking pipe holds right now (bounded), bypassing the reactor's view.
fn drain_now(fd: std::os::fd::BorrowedFd<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while out.len() < 4 * 1024 * 1024 {
        match rustix::io::read(fd, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

fn describe_death(r: &Reaped) -> String {
    match (r.signal, r.exit_code) {
        (Some(s), _) => format!(
            "killed by {} ({s}){}",
            signal_name(s),
            if r.core_dumped { ", core dumped" } else { "" }
        ),
        (None, Some(c)) => format!("exited with code {c}"),
        _ => "ended".to_string(),
    }
}

fn outputs_dir() -> String {
    DEFAULT_OUTPUTS_DIR.to_string()
}

// ------------------------------------------------------------------------------------------
// Requests

impl Kernel {
    async fn send(&mut self, mut req: Value) -> Result<u64, WireError> {
        let id = self.next_request;
        self.next_request += 1;
        req["id"] = json!(id);
        let mut line = req.to_string().into_bytes();
        line.push(b'\n');
        self.ctl
            .write_all(&line)
            .await
            .map_err(|e| error(ErrorCode::Io, format!("the kernel stopped reading: {e}")))?;
        Ok(id)
    }

    /// Sends a request and waits for its `reply`.
    async fn call(&mut self, req: Value) -> Result<Value, WireError> {
        self.call_within(req, REPLY_TIMEOUT).await
    }

    /// Sends a request and waits up to `limit` for its `reply`.
    async fn call_within(&mut self, req: Value, limit: Duration) -> Result<Value, WireError> {
        let id = self.send(req).await?;
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                out = self.out.recv() => match out {
                    Some(KernelOutput::Event(v)) if v["id"] == json!(id) && v["type"] == "reply" => {
                        if let Some(msg) = v["error"].as_str() {
                            return Err(error(ErrorCode::InvalidArgument, msg));
                        }
                        return Ok(v);
                    }
                    Some(KernelOutput::Event(_)) => {}
                    Some(o @ (KernelOutput::Stdout(_) | KernelOutput::Stderr(_))) => self.early.push(o),
                    Some(KernelOutput::Exited(r)) => {
                        self.early.push(KernelOutput::Exited(r));
                        return Err(error(ErrorCode::InvalidState, format!("the kernel died: {}", describe_death(&r))));
                    }
                    None => return Err(error(ErrorCode::InvalidState, "the kernel is gone")),
                },
                () = &mut deadline => {
                    return Err(error(ErrorCode::Internal, format!("the kernel did not answer within {}s", limit.as_secs())));
                }
            }
        }
    }
}

/// Ensures the context has a live kernel; returns whether a dead one was replaced and why
/// it had died.
async fn ensure_kernel(
    shared: &Arc<Shared>,
    ctx: &Context,
    slot: &mut Slot,
) -> Result<Option<String>, WireError> {
    // A kernel that died while idle: collect the news first.
    if let Some(k) = slot.kernel.as_mut() {
        let mut died = None;
        while let Ok(o) = k.out.try_recv() {
            match o {
                KernelOutput::Exited(r) => died = Some(describe_death(&r)),
                other => k.early.push(other),
            }
        }
        if let Some(KernelOutput::Exited(r)) = k
            .early
            .iter()
            .find(|o| matches!(o, KernelOutput::Exited(_)))
        {
            died = Some(describe_death(r));
        }
        if let Some(why) = died {
            slot.kernel = None;
            slot.died = Some(why);
            ctx.pid.store(0, Ordering::SeqCst);
        }
    }
    if slot.kernel.is_none() {
        slot.kernel = Some(start_kernel(shared, ctx).await?);
        return Ok(slot.died.take());
    }
    Ok(None)
}

/// Locks a context for one request, or says it is busy running code. (A kernel still
/// starting holds the lock too: that is waited for.)
async fn try_slot(ctx: &Context) -> Result<tokio::sync::MutexGuard<'_, Slot>, WireError> {
    if ctx.busy.load(Ordering::SeqCst) {
        return Err(error(
            ErrorCode::InvalidState,
            format!(
                "context '{}' is busy with another request; interrupt it or use another context",
                ctx.id
            ),
        ));
    }
    Ok(ctx.slot.lock().await)
}

/// `Prepare`: records the kernels' environment and starts the requested kernels in the
/// background.
pub(crate) fn prepare(
    shared: &Arc<Shared>,
    env: BTreeMap<String, String>,
    languages: Vec<Language>,
) -> Result<GuestMessage, WireError> {
    if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
        return Err(error(
            ErrorCode::InvalidArgument,
            format!("environment variable name {bad:?} is not valid"),
        ));
    }
    *lock(&shared.kernels.env) = env;
    for language in languages {
        let ctx = shared.kernels.resolve(None, Some(language))?;
        // Counted before the task runs, so an exec that comes right behind waits for it.
        let starting = StartingGuard::new(shared);
        let shared = shared.clone();
        tokio::spawn(async move {
            let _starting = starting;
            let mut slot = ctx.slot.lock().await;
            // A failure shows again, with its reason, on the first execution.
            let _ = ensure_kernel(&shared, &ctx, &mut slot).await;
        });
    }
    Ok(GuestMessage::Ok)
}

/// Serves `RunCode` on request `id`: events as they come, then `CodeDone`.
pub(crate) async fn run_code(shared: Arc<Shared>, id: u32, req: RunCodeRequest) {
    let out = shared.out.clone();
    let ctx = match shared.kernels.resolve(req.context.as_deref(), req.language) {
        Ok(c) => c,
        Err(e) => return out.error(id, e).await,
    };
    let mut slot = match try_slot(&ctx).await {
        Ok(s) => s,
        Err(e) => return out.error(id, e).await,
    };
    ctx.busy.store(true, Ordering::SeqCst);
    let _busy = BusyGuard(&ctx.busy);
    let started = Instant::now();
    let restarted_after = match ensure_kernel(&shared, &ctx, &mut slot).await {
        Ok(r) => r,
        Err(e) => return out.error(id, e).await,
    };
    let before = snapshot_outputs(&shared).await;
    let mut run = Run::new(&ctx, id, out.clone());
    let status = run
        .execute(
            &mut slot,
            &req.code,
            req.timeout_ms.map(Duration::from_millis),
        )
        .await;
    let artifacts = match before {
        Some(before) => changed_outputs(&shared, before).await,
        None => Vec::new(),
    };
    let Ended {
        status,
        exit_code,
        crash,
        crash_signal,
        state_lost,
    } = status;
    if state_lost {
        slot.kernel = None;
        // Reported by the next execution, which starts a fresh kernel.
        slot.died = crash.clone();
        ctx.pid.store(0, Ordering::SeqCst);
    }
    let mut notes = Vec::new();
    if let Some(why) = &restarted_after {
        notes.push(format!(
            "the previous kernel had died ({why}); this ran in a fresh kernel, so earlier \
             variables are gone"
        ));
    }
    if let Some(why) = &crash {
        notes.push(format!(
            "the kernel died ({why}); its state is lost and the next execution starts a fresh one"
        ));
    }
    for (name, dropped) in [("stdout", run.dropped[0]), ("stderr", run.dropped[1])] {
        if dropped > 0 {
            notes.push(format!(
                "{dropped} bytes of {name} were dropped past the output limit"
            ));
        }
    }
    let count = slot.kernel.as_ref().map_or(0, |k| k.execution_count);
    ctx.execution_count.store(count, Ordering::SeqCst);
    let done = CodeDone {
        context: ctx.id.clone(),
        language: ctx.language,
        status,
        execution_count: run.execution_count.unwrap_or(count),
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        exit_code,
        state_lost,
        kernel_restarted: restarted_after.is_some(),
        crash,
        crash_signal,
        notice: (!notes.is_empty()).then(|| notes.join("; ")),
        artifacts,
        stdout_dropped: run.dropped[0],
        stderr_dropped: run.dropped[1],
    };
    drop(slot);
    out.msg(id, &GuestMessage::CodeDone(Box::new(done))).await;
}

/// How an execution ended, as the supervisor saw it.
struct Ended {
    status: CodeStatus,
    exit_code: Option<i32>,
    crash: Option<String>,
    crash_signal: Option<i32>,
    state_lost: bool,
}

/// One execution being forwarded to the host.
struct Run<'a> {
    ctx: &'a Context,
    id: u32,
    out: crate::out::Out,
    limit: u64,
    /// Bytes of fd-level output forwarded, per stream.
    forwarded: [u64; 2],
    /// Bytes dropped past the limit (the kernel's and ours), per stream.
    dropped: [u64; 2],
    /// Incomplete UTF-8 sequences carried to the next chunk, per stream.
    partial: [Vec<u8>; 2],
    execution_count: Option<u64>,
}

impl<'a> Run<'a> {
    fn new(ctx: &'a Context, id: u32, out: crate::out::Out) -> Self {
        Self {
            ctx,
            id,
            out,
            limit: DEFAULT_STREAM_LIMIT,
            forwarded: [0; 2],
            dropped: [0; 2],
            partial: [Vec::new(), Vec::new()],
            execution_count: None,
        }
    }

    async fn execute(&mut self, slot: &mut Slot, code: &str, timeout: Option<Duration>) -> Ended {
        let Some(kernel) = slot.kernel.as_mut() else {
            return self.lost("no kernel", None).await;
        };
        for early in std::mem::take(&mut kernel.early) {
            match early {
                KernelOutput::Stdout(b) => self.fd_output(0, &b).await,
                KernelOutput::Stderr(b) => self.fd_output(1, &b).await,
                _ => {}
            }
        }
        let request = match kernel.send(json!({"op": "execute", "code": code})).await {
            Ok(r) => r,
            Err(e) => return self.lost(&e.message, None).await,
        };
        let started = tokio::time::Instant::now();
        let mut deadline = timeout.map(|t| started + t);
        let mut timed_out = false;
        loop {
            let next = tokio::select! {
                o = kernel.out.recv() => o,
                () = sleep_until(deadline) => {
                    if timed_out {
                        // It did not yield to the interrupt: kill it.
                        self.ctx.signal(libc::SIGKILL);
                        deadline = None;
                    } else {
                        timed_out = true;
                        self.ctx.signal(libc::SIGINT);
                        deadline = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                    }
                    continue;
                }
            };
            match next {
                Some(KernelOutput::Stdout(b)) => self.fd_output(0, &b).await,
                Some(KernelOutput::Stderr(b)) => self.fd_output(1, &b).await,
                Some(KernelOutput::Event(v)) => {
                    if !belongs_to(&v, request) {
                        continue;
                    }
                    if v["type"] == "done" {
                        self.flush_partial().await;
                        let done = read_done(&v, kernel.execution_count, timed_out);
                        kernel.execution_count = done.execution_count;
                        self.execution_count = Some(kernel.execution_count);
                        for (total, more) in self.dropped.iter_mut().zip(done.dropped) {
                            *total = total.saturating_add(more);
                        }
                        return Ended {
                            status: done.status,
                            exit_code: done.exit_code,
                            crash: None,
                            crash_signal: None,
                            state_lost: false,
                        };
                    }
                    self.event(v).await;
                }
                Some(KernelOutput::Exited(r)) => {
                    self.flush_partial().await;
                    let why = match *lock(&self.ctx.killing) {
                        Some(reason) => reason.to_string(),
                        None if timed_out => format!(
                            "killed after it did not yield to the timeout's interrupt within {}s",
                            INTERRUPT_GRACE.as_secs()
                        ),
                        None => describe_death(&r),
                    };
                    let mut ended = self.lost(&why, r.signal).await;
                    if timed_out {
                        ended.status = CodeStatus::Timeout;
                    }
                    return ended;
                }
                None => return self.lost("its output closed", None).await,
            }
        }
    }

    /// The kernel is gone: report it as an error event and a crash.
    async fn lost(&mut self, why: &str, signal: Option<i32>) -> Ended {
        let err = CodeError {
            ename: "KernelDied".into(),
            evalue: format!("the {} kernel died: {why}", self.ctx.language),
            traceback: Vec::new(),
        };
        self.out.msg(self.id, &GuestMessage::CodeError(err)).await;
        Ended {
            status: CodeStatus::Crashed,
            exit_code: None,
            crash: Some(why.to_string()),
            crash_signal: signal,
            state_lost: true,
        }
    }

    async fn event(&mut self, v: Value) {
        let msg = event_message(&v);
        self.out.msg(self.id, &msg).await;
    }

    /// Forwards fd-level output as text, within the limit (a marker says when it is cut).
    async fn fd_output(&mut self, stream: usize, bytes: &[u8]) {
        let room = self.limit.saturating_sub(self.forwarded[stream]);
        let len = bytes.len() as u64;
        if len <= room {
            self.forwarded[stream] += len;
            self.send_text(stream, bytes).await;
            return;
        }
        // room < len, so it fits in usize.
        let take = usize::try_from(room).unwrap_or(0);
        self.send_text(stream, &bytes[..take]).await;
        self.forwarded[stream] = self.limit;
        let first = self.dropped[stream] == 0;
        self.dropped[stream] += len - room;
        if first {
            self.flush_partial().await;
            let marker = format!(
                "\n[sandcell: output truncated after {} bytes]\n",
                self.limit
            );
            self.send_stream(stream, marker).await;
        }
    }

    /// Decodes UTF-8 across chunk boundaries (invalid bytes become U+FFFD).
    async fn send_text(&mut self, stream: usize, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut buf = std::mem::take(&mut self.partial[stream]);
        buf.extend_from_slice(bytes);
        let keep = incomplete_tail(&buf);
        let tail = buf.split_off(buf.len() - keep);
        self.partial[stream] = tail;
        if !buf.is_empty() {
            let text = String::from_utf8_lossy(&buf).into_owned();
            self.send_stream(stream, text).await;
        }
    }

    async fn flush_partial(&mut self) {
        for stream in 0..2 {
            let rest = std::mem::take(&mut self.partial[stream]);
            if !rest.is_empty() {
                let text = String::from_utf8_lossy(&rest).into_owned();
                self.send_stream(stream, text).await;
            }
        }
    }

    async fn send_stream(&self, stream: usize, text: String) {
        let name = if stream == 0 { "stdout" } else { "stderr" };
        self.out
            .msg(
                self.id,
                &GuestMessage::CodeStream {
                    name: name.into(),
                    text,
                },
            )
            .await;
    }
}

/// How many bytes at the end of `buf` start a UTF-8 sequence that is not complete yet.
fn incomplete_tail(buf: &[u8]) -> usize {
    let n = buf.len();
    for back in 1..=3.min(n) {
        let b = buf[n - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

// ------------------------------------------------------------------------------------------
// Artifacts

type OutputsSnapshot = BTreeMap<PathBuf, (u64, SystemTime)>;

/// Below this many files (at the last look) the outputs folder is scanned on the runtime
/// thread: cheaper than a hop to a worker thread and back, twice per execution.
const INLINE_SCAN_MAX: usize = 64;

/// Files in the outputs folder with their size and mtime (None when there is no folder).
async fn snapshot_outputs(shared: &Arc<Shared>) -> Option<OutputsSnapshot> {
    let dir = PathBuf::from(outputs_dir());
    // Taken before the listing: an entry added after it changes the stamp.
    let stamp = dir_stamp(&dir);
    if stamp.is_some() && *lock(&shared.kernels.outputs_empty) == stamp {
        return Some(BTreeMap::new());
    }
    let listed = dir.clone();
    let scan_all = move || {
        let mut out = BTreeMap::new();
        scan(&listed, 0, &mut out).then_some(out)
    };
    let last = shared.kernels.outputs_seen.load(Ordering::Relaxed);
    let snapshot = if last < INLINE_SCAN_MAX {
        scan_all()
    } else {
        shared.workers.run(scan_all).await.ok().flatten()
    };
    let seen = snapshot.as_ref().map_or(0, BTreeMap::len);
    shared.kernels.outputs_seen.store(seen, Ordering::Relaxed);
    // No files may still mean subfolders, whose new files the stamp would not show.
    let empty = seen == 0 && std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
    *lock(&shared.kernels.outputs_empty) = if empty { stamp } else { None };
    snapshot
}

fn scan(dir: &Path, depth: usize, out: &mut OutputsSnapshot) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return depth > 0;
    };
    for entry in entries.flatten() {
        if out.len() >= ARTIFACT_SCAN_LIMIT {
            break;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() && depth < 8 {
            scan(&entry.path(), depth + 1, out);
        } else if meta.is_file() {
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            out.insert(entry.path(), (meta.len(), mtime));
        }
    }
    true
}

async fn changed_outputs(shared: &Arc<Shared>, before: OutputsSnapshot) -> Vec<Artifact> {
    let Some(after) = snapshot_outputs(shared).await else {
        return Vec::new();
    };
    after
        .into_iter()
        .filter(|(path, meta)| before.get(path) != Some(meta))
        .map(|(path, (size, _))| Artifact {
            mime: mime_of(&path).to_string(),
            path: path.display().to_string(),
            size,
        })
        .collect()
}

/// A MIME type from a file name.
pub(crate) fn mime_of(path: &Path) -> &'static str {
    sandcell_protocol::mime_of_name(&path.to_string_lossy())
}

// ------------------------------------------------------------------------------------------
// Contexts and variables

/// `CreateContext`: a new context with its kernel started.
pub(crate) async fn create_context(
    shared: &Arc<Shared>,
    language: Language,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
) -> Result<GuestMessage, WireError> {
    if let Some(c) = &cwd
        && !c.starts_with('/')
    {
        return Err(error(
            ErrorCode::InvalidArgument,
            format!("cwd '{c}' must be an absolute path"),
        ));
    }
    // Checked here: a spawn into a missing directory fails as if the interpreter were missing.
    if let Some(c) = &cwd
        && !std::path::Path::new(c).is_dir()
    {
        return Err(error(
            ErrorCode::InvalidArgument,
            format!("cwd '{c}' is not a directory in the sandbox"),
        ));
    }
    if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
        return Err(error(
            ErrorCode::InvalidArgument,
            format!("environment variable name {bad:?} is not valid"),
        ));
    }
    // A context restored from a snapshot may hold a number already (see `load_state`).
    let id = loop {
        let n = shared.kernels.created.fetch_add(1, Ordering::SeqCst) + 1;
        let id = format!("{}-{n}", language.as_str());
        if !lock(&shared.kernels.contexts).contains_key(&id) {
            break id;
        }
    };
    let ctx = Arc::new(new_context(id.clone(), language, cwd, env));
    {
        let mut slot = ctx.slot.lock().await;
        slot.kernel = Some(start_kernel(shared, &ctx).await?);
    }
    lock(&shared.kernels.contexts).insert(id, ctx.clone());
    Ok(GuestMessage::Context {
        context: ctx.info(),
    })
}

/// `ListContexts`.
pub(crate) fn list_contexts(shared: &Shared) -> GuestMessage {
    GuestMessage::Contexts {
        contexts: shared.kernels.all().iter().map(|c| c.info()).collect(),
    }
}

/// `Interrupt`: SIGINT to the context's kernel (a no-op when nothing runs).
pub(crate) fn interrupt(shared: &Shared, context: &str) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.existing(context)?;
    if ctx.busy.load(Ordering::SeqCst) {
        ctx.signal(libc::SIGINT);
    }
    Ok(GuestMessage::Ok)
}

/// `RestartContext`: kills the kernel (ending a running execution) and starts a fresh one.
pub(crate) async fn restart(
    shared: &Arc<Shared>,
    context: &str,
) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.existing(context)?;
    kill_kernel(&ctx, "the kernel was restarted on request").await;
    let mut slot = ctx.slot.lock().await;
    *lock(&ctx.killing) = None;
    slot.kernel = Some(start_kernel(shared, &ctx).await?);
    slot.died = None;
    Ok(GuestMessage::Context {
        context: ctx.info(),
    })
}

/// `DestroyContext`.
pub(crate) async fn destroy(
    shared: &Arc<Shared>,
    context: &str,
) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.existing(context)?;
    lock(&shared.kernels.contexts).remove(&ctx.id);
    kill_kernel(&ctx, "the context was destroyed").await;
    Ok(GuestMessage::Ok)
}

/// Kills the context's kernel and waits until no request holds it.
async fn kill_kernel(ctx: &Context, reason: &'static str) {
    *lock(&ctx.killing) = Some(reason);
    ctx.signal(libc::SIGKILL);
    let mut slot = ctx.slot.lock().await;
    slot.kernel = None;
    slot.died = None;
    ctx.pid.store(0, Ordering::SeqCst);
    ctx.execution_count.store(0, Ordering::SeqCst);
}

/// Kills every kernel (the connection is ending).
pub(crate) fn kill_all(shared: &Shared) {
    for ctx in shared.kernels.all() {
        ctx.signal(libc::SIGKILL);
    }
}

/// Runs a non-execute kernel request on an idle context.
async fn kernel_call(shared: &Arc<Shared>, ctx: &Context, req: Value) -> Result<Value, WireError> {
    let mut slot = try_slot(ctx).await?;
    ensure_kernel(shared, ctx, &mut slot).await?;
    let Some(kernel) = slot.kernel.as_mut() else {
        return Err(error(ErrorCode::Internal, "no kernel"));
    };
    kernel.call(req).await
}

fn string_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn variables_supported(ctx: &Context) -> Result<(), WireError> {
    match ctx.language {
        Language::Python | Language::Node => Ok(()),
        other => Err(error(
            ErrorCode::InvalidArgument,
            format!("context variables are available for python and node, not {other}"),
        )),
    }
}

/// `IsComplete`.
pub(crate) async fn is_complete(
    shared: &Arc<Shared>,
    context: Option<&str>,
    language: Option<Language>,
    code: String,
) -> Result<GuestMessage, WireError> {
    let ctx = shared.kernels.resolve(context, language)?;
    let v = kernel_call(shared, &ctx, json!({"op": "is_complete", "code": code})).await?;
    let status = match v["status"].as_str() {
        Some("incomplete") => Completeness::Incomplete,
        Some("invalid") => Completeness::Invalid,
        _ => Completeness::Complete,
    };
    Ok(GuestMessage::Completeness {
        status,
        indent: v["indent"].as_str().map(str::to_string),
    })
}

/// A variables request to a Python or Node context.
async fn variables_call(
    shared: &Arc<Shared>,
    context: &str,
    req: Value,
) -> Result<Value, WireError> {
    let ctx = shared.kernels.existing(context)?;
    variables_supported(&ctx)?;
    kernel_call(shared, &ctx, req).await
}

/// `GetVariables`.
pub(crate) async fn get_variables(
    shared: &Arc<Shared>,
    context: &str,
    names: Option<Vec<String>>,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "get_vars", "names": names})).await?;
    let values = v["values"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let unrepresentable = v["unrepresentable"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, d)| {
                    (
                        k.clone(),
                        Unrepresentable {
                            type_name: d["type"].as_str().unwrap_or("?").to_string(),
                            repr: d["repr"].as_str().unwrap_or_default().to_string(),
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(GuestMessage::Variables(Variables {
        values,
        unrepresentable,
        missing: string_list(&v["missing"]),
    }))
}

/// `SetVariables`.
pub(crate) async fn set_variables(
    shared: &Arc<Shared>,
    context: &str,
    values: BTreeMap<String, Value>,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "set_vars", "values": values})).await?;
    Ok(GuestMessage::VariableNames {
        names: string_list(&v["set"]),
    })
}

/// `ClearVariables`.
pub(crate) async fn clear_variables(
    shared: &Arc<Shared>,
    context: &str,
    names: Option<Vec<String>>,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "clear_vars", "names": names})).await?;
    Ok(GuestMessage::VariableNames {
        names: string_list(&v["cleared"]),
    })
}

/// `ListVariables`.
pub(crate) async fn list_variables(
    shared: &Arc<Shared>,
    context: &str,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "list_vars"})).await?;
    let variables = v["variables"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| VariableInfo {
                    name: d["name"].as_str().unwrap_or_default().to_string(),
                    type_name: d["type"].as_str().unwrap_or("?").to_string(),
                    json: d["json"].as_bool().unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(GuestMessage::VariableList { variables })
}

// ------------------------------------------------------------------------------------------
// State capture (snapshots)

fn state_supported(language: Language) -> Result<(), WireError> {
    match language {
        Language::Python | Language::Node => Ok(()),
        other => Err(error(
            ErrorCode::InvalidArgument,
            format!("kernel state capture is available for python and node contexts, not {other}"),
        )),
    }
}

fn state_path(path: &str) -> Result<(), WireError> {
    if !path.starts_with('/') || path.contains('\0') || path.contains('\n') {
        return Err(error(
            ErrorCode::InvalidArgument,
            format!("state file path {path:?} must be an absolute path"),
        ));
    }
    Ok(())
}

/// A state request on an idle context: marked busy meanwhile (a run waits for no turn, it
/// is refused), with a timeout fit for large files.
async fn state_call(shared: &Arc<Shared>, ctx: &Context, req: Value) -> Result<Value, WireError> {
    let mut slot = try_slot(ctx).await?;
    ctx.busy.store(true, Ordering::SeqCst);
    let _busy = BusyGuard(&ctx.busy);
    ensure_kernel(shared, ctx, &mut slot).await?;
    let Some(kernel) = slot.kernel.as_mut() else {
        return Err(error(ErrorCode::Internal, "no kernel"));
    };
    kernel.call_within(req, STATE_TIMEOUT).await
}

/// `DumpKernelState`: the context's kernel writes its variables to `path`.
pub(crate) async fn dump_state(
    shared: &Arc<Shared>,
    context: &str,
    path: &str,
) -> Result<GuestMessage, WireError> {
    // Only a context that exists: naming a language's default context must not make one.
    let ctx = lock(&shared.kernels.contexts)
        .get(context)
        .cloned()
        .ok_or_else(|| {
            error(
                ErrorCode::NotFound,
                format!("no context '{context}' in this sandbox"),
            )
        })?;
    state_supported(ctx.language)?;
    state_path(path)?;
    let v = state_call(shared, &ctx, json!({"op": "dump_state", "path": path})).await?;
    let report: StateReport = serde_json::from_value(v).map_err(|e| {
        error(
            ErrorCode::Internal,
            format!("the kernel's state report is malformed: {e}"),
        )
    })?;
    Ok(GuestMessage::KernelStateSaved {
        saved: report.saved,
        skipped: report.skipped,
        bytes: report.bytes,
    })
}

/// `LoadKernelState`: restores a state file into the context, which is created (with this
/// id and language) and given a kernel when it has none: a sandbox restored from a snapshot
/// starts without its contexts.
pub(crate) async fn load_state(
    shared: &Arc<Shared>,
    context: &str,
    language: Language,
    path: &str,
) -> Result<GuestMessage, WireError> {
    state_supported(language)?;
    state_path(path)?;
    // Checked before a context is made for it; the agent reads as the kernel would.
    match std::fs::File::open(path).and_then(|f| f.metadata()) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(error(
                ErrorCode::InvalidArgument,
                format!("state file {path} is not a regular file"),
            ));
        }
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => ErrorCode::NotFound,
                std::io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
                _ => ErrorCode::Io,
            };
            return Err(error(code, format!("cannot read state file {path}: {e}")));
        }
    }
    let (ctx, made) = context_for_restore(shared, context, language)?;
    let v = match state_call(shared, &ctx, json!({"op": "load_state", "path": path})).await {
        Ok(v) => v,
        Err(e) => {
            // A context made for this restore alone does not outlive its failure.
            if made {
                lock(&shared.kernels.contexts).remove(&ctx.id);
                kill_kernel(&ctx, "the restore failed").await;
            }
            return Err(e);
        }
    };
    let report: RestoreReport = serde_json::from_value(v).map_err(|e| {
        error(
            ErrorCode::Internal,
            format!("the kernel's restore report is malformed: {e}"),
        )
    })?;
    Ok(GuestMessage::KernelStateLoaded {
        restored: report.restored,
        failed: report.failed,
    })
}

/// The context `id` of `language`, made (without a kernel yet) when it does not exist; and
/// whether it was made.
fn context_for_restore(
    shared: &Shared,
    id: &str,
    language: Language,
) -> Result<(Arc<Context>, bool), WireError> {
    let mut contexts = lock(&shared.kernels.contexts);
    if let Some(ctx) = contexts.get(id) {
        if ctx.language != language {
            return Err(error(
                ErrorCode::InvalidArgument,
                format!(
                    "context '{id}' runs {}, not {language}",
                    ctx.language.as_str()
                ),
            ));
        }
        return Ok((ctx.clone(), false));
    }
    let valid = !id.is_empty()
        && id.len() <= MAX_CONTEXT_ID
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(error(
            ErrorCode::InvalidArgument,
            format!("context id {id:?} is not valid (letters, digits, '-', '_', '.')"),
        ));
    }
    if let Some(default_of) = Language::ALL.into_iter().find(|l| l.as_str() == id)
        && default_of != language
    {
        return Err(error(
            ErrorCode::InvalidArgument,
            format!("context '{id}' is the default context of {default_of}, not {language}"),
        ));
    }
    // A later `CreateContext` numbers past a restored `python-3`.
    if let Some(n) = id
        .strip_prefix(language.as_str())
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|n| n.parse::<u64>().ok())
    {
        shared.kernels.created.fetch_max(n, Ordering::SeqCst);
    }
    let cwd = shared.config.default_cwd.to_string_lossy().into_owned();
    let ctx = Arc::new(new_context(
        id.to_string(),
        language,
        Some(cwd),
        BTreeMap::new(),
    ));
    contexts.insert(ctx.id.clone(), ctx.clone());
    Ok((ctx, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_tails_are_held_back() {
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"漢".as_bytes()[..2]), 2);
        assert_eq!(incomplete_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_tail("😀".as_bytes()), 0);
        // Invalid bytes are not held back (they decode to U+FFFD now).
        assert_eq!(incomplete_tail(b"\xff"), 0);
    }

    #[test]
    fn mime_types_from_names() {
        assert_eq!(mime_of(Path::new("/w/outputs/plot.PNG")), "image/png");
        assert_eq!(mime_of(Path::new("data.csv")), "text/csv");
        assert_eq!(mime_of(Path::new("blob")), "application/octet-stream");
    }
}
