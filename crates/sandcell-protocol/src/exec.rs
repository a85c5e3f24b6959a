//! Process execution: requests, results and process listings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecCommand {
    /// An argument vector; `argv[0]` is looked up on `PATH` when it has no slash.
    Argv(Vec<String>),
    /// A command line run by `/bin/sh -c`.
    Shell(String),
}

/// Default cap on captured stdout bytes per exec.
pub const DEFAULT_STDOUT_LIMIT: u64 = 1024 * 1024;
/// Default cap on captured stderr bytes per exec.
pub const DEFAULT_STDERR_LIMIT: u64 = 1024 * 1024;

/// A request to start a process in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The command.
    pub command: ExecCommand,
    /// Variables added to (or overriding) the sandbox's default environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; default `/workspace`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// When true the host streams stdin as [`crate::Channel::Stdin`] chunks and ends it with
    /// [`crate::HostMessage::StdinClose`]; when false stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Wall-clock limit in milliseconds; the whole process tree is killed when it passes.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes of stdout forwarded before the rest is dropped and marked truncated.
    #[serde(default = "default_stdout_limit")]
    pub stdout_limit: u64,
    /// Bytes of stderr forwarded before the rest is dropped and marked truncated.
    #[serde(default = "default_stderr_limit")]
    pub stderr_limit: u64,
}

fn default_stdout_limit() -> u64 {
    DEFAULT_STDOUT_LIMIT
}
fn default_stderr_limit() -> u64 {
    DEFAULT_STDERR_LIMIT
}

impl ExecRequest {
    /// A request for an argument vector with default settings.
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        Self::new(ExecCommand::Argv(argv.into_iter().map(Into::into).collect()))
    }

    /// A request for a `sh -c` command line with default settings.
    pub fn shell(line: impl Into<String>) -> Self {
        Self::new(ExecCommand::Shell(line.into()))
    }

    fn new(command: ExecCommand) -> Self {
        Self {
            command,
            env: BTreeMap::new(),
            cwd: None,
            stdin: false,
            timeout_ms: None,
            stdout_limit: DEFAULT_STDOUT_LIMIT,
            stderr_limit: DEFAULT_STDERR_LIMIT,
        }
    }
}

/// How a process ended, as the guest agent saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecExit {
    /// Exit code when the process exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the process was killed by a signal.
    pub signal: Option<i32>,
    /// Whether the signal produced a core dump.
    #[serde(default)]
    pub core_dumped: bool,
    /// The agent killed the tree because `timeout_ms` passed.
    #[serde(default)]
    pub timed_out: bool,
    /// The tree was killed on the host's request.
    #[serde(default)]
    pub killed: bool,
    /// Bytes of stdout the process wrote (including dropped ones).
    pub stdout_bytes: u64,
    /// Bytes of stderr the process wrote (including dropped ones).
    pub stderr_bytes: u64,
    /// Stdout went over its limit and the excess was dropped.
    pub stdout_truncated: bool,
    /// Stderr went over its limit and the excess was dropped.
    pub stderr_truncated: bool,
    /// Microseconds from spawn to exit.
    pub duration_us: u64,
}

/// One process in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Pid inside the sandbox.
    pub pid: i32,
    /// Parent pid inside the sandbox.
    pub ppid: i32,
    /// Process group id.
    pub pgid: i32,
    /// State letter from `/proc/PID/stat` (R, S, D, Z, T, …).
    pub state: String,
    /// Command line, or `[comm]` when it has none.
    pub cmdline: String,
    /// Resident memory in bytes.
    pub rss_bytes: u64,
    /// The exec request that started this process's tree, when known.
    pub exec_id: Option<u32>,
}

/// The conventional name of a signal (`SIGKILL`), or `SIG<n>` for unknown numbers.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        16 => "SIGSTKFLT",
        17 => "SIGCHLD",
        18 => "SIGCONT",
        19 => "SIGSTOP",
        20 => "SIGTSTP",
        21 => "SIGTTIN",
        22 => "SIGTTOU",
        23 => "SIGURG",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        26 => "SIGVTALRM",
        27 => "SIGPROF",
        28 => "SIGWINCH",
        29 => "SIGIO",
        30 => "SIGPWR",
        31 => "SIGSYS",
        _ => return format!("SIG{signal}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_request_defaults_fill_in() {
        let req: ExecRequest = serde_json::from_str(r#"{"command":{"shell":"true"}}"#).unwrap();
        assert_eq!(req, ExecRequest::shell("true"));
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(64), "SIG64");
    }
}
