//! Terminals: start a process on a new terminal (or join a running one) and pump it both
//! ways. The front end carries the bytes and frames (REST: a WebSocket).

use sandcell_api::SandboxId;
use sandcell_api::processes::{OpenTerminal, StartProcess, TermSize, TerminalFrame};
use sandcell_engine::{AttachEvent, AttachFrom, AttachStream, Sandbox};

use super::background::{pty_size, start_request};
use super::check_pid;
use crate::exec::stream_error;
use crate::{Caller, Service, ServiceResult};

/// What a new terminal runs when the request names nothing.
pub const DEFAULT_TERMINAL_COMMAND: &str = "exec bash -l";

/// An open terminal: its process, its output and its input (which may go to another task).
pub struct Terminal {
    /// The terminal's process (join it again with this pid after a disconnect).
    pub pid: i32,
    /// What it prints, then how it ended.
    pub output: TerminalOutput,
    /// Keystrokes and resizes.
    pub input: TerminalInput,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// One thing a terminal sends its client.
#[derive(Debug, Clone, PartialEq)]
pub enum TerminalEvent {
    /// The terminal's bytes.
    Output(Vec<u8>),
    /// A frame: `lost`, or the last one, `exit` or `error`.
    Frame(TerminalFrame),
}

/// A terminal's output side.
pub struct TerminalOutput {
    attach: AttachStream,
    done: bool,
}

impl TerminalOutput {
    /// The next event; `None` after `exit` or `error`.
    pub async fn next(&mut self) -> Option<TerminalEvent> {
        if self.done {
            return None;
        }
        let event = match self.attach.next().await {
            Some(Ok(AttachEvent::Stdout(b) | AttachEvent::Stderr(b))) => TerminalEvent::Output(b),
            Some(Ok(AttachEvent::Lost { bytes, .. })) => {
                TerminalEvent::Frame(TerminalFrame::Lost { bytes })
            }
            Some(Ok(AttachEvent::Exit(result))) => {
                self.done = true;
                TerminalEvent::Frame(TerminalFrame::Exit {
                    exit_code: result.exit_code,
                    ok: result.success(),
                    result: (&result).into(),
                })
            }
            Some(Err(e)) => {
                self.done = true;
                let e = stream_error(e);
                TerminalEvent::Frame(TerminalFrame::Error {
                    code: e.code,
                    message: e.message,
                })
            }
            None => {
                self.done = true;
                return None;
            }
        };
        Some(event)
    }
}

/// A terminal's input side; cheap to clone.
#[derive(Clone)]
pub struct TerminalInput {
    sandbox: Sandbox,
    pid: i32,
}

impl TerminalInput {
    /// Types `bytes` into the terminal.
    pub async fn keys(&self, bytes: &[u8]) -> ServiceResult<()> {
        Ok(self.sandbox.write_process_stdin(self.pid, bytes).await?)
    }

    /// Resizes the terminal.
    pub async fn resize(&self, size: TermSize) -> ServiceResult<()> {
        let size = pty_size(size)?;
        Ok(self
            .sandbox
            .resize_pty(self.pid, size.rows, size.cols)
            .await?)
    }

    /// A text message from the client: a `resize` frame resizes (one naming no valid size
    /// is ignored), anything else is typed.
    pub async fn text(&self, text: &str) -> ServiceResult<()> {
        match TerminalFrame::resize_of(text) {
            Some(Some(size)) => self.resize(size).await,
            Some(None) => Ok(()),
            None => self.keys(text.as_bytes()).await,
        }
    }
}

impl Service {
    /// Opens a terminal in the caller's sandbox `id`: starts `cmd` (default
    /// [`DEFAULT_TERMINAL_COMMAND`]) on a new terminal, or with `pid` joins a running
    /// terminal process (its recent output is replayed). Attached before it returns, so a
    /// wrong pid is an error here, not a closed terminal.
    pub async fn open_terminal(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: OpenTerminal,
    ) -> ServiceResult<Terminal> {
        if let Some(pid) = req.pid {
            check_pid(pid)?;
        }
        let size = req.size().check()?;
        let sandbox = self.running_sandbox(caller, id)?;
        let (pid, from) = match req.pid {
            Some(pid) => (pid, AttachFrom::buffered()),
            None => {
                let start = StartProcess {
                    cmd: Some(
                        req.cmd
                            .unwrap_or_else(|| DEFAULT_TERMINAL_COMMAND.to_string()),
                    ),
                    cwd: req.cwd,
                    pty: Some(size),
                    stdin: true,
                    ..StartProcess::default()
                };
                let started = sandbox.spawn(start_request(&start)?).await?;
                (started.pid, AttachFrom::start())
            }
        };
        let attach = sandbox.attach(pid, from).await?;
        Ok(Terminal {
            pid,
            output: TerminalOutput {
                attach,
                done: false,
            },
            input: TerminalInput { sandbox, pid },
        })
    }
}
