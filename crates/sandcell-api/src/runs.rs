//! `/v1/runs`: agent runs — a model that writes code, runs it in a sandbox's kernels, reads
//! the result and goes on until it answers, within budgets, every step in a trajectory.

use serde::{Deserialize, Serialize};

use crate::rules::ValidationError;
use crate::values::{SandboxId, Timeout};

/// How the model works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// The model calls JSON tools (`execute_code`, `execute_terminal`, …) and answers with
    /// `final_answer` or a plain reply.
    #[default]
    Tools,
    /// Recursive language model: the input is the kernel variable `context`; the model answers
    /// with code blocks that may call `llm_query` / `rlm_query` and end with `FINAL(…)`.
    Repl,
}

impl RunMode {
    /// The mode's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Tools => "tools",
            RunMode::Repl => "repl",
        }
    }
}

/// Limits asked for a run; each absent one takes the configured default, each is capped by
/// its hard maximum.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BudgetsInput {
    /// Model calls that may use tools (default 10, at most 50).
    pub max_iterations: Option<u32>,
    /// Levels of sub-runs below this one (default 4, at most 5).
    pub max_depth: Option<u32>,
    /// Sub-calls (`sub_complete`, `llm_query`, …) in the whole run tree (default 12).
    pub max_sub_calls: Option<u32>,
    /// Input plus output tokens of the whole run tree (default: no limit).
    pub token_budget: Option<u64>,
    /// US dollars the whole run tree may spend (default 2.00, at most 10.00).
    pub cost_limit_usd: Option<f64>,
    /// Seconds the run may take in all (default 300, at most 600).
    pub timeout_secs: Option<f64>,
    /// Seconds one cell of code may run (default 30, at most 600).
    pub cell_timeout_secs: Option<f64>,
    /// Output tokens one model call may produce (default 4096).
    pub max_output_tokens: Option<u32>,
}

/// The limits a run runs under, every one resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Budgets {
    /// Model calls that may use tools.
    pub max_iterations: u32,
    /// Levels of sub-runs.
    pub max_depth: u32,
    /// Sub-calls in the run tree.
    pub max_sub_calls: u32,
    /// Tokens of the run tree (none: no limit).
    pub token_budget: Option<u64>,
    /// US dollars of the run tree.
    pub cost_limit_usd: f64,
    /// Seconds in all.
    pub timeout_secs: f64,
    /// Seconds per cell of code.
    pub cell_timeout_secs: f64,
    /// Output tokens per model call.
    pub max_output_tokens: u32,
}

/// `POST /v1/runs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StartRun {
    /// What to do (tools mode), or the prompt (repl mode).
    pub task: String,
    /// `provider/model` (`openai/gpt-4o-mini`, `anthropic/claude-sonnet-4-5`; default: the
    /// configured one).
    pub model: Option<String>,
    /// `tools` (default) or `repl`.
    pub mode: Option<RunMode>,
    /// Run in this existing sandbox (its kernels' state is what the model starts from).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub sandbox_id: Option<SandboxId>,
    /// Make the run's sandbox from this template (default `python`); ignored with
    /// `sandbox_id`.
    pub template: Option<String>,
    /// Repl mode: the input put in the kernel as the variable `context`.
    pub context: Option<String>,
    /// Limits (absent ones: the configured defaults).
    #[serde(default)]
    pub budgets: BudgetsInput,
    /// Answer when the run has ended (the run's result) instead of at once (202).
    #[serde(default)]
    pub wait: bool,
    /// Keep the sandbox the run made when it ends (default: it is deleted then; a sandbox
    /// given by `sandbox_id` is never deleted).
    #[serde(default)]
    pub keep_sandbox: bool,
    /// Check the model's final answer with a command run in the run's sandbox; a failure
    /// goes back to the model, which tries again.
    pub validate: Option<Validate>,
    /// When the run snapshots its sandbox at the end of a step (default: the configured
    /// `agent.step_snapshots`, `on_mutation` unless changed). A step's snapshot is what a
    /// resume, a fork or a rewind starts from.
    pub snapshots: Option<SnapshotPolicy>,
    /// Keep all its step snapshots when it ends (default: the last one and those in use
    /// stay, the rest go, unless `agent.prune_step_snapshots` is false), so that it can be
    /// forked from any step later.
    #[serde(default)]
    pub keep_snapshots: bool,
    /// Run on this thread (`th-…`): the model sees the thread's earlier conversation and
    /// works in its sandbox (restored from its last step snapshot when that sandbox is gone).
    pub thread_id: Option<String>,
}

/// The longest thread name, in characters.
pub const MAX_THREAD_NAME_CHARS: usize = 100;

/// Checks a thread's name: 1 to [`MAX_THREAD_NAME_CHARS`] characters, none a control
/// character.
pub fn check_thread_name(name: &str) -> Result<(), ValidationError> {
    let n = name.chars().count();
    if name.trim().is_empty() || n > MAX_THREAD_NAME_CHARS {
        return Err(ValidationError(format!(
            "'name' must be 1 to {MAX_THREAD_NAME_CHARS} characters, not {n}"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(ValidationError(
            "'name' contains a control character".into(),
        ));
    }
    Ok(())
}

/// `POST /v1/threads`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateThread {
    /// Its name, unique among the caller's threads (default: its id).
    pub name: Option<String>,
}

/// `PATCH /v1/threads/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenameThread {
    /// Its new name.
    pub name: String,
}

/// A thread: a conversation that persists across runs, in one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ThreadInfo {
    /// `th-…`.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The sandbox its runs share (none until its first run).
    pub sandbox_id: Option<String>,
    /// Its latest run.
    pub last_run_id: Option<String>,
    /// Runs started on it.
    pub runs: u32,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// When it last changed (RFC 3339).
    pub updated_at: String,
}

/// Threads, the most recently used first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ThreadList {
    /// The threads.
    pub threads: Vec<ThreadInfo>,
}

/// When a run snapshots its sandbox at the end of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SnapshotPolicy {
    /// After steps that changed the sandbox: code, a terminal command, an import, a
    /// kernel's variables set or cleared.
    #[default]
    OnMutation,
    /// After every step.
    EveryStep,
    /// Never: the run cannot be resumed or forked with its sandbox's state.
    Off,
}

impl SnapshotPolicy {
    /// Its name on the wire and in the settings.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotPolicy::OnMutation => "on_mutation",
            SnapshotPolicy::EveryStep => "every_step",
            SnapshotPolicy::Off => "off",
        }
    }
}

impl std::str::FromStr for SnapshotPolicy {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, ValidationError> {
        match s {
            "on_mutation" => Ok(SnapshotPolicy::OnMutation),
            "every_step" => Ok(SnapshotPolicy::EveryStep),
            "off" => Ok(SnapshotPolicy::Off),
            other => Err(ValidationError(format!(
                "'snapshots' must be on_mutation, every_step or off, not {other:?}"
            ))),
        }
    }
}

/// The longest validation command, in bytes.
pub const MAX_VALIDATE_COMMAND_BYTES: usize = 64 * 1024;
/// The longest a validation command may run, in seconds.
pub const MAX_VALIDATE_TIMEOUT_SECS: f64 = 600.0;
/// The most attempts a run's answer may get.
pub const MAX_VALIDATE_ATTEMPTS: u32 = 10;
/// Seconds a validation command runs when no timeout is given.
pub const DEFAULT_VALIDATE_TIMEOUT_SECS: f64 = 60.0;
/// Attempts when none are given.
pub const DEFAULT_VALIDATE_ATTEMPTS: u32 = 3;

/// How a run's final answer is checked: `command` runs (through `sh -c`) in the run's
/// sandbox; exit 0 ends the run `validated`; anything else goes back to the model, until
/// `max_attempts` answers have failed (`validation_failed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, try_from = "ValidateInput")]
pub struct Validate {
    /// The command (`pytest -q`, `test -s out.csv`).
    pub command: String,
    /// Seconds it may run (default 60, at most 600).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, exclusive_minimum = 0, maximum = 600))]
    pub timeout_s: Option<Timeout>,
    /// Answers the model may give before the run fails (default 3, at most 10).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10))]
    pub max_attempts: Option<u32>,
}

/// [`Validate`] as it arrives, before its checks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidateInput {
    command: String,
    timeout_s: Option<Timeout>,
    max_attempts: Option<u32>,
}

impl TryFrom<ValidateInput> for Validate {
    type Error = ValidationError;

    fn try_from(v: ValidateInput) -> Result<Self, ValidationError> {
        Validate::new(v.command, v.timeout_s, v.max_attempts)
    }
}

impl Validate {
    /// Checks and keeps a validation: a command that is not blank and not too long, a timeout
    /// of at most [`MAX_VALIDATE_TIMEOUT_SECS`], 1 to [`MAX_VALIDATE_ATTEMPTS`] attempts.
    pub fn new(
        command: String,
        timeout_s: Option<Timeout>,
        max_attempts: Option<u32>,
    ) -> Result<Self, ValidationError> {
        if command.trim().is_empty() {
            return Err(ValidationError("'validate.command' is empty".into()));
        }
        if command.len() > MAX_VALIDATE_COMMAND_BYTES {
            return Err(ValidationError(format!(
                "'validate.command' of {} bytes is over the {} KiB limit",
                command.len(),
                MAX_VALIDATE_COMMAND_BYTES >> 10
            )));
        }
        if command.contains('\0') {
            return Err(ValidationError(
                "'validate.command' contains a NUL byte".into(),
            ));
        }
        if let Some(t) = timeout_s
            && t.secs() > MAX_VALIDATE_TIMEOUT_SECS
        {
            return Err(ValidationError(format!(
                "'validate.timeout_s' of {} is over the maximum of {MAX_VALIDATE_TIMEOUT_SECS}",
                t.secs()
            )));
        }
        if let Some(n) = max_attempts
            && !(1..=MAX_VALIDATE_ATTEMPTS).contains(&n)
        {
            return Err(ValidationError(format!(
                "'validate.max_attempts' must be 1 to {MAX_VALIDATE_ATTEMPTS}, not {n}"
            )));
        }
        Ok(Self {
            command,
            timeout_s,
            max_attempts,
        })
    }

    /// The attempts the answer gets.
    pub fn attempts(&self) -> u32 {
        self.max_attempts.unwrap_or(DEFAULT_VALIDATE_ATTEMPTS)
    }

    /// Seconds the command may run.
    pub fn timeout_secs(&self) -> f64 {
        self.timeout_s
            .map_or(DEFAULT_VALIDATE_TIMEOUT_SECS, Timeout::secs)
    }
}

/// Tokens and money a run (with its sub-calls and sub-runs) has used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunUsage {
    /// Input tokens the providers counted.
    pub input_tokens: u64,
    /// Output tokens the providers counted.
    pub output_tokens: u64,
    /// US dollars, from the price table; none when a model's price is unknown.
    pub cost_usd: Option<f64>,
    /// Steps (model responses with their tool calls).
    pub steps: u32,
    /// Model calls, sub-calls included.
    pub llm_calls: u32,
    /// Tool calls.
    pub tool_calls: u32,
    /// Sub-calls (`sub_complete`, `llm_query`, …).
    pub sub_calls: u32,
    /// Whether some token counts are estimates (a server that reported none).
    #[serde(default)]
    pub estimated: bool,
}

/// A run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunInfo {
    /// Its id.
    pub id: String,
    /// `running`, `succeeded`, `failed` or `cancelled`.
    pub status: String,
    /// Why it ended: `final`, `text`, `forced`, `budget:<which>`, `timeout`, `cancelled`,
    /// `provider_error`, `error`.
    pub reason: Option<String>,
    /// Its answer, when it gave one.
    pub answer: Option<String>,
    /// What it was asked.
    pub task: String,
    /// `provider/model`.
    pub model: String,
    /// `tools` or `repl`.
    pub mode: RunMode,
    /// Its sandbox, once it has one.
    pub sandbox_id: Option<String>,
    /// The run that started it, for a sub-run.
    pub parent_id: Option<String>,
    /// The top of its run tree.
    pub root_id: String,
    /// 0 for a top-level run.
    pub depth: u32,
    /// The limits it ran under.
    pub budgets: Budgets,
    /// What it used.
    pub usage: RunUsage,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// When it ended (RFC 3339).
    pub ended_at: Option<String>,
    /// The run and step it was forked from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// Where a forked run's history comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkedFrom {
    /// The original run.
    pub run_id: String,
    /// Its last step the fork's history holds.
    pub step: u32,
}

/// `POST /v1/runs/{id}/fork`: a new run whose history is steps 1..`from_step` of the
/// original and whose sandbox is restored from that step's snapshot; the original is never
/// changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ForkRun {
    /// The original's step to go on from (1 for the first; it must be committed).
    pub from_step: u32,
    /// A new instruction, given to the model after the history (default: the model goes on
    /// with the original task).
    pub task: Option<String>,
    /// Another `provider/model` (default: the original's).
    pub model: Option<String>,
    /// Limits of the fork (absent ones: the configured defaults).
    #[serde(default)]
    pub budgets: BudgetsInput,
    /// Its check of the final answer (default: the original's).
    pub validate: Option<Validate>,
    /// Answer when the fork has ended instead of at once (202).
    #[serde(default)]
    pub wait: bool,
    /// Keep the fork's sandbox when it ends.
    #[serde(default)]
    pub keep_sandbox: bool,
}

/// `POST /v1/runs/{id}/steps/{step}/sandbox`: a new sandbox as the run's sandbox was at the
/// end of that step, without starting a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepSandbox {
    /// The new sandbox.
    pub sandbox_id: String,
    /// The step snapshot it was restored from.
    pub snapshot_id: String,
    /// The step that snapshot was taken at (the newest at or before the step asked for:
    /// the steps between changed nothing).
    pub snapshot_step: u32,
    /// What the snapshot did not carry.
    pub not_carried: Vec<String>,
}

/// Runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunList {
    /// The runs.
    pub runs: Vec<RunInfo>,
}
