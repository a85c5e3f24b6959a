//! Processes: every process in a sandbox and signals to them; background processes
//! ([`background`]: start, follow, collect, stdin, resize) and terminals ([`terminal`]).

pub mod background;
pub mod terminal;

use sandcell_api::processes::{ProcessList, ProcessView};
use sandcell_api::rules::check_sandbox_id;

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
    pub async fn list_processes(&self, caller: &Caller, id: &str) -> ServiceResult<ProcessList> {
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
        id: &str,
        pid: i32,
        signal: i32,
        tree: bool,
    ) -> ServiceResult<()> {
        check_sandbox_id(id)?;
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
