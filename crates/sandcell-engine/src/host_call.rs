//! Host calls, host side: code running in a kernel asks the host something (a model call
//! for a repl-mode agent run) and waits; the caller of [`crate::Sandbox::run_code_with`]
//! supplies the [`HostCallHandler`] that answers, for that execution only. The question and
//! the answer travel over the agent's connection (`sandcell_protocol::host_call`), so the
//! sandbox needs no network and never holds the credentials the handler uses.
//!
//! Each call is answered in a task of its own (calls of one execution are answered
//! concurrently); when the execution ends, answers still being worked on are abandoned (their
//! tasks aborted). Without a handler, every call is answered
//! [`HostCallErrorKind::Unavailable`] at once.

use std::future::Future;
use std::pin::Pin;

pub use sandcell_protocol::{HostCallError, HostCallErrorKind, HostCallResult};

/// What code in a kernel asked.
#[derive(Debug, Clone, PartialEq)]
pub struct HostCallRequest {
    /// The kernel's number for the call (unique within the kernel).
    pub call: u64,
    /// The method (`llm_query`, `llm_query_batched`, `rlm_query`, `final`, …).
    pub method: String,
    /// Its arguments, as the kernel sent them (checked by the handler).
    pub payload: serde_json::Value,
}

/// The answer being worked on.
pub type HostCallFuture =
    Pin<Box<dyn Future<Output = Result<serde_json::Value, HostCallError>> + Send + 'static>>;

/// Answers the host calls of the executions it is given to. A closure
/// `Fn(HostCallRequest) -> HostCallFuture` is one.
pub trait HostCallHandler: Send + Sync {
    /// Works out the answer to `request`; an error is raised in the kernel as an exception
    /// of its kind.
    fn call(&self, request: HostCallRequest) -> HostCallFuture;
}

impl<F> HostCallHandler for F
where
    F: Fn(HostCallRequest) -> HostCallFuture + Send + Sync,
{
    fn call(&self, request: HostCallRequest) -> HostCallFuture {
        self(request)
    }
}

/// The answer to host calls of code run without a handler.
pub const NO_HANDLER: &str = "host calls are unavailable here: this code was run without a \
host-call handler (llm_query and the others work in repl-mode agent runs)";
