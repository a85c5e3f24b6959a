//! Host calls: code running in a kernel asks the host something and blocks for the answer
//! (repl-mode agent runs: `llm_query`, `rlm_query`, `FINAL`), over the connection the
//! execution already has. The sandbox needs no network for it and no secret ever enters it:
//! the host does the work and sends back only the answer.
//!
//! ```text
//! kernel                      agent                              host
//! host_call event    ->  GuestMessage::HostCall{call, ..}  ->  the run_code caller's handler
//!   (blocks)             on the RunCode request's id
//! host_reply line    <-  HostMessage::HostCallReply{call, result}  <-  its answer
//! ```
//!
//! - A call belongs to the execution that made it: it travels on that `RunCode` request's id,
//!   and its `call` number (the kernel's, unique within the kernel) pairs it with its reply.
//! - Only a host that greeted with protocol 2 or later gets host calls; for an older host the
//!   agent answers every call itself with [`HostCallErrorKind::Unavailable`].
//! - A host with nothing to answer them (code run without a handler) answers
//!   [`HostCallErrorKind::Unavailable`] at once.
//! - An interrupt (or the cell's timeout) ends the wait in the kernel. When the execution ends
//!   with calls still pending, the agent answers them [`HostCallErrorKind::Cancelled`] to the
//!   kernel and drops the host's later replies; the host stops waiting for their answers.
//! - Time spent waiting for the host does not count against the execution's timeout (the
//!   host bounds its own work); the agent allows at most [`MAX_PENDING_HOST_CALLS`] calls in
//!   flight per execution and answers more with [`HostCallErrorKind::InvalidArgument`].

use serde::{Deserialize, Serialize};

/// The first protocol version with host calls.
pub const HOST_CALLS_SINCE: u32 = 2;

/// Calls one execution may have waiting for the host at once.
pub const MAX_PENDING_HOST_CALLS: usize = 64;

/// The longest method name, in bytes.
pub const MAX_HOST_CALL_METHOD: usize = 64;

/// A kernel's question to the host (guest → host, on the `RunCode` request's id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCall {
    /// Pairs the call with its reply (numbered by the kernel).
    pub call: u64,
    /// What is asked (`llm_query`, `llm_query_batched`, `rlm_query`, `final`, …); the
    /// handler decides what it serves.
    pub method: String,
    /// The method's arguments.
    #[serde(default)]
    pub payload: serde_json::Value,
}

/// The answer to a [`HostCall`]: `{"ok": value}` or `{"error": {"kind", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostCallResult {
    /// The method's answer.
    Ok(serde_json::Value),
    /// Why there is none.
    Error(HostCallError),
}

impl HostCallResult {
    /// An error answer.
    pub fn error(kind: HostCallErrorKind, message: impl Into<String>) -> Self {
        HostCallResult::Error(HostCallError::new(kind, message))
    }
}

impl From<Result<serde_json::Value, HostCallError>> for HostCallResult {
    fn from(r: Result<serde_json::Value, HostCallError>) -> Self {
        match r {
            Ok(v) => HostCallResult::Ok(v),
            Err(e) => HostCallResult::Error(e),
        }
    }
}

/// Why a host call has no answer; the kernel raises it as an exception of its kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct HostCallError {
    /// Which kind of refusal or failure.
    pub kind: HostCallErrorKind,
    /// Lowercase, specific, shown to the code's reader.
    pub message: String,
}

impl HostCallError {
    /// Builds an error.
    pub fn new(kind: HostCallErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Kinds of [`HostCallError`] (the Python kernel raises `SandcellBudgetError` for `budget`,
/// `SandcellCancelledError` for `cancelled`, `SandcellHostCallError` for the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostCallErrorKind {
    /// Nobody on the host answers host calls for this execution (plain `run_code`, a host
    /// that predates them).
    Unavailable,
    /// The handler serves no such method.
    UnknownMethod,
    /// The arguments are not what the method takes (or too many calls are in flight).
    InvalidArgument,
    /// A budget of the run is spent (the message names it, e.g. `budget:sub_calls`).
    Budget,
    /// The run was cancelled, or the execution ended before the answer.
    Cancelled,
    /// The host tried and failed (a provider error).
    Failed,
}

impl HostCallErrorKind {
    /// The wire name (`unavailable`, `budget`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            HostCallErrorKind::Unavailable => "unavailable",
            HostCallErrorKind::UnknownMethod => "unknown_method",
            HostCallErrorKind::InvalidArgument => "invalid_argument",
            HostCallErrorKind::Budget => "budget",
            HostCallErrorKind::Cancelled => "cancelled",
            HostCallErrorKind::Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn results_have_stable_json() {
        let ok = HostCallResult::Ok(json!(["a", "b"]));
        assert_eq!(serde_json::to_string(&ok).unwrap(), r#"{"ok":["a","b"]}"#);
        let err = HostCallResult::error(HostCallErrorKind::Budget, "budget:sub_calls");
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"error":{"kind":"budget","message":"budget:sub_calls"}}"#
        );
        for kind in [
            HostCallErrorKind::Unavailable,
            HostCallErrorKind::UnknownMethod,
            HostCallErrorKind::InvalidArgument,
            HostCallErrorKind::Budget,
            HostCallErrorKind::Cancelled,
            HostCallErrorKind::Failed,
        ] {
            let v = serde_json::to_value(kind).unwrap();
            assert_eq!(v, json!(kind.as_str()));
        }
        // A null answer is still an answer.
        let none: HostCallResult = serde_json::from_str(r#"{"ok":null}"#).unwrap();
        assert_eq!(none, HostCallResult::Ok(serde_json::Value::Null));
    }

    #[test]
    fn a_call_without_payload_reads_as_null() {
        let c: HostCall = serde_json::from_str(r#"{"call":3,"method":"final"}"#).unwrap();
        assert_eq!(c.payload, serde_json::Value::Null);
        assert_eq!((c.call, c.method.as_str()), (3, "final"));
    }
}
