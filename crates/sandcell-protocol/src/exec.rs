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
/// Default size of the ring buffer that keeps a tracked process's recent output, per stream.
pub const DEFAULT_BUFFER_BYTES: u64 = 1024 * 1024;
/// Largest ring buffer a request may ask for, per stream.
pub const MAX_BUFFER_BYTES: u64 = 64 * 1024 * 1024;
/// Exited tracked processes the agent keeps (output and exit) until they are released;
/// past this many, the one that exited first is dropped.
pub const EXITED_PROCESSES_KEPT: usize = 64;

/// The window size of a pseudo-terminal, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Lines.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

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
    /// Run in the background: the agent replies `ExecStarted` and nothing more on the
    /// request; the output goes only to the process's ring buffers, read with
    /// [`crate::HostMessage::Attach`]. A background process has no timeout unless
    /// `timeout_ms` is set.
    #[serde(default, skip_serializing_if = "is_false")]
    pub background: bool,
    /// Run on a new pseudo-terminal of this size (stdin, stdout and stderr, and the
    /// controlling terminal of a new session). Its output arrives as one stdout stream;
    /// input is always accepted, whatever `stdin` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Size of each of the ring buffers keeping the process's recent stdout and stderr
    /// (default [`DEFAULT_BUFFER_BYTES`], at most [`MAX_BUFFER_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_bytes: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
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
        Self::new(ExecCommand::Argv(
            argv.into_iter().map(Into::into).collect(),
        ))
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
            background: false,
            pty: None,
            buffer_bytes: None,
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

/// Why an exec ended, from most to least specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitCause {
    /// The process exited on its own with `exit_code`.
    Exited,
    /// A signal killed it (not one of the causes below).
    Signaled,
    /// The kernel's OOM killer killed it: the sandbox hit its memory limit.
    OomKilled,
    /// It ran past its timeout and its whole process tree was killed.
    Timeout,
    /// It failed after the sandbox hit its process limit (fork/clone refused).
    PidsLimit,
    /// It was killed on request.
    Killed,
}

/// How an exec ended, classified with the sandbox's resource counters. This is what every
/// front end shows; `message` is the human-readable cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResult {
    /// The most specific cause.
    pub cause: ExitCause,
    /// Exit code when the process exited.
    pub exit_code: Option<i32>,
    /// Signal number when a signal ended it.
    pub signal: Option<i32>,
    /// Signal name (`SIGKILL`) when a signal ended it.
    pub signal_name: Option<String>,
    /// The memory cgroup's OOM-kill counter rose during the exec (the process itself, or any
    /// other of the sandbox, was killed for memory).
    pub oom_killed: bool,
    /// The timeout passed.
    pub timed_out: bool,
    /// The pids cgroup refused a fork during the exec.
    pub pids_limit_hit: bool,
    /// Lowercase sentence naming the cause, e.g. "killed by SIGKILL (9): out of memory".
    pub message: String,
    /// Bytes of stdout the process wrote.
    pub stdout_bytes: u64,
    /// Bytes of stderr the process wrote.
    pub stderr_bytes: u64,
    /// Stdout was cut at its limit.
    pub stdout_truncated: bool,
    /// Stderr was cut at its limit.
    pub stderr_truncated: bool,
    /// Milliseconds from spawn to exit.
    pub duration_ms: f64,
}

impl ExecResult {
    /// Classifies an exit given how much the sandbox's OOM-kill and pids-limit counters
    /// rose while it ran. `timeout_ms` is only used in the message.
    pub fn classify(
        exit: &ExecExit,
        oom_kills: u64,
        pids_limit_hits: u64,
        timeout_ms: Option<u64>,
    ) -> Self {
        let name = exit.signal.map(signal_name);
        let sig_text = |s: i32| format!("killed by {} ({s})", signal_name(s));
        // Any OOM kill in the sandbox while it ran counts: with a shell line the victim is
        // usually a child, and the shell reports it as 137 or carries on.
        let oom_killed = oom_kills > 0;
        let oom_ended_it = oom_killed && (exit.signal == Some(9) || exit.exit_code == Some(137));
        let pids_limit_hit = pids_limit_hits > 0;
        let (cause, mut message) = if exit.timed_out {
            let after = timeout_ms
                .map(|t| format!(" of {} ms", t))
                .unwrap_or_default();
            (
                ExitCause::Timeout,
                format!("timed out: passed its timeout{after}; the whole process tree was killed"),
            )
        } else if oom_ended_it {
            let how = match exit.exit_code {
                Some(code) => format!("exited with code {code} (a child killed by SIGKILL)"),
                None => sig_text(9),
            };
            (
                ExitCause::OomKilled,
                format!(
                    "{how}: out of memory (the sandbox hit its memory limit and the kernel's oom killer ended the process)"
                ),
            )
        } else if exit.killed {
            (
                ExitCause::Killed,
                match exit.signal {
                    Some(s) => format!("{} on request", sig_text(s)),
                    None => "killed on request".to_string(),
                },
            )
        } else if pids_limit_hit && exit.exit_code != Some(0) {
            let how = match (exit.exit_code, exit.signal) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(s)) => sig_text(s),
                _ => "ended".to_string(),
            };
            (
                ExitCause::PidsLimit,
                format!("{how} after hitting the sandbox's process limit (fork refused)"),
            )
        } else if let Some(s) = exit.signal {
            let core = if exit.core_dumped {
                " (core dumped)"
            } else {
                ""
            };
            (ExitCause::Signaled, format!("{}{core}", sig_text(s)))
        } else {
            let code = exit.exit_code.unwrap_or(-1);
            (ExitCause::Exited, format!("exited with code {code}"))
        };
        if oom_killed && cause != ExitCause::OomKilled {
            message
                .push_str("; the kernel's oom killer ended a process of the sandbox while it ran");
        }
        if pids_limit_hit && cause != ExitCause::PidsLimit {
            message.push_str("; the process limit was hit while it ran");
        }
        if exit.stdout_truncated || exit.stderr_truncated {
            message.push_str("; output truncated");
        }
        Self {
            cause,
            exit_code: exit.exit_code,
            signal: exit.signal,
            signal_name: name,
            oom_killed,
            timed_out: exit.timed_out,
            pids_limit_hit,
            message,
            stdout_bytes: exit.stdout_bytes,
            stderr_bytes: exit.stderr_bytes,
            stdout_truncated: exit.stdout_truncated,
            stderr_truncated: exit.stderr_truncated,
            duration_ms: exit.duration_us as f64 / 1000.0,
        }
    }

    /// True when the process exited with code 0.
    pub fn success(&self) -> bool {
        self.cause == ExitCause::Exited && self.exit_code == Some(0)
    }

    /// The status a shell would report: the exit code, 124 for a timeout, 128+N for signal N.
    pub fn shell_status(&self) -> i32 {
        match (self.cause, self.exit_code, self.signal) {
            (ExitCause::Timeout, _, _) => 124,
            (_, Some(code), _) => code,
            (_, None, Some(sig)) => 128 + sig,
            _ => 1,
        }
    }
}

/// One process in the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The agent tracks this process (an exec's main process): it keeps its output and exit,
    /// and the fields below describe it. False for every other process.
    #[serde(default)]
    pub tracked: bool,
    /// Started as a background exec.
    #[serde(default)]
    pub background: bool,
    /// Runs on a pseudo-terminal.
    #[serde(default)]
    pub pty: bool,
    /// It has exited (then `state` is `X` and `exit` says how); the agent keeps the entry
    /// until it is released or pushed out by newer exits.
    #[serde(default)]
    pub exited: bool,
    /// How it ended, once it has.
    #[serde(default)]
    pub exit: Option<ExecExit>,
    /// Bytes it has written to stdout so far (the offset after its last byte).
    #[serde(default)]
    pub stdout_bytes: Option<u64>,
    /// Bytes it has written to stderr so far.
    #[serde(default)]
    pub stderr_bytes: Option<u64>,
    /// When it started, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub started_at_ms: Option<u64>,
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

    fn exit(code: Option<i32>, signal: Option<i32>) -> ExecExit {
        ExecExit {
            exit_code: code,
            signal,
            core_dumped: false,
            timed_out: false,
            killed: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            duration_us: 1500,
        }
    }

    #[test]
    fn classification_picks_the_most_specific_cause() {
        let ok = ExecResult::classify(&exit(Some(0), None), 0, 0, None);
        assert!(ok.success());
        assert_eq!(ok.duration_ms, 1.5);
        let oom = ExecResult::classify(&exit(None, Some(9)), 1, 0, None);
        assert_eq!(oom.cause, ExitCause::OomKilled);
        assert!(oom.message.contains("out of memory"));
        assert_eq!(oom.shell_status(), 137);
        let segv = ExecResult::classify(&exit(None, Some(11)), 0, 0, None);
        assert_eq!(segv.cause, ExitCause::Signaled);
        assert_eq!(segv.message, "killed by SIGSEGV (11)");
        let mut t = exit(None, Some(9));
        t.timed_out = true;
        let timeout = ExecResult::classify(&t, 0, 3, Some(1000));
        assert_eq!(timeout.cause, ExitCause::Timeout);
        assert!(timeout.pids_limit_hit && timeout.message.contains("process limit"));
        assert_eq!(timeout.shell_status(), 124);
        let bomb = ExecResult::classify(&exit(Some(2), None), 0, 5, None);
        assert_eq!(bomb.cause, ExitCause::PidsLimit);
        // A shell whose child the OOM killer ended: 137, or it carried on.
        let shell = ExecResult::classify(&exit(Some(137), None), 1, 0, None);
        assert_eq!(shell.cause, ExitCause::OomKilled);
        assert!(
            shell.message.starts_with("exited with code 137"),
            "{}",
            shell.message
        );
        let went_on = ExecResult::classify(&exit(Some(0), None), 1, 0, None);
        assert_eq!(went_on.cause, ExitCause::Exited);
        assert!(went_on.oom_killed && went_on.message.contains("oom killer"));
        // A SIGKILL without an OOM count is a plain signal, not an OOM.
        assert_eq!(
            ExecResult::classify(&exit(None, Some(9)), 0, 0, None).cause,
            ExitCause::Signaled
        );
    }

    #[test]
    fn exec_request_defaults_fill_in() {
        let req: ExecRequest = serde_json::from_str(r#"{"command":{"shell":"true"}}"#).unwrap();
        assert_eq!(req, ExecRequest::shell("true"));
    }

    #[test]
    fn old_exec_requests_parse_as_foreground_without_a_pty() {
        let req: ExecRequest = serde_json::from_str(
            r#"{"command":{"argv":["cat"]},"env":{},"cwd":null,"stdin":true,"timeout_ms":5,"stdout_limit":10,"stderr_limit":20}"#,
        )
        .unwrap();
        assert!(!req.background);
        assert_eq!(req.pty, None);
        assert_eq!(req.buffer_bytes, None);
        assert!(req.stdin);
        assert_eq!((req.stdout_limit, req.stderr_limit), (10, 20));
    }

    #[test]
    fn old_process_infos_parse_as_untracked() {
        let info: ProcessInfo = serde_json::from_str(
            r#"{"pid":5,"ppid":1,"pgid":5,"state":"S","cmdline":"sleep 9","rss_bytes":4096,"exec_id":2}"#,
        )
        .unwrap();
        assert_eq!(info.exec_id, Some(2));
        assert!(!info.tracked && !info.background && !info.pty && !info.exited);
        assert_eq!(
            (info.exit, info.stdout_bytes, info.started_at_ms),
            (None, None, None)
        );
    }

    #[test]
    fn tracked_process_infos_round_trip() {
        let info = ProcessInfo {
            pid: 9,
            ppid: 1,
            pgid: 9,
            state: "X".into(),
            cmdline: "sh -c x".into(),
            rss_bytes: 0,
            exec_id: Some(4),
            tracked: true,
            background: true,
            pty: true,
            exited: true,
            exit: Some(exit(None, Some(9))),
            stdout_bytes: Some(12),
            stderr_bytes: Some(0),
            started_at_ms: Some(1_700_000_000_000),
        };
        let json = serde_json::to_string(&info).unwrap();
        assert_eq!(serde_json::from_str::<ProcessInfo>(&json).unwrap(), info);
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(64), "SIG64");
    }
}
