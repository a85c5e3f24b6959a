//! `/v1/sandboxes/{id}/processes`: every process in a sandbox, and signals to them.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use sandcell_protocol::ProcessInfo;
use serde::Serialize;
use utoipa::ToSchema;

use super::extract::{ApiPath, check_sandbox_id, query_pairs};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// One process.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessView {
    /// Pid inside the sandbox.
    pub pid: i32,
    /// Parent pid.
    pub ppid: i32,
    /// Process group.
    pub pgid: i32,
    /// State letter (R, S, D, Z, T…).
    pub state: String,
    /// Command line.
    pub cmdline: String,
    /// Resident memory in bytes.
    pub rss_bytes: u64,
    /// The exec that started its tree, when known.
    pub exec_id: Option<u32>,
    /// Started by an exec or a background start (its output can be attached to).
    pub tracked: bool,
    /// Started in the background.
    pub background: bool,
    /// Runs on a terminal.
    pub pty: bool,
    /// It has ended (kept so its output and exit can still be read).
    pub exited: bool,
    /// Its exit code, once it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub exit_signal: Option<i32>,
    /// Stdout bytes written so far.
    pub stdout_bytes: Option<u64>,
    /// Stderr bytes written so far.
    pub stderr_bytes: Option<u64>,
    /// When it started, milliseconds since the epoch.
    pub started_at_ms: Option<u64>,
}

impl From<ProcessInfo> for ProcessView {
    fn from(p: ProcessInfo) -> Self {
        Self {
            pid: p.pid,
            ppid: p.ppid,
            pgid: p.pgid,
            state: p.state,
            cmdline: p.cmdline,
            rss_bytes: p.rss_bytes,
            exec_id: p.exec_id,
            tracked: p.tracked,
            background: p.background,
            pty: p.pty,
            exited: p.exited,
            exit_code: p.exit.as_ref().and_then(|e| e.exit_code),
            exit_signal: p.exit.as_ref().and_then(|e| e.signal),
            stdout_bytes: p.stdout_bytes,
            stderr_bytes: p.stderr_bytes,
            started_at_ms: p.started_at_ms,
        }
    }
}

/// A sandbox's processes.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessList {
    /// By pid.
    pub processes: Vec<ProcessView>,
}

/// Lists every process in the sandbox (its agent excluded).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = ProcessList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<ProcessList>> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let processes = sandbox.processes().await?;
    Ok(Json(ProcessList {
        processes: processes.into_iter().map(ProcessView::from).collect(),
    }))
}

/// Signal numbers by name, for `?signal=`.
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("KILL", 9),
    ("USR1", 10),
    ("USR2", 12),
    ("TERM", 15),
    ("CONT", 18),
    ("STOP", 19),
];

/// Parses `KILL`, `SIGKILL` or `9`.
pub fn parse_signal(v: &str) -> Result<i32, ApiError> {
    let name = v.trim().to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    if let Some((_, n)) = SIGNALS.iter().find(|(s, _)| *s == name) {
        return Ok(*n);
    }
    name.parse::<i32>()
        .ok()
        .filter(|n| (1..=64).contains(n))
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "signal '{v}' is not a signal name (TERM, KILL, INT, HUP, …) or number from 1 to 64"
            ))
        })
}

/// Sends a signal (default KILL) to a process, or with `tree=true` to it and its descendants.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = i32, Path, description = "Pid inside the sandbox"),
        ("signal" = Option<String>, Query, description = "TERM, KILL (default), INT, HUP… or a number"),
        ("tree" = Option<bool>, Query, description = "Its descendants too"),
    ),
    responses(
        (status = 204, description = "Sent"),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn signal(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    check_sandbox_id(&id)?;
    if pid < 2 {
        return Err(ApiError::invalid(format!(
            "pid {pid} is not a process you can signal (pid 1 is the sandbox's agent)"
        )));
    }
    let mut signal = 9;
    let mut tree = false;
    for (k, v) in query_pairs(raw.as_deref())? {
        match k.as_str() {
            "signal" => signal = parse_signal(&v)?,
            "tree" => {
                tree = match v.as_str() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "'tree' must be true or false, got '{v}'"
                        )));
                    }
                }
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (signal, tree)"
                )));
            }
        }
    }
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    sandbox.kill_process(pid, signal, tree).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_or_number() {
        assert_eq!(parse_signal("TERM").unwrap(), 15);
        assert_eq!(parse_signal("sigkill").unwrap(), 9);
        assert_eq!(parse_signal("2").unwrap(), 2);
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("NOPE").is_err());
    }
}
