//! One execution (`RunCode`): forwarding its events and output to the host as they come,
//! its host calls to the host and their answers back to the kernel, the timeout (interrupt,
//! then kill; paused while the host is asked), and the final `CodeDone`.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sandcell_kernels::DEFAULT_STREAM_LIMIT;
use sandcell_protocol::host_call::MAX_HOST_CALL_METHOD;
use sandcell_protocol::{
    CodeDone, CodeError, CodeStatus, GuestMessage, HOST_CALLS_SINCE, HostCall, HostCallErrorKind,
    HostCallResult, MAX_PENDING_HOST_CALLS, RunCodeRequest,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::shared::Shared;
use crate::sync::lock;

use super::events::{belongs_to, event_message, read_done};
use super::kernel::{KernelOutput, describe_death};
use super::process::ensure_kernel;
use super::table::{BusyGuard, Context, Slot};
use super::try_slot;

/// After an interrupt for a timeout, how long the kernel has to yield before it is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// What reaches a running execution from the connection about its host calls.
#[derive(Debug)]
pub(crate) enum HostNews {
    /// The host's answer to call `.0`.
    Answer(u64, HostCallResult),
    /// The host's connection ended: nobody will answer the calls pending, or later ones.
    Gone,
}

/// `HostCallReply` on request `id`: hands the answer to that execution, if it still runs.
pub(crate) fn host_call_reply(shared: &Shared, id: u32, call: u64, result: HostCallResult) {
    if let Some(tx) = lock(&shared.tables).host_calls.get(&id) {
        let _ = tx.send(HostNews::Answer(call, result));
    }
}

/// The host's connection ended: every running execution stops waiting for it.
pub(crate) fn host_gone(shared: &Shared) {
    for tx in lock(&shared.tables).host_calls.values() {
        let _ = tx.send(HostNews::Gone);
    }
}

/// Keeps an execution's entry in the host-call routes while it runs.
struct Route<'a> {
    shared: &'a Shared,
    id: u32,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        lock(&self.shared.tables).host_calls.remove(&self.id);
    }
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
    let before = shared.kernels.outputs.snapshot(&shared.workers).await;
    let (news_tx, news) = mpsc::unbounded_channel();
    lock(&shared.tables).host_calls.insert(id, news_tx);
    let route = Route {
        shared: &shared,
        id,
    };
    let forward = shared.protocol.load(Ordering::SeqCst) >= HOST_CALLS_SINCE;
    let mut run = Run::new(&ctx, id, out.clone(), HostCalls::new(forward, news));
    let status = run
        .execute(
            &mut slot,
            &req.code,
            req.timeout_ms.map(Duration::from_millis),
        )
        .await;
    drop(route);
    let artifacts = match before {
        Some(before) => {
            shared
                .kernels
                .outputs
                .changed(&shared.workers, before)
                .await
        }
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
    host: HostCalls,
}

/// The execution's host calls: forwarded to the host, or answered here.
struct HostCalls {
    /// The host takes them (it greeted with protocol 2 or later) and is still connected.
    forward: bool,
    news: mpsc::UnboundedReceiver<HostNews>,
    /// Whether `news` can still bring anything.
    open: bool,
    /// Calls forwarded and not answered yet.
    pending: HashSet<u64>,
    /// Since when the execution has waited for the host (its timeout is paused meanwhile).
    waiting_since: Option<tokio::time::Instant>,
}

impl HostCalls {
    fn new(forward: bool, news: mpsc::UnboundedReceiver<HostNews>) -> Self {
        Self {
            forward,
            news,
            open: true,
            pending: HashSet::new(),
            waiting_since: None,
        }
    }
}

/// The `host_reply` line answering call `call` of execution `request`.
fn host_reply(request: u64, call: u64, result: &HostCallResult) -> Value {
    let mut line = json!({"op": "host_reply", "id": request, "call": call});
    if let Ok(Value::Object(answer)) = serde_json::to_value(result) {
        for (k, v) in answer {
            line[k] = v;
        }
    }
    line
}

impl<'a> Run<'a> {
    fn new(ctx: &'a Context, id: u32, out: crate::out::Out, host: HostCalls) -> Self {
        Self {
            ctx,
            id,
            out,
            limit: DEFAULT_STREAM_LIMIT,
            forwarded: [0; 2],
            dropped: [0; 2],
            partial: [Vec::new(), Vec::new()],
            execution_count: None,
            host,
        }
    }

    /// A `host_call` event of the execution: forwarded to the host, or answered at once when
    /// it cannot be.
    async fn host_call(&mut self, kernel: &super::kernel::Kernel, request: u64, v: &Value) {
        let Some(call) = v["call"].as_u64() else {
            self.send_stream(
                1,
                "[sandcell: a host call without a call number was ignored]\n".into(),
            )
            .await;
            return;
        };
        let method = v["method"].as_str().unwrap_or_default();
        let refused = if method.is_empty() || method.len() > MAX_HOST_CALL_METHOD {
            Some((
                HostCallErrorKind::InvalidArgument,
                format!("a host call names a method of 1 to {MAX_HOST_CALL_METHOD} bytes"),
            ))
        } else if self.host.pending.contains(&call) {
            Some((
                HostCallErrorKind::InvalidArgument,
                format!("host call number {call} is already waiting for its answer"),
            ))
        } else if self.host.pending.len() >= MAX_PENDING_HOST_CALLS {
            Some((
                HostCallErrorKind::InvalidArgument,
                format!(
                    "at most {MAX_PENDING_HOST_CALLS} host calls may wait at once in one execution"
                ),
            ))
        } else if !self.host.forward {
            Some((
                HostCallErrorKind::Unavailable,
                "host calls are unavailable: the host connected to this sandbox does not take them"
                    .to_string(),
            ))
        } else {
            None
        };
        if let Some((kind, message)) = refused {
            let _ = kernel.write_line(&host_reply(
                request,
                call,
                &HostCallResult::error(kind, message),
            ));
            return;
        }
        if self.host.pending.is_empty() {
            self.host.waiting_since = Some(tokio::time::Instant::now());
        }
        self.host.pending.insert(call);
        let msg = GuestMessage::HostCall(HostCall {
            call,
            method: method.to_string(),
            payload: v["payload"].clone(),
        });
        self.out.msg(self.id, &msg).await;
    }

    /// News from the connection: an answer goes to the kernel (if the call still waits); the
    /// host gone fails every pending call. Returns how long the execution had waited when
    /// nothing is pending any more (its timeout moves on by that much).
    fn host_news(
        &mut self,
        kernel: &super::kernel::Kernel,
        request: u64,
        news: HostNews,
    ) -> Option<Duration> {
        match news {
            HostNews::Answer(call, result) => {
                if !self.host.pending.remove(&call) {
                    return None;
                }
                let _ = kernel.write_line(&host_reply(request, call, &result));
            }
            HostNews::Gone => {
                self.host.forward = false;
                self.answer_pending(
                    kernel,
                    request,
                    HostCallErrorKind::Cancelled,
                    "the host's connection ended before it answered",
                );
            }
        }
        if self.host.pending.is_empty() {
            return self.host.waiting_since.take().map(|t| t.elapsed());
        }
        None
    }

    /// Answers every pending call itself (the execution ended, or the host is gone).
    fn answer_pending(
        &mut self,
        kernel: &super::kernel::Kernel,
        request: u64,
        kind: HostCallErrorKind,
        message: &str,
    ) {
        let mut calls: Vec<u64> = self.host.pending.drain().collect();
        calls.sort_unstable();
        for call in calls {
            let result = HostCallResult::error(kind, message);
            let _ = kernel.write_line(&host_reply(request, call, &result));
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
        let request = match kernel.send(json!({"op": "execute", "code": code})) {
            Ok(r) => r,
            Err(e) => return self.lost(&e.message, None).await,
        };
        let started = tokio::time::Instant::now();
        let mut deadline = timeout.map(|t| started + t);
        let mut timed_out = false;
        loop {
            // The timeout waits while the host is asked (the host bounds its own work); once
            // it has fired, the interrupt's grace runs regardless.
            let limit = if self.host.pending.is_empty() || timed_out {
                deadline
            } else {
                None
            };
            let next = tokio::select! {
                o = kernel.out.recv() => o,
                news = self.host.news.recv(), if self.host.open => {
                    let Some(news) = news else {
                        // No route any more (it lives as long as the execution): never again.
                        self.host.open = false;
                        continue;
                    };
                    if let Some(waited) = self.host_news(kernel, request, news)
                        && !timed_out
                        && let Some(d) = deadline.as_mut()
                    {
                        *d += waited;
                    }
                    continue;
                }
                () = sleep_until(limit) => {
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
                    if v["type"] == "host_call" {
                        self.host_call(kernel, request, &v).await;
                        continue;
                    }
                    if v["type"] == "done" {
                        // A thread of the cell may still wait: it must not wait for good.
                        self.answer_pending(
                            kernel,
                            request,
                            HostCallErrorKind::Cancelled,
                            "the cell ended before the host answered",
                        );
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
}
