//! Background processes and reattaching: start a process that outlives its request, follow
//! the output of any tracked process from an offset, write its stdin and resize its terminal
//! by pid.
//!
//! The agent keeps every exec's recent output in ring buffers (see the protocol crate's
//! docs), so an attachment can start late, from an offset, and several can follow one
//! process at once; bytes that left the buffer first are reported as [`AttachEvent::Lost`].

use std::time::Duration;

use sandcell_protocol::{Channel, ExecRequest, ExecResult, GuestMessage, HostMessage};
use serde::Serialize;

use crate::backend::ResourceCounters;
use crate::client::{Call, Reply};
use crate::error::EngineError;
use crate::sandbox::{Sandbox, prepare_spawn, unexpected};

/// How long an explicit detach waits for the agent's answer.
const DETACH_TIMEOUT: Duration = Duration::from_secs(10);

/// A process started in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BackgroundProcess {
    /// Its pid inside the sandbox: the handle for attach, stdin, resize, signals.
    pub pid: i32,
    /// The exec request that started it (its processes carry it as `SANDCELL_EXEC_ID`).
    pub exec_id: u32,
}

/// Where an attachment starts in each stream, as an offset in the stream's bytes since the
/// process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AttachFrom {
    /// Stdout offset; `None` for the oldest byte still buffered.
    pub stdout: Option<u64>,
    /// Stderr offset; `None` for the oldest byte still buffered.
    pub stderr: Option<u64>,
}

impl AttachFrom {
    /// Everything still buffered (nothing is reported lost).
    pub fn buffered() -> Self {
        Self::default()
    }

    /// From each stream's first byte: bytes no longer buffered are reported lost.
    pub fn start() -> Self {
        Self::offsets(0, 0)
    }

    /// Only output written from now on.
    pub fn now() -> Self {
        Self::offsets(u64::MAX, u64::MAX)
    }

    /// From these offsets (e.g. where an earlier attachment stopped).
    pub fn offsets(stdout: u64, stderr: u64) -> Self {
        Self {
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }
}

/// One event of an attachment.
#[derive(Debug, Clone, PartialEq)]
pub enum AttachEvent {
    /// Bytes on stdout.
    Stdout(Vec<u8>),
    /// Bytes on stderr.
    Stderr(Vec<u8>),
    /// Bytes `offset..offset + bytes` of a stream left the agent's buffer before this
    /// attachment got them; the stream continues after them.
    Lost {
        /// `Stdout` or `Stderr`.
        channel: Channel,
        /// Offset of the first lost byte.
        offset: u64,
        /// How many bytes were lost.
        bytes: u64,
    },
    /// The process ended; no events follow.
    Exit(ExecResult),
}

/// Everything an attachment received.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttachOutput {
    /// Stdout bytes, from the attachment's start.
    pub stdout: Vec<u8>,
    /// Stderr bytes, from the attachment's start.
    pub stderr: Vec<u8>,
    /// Stdout bytes lost (no longer buffered).
    pub stdout_lost: u64,
    /// Stderr bytes lost (no longer buffered).
    pub stderr_lost: u64,
    /// How the process ended.
    pub result: ExecResult,
}

/// An attachment to a tracked process's output. Dropping it detaches (in the background);
/// [`AttachStream::detach`] does so and waits for the agent.
///
/// Its exit is classified with the sandbox's resource counters as they were when it
/// attached: an OOM kill or a refused fork from before that is not attributed to the
/// process.
pub struct AttachStream {
    sandbox: Sandbox,
    call: Call,
    pid: i32,
    before: ResourceCounters,
    timeout_ms: Option<u64>,
    /// The offsets of the next stdout and stderr bytes.
    next: [u64; 2],
    done: bool,
}

impl AttachStream {
    /// The process's pid inside the sandbox.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Offset of the next stdout byte this attachment delivers (where it started, before
    /// any event); resume from here with [`AttachFrom::offsets`].
    pub fn stdout_offset(&self) -> u64 {
        self.next[0]
    }

    /// Offset of the next stderr byte this attachment delivers.
    pub fn stderr_offset(&self) -> u64 {
        self.next[1]
    }

    /// The next event; `None` after `Exit`.
    pub async fn next(&mut self) -> Option<Result<AttachEvent, EngineError>> {
        if self.done {
            return None;
        }
        let event = match self.call.next().await {
            Reply::Data(chunk) if chunk.channel == Channel::Stdout => {
                self.next[0] += chunk.bytes.len() as u64;
                Ok(AttachEvent::Stdout(chunk.bytes))
            }
            Reply::Data(chunk) if chunk.channel == Channel::Stderr => {
                self.next[1] += chunk.bytes.len() as u64;
                Ok(AttachEvent::Stderr(chunk.bytes))
            }
            Reply::Data(chunk) => Err(EngineError::Connection(format!(
                "unexpected {:?} chunk in an attachment",
                chunk.channel
            ))),
            Reply::Message(GuestMessage::OutputLost {
                channel,
                offset,
                bytes,
            }) => {
                let i = usize::from(channel == Channel::Stderr);
                self.next[i] = offset + bytes;
                Ok(AttachEvent::Lost {
                    channel,
                    offset,
                    bytes,
                })
            }
            Reply::Message(GuestMessage::ExecExited(exit)) => {
                self.done = true;
                Ok(AttachEvent::Exit(self.sandbox.classify_exit(
                    &self.before,
                    &exit,
                    self.timeout_ms,
                )))
            }
            Reply::Message(GuestMessage::Error(e)) => {
                self.done = true;
                Err(EngineError::Guest(e))
            }
            Reply::Message(other) => Err(unexpected(other)),
            Reply::Closed(reason) => {
                self.done = true;
                Err(self.sandbox.gone(reason))
            }
        };
        Some(event)
    }

    /// Collects everything until the process ends.
    pub async fn collect(mut self) -> Result<AttachOutput, EngineError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut lost = [0u64; 2];
        while let Some(event) = self.next().await {
            match event? {
                AttachEvent::Stdout(b) => stdout.extend_from_slice(&b),
                AttachEvent::Stderr(b) => stderr.extend_from_slice(&b),
                AttachEvent::Lost { channel, bytes, .. } => {
                    lost[usize::from(channel == Channel::Stderr)] += bytes;
                }
                AttachEvent::Exit(result) => {
                    return Ok(AttachOutput {
                        stdout,
                        stderr,
                        stdout_lost: lost[0],
                        stderr_lost: lost[1],
                        result,
                    });
                }
            }
        }
        Err(EngineError::Connection(
            "attachment ended without an exit status".into(),
        ))
    }

    /// Stops following the process (it keeps running) and waits until the agent has ended
    /// the attachment. Output that was on its way is dropped.
    pub async fn detach(mut self) -> Result<(), EngineError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let client = self.sandbox.client();
        client
            .send(self.call.id, &HostMessage::Detach)
            .await
            .map_err(|e| self.sandbox.map_closed(e))?;
        let wait = async {
            loop {
                match self.call.next().await {
                    Reply::Message(GuestMessage::Detached | GuestMessage::ExecExited(_)) => {
                        return Ok(());
                    }
                    Reply::Message(GuestMessage::Error(e)) => return Err(EngineError::Guest(e)),
                    Reply::Closed(reason) => return Err(self.sandbox.gone(reason)),
                    // Output already on its way.
                    Reply::Message(_) | Reply::Data(_) => {}
                }
            }
        };
        tokio::time::timeout(DETACH_TIMEOUT, wait)
            .await
            .map_err(|_| EngineError::Unresponsive("no answer to detach".into()))?
    }
}

impl Drop for AttachStream {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Tell the agent to stop sending; its answer goes nowhere (the call's route is gone).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (sandbox, id) = (self.sandbox.clone(), self.call.id);
            runtime.spawn(async move {
                let _ = sandbox.client().send(id, &HostMessage::Detach).await;
            });
        }
    }
}

impl Sandbox {
    /// Starts a process in the background and returns once it runs. Its output goes to the
    /// agent's ring buffers only (follow it with [`Sandbox::attach`]); the sandbox's exec
    /// timeout does not apply unless `req.timeout_ms` is set. With `req.stdin` (or
    /// `req.pty`) its stdin is written with [`Sandbox::write_process_stdin`].
    pub async fn spawn(&self, req: ExecRequest) -> Result<BackgroundProcess, EngineError> {
        self.check_alive().await?;
        let req = prepare_spawn(self.spec(), req)?;
        let mut call = self
            .client()
            .request(&HostMessage::Exec(req))
            .await
            .map_err(|e| self.map_closed(e))?;
        match self.with_timeout(call.message()).await? {
            GuestMessage::ExecStarted { pid } => Ok(BackgroundProcess {
                pid,
                exec_id: call.id,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Follows a tracked process's output (any exec's main process, background or not):
    /// what is buffered from `from`, then new output, then its exit (at once if it has
    /// ended). An unknown or released pid is a `no_such_process` error.
    pub async fn attach(&self, pid: i32, from: AttachFrom) -> Result<AttachStream, EngineError> {
        self.check_alive().await?;
        let before = self.counters();
        let msg = HostMessage::Attach {
            pid,
            stdout_from: from.stdout,
            stderr_from: from.stderr,
        };
        let mut call = self
            .client()
            .request(&msg)
            .await
            .map_err(|e| self.map_closed(e))?;
        match self.with_timeout(call.message()).await? {
            GuestMessage::Attached {
                stdout_offset,
                stderr_offset,
                timeout_ms,
                ..
            } => Ok(AttachStream {
                sandbox: self.clone(),
                call,
                pid,
                before,
                timeout_ms,
                next: [stdout_offset, stderr_offset],
                done: false,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Writes to a tracked process's stdin (a pipe, or its terminal) and returns once the
    /// bytes are written.
    pub async fn write_process_stdin(&self, pid: i32, bytes: &[u8]) -> Result<(), EngineError> {
        self.check_alive().await?;
        let client = self.client();
        let mut call = client
            .request(&HostMessage::ProcessStdin { pid })
            .await
            .map_err(|e| self.map_closed(e))?;
        client
            .send_data(call.id, Channel::Stdin, 0, bytes)
            .await
            .map_err(|e| self.map_closed(e))?;
        client
            .send(call.id, &HostMessage::EndOfData)
            .await
            .map_err(|e| self.map_closed(e))?;
        match self.with_timeout(call.message()).await? {
            GuestMessage::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Closes a tracked process's stdin (on a terminal: types ^D).
    pub async fn close_process_stdin(&self, pid: i32) -> Result<(), EngineError> {
        self.expect_ok(HostMessage::ProcessStdinClose { pid }).await
    }

    /// Sets the window size of a pty process's terminal.
    pub async fn resize_pty(&self, pid: i32, rows: u16, cols: u16) -> Result<(), EngineError> {
        self.expect_ok(HostMessage::Resize { pid, rows, cols })
            .await
    }

    /// Forgets an exited background process (its buffered output and exit) in the agent.
    pub async fn release_process(&self, pid: i32) -> Result<(), EngineError> {
        self.expect_ok(HostMessage::ReleaseProcess { pid }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_positions_map_to_offsets() {
        assert_eq!(
            AttachFrom::buffered(),
            AttachFrom {
                stdout: None,
                stderr: None
            }
        );
        assert_eq!(AttachFrom::start(), AttachFrom::offsets(0, 0));
        assert_eq!(AttachFrom::now().stdout, Some(u64::MAX));
        assert_eq!(AttachFrom::offsets(3, 4).stderr, Some(4));
    }
}
