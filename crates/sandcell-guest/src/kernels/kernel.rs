//! A running kernel as its context holds it: the request pipe and the merged queue of what
//! it sends, and request/reply calls over them.

use std::time::Duration;

use sandcell_protocol::{ErrorCode, WireError, signal_name};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
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
    ctl: pipe::Sender,
    pub(super) out: mpsc::UnboundedReceiver<KernelOutput>,
    next_request: u64,
    pub(super) execution_count: u64,
    /// Output of fd 1/2 that arrived between requests, for the next execution.
    pub(super) early: Vec<KernelOutput>,
}

impl Kernel {
    /// A kernel that takes requests on `ctl` and whose output `out` merges.
    pub(super) fn new(ctl: pipe::Sender, out: mpsc::UnboundedReceiver<KernelOutput>) -> Self {
        Self {
            ctl,
            out,
            next_request: 1,
            execution_count: 0,
            early: Vec::new(),
        }
    }

    pub(super) async fn send(&mut self, mut req: Value) -> Result<u64, WireError> {
        let id = self.next_request;
        self.next_request += 1;
        req["id"] = json!(id);
        let mut line = req.to_string().into_bytes();
        line.push(b'\n');
        self.ctl.write_all(&line).await.map_err(|e| {
            WireError::new(ErrorCode::Io, format!("the kernel stopped reading: {e}"))
        })?;
        Ok(id)
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
        let id = self.send(req).await?;
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
