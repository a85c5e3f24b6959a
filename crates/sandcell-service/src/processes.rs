//! Processes: every process in a sandbox and signals to them; background processes
//! ([`background`]: start, follow, collect, stdin, resize) and terminals ([`terminal`]).

pub mod background;
pub mod terminal;

use sandcell_api::SandboxId;
use sandcell_api::processes::{ProcessList, ProcessView};

pub use terminal::{Terminal, TerminalEvent, TerminalInput, TerminalOutput};

use crate::{Caller, Service, ServiceError, ServiceResult};

/// A background process's pid: the sandbox's agent (pid 1) is not one.
pub(crate) fn check_pid(pid: i32) -> ServiceResult<()> {
    if pid < 2 {
        return Err(ServiceError::invalid(format!(
            "pid {pid} is not a process of the sandbox's (pid 1 is its agent)"
        )));
    }
    Ok(())
}

impl Service {
    /// Every process in the caller's sandbox `id` (its agent excluded), by pid.
    pub async fn list_processes(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<ProcessList> {
        let sandbox = self.running_sandbox(caller, id)?;
        let processes = sandbox.processes().await?;
        Ok(ProcessList {
            processes: processes.into_iter().map(ProcessView::from).collect(),
        })
    }

    /// Sends `signal` (1 to 64) to process `pid` of the caller's sandbox `id`, or with `tree`
    /// to it and its descendants.
    pub async fn signal_process(
        &self,
        caller: &Caller,
        id: &SandboxId,
        pid: i32,
        signal: i32,
        tree: bool,
    ) -> ServiceResult<()> {
        if pid < 2 {
            return Err(ServiceError::invalid(format!(
                "pid {pid} is not a process you can signal (pid 1 is the sandbox's agent)"
            )));
        }
        if !(1..=64).contains(&signal) {
            return Err(ServiceError::invalid(format!(
                "signal {signal} must be a number from 1 to 64"
            )));
        }
        let sandbox = self.running_sandbox(caller, id)?;
        sandbox.kill_process(pid, signal, tree).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sandcell_api::processes::{OpenTerminal, OutputFrom, TermSize};

    use crate::exec::testing::{block_on, service};

    #[test]
    fn pids_signals_sizes_and_stdin_are_checked_first() {
        let (service, caller, _home) = service();
        let id = &crate::exec::testing::sid("sb-1a2b");
        block_on(async {
            let code = |r: crate::ServiceResult<()>| r.unwrap_err().code();
            assert_eq!(
                code(service.signal_process(&caller, id, 1, 9, false).await),
                "invalid_argument"
            );
            assert_eq!(
                code(service.signal_process(&caller, id, 42, 0, false).await),
                "invalid_argument"
            );
            assert_eq!(
                code(service.signal_process(&caller, id, 42, 15, true).await),
                "not_found"
            );
            let e = service
                .follow_process(&caller, id, 1, OutputFrom::default())
                .await
                .err()
                .unwrap();
            assert_eq!(e.code(), "invalid_argument");
            let e = service
                .process_output(&caller, id, 0, OutputFrom::default())
                .await
                .unwrap_err();
            assert_eq!(e.code(), "invalid_argument");
            let size = TermSize {
                rows: 24,
                cols: 1001,
            };
            assert_eq!(
                code(service.resize_terminal(&caller, id, 42, size).await),
                "invalid_argument"
            );
            let big = vec![0; sandcell_api::processes::MAX_STDIN_BYTES + 1];
            assert_eq!(
                code(
                    service
                        .write_process_stdin(&caller, id, 42, &big, true)
                        .await
                ),
                "body_too_large"
            );
            let open = OpenTerminal {
                cols: size.cols,
                ..OpenTerminal::default()
            };
            let e = service.open_terminal(&caller, id, open).await.unwrap_err();
            assert_eq!(e.code(), "invalid_argument");
            let join = OpenTerminal {
                pid: Some(1),
                ..OpenTerminal::default()
            };
            let e = service.open_terminal(&caller, id, join).await.unwrap_err();
            assert_eq!(e.code(), "invalid_argument");
            let e = service.list_processes(&caller, id).await.unwrap_err();
            assert_eq!(e.code(), "not_found");
        });
    }
}
