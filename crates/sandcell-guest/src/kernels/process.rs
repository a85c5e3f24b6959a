//! Starting and supervising a kernel process: its pipes and environment, the reader task
//! that merges its events, fd output and exit into one queue, and its replacement when it died.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::poller::PolledFd;
use sandcell_kernels::{
    CTL_FD_VAR, DEFAULT_STREAM_LIMIT, EVENT_FD_VAR, OUTPUTS_DIR_VAR, PROTOCOL_VAR, STREAM_LIMIT_VAR,
};
use sandcell_protocol::{ErrorCode, WireError};
use tokio::sync::{mpsc, oneshot};

use crate::procs::SESSION_VAR;
use crate::reaper::Reaped;
use crate::shared::Shared;
use crate::sync::lock;

use super::artifacts::outputs_dir;
use super::events::{EventLines, MAX_EVENT_LINE};
use super::kernel::{Kernel, KernelOutput, describe_death};
use super::table::{Context, Slot};

/// How long a kernel may take to say it is ready (R is the slowest).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes read from a kernel's fd 1 or 2 at a time.
const FD_CHUNK: usize = 64 * 1024;

/// A pipe whose two ends are close-on-exec; the caller clears it on the child's end.
fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), WireError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| WireError::new(ErrorCode::Io, format!("create a kernel pipe: {e}")))
}

fn inheritable(fd: &OwnedFd) -> Result<(), WireError> {
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())
        .map_err(|e| WireError::new(ErrorCode::Io, format!("pass a pipe to the kernel: {e}")))
}

/// Starts the kernel of `ctx` and waits until it is ready.
pub(super) async fn start_kernel(shared: &Arc<Shared>, ctx: &Context) -> Result<Kernel, WireError> {
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
        WireError::new(
            ErrorCode::SpawnFailed,
            format!(
                "cannot start the {} kernel ({}): {e}",
                ctx.language, argv[0]
            ),
        )
    })?;
    let pid = i32::try_from(child.id())
        .map_err(|_| WireError::new(ErrorCode::Internal, "kernel pid out of range"))?;
    let exited = shared.reaper.watch(pid);
    // While the kernel starts: the kill thread must exist before user code can fork much.
    shared.workers.start_killer();
    let stdout = child.stdout.take().map(OwnedFd::from);
    let stderr = child.stderr.take().map(OwnedFd::from);
    // Dropping a std Child neither waits nor kills: the reaper collects it.
    drop(child);
    let to_pipe = |fd: Option<OwnedFd>| -> Result<PolledFd, WireError> {
        let fd =
            fd.ok_or_else(|| WireError::new(ErrorCode::Internal, "kernel output pipe missing"))?;
        PolledFd::new(fd)
            .map_err(|e| WireError::new(ErrorCode::Io, format!("watch the kernel's output: {e}")))
    };
    let (stdout, stderr) = (to_pipe(stdout)?, to_pipe(stderr)?);
    let events = PolledFd::new(event_read)
        .map_err(|e| WireError::new(ErrorCode::Io, format!("watch the kernel's events: {e}")))?;
    let ctl = PolledFd::new(ctl_write)
        .map_err(|e| WireError::new(ErrorCode::Io, format!("talk to the kernel: {e}")))?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(read_kernel(events, stdout, stderr, exited, tx));
    let mut kernel = Kernel::new(ctl, rx);
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
        return Err(WireError::new(
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
    events: PolledFd,
    stdout: PolledFd,
    stderr: PolledFd,
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
            n = stdout.read_into(&mut out_buf), if out_open => match n {
                Ok(n) if n > 0 => KernelOutput::Stdout(out_buf.clone()),
                _ => { out_open = false; continue; }
            },
            n = stderr.read_into(&mut err_buf), if err_open => match n {
                Ok(n) if n > 0 => KernelOutput::Stderr(err_buf.clone()),
                _ => { err_open = false; continue; }
            },
            n = events.read_into(&mut ev_buf), if events_open => {
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

/// Ensures the context has a live kernel; returns whether a dead one was replaced and why
/// it had died.
pub(super) async fn ensure_kernel(
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
