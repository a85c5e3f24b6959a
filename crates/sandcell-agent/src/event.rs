//! The trajectory: every event of a run, in order, as it is written to the store (the source
//! of truth), the JSONL mirror and live followers. The envelope is the same for every event;
//! `type` says which one it is.

use sandcell_api::runs::{Budgets, RunMode, RunUsage};
use sandcell_llm::{FinishReason, ToolCall, Usage};
use serde::{Deserialize, Serialize};

/// The version of the event schema.
pub const EVENT_VERSION: u32 = 1;

/// One event with its envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The schema version.
    pub v: u32,
    /// The run.
    pub run_id: String,
    /// The top of its run tree.
    pub root_run_id: String,
    /// 1, 2, 3, … without gaps (also the SSE event id).
    pub seq: u64,
    /// When (RFC 3339).
    pub ts: String,
    /// The step it belongs to (0 before the first model call).
    pub step: u32,
    /// The run's depth in its tree.
    pub depth: u32,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// An image or a large output kept beside the trajectory rather than inside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactRef {
    /// Its MIME type.
    pub media_type: String,
    /// The file, under the home's `trajectories/<run>/`.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A step's snapshot of the run's sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSnapshot {
    /// The snapshot (`GET /v1/snapshots/{id}`).
    pub snapshot_id: String,
    /// `files`, `language` or `process`: what a restore brings back.
    pub fidelity: String,
    /// What it does not carry (running processes, variables that could not be saved).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_carried: Vec<String>,
    /// How long taking it took.
    pub duration_ms: u64,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// The run began.
    RunStarted {
        /// What it was asked.
        task: String,
        /// How the model works.
        mode: RunMode,
        /// `provider/model`.
        model: String,
        /// Its limits.
        budgets: Budgets,
        /// The run that started it, for a sub-run.
        parent_run_id: Option<String>,
        /// How its final answer is checked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        validate: Option<sandcell_api::runs::Validate>,
        /// The run and step a fork's history comes from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forked_from: Option<sandcell_api::runs::ForkedFrom>,
        /// Repl mode: its input (`context`), kept as a file when it is not the task, so a
        /// resume or a fork can load it into a new kernel.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<ArtifactRef>,
    },
    /// Repl mode: the kernel context the run's code runs in (its variables are the run's
    /// working state, carried by the step snapshots).
    KernelReady {
        /// The context (`/v1/sandboxes/{id}/contexts/{context_id}`).
        context_id: String,
        /// Made and loaded with the input now (else the one the sandbox already had).
        fresh: bool,
    },
    /// A thread's history: the conversation of its earlier runs (and this run's task), and
    /// the sandbox its runs share.
    ThreadHistory {
        /// The thread.
        thread_id: String,
        /// Its run before this one (none: this is its first).
        from_run_id: Option<String>,
        /// The conversation this run starts from, images as files.
        messages: Vec<sandcell_llm::Message>,
        /// The step snapshot the thread's sandbox was restored from (its sandbox was gone).
        restored_from: Option<String>,
    },
    /// A fork's history: the original's conversation up to the step it was forked from
    /// (and the fork's own instruction), and the sandbox it goes on in.
    Forked {
        /// The original run.
        from_run_id: String,
        /// Its step.
        from_step: u32,
        /// The conversation the fork starts from, images as files.
        messages: Vec<sandcell_llm::Message>,
        /// The step snapshot its sandbox was restored from (none: a new sandbox, as
        /// nothing had changed the original's before that step).
        restored_from: Option<String>,
    },
    /// The final answer was checked with the run's validation command.
    Validation {
        /// Which answer this was (1 for the first).
        attempt: u32,
        /// The attempts the run allows.
        max_attempts: u32,
        /// The command.
        command: String,
        /// It exited 0.
        passed: bool,
        /// Its exit code, when it exited.
        exit_code: Option<i32>,
        /// How it ended (`exited`, `timeout`, `killed`, …).
        cause: String,
        /// The end of its output (stdout, then stderr).
        output_tail: String,
        /// How long it ran.
        duration_ms: u64,
    },
    /// Its sandbox is ready.
    SandboxReady {
        /// The sandbox.
        sandbox_id: String,
        /// Made for this run (else an existing one).
        created: bool,
    },
    /// A model call is sent.
    LlmRequest {
        /// The run's call number (1, 2, …).
        call: u32,
        /// `provider/model`.
        model: String,
        /// Messages in the conversation.
        messages: usize,
        /// Tools offered.
        tools: Vec<String>,
        /// Output tokens asked for (after the budget's reservation).
        max_tokens: u32,
        /// The prompt's estimated tokens.
        prompt_estimate: u64,
        /// A sub-call (not the run's own step).
        sub_call: bool,
        /// The call that summarizes older steps (not the step's own answer).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        condense: bool,
    },
    /// A model call answered.
    LlmResponse {
        /// The call number.
        call: u32,
        /// The text it wrote.
        text: String,
        /// The tools it called.
        tool_calls: Vec<ToolCall>,
        /// Why it stopped.
        finish: FinishReason,
        /// Tokens it used.
        usage: Usage,
        /// What it cost (none: unknown price).
        cost_usd: Option<f64>,
        /// How long it took, retries included.
        latency_ms: u64,
        /// Attempts (1: no retry).
        attempts: u32,
        /// The provider's request id.
        request_id: Option<String>,
    },
    /// A model call failed for good.
    LlmError {
        /// The call number.
        call: u32,
        /// `auth`, `rate_limited`, …
        kind: String,
        /// The provider's message.
        message: String,
        /// The HTTP status, when there was one.
        status: Option<u16>,
        /// Attempts made.
        attempts: u32,
    },
    /// A tool call begins.
    ToolCall {
        /// The model's id for the call.
        call_id: String,
        /// The tool.
        name: String,
        /// Its arguments.
        arguments: serde_json::Value,
    },
    /// A tool call's result.
    ToolResult {
        /// The model's id for the call.
        call_id: String,
        /// The tool.
        name: String,
        /// The result failed (an error in the code, a bad argument, a tool that failed).
        is_error: bool,
        /// What the model reads (truncated with a marker when long).
        text: String,
        /// Whether `text` was cut.
        truncated: bool,
        /// The whole text, kept as a file when it was cut.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        full_text: Option<ArtifactRef>,
        /// Images it produced.
        images: Vec<ArtifactRef>,
        /// How long it took.
        duration_ms: u64,
    },
    /// A step ended: the model's response and all its tool calls are done.
    StepCommitted {
        /// Usage of the run tree so far.
        usage: RunUsage,
        /// The sandbox as the step left it (none: the policy took none, or it failed, with
        /// a warning before this event).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot: Option<StepSnapshot>,
        /// The messages the step added to the conversation, images as files (what a resume
        /// or a fork rebuilds the conversation from).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        messages: Vec<sandcell_llm::Message>,
    },
    /// The run goes on after the process running it stopped (a crash, a restart).
    Resumed {
        /// The last step committed before the stop.
        after_step: u32,
        /// The model's answer for the next step was recorded and is used, not asked again.
        reused_response: bool,
        /// Tool calls of the next step that had started and run again.
        rerun_tool_calls: u32,
        /// The step snapshot the sandbox was restored from (none: the sandbox was kept).
        restored_from: Option<String>,
        /// The sandbox the run goes on in.
        sandbox_id: String,
        /// What the resume could not bring back, in words.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        notes: Vec<String>,
    },
    /// Older steps were replaced by a summary, as the conversation neared the model's
    /// context window.
    Condensed {
        /// The summary the model reads instead.
        summary: String,
        /// Messages it replaced.
        messages_replaced: usize,
        /// The prompt's estimated tokens before.
        tokens_before: u64,
        /// And after.
        tokens_after: u64,
    },
    /// Something the run's reader should know (a budget that cannot be held, vision off, …).
    Warning {
        /// What.
        message: String,
    },
    /// The run ended.
    RunFinished {
        /// `succeeded`, `failed` or `cancelled`.
        status: String,
        /// Why.
        reason: String,
        /// Its answer, when it gave one.
        answer: Option<String>,
        /// Usage of the run tree.
        usage: RunUsage,
    },
}

impl EventKind {
    /// The `type` of the event, as stored.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::RunStarted { .. } => "run_started",
            EventKind::SandboxReady { .. } => "sandbox_ready",
            EventKind::KernelReady { .. } => "kernel_ready",
            EventKind::LlmRequest { .. } => "llm_request",
            EventKind::LlmResponse { .. } => "llm_response",
            EventKind::LlmError { .. } => "llm_error",
            EventKind::ToolCall { .. } => "tool_call",
            EventKind::ToolResult { .. } => "tool_result",
            EventKind::StepCommitted { .. } => "step_committed",
            EventKind::Condensed { .. } => "condensed",
            EventKind::Warning { .. } => "warning",
            EventKind::Validation { .. } => "validation",
            EventKind::Resumed { .. } => "resumed",
            EventKind::Forked { .. } => "forked",
            EventKind::ThreadHistory { .. } => "thread_history",
            EventKind::RunFinished { .. } => "run_finished",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_flat_object_with_its_type() {
        let e = Event {
            v: EVENT_VERSION,
            run_id: "run-1".into(),
            root_run_id: "run-1".into(),
            seq: 3,
            ts: "2026-11-26T00:00:00.000Z".into(),
            step: 1,
            depth: 0,
            kind: EventKind::Warning {
                message: "m".into(),
            },
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "warning");
        assert_eq!(v["seq"], 3);
        assert_eq!(v["message"], "m");
        assert_eq!(e.kind.name(), "warning");
        let back: Event = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
    }
}
