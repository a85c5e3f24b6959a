//! Background processes: start one that outlives the request, follow its output from any
//! offset (and again after a disconnect), collect it, feed its stdin, resize its terminal.

use futures_util::StreamExt;
use sandcell_api::SandboxId;
use sandcell_api::exec::{ExecInput, ExitEvent, ExitInfo};
use sandcell_api::processes::{
    LostOutput, OutputChunk, OutputFrom, ProcessOutput, ProcessStreamEvent, StartProcess, Started,
    TermSize,
};
use sandcell_engine::{AttachEvent, AttachFrom};
use sandcell_protocol::{Channel, ExecRequest, PtySize};

use super::check_pid;
use crate::exec::{Events, exec_request, stream_error};
use crate::{Caller, Service, ServiceError, ServiceResult};

/// The engine's size of a checked terminal size.
pub(crate) fn pty_size(size: TermSize) -> ServiceResult<PtySize> {
    let size = size.check()?;
    Ok(PtySize {
        rows: size.rows,
        cols: size.cols,
    })
}

/// The engine request a background start asks for, checked.
pub fn start_request(input: &StartProcess) -> ServiceResult<ExecRequest> {
    let mut req = exec_request(&ExecInput {
        cmd: input.cmd.clone(),
        argv: input.argv.clone(),
        env: input.env.clone(),
        cwd: input.cwd.clone(),
        timeout_secs: input.timeout_secs,
        stdin: None,
    })?;
    req.background = true;
    req.stdin = input.stdin;
    req.pty = input.pty.map(pty_size).transpose()?;
    if let Some(b) = input.buffer_bytes {
        if b > sandcell_protocol::exec::MAX_BUFFER_BYTES {
            return Err(ServiceError::invalid(format!(
                "buffer_bytes must be at most {}",
                sandcell_protocol::exec::MAX_BUFFER_BYTES
            )));
        }
        req.buffer_bytes = Some(b);
    }
    Ok(req)
}

fn attach_from(from: OutputFrom) -> AttachFrom {
    AttachFrom {
        stdout: from.stdout_from,
        stderr: from.stderr_from,
    }
}

impl Service {
    /// Starts a process in the background in the caller's sandbox `id`; answers at once with
    /// its pid.
    pub async fn start_process(
        &self,
        caller: &Caller,
        id: &SandboxId,
        input: StartProcess,
    ) -> ServiceResult<Started> {
        let req = start_request(&input)?;
        let sandbox = self.running_sandbox(caller, id)?;
        let started = sandbox.spawn(req).await?;
        Ok(Started {
            pid: started.pid,
            exec_id: started.exec_id,
        })
    }

    /// Follows process `pid`'s output from the offsets asked: `stdout`/`stderr` chunks with
    /// their offsets, `lost` where asked-for bytes are no longer buffered, then `exit` (or
    /// an `error`).
    pub async fn follow_process(
        &self,
        caller: &Caller,
        id: &SandboxId,
        pid: i32,
        from: OutputFrom,
    ) -> ServiceResult<Events<ProcessStreamEvent>> {
        check_pid(pid)?;
        let sandbox = self.running_sandbox(caller, id)?;
        let attach = sandbox.attach(pid, attach_from(from)).await?;
        Ok(
            futures_util::stream::unfold(Some(attach), |state| async move {
                let mut attach = state?;
                let before = [attach.stdout_offset(), attach.stderr_offset()];
                let chunk = |b: Vec<u8>, offset: u64| OutputChunk {
                    data: String::from_utf8_lossy(&b).into_owned(),
                    offset,
                    bytes: b.len(),
                };
                let event = match attach.next().await? {
                    Ok(AttachEvent::Stdout(b)) => ProcessStreamEvent::Stdout(chunk(b, before[0])),
                    Ok(AttachEvent::Stderr(b)) => ProcessStreamEvent::Stderr(chunk(b, before[1])),
                    Ok(AttachEvent::Lost {
                        channel,
                        offset,
                        bytes,
                    }) => ProcessStreamEvent::Lost(LostOutput {
                        channel: if channel == Channel::Stderr {
                            "stderr"
                        } else {
                            "stdout"
                        }
                        .to_string(),
                        offset,
                        bytes,
                    }),
                    Ok(AttachEvent::Exit(result)) => {
                        return Some((ProcessStreamEvent::Exit(ExitEvent::from(&result)), None));
                    }
                    Err(e) => return Some((ProcessStreamEvent::Error(stream_error(e)), None)),
                };
                Some((event, Some(attach)))
            })
            .boxed(),
        )
    }

    /// Waits for process `pid` to end and returns its output from the offsets asked.
    pub async fn process_output(
        &self,
        caller: &Caller,
        id: &SandboxId,
        pid: i32,
        from: OutputFrom,
    ) -> ServiceResult<ProcessOutput> {
        check_pid(pid)?;
        let sandbox = self.running_sandbox(caller, id)?;
        let out = sandbox
            .attach(pid, attach_from(from))
            .await?
            .collect()
            .await?;
        Ok(ProcessOutput {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout_lost: out.stdout_lost,
            stderr_lost: out.stderr_lost,
            exit_code: out.result.exit_code,
            ok: out.result.exit_code == Some(0),
            result: ExitInfo::from(&out.result),
        })
    }

    /// Writes `bytes` to process `pid`'s stdin (or terminal), then with `close` closes it
    /// (no bytes and `close`: only closes).
    pub async fn write_process_stdin(
        &self,
        caller: &Caller,
        id: &SandboxId,
        pid: i32,
        bytes: &[u8],
        close: bool,
    ) -> ServiceResult<()> {
        check_pid(pid)?;
        if bytes.len() > sandcell_api::processes::MAX_STDIN_BYTES {
            return Err(ServiceError::new(
                crate::ErrorKind::BodyTooLarge,
                format!(
                    "a stdin write is at most {} bytes",
                    sandcell_api::processes::MAX_STDIN_BYTES
                ),
            ));
        }
        let sandbox = self.running_sandbox(caller, id)?;
        if !bytes.is_empty() {
            sandbox.write_process_stdin(pid, bytes).await?;
        }
        if close {
            sandbox.close_process_stdin(pid).await?;
        }
        Ok(())
    }

    /// Resizes process `pid`'s terminal.
    pub async fn resize_terminal(
        &self,
        caller: &Caller,
        id: &SandboxId,
        pid: i32,
        size: TermSize,
    ) -> ServiceResult<()> {
        check_pid(pid)?;
        let size = pty_size(size)?;
        let sandbox = self.running_sandbox(caller, id)?;
        sandbox.resize_pty(pid, size.rows, size.cols).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_are_checked() {
        let ok = StartProcess {
            cmd: Some("sleep 9".into()),
            pty: Some(TermSize { rows: 30, cols: 90 }),
            buffer_bytes: Some(4096),
            ..StartProcess::default()
        };
        let req = start_request(&ok).unwrap();
        assert!(req.background);
        assert_eq!(req.pty, Some(PtySize { rows: 30, cols: 90 }));
        for bad in [
            StartProcess::default(),
            StartProcess {
                pty: Some(TermSize { rows: 0, cols: 80 }),
                ..ok.clone()
            },
            StartProcess {
                buffer_bytes: Some(sandcell_protocol::exec::MAX_BUFFER_BYTES + 1),
                ..ok.clone()
            },
        ] {
            assert_eq!(start_request(&bad).unwrap_err().code(), "invalid_argument");
        }
    }
}
