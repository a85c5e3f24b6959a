//! Exec: validate, spawn (on pipes or a pty), track the process, stream output, feed stdin,
//! enforce the timeout, report the exit.
//!
//! One task per process ([`ExecTask`]) reads its output into its tracked entry's ring
//! buffers (see [`crate::process`]) and, for a foreground exec, also forwards it on the exec's
//! request as it always did. A background exec has no request to forward to: its output is
//! only buffered, for attachments.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandcell_protocol::exec::{DEFAULT_BUFFER_BYTES, MAX_BUFFER_BYTES};
use sandcell_protocol::{
    Channel, ErrorCode, ExecCommand, ExecExit, ExecRequest, GuestMessage, WireError, encode_data,
};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::files::io_text;
use crate::poller::PolledFd;
use crate::process::{NewProc, OUTPUT_CHUNK, Proc, PtyMaster, StdinMsg};
use crate::procs::{EXEC_ID_VAR, SESSION_VAR, TREE_VAR};
use crate::reaper::Reaped;
use crate::shared::{ExecSlot, Shared};
use crate::sync::lock;

/// `TERM` of a pty exec that does not set one.
const PTY_TERM: &str = "xterm-256color";
/// The terminal's default end-of-file character (^D), written when a pty's stdin is closed.
const VEOF: u8 = 0x04;
/// After the process exits, output still arriving is forwarded until this much silence.
const DRAIN_IDLE: Duration = Duration::from_millis(100);
/// After the process exits, output is forwarded for at most this long (a background
/// process may hold the pipe open and keep writing).
const DRAIN_MAX: Duration = Duration::from_secs(1);

/// A freshly spawned process and its pipes or terminal.
struct Spawned {
    pid: i32,
    started: Instant,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// The terminal's master side and the terminal's path, for a pty exec.
    pty: Option<(OwnedFd, String)>,
    cmdline: String,
}

fn invalid(message: String) -> WireError {
    WireError::new(ErrorCode::InvalidArgument, message)
}

/// Checks the request's fields before anything is spawned.
fn validate(req: &ExecRequest) -> Result<(), WireError> {
    match &req.command {
        ExecCommand::Argv(argv) => {
            let Some(first) = argv.first() else {
                return Err(invalid("argv is empty".into()));
            };
            if first.is_empty() {
                return Err(invalid("argv[0] is empty".into()));
            }
            if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
                return Err(invalid(format!("argv[{i}] contains a nul byte")));
            }
        }
        ExecCommand::Shell(line) => {
            if line.contains('\0') {
                return Err(invalid("the shell command contains a nul byte".into()));
            }
        }
    }
    for (k, v) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(invalid(format!(
                "environment variable name {k:?} is invalid"
            )));
        }
        if v.contains('\0') {
            return Err(invalid(format!(
                "environment variable {k} contains a nul byte"
            )));
        }
    }
    if let Some(cwd) = &req.cwd
        && cwd.contains('\0')
    {
        return Err(invalid("cwd contains a nul byte".into()));
    }
    if let Some(n) = req.buffer_bytes
        && n > MAX_BUFFER_BYTES
    {
        return Err(invalid(format!(
            "buffer_bytes {n} is over the limit of {MAX_BUFFER_BYTES}"
        )));
    }
    Ok(())
}

fn spawn(shared: &Shared, id: u32, tree: u64, req: &ExecRequest) -> Result<Spawned, WireError> {
    validate(req)?;
    let (program, args): (&str, Vec<&str>) = match &req.command {
        ExecCommand::Argv(argv) => (
            argv[0].as_str(),
            argv[1..].iter().map(String::as_str).collect(),
        ),
        ExecCommand::Shell(line) => ("/bin/sh", vec!["-c", line.as_str()]),
    };
    let default_cwd = &shared.config.default_cwd;
    let cwd: PathBuf = match &req.cwd {
        None => default_cwd.clone(),
        Some(c) if Path::new(c).is_absolute() => PathBuf::from(c),
        Some(c) => default_cwd.join(c),
    };
    // Resolving a bare name here (on the PATH the process will get) lets std use the
    // cheaper posix_spawn path, which it cannot when the child's PATH differs from ours.
    let resolved = if program.contains('/') {
        None
    } else {
        let path = req
            .env
            .get("PATH")
            .map(String::as_str)
            .or_else(|| {
                shared
                    .config
                    .base_env
                    .iter()
                    .find(|(k, _)| k == "PATH")
                    .map(|(_, v)| v.as_str())
            })
            .unwrap_or("");
        Some(find_on_path(program, path, &cwd).ok_or_else(|| {
            WireError::new(
                ErrorCode::SpawnFailed,
                format!("cannot run '{program}': no such file or directory"),
            )
        })?)
    };
    let mut cmd = match &resolved {
        Some(p) => {
            let mut c = Command::new(p);
            c.arg0(program);
            c
        }
        None => Command::new(program),
    };
    cmd.args(&args)
        .env_clear()
        .envs(shared.config.base_env.iter().map(|(k, v)| (k, v)))
        .envs(&req.env)
        // Set last so a request cannot disguise its processes as another exec's.
        .env(EXEC_ID_VAR, id.to_string())
        .env(TREE_VAR, tree.to_string())
        .env(SESSION_VAR, &shared.session)
        .current_dir(&cwd);
    let cmdline = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let started = Instant::now();
    let Some(size) = req.pty else {
        cmd.stdin(if req.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so the whole tree can be found and killed.
        .process_group(0);
        let mut child = cmd.spawn().map_err(|e| spawn_error(program, &cwd, &e))?;
        let pid = child_pid(&child)?;
        let spawned = Spawned {
            pid,
            started,
            stdin: child.stdin.take().map(OwnedFd::from),
            stdout: child.stdout.take().map(OwnedFd::from),
            stderr: child.stderr.take().map(OwnedFd::from),
            pty: None,
            cmdline,
        };
        // Dropping a std Child neither waits nor kills: the reaper collects it.
        drop(child);
        return Ok(spawned);
    };
    // A terminal program needs a TERM naming what it talks to, whatever the base
    // environment says for piped execs; the request's own wins.
    if !req.env.contains_key("TERM") {
        cmd.env("TERM", PTY_TERM);
    }
    let pair = sandcell_jail::pty::open(size.rows, size.cols).map_err(|e| {
        WireError::new(
            ErrorCode::SpawnFailed,
            format!("cannot open a pseudo-terminal: {}", io_text(&e)),
        )
    })?;
    // A new session it leads, on the terminal: its process group is its pid, as for a piped
    // exec, so tree kills and timeouts find it the same way.
    let child = sandcell_jail::pty::spawn(&mut cmd, &pair.slave)
        .map_err(|e| spawn_error(program, &cwd, &e))?;
    // The command holds copies of the terminal: the end of output (EIO on the master) only
    // comes once the process's copies are the last ones.
    drop(cmd);
    drop(pair.slave);
    let pid = child_pid(&child)?;
    drop(child);
    Ok(Spawned {
        pid,
        started,
        stdin: None,
        stdout: None,
        stderr: None,
        pty: Some((pair.master, pair.slave_path)),
        cmdline,
    })
}

fn child_pid(child: &std::process::Child) -> Result<i32, WireError> {
    i32::try_from(child.id())
        .map_err(|_| WireError::new(ErrorCode::Internal, "spawned process has an invalid pid"))
}

/// The first executable regular file named `name` in the `:`-separated `path` (an empty
/// entry means the working directory, as for `execvp`).
fn find_on_path(name: &str, path: &str, cwd: &Path) -> Option<PathBuf> {
    path.split(':').find_map(|dir| {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(dir)
        };
        let candidate = cwd.join(dir).join(name);
        let meta = std::fs::metadata(&candidate).ok()?;
        let executable = meta.is_file() && meta.permissions().mode() & 0o111 != 0;
        executable.then_some(candidate)
    })
}

fn spawn_error(program: &str, cwd: &Path, e: &std::io::Error) -> WireError {
    let reason = if !cwd.is_dir() {
        format!("working directory '{}' does not exist", cwd.display())
    } else {
        io_text(e)
    };
    WireError::new(
        ErrorCode::SpawnFailed,
        format!("cannot run '{program}': {reason}"),
    )
}

/// Where a process's output comes from.
enum Output {
    Pipe(PolledFd),
    Pty(PtyMaster),
}

/// Where the host's input for a process goes.
enum Input {
    Pipe(PolledFd),
    Pty(PtyMaster),
}

impl Input {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Pipe(p) => p.write_all(bytes).await,
            Self::Pty(p) => p.write_all(bytes).await,
        }
    }
}

/// Reads from a (non-blocking) terminal master into `buf` (kept at [`OUTPUT_CHUNK`] bytes);
/// 0 at the end: EIO once every copy of the terminal is closed.
async fn read_pty(fd: &PolledFd, buf: &mut Vec<u8>) -> usize {
    if buf.len() < OUTPUT_CHUNK {
        buf.resize(OUTPUT_CHUNK, 0);
    }
    fd.read(&mut buf[..]).await.unwrap_or(0)
}

/// Starts an exec: spawns it, tracks it and runs its task. Errors are replied on `id`.
pub(crate) async fn start(shared: &Arc<Shared>, id: u32, req: ExecRequest) {
    let tree = shared.processes.next_tree();
    let spawned = match spawn(shared, id, tree, &req) {
        Ok(s) => s,
        Err(e) => return shared.out.error(id, e).await,
    };
    // Registered before the next await, so the reaper cannot miss the status.
    let exit_rx = shared.reaper.watch(spawned.pid);
    // While the command starts: the kill thread must exist before it can fork much.
    shared.workers.start_killer();
    let Spawned {
        pid,
        started,
        stdin,
        stdout,
        stderr,
        pty,
        cmdline,
    } = spawned;
    let io = (|| -> std::io::Result<_> {
        if let Some((master, slave_path)) = pty {
            let master: PtyMaster = Arc::new(PolledFd::new(master)?);
            let input = Input::Pty(master.clone());
            let output = Output::Pty(master.clone());
            return Ok((
                Some(input),
                Some(output),
                None,
                Some(master),
                vec![slave_path],
            ));
        }
        let stdin = stdin.map(PolledFd::new).transpose()?;
        let stdout = stdout.map(PolledFd::new).transpose()?;
        let stderr = stderr.map(PolledFd::new).transpose()?;
        let holders = [stdout.as_ref(), stderr.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| rustix::fs::fstat(p).ok())
            .map(|st| format!("pipe:[{}]", st.st_ino))
            .collect();
        Ok((
            stdin.map(Input::Pipe),
            stdout.map(Output::Pipe),
            stderr.map(Output::Pipe),
            None,
            holders,
        ))
    })();
    let (input, stdout, stderr, master, holders) = match io {
        Ok(io) => io,
        Err(e) => {
            let _ = crate::procs::send(pid, libc::SIGKILL);
            tokio::spawn(async move {
                let _ = exit_rx.await;
            });
            let msg = format!("cannot watch the output of pid {pid}: {}", io_text(&e));
            return shared
                .out
                .error(id, WireError::new(ErrorCode::Internal, msg))
                .await;
        }
    };
    let (stdin_tx, stdin_task) = match input {
        Some(sink) => {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Some(tokio::spawn(feed_stdin(sink, rx))))
        }
        None => (None, None),
    };
    let buffer_bytes = req.buffer_bytes.unwrap_or(DEFAULT_BUFFER_BYTES);
    let proc = Arc::new(Proc::new(NewProc {
        pid,
        tree,
        exec_id: id,
        cmdline,
        background: req.background,
        timeout_ms: req.timeout_ms,
        buffer_bytes: usize::try_from(buffer_bytes).unwrap_or(usize::MAX),
        stdin: stdin_tx,
        pty: master,
    }));
    shared.processes.insert(proc.clone());
    let sink = if req.background {
        // The request ends here; the process is reached by its pid from now on.
        shared.out.msg(id, &GuestMessage::ExecStarted { pid }).await;
        None
    } else {
        lock(&shared.tables)
            .execs
            .insert(id, ExecSlot { proc: proc.clone() });
        Some(id)
    };
    let task = ExecTask {
        shared: shared.clone(),
        proc,
        sink,
        started,
        stdout_limit: req.stdout_limit,
        stderr_limit: req.stderr_limit,
        timeout: req.timeout_ms.map(Duration::from_millis),
        holders,
    };
    tokio::spawn(task.run(stdout, stderr, exit_rx, stdin_task));
}

async fn feed_stdin(sink: Input, mut rx: mpsc::UnboundedReceiver<StdinMsg>) {
    let mut sink = Some(sink);
    while let Some(msg) = rx.recv().await {
        match msg {
            StdinMsg::Data(bytes) => {
                if let Some(s) = sink.as_mut()
                    && s.write_all(&bytes).await.is_err()
                {
                    // The process closed its stdin (EPIPE): drop the rest.
                    sink = None;
                }
            }
            StdinMsg::Flush(done) => {
                let _ = done.send(sink.is_some());
            }
            StdinMsg::Close => {
                // A terminal cannot be half-closed: a program reading it sees end of input
                // when ^D arrives (in canonical mode, as at a shell prompt).
                if let Some(Input::Pty(fd)) = &sink {
                    let _ = fd.write_all(&[VEOF]).await;
                }
                return;
            }
        }
    }
}

/// Byte accounting for one output stream.
struct Stream {
    limit: u64,
    total: u64,
    forwarded: u64,
    truncated: bool,
}

impl Stream {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            total: 0,
            forwarded: 0,
            truncated: false,
        }
    }

    /// Counts `n` read bytes; returns how many of them may be forwarded.
    fn admit(&mut self, n: usize) -> usize {
        let n64 = n as u64;
        self.total += n64;
        let take = n64.min(self.limit.saturating_sub(self.forwarded));
        if take < n64 {
            self.truncated = true;
        }
        self.forwarded += take;
        // take <= n, which is a usize.
        usize::try_from(take).unwrap_or(n)
    }
}

/// The task of one tracked process, from spawn to exit.
struct ExecTask {
    shared: Arc<Shared>,
    proc: Arc<Proc>,
    /// The foreground exec's request, which gets the output and the exit as well.
    sink: Option<u32>,
    started: Instant,
    stdout_limit: u64,
    stderr_limit: u64,
    timeout: Option<Duration>,
    /// What `/proc/PID/fd` links to the process's output pipes or terminal read.
    holders: Vec<String>,
}

/// Reads into `buf` and returns how many bytes came (they are `buf[..n]`); 0 at the end.
/// A pipe read replaces `buf`'s contents without zeroing it first: a zeroed buffer per
/// stream costs page faults on every exec.
async fn read_opt(src: &mut Option<Output>, buf: &mut Vec<u8>) -> usize {
    match src {
        Some(Output::Pipe(p)) => {
            buf.clear();
            // A read error ends the stream like EOF does.
            p.read_into(buf).await.unwrap_or(0)
        }
        Some(Output::Pty(fd)) => read_pty(fd, buf).await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl ExecTask {
    async fn run(
        self,
        mut stdout: Option<Output>,
        mut stderr: Option<Output>,
        mut exit_rx: oneshot::Receiver<Reaped>,
        stdin_task: Option<JoinHandle<()>>,
    ) {
        let out = &self.shared.out;
        let pid = self.proc.pid;
        if let Some(id) = self.sink {
            out.msg(id, &GuestMessage::ExecStarted { pid }).await;
        }
        let mut seq = 0u64;
        let mut streams = [
            Stream::new(self.stdout_limit),
            Stream::new(self.stderr_limit),
        ];
        let mut out_buf = Vec::with_capacity(OUTPUT_CHUNK);
        let mut err_buf = Vec::with_capacity(OUTPUT_CHUNK);
        let started = tokio::time::Instant::from_std(self.started);
        let mut deadline = self.timeout.map(|t| started + t);
        let mut timed_out = false;
        let mut reaped: Option<Reaped> = None;
        let mut drain_cap = None;
        let mut drain_at = None;
        loop {
            if reaped.is_some() && stdout.is_none() && stderr.is_none() {
                break;
            }
            let (channel, n) = tokio::select! {
                biased;
                n = read_opt(&mut stdout, &mut out_buf) => {
                    if n == 0 {
                        stdout = None;
                    }
                    (Channel::Stdout, n)
                }
                n = read_opt(&mut stderr, &mut err_buf) => {
                    if n == 0 {
                        stderr = None;
                    }
                    (Channel::Stderr, n)
                }
                r = &mut exit_rx, if reaped.is_none() => {
                    let r = r.unwrap_or(Reaped {
                        exit_code: None,
                        signal: None,
                        core_dumped: false,
                        at: Instant::now(),
                    });
                    reaped = Some(r);
                    deadline = None;
                    self.proc.state().reaped = true;
                    let now = tokio::time::Instant::now();
                    drain_cap = Some(now + DRAIN_MAX);
                    drain_at = Some(now + DRAIN_IDLE);
                    continue;
                }
                _ = sleep_opt(deadline) => {
                    deadline = None;
                    timed_out = true;
                    let tree = self.shared.proc_tree(&self.proc);
                    let _ = self.shared.workers.kill(move || tree.signal(libc::SIGKILL)).await;
                    continue;
                }
                _ = sleep_opt(drain_at) => break,
            };
            if n > 0 {
                let idx = if channel == Channel::Stdout { 0 } else { 1 };
                let buf = if idx == 0 { &out_buf } else { &err_buf };
                self.proc.append(idx, &buf[..n]);
                let take = streams[idx].admit(n);
                if let Some(id) = self.sink
                    && take > 0
                {
                    out.frame(encode_data(id, channel, seq, &buf[..take])).await;
                    seq += 1;
                }
            }
            if let (Some(_), Some(cap)) = (reaped, drain_cap) {
                drain_at = Some((tokio::time::Instant::now() + DRAIN_IDLE).min(cap));
            }
        }
        if let Some(task) = stdin_task {
            task.abort();
        }
        if stdout.is_some() || stderr.is_some() {
            // Processes of the exec still hold its output pipes (or terminal) after it ended.
            // Their output has nowhere to go any more (they would die of SIGPIPE on their next
            // write), so end them now, before the exit is reported; background processes
            // that redirected their output are not touched.
            let (names, tag, session) = (
                self.holders.clone(),
                self.proc.tree,
                self.shared.session.clone(),
            );
            let _ = self
                .shared
                .workers
                .kill(move || crate::procs::kill_pipe_holders(&names, tag, pid, &session))
                .await;
        }
        drop((stdout, stderr));
        if let Some(id) = self.sink {
            lock(&self.shared.tables).execs.remove(&id);
        }
        let killed = self.proc.state().killed;
        let r = reaped.unwrap_or(Reaped {
            exit_code: None,
            signal: None,
            core_dumped: false,
            at: Instant::now(),
        });
        let [o, e] = streams;
        // A foreground exec's output is cut at its limits; a background one's only when its
        // ring buffer had to drop bytes.
        let (stdout_truncated, stderr_truncated) = match self.sink {
            Some(_) => (o.truncated, e.truncated),
            None => (self.proc.overflowed(0), self.proc.overflowed(1)),
        };
        let exit = ExecExit {
            exit_code: r.exit_code,
            signal: r.signal,
            core_dumped: r.core_dumped,
            timed_out,
            killed,
            stdout_bytes: o.total,
            stderr_bytes: e.total,
            stdout_truncated,
            stderr_truncated,
            duration_us: u64::try_from(r.at.saturating_duration_since(self.started).as_micros())
                .unwrap_or(u64::MAX),
        };
        self.proc.finish(exit.clone());
        match self.sink {
            Some(id) => {
                // Collected by its own request: gone from the table once the host has the exit.
                self.shared.processes.remove(&self.proc);
                out.msg(id, &GuestMessage::ExecExited(exit)).await;
            }
            None => self.shared.processes.exited(&self.proc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_admits_up_to_its_limit_and_counts_everything() {
        let mut s = Stream::new(1000);
        assert_eq!(s.admit(600), 600);
        assert_eq!(s.admit(600), 400);
        assert_eq!(s.admit(600), 0);
        assert_eq!((s.total, s.forwarded, s.truncated), (1800, 1000, true));
    }

    #[test]
    fn validation_rejects_bad_requests() {
        assert!(validate(&ExecRequest::argv(Vec::<String>::new())).is_err());
        assert!(validate(&ExecRequest::argv(["echo", "a\0b"])).is_err());
        let mut r = ExecRequest::argv(["true"]);
        r.env.insert("A=B".into(), "x".into());
        assert_eq!(validate(&r).unwrap_err().code, ErrorCode::InvalidArgument);
        assert!(validate(&ExecRequest::shell("true")).is_ok());
    }
}
