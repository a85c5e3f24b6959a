//! A running kernel as its context holds it: the request pipe and the merged queue of what
//! it sends, and request/reply calls over them. Lines for the request pipe go through a
//! writer task, so a kernel that is not reading (busy in user code while a host call's late
//! answer is sent) never holds up the execution's supervision.

use std::time::Duration;

use crate::poller::PolledFd;
use sandcell_protocol::{ErrorCode, WireError, signal_name};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::reaper::Reaped;

/// How long a kernel may take to answer a request other than `execute`.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a kernel sends, merged.
pub(super) enum KernelOutput {
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
pub(super) struct Kernel {
    /// Lines for the request pipe, written in order by [`write_ctl`].
    ctl: mpsc::UnboundedSender<Vec<u8>>,
    pub(super) out: mpsc::UnboundedReceiver<KernelOutput>,
    next_request: u64,
    pub(super) execution_count: u64,
    /// Output of fd 1/2 that arrived between requests, for the next execution.
    pub(super) early: Vec<KernelOutput>,
}

impl Kernel {
    /// A kernel that takes requests on `ctl` and whose output `out` merges.
    pub(super) fn new(ctl: PolledFd, out: mpsc::UnboundedReceiver<KernelOutput>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_ctl(ctl, rx));
        Self {
            ctl: tx,
            out,
            next_request: 1,
            execution_count: 0,
            early: Vec::new(),
        }
    }

    /// Queues a request with the kernel's next id; returns the id.
    pub(super) fn send(&mut self, mut req: Value) -> Result<u64, WireError> {
        let id = self.next_request;
        self.next_request += 1;
        req["id"] = json!(id);
        self.write_line(&req)?;
        Ok(id)
    }

    /// Queues one line for the request pipe as it is (a `host_reply` carries the id of the
    /// execution it answers, not a new one).
    pub(super) fn write_line(&self, v: &Value) -> Result<(), WireError> {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        self.ctl
            .send(line)
            .map_err(|_| WireError::new(ErrorCode::Io, "the kernel stopped reading its requests"))
    }

    /// Sends a request and waits for its `reply`.
    pub(super) async fn call(&mut self, req: Value) -> Result<Value, WireError> {
        self.call_within(req, REPLY_TIMEOUT).await
    }

    /// Sends a request and waits up to `limit` for its `reply`.
    pub(super) async fn call_within(
        &mut self,
        req: Value,
        limit: Duration,
    ) -> Result<Value, WireError> {
        let id = self.send(req)?;
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                out = self.out.recv() => match out {
                    Some(KernelOutput::Event(v)) if v["id"] == json!(id) && v["type"] == "reply" => {
                        if let Some(msg) = v["error"].as_str() {
                            return Err(WireError::new(ErrorCode::InvalidArgument, msg));
                        }
                        return Ok(v);
                    }
                    Some(KernelOutput::Event(_)) => {}
                    Some(o @ (KernelOutput::Stdout(_) | KernelOutput::Stderr(_))) => self.early.push(o),
                    Some(KernelOutput::Exited(r)) => {
                        self.early.push(KernelOutput::Exited(r));
                        return Err(WireError::new(ErrorCode::InvalidState, format!("the kernel died: {}", describe_death(&r))));
                    }
                    None => return Err(WireError::new(ErrorCode::InvalidState, "the kernel is gone")),
                },
                () = &mut deadline => {
                    return Err(WireError::new(ErrorCode::Internal, format!("the kernel did not answer within {}s", limit.as_secs())));
                }
            }
        }
    }
}

/// Writes the queued lines to the kernel's request pipe, in order, until the kernel stops
/// reading (its end closed) or the kernel is dropped (the queue closed: the pipe then closes,
/// which ends an idle kernel).
async fn write_ctl(ctl: PolledFd, mut lines: mpsc::UnboundedReceiver<Vec<u8>>) {
    while let Some(line) = lines.recv().await {
        if ctl.write_all(&line).await.is_err() {
            return;
        }
    }
}

pub(super) fn describe_death(r: &Reaped) -> String {
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
