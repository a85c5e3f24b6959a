//! One run, step by step: check cancellation and budgets, reserve the call's worst case, ask
//! the model, run the tools it called, commit the step; every arrow an event committed before
//! the next one happens. It ends with a status and a reason, whatever happens.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use sandcell_api::SandboxId;
use sandcell_api::Timeout;
use sandcell_api::runs::{RunUsage, SnapshotPolicy, Validate};
use sandcell_api::sandboxes::CreateSandbox;
use sandcell_llm::{
    ChatRequest, ChatResponse, Llm, LlmError, LlmErrorKind, Message, ModelRef, Part, Role,
    StreamDelta, ToolCall, ToolResult, ToolSpec,
};
use sandcell_service::{Caller, Service, ServiceError};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::budget::{Exhausted, Pool};
use crate::durable;
use crate::event::{ArtifactRef, EventKind};
use crate::journal::{Journal, now_ms};
use crate::tools::{self, FINAL_ANSWER, SUB_COMPLETE, SUB_COMPLETE_BATCHED};
use crate::validate;

/// What the model is told in `tools` mode.
pub const SYSTEM_TOOLS: &str = "You are an agent working in an isolated Linux sandbox with live \
kernels (python, node, bash, r) whose state persists between calls. Solve the task step by \
step: run code with the tools, read the results, and go on. When you are done, call \
final_answer with the answer (or reply with the answer in plain text, without calling a tool).";

/// The context window of a model the price table does not know.
pub const DEFAULT_CONTEXT_WINDOW: u32 = 128_000;
/// Past this share of the context window, older steps are condensed.
const CONDENSE_AT: f64 = 0.8;
/// Steps kept whole when older ones are condensed.
const KEEP_STEPS: usize = 2;

const CONDENSE_SYSTEM: &str = "You condense the working history of an agent that runs code in a sandbox. Write a compact summary of the steps below: what was tried, what was found (exact values, file names, variable names), what failed and why. It replaces the steps, so keep every fact the agent may still need.";

/// What the model is told when it has used all its steps.
const FORCE_ANSWER: &str = "You have used all the steps of this run. Answer now with what you \
have found; you cannot call tools any more.";

/// Where the run's sandbox comes from.
#[derive(Debug, Clone)]
pub enum SandboxPlan {
    /// An existing sandbox of the caller's.
    Existing(SandboxId),
    /// A new one from this template, deleted when the run ends unless `keep`.
    Create {
        /// The template.
        template: String,
        /// Keep it after the run.
        keep: bool,
    },
}

/// Everything one run needs.
#[derive(Debug)]
pub struct RunContext {
    /// The typed operations.
    pub service: Arc<Service>,
    /// The providers.
    pub llm: Arc<Llm>,
    /// Whose run it is.
    pub caller: Caller,
    /// The model.
    pub model: ModelRef,
    /// Stream model answers.
    pub stream: bool,
    /// The run tree's budgets.
    pub pool: Arc<Pool>,
    /// Set when the run is cancelled.
    pub cancel: CancellationToken,
    /// Its trajectory.
    pub journal: Journal,
    /// Its sandbox.
    pub sandbox: SandboxPlan,
    /// The runs going on in this process, where its sub-runs register.
    pub runs: Arc<crate::runner::LiveRuns>,
    /// How its final answer is checked (none: it is taken as given).
    pub validate: Option<Validate>,
    /// Its step snapshots.
    pub durability: Durability,
}

/// A run's step snapshots: when they are taken, and whether the unneeded ones go when the
/// run ends.
#[derive(Debug, Clone, Copy)]
pub struct Durability {
    /// When a step is snapshotted.
    pub policy: SnapshotPolicy,
    /// At the end, delete the step snapshots but the last and those in use.
    pub prune: bool,
}

impl Default for Durability {
    fn default() -> Self {
        Self {
            policy: SnapshotPolicy::OnMutation,
            prune: true,
        }
    }
}

/// How a run starts.
#[derive(Debug)]
pub enum Start {
    /// Afresh, with its task.
    Fresh(String),
    /// Again after its process stopped, from what its trajectory recorded.
    Resumed(Box<durable::Rebuilt>),
    /// A fork, its start recorded: this conversation, in this sandbox.
    Forked {
        /// The sandbox, ready.
        sandbox: SandboxId,
        /// The history.
        messages: Vec<Message>,
    },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// `succeeded`, `failed` or `cancelled`.
    pub status: &'static str,
    /// Why.
    pub reason: String,
    /// Its answer.
    pub answer: Option<String>,
}

impl Ended {
    pub(crate) fn succeeded(reason: &str, answer: String) -> Self {
        Self {
            status: "succeeded",
            reason: reason.to_string(),
            answer: Some(answer),
        }
    }

    pub(crate) fn failed(reason: impl Into<String>) -> Self {
        Self {
            status: "failed",
            reason: reason.into(),
            answer: None,
        }
    }

    pub(crate) fn validation_failed(answer: String) -> Self {
        Self {
            status: "failed",
            reason: "validation_failed".into(),
            answer: Some(answer),
        }
    }

    pub(crate) fn cancelled() -> Self {
        Self {
            status: "cancelled",
            reason: "cancelled".into(),
            answer: None,
        }
    }
}

/// Runs to the end and records how it ended; the run's record says the same.
pub async fn drive(ctx: RunContext, task: String) -> Ended {
    drive_from(ctx, Start::Fresh(task)).await
}

/// [`drive`], from a fresh start or a resume.
pub async fn drive_from(mut ctx: RunContext, start: Start) -> Ended {
    let ended = match steps(&mut ctx, start).await {
        Ok(ended) => ended,
        Err(e) => {
            let _ = ctx.journal.emit(
                EventKind::Warning {
                    message: format!("the run failed: {}: {}", e.code(), e.message),
                },
                false,
            );
            Ended::failed("error")
        }
    };
    // The sandbox goes before `run_finished`: whoever sees the end sees it gone.
    let made = ctx.journal.record.sandbox_id.clone();
    release_sandbox(&ctx.service, &ctx.caller, &ctx.sandbox, made.as_deref()).await;
    if ctx.durability.prune {
        durable::prune(&ctx.service, &ctx.caller, &ctx.journal.record.id).await;
    }
    finish(&mut ctx.journal, ctx.pool.usage(), &ended);
    ended
}

/// Records a run's end: its record and the `run_finished` event, in one commit.
pub(crate) fn finish(journal: &mut Journal, usage: RunUsage, ended: &Ended) {
    let r = &mut journal.record;
    r.status = ended.status.to_string();
    r.reason = Some(ended.reason.clone());
    r.answer.clone_from(&ended.answer);
    r.totals = serde_json::to_value(&usage).unwrap_or(Value::Null);
    r.ended_at = Some(now_ms());
    let event = EventKind::RunFinished {
        status: ended.status.to_string(),
        reason: ended.reason.clone(),
        answer: ended.answer.clone(),
        usage,
    };
    if let Err(e) = journal.emit(event, true) {
        tracing::error!(run = %journal.record.id, error = %e, "the end of a run was not recorded");
    }
}

/// The run's sandbox: the existing one (checked to be the caller's), or one made now; with
/// whether it was made.
pub(crate) async fn open_sandbox(
    service: &Service,
    caller: &Caller,
    plan: &SandboxPlan,
) -> Result<(SandboxId, bool), ServiceError> {
    match plan {
        SandboxPlan::Existing(id) => {
            service.get_sandbox(caller, id)?;
            Ok((id.clone(), false))
        }
        SandboxPlan::Create { template, .. } => {
            let req = CreateSandbox {
                template: Some(template.clone()),
                ..CreateSandbox::default()
            };
            let info = service.create_sandbox(caller, req).await?;
            Ok((SandboxId::parse(info.id)?, true))
        }
    }
}

/// Records the run's sandbox in its record and trajectory.
pub(crate) fn sandbox_ready(
    journal: &mut Journal,
    id: &SandboxId,
    created: bool,
) -> Result<(), ServiceError> {
    journal.record.sandbox_id = Some(id.to_string());
    journal.emit(
        EventKind::SandboxReady {
            sandbox_id: id.to_string(),
            created,
        },
        true,
    )?;
    Ok(())
}

/// Deletes the sandbox a run made (`made`), at its end, unless it was to be kept.
pub(crate) async fn release_sandbox(
    service: &Service,
    caller: &Caller,
    plan: &SandboxPlan,
    made: Option<&str>,
) {
    if let (SandboxPlan::Create { keep: false, .. }, Some(id)) = (plan, made)
        && let Ok(id) = SandboxId::parse(id)
        && let Err(e) = service.delete_sandbox(caller, &id).await
    {
        tracing::warn!(sandbox = %id, error = %e, "a run's sandbox was not deleted");
    }
}

async fn prepare_sandbox(ctx: &mut RunContext) -> Result<SandboxId, ServiceError> {
    let (id, created) = open_sandbox(&ctx.service, &ctx.caller, &ctx.sandbox).await?;
    sandbox_ready(&mut ctx.journal, &id, created)?;
    Ok(id)
}

/// What a model call came to.
pub(crate) enum Asked {
    /// Its answer.
    Answer(ChatResponse),
    /// The model refused the images in the request (recorded as an `llm_error`).
    ImagesRejected,
    /// The run ends.
    End(Ended),
}

/// Records a fresh run's start: `run_started`, and a warning when its model has no price.
fn begin(ctx: &mut RunContext, task: &str) -> Result<(), ServiceError> {
    ctx.journal.emit(
        EventKind::RunStarted {
            task: task.to_string(),
            mode: sandcell_api::runs::RunMode::Tools,
            model: ctx.model.to_string(),
            budgets: ctx.pool.budgets().clone(),
            parent_run_id: ctx.journal.record.parent_id.clone(),
            validate: ctx.validate.clone(),
            forked_from: None,
            input: None,
        },
        false,
    )?;
    if ctx.llm.config().prices.get(&ctx.model).is_none() {
        ctx.journal.emit(
            EventKind::Warning {
                message: format!(
                    "no price is known for {}: its cost is reported as unknown and the cost limit cannot be held (add it to agent.prices)",
                    ctx.model
                ),
            },
            false,
        )?;
    }
    Ok(())
}

/// What a model call is for (recorded, so a resume knows which answer was the step's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    /// The step's own answer.
    Step,
    /// A sub-call (a tool's or the code's).
    Sub,
    /// The summary of older steps.
    Condense,
}

/// One model call, with its budget reservation and events.
async fn ask(
    ctx: &mut RunContext,
    call: u32,
    mut req: ChatRequest,
    kind: CallKind,
) -> Result<Asked, ServiceError> {
    let sub_call = kind == CallKind::Sub;
    let price = ctx.llm.config().prices.get(&ctx.model).cloned();
    let estimate = req.estimated_input_tokens();
    let reservation = match ctx
        .pool
        .reserve(estimate, req.max_tokens, price.as_ref(), sub_call)
    {
        Ok(r) => r,
        Err(which) => return Ok(Asked::End(Ended::failed(which.reason()))),
    };
    req.max_tokens = reservation.max_tokens;
    ctx.journal.emit(
        EventKind::LlmRequest {
            call,
            model: ctx.model.to_string(),
            messages: req.messages.len(),
            tools: req.tools.iter().map(|t| t.name.clone()).collect(),
            max_tokens: req.max_tokens,
            prompt_estimate: estimate,
            sub_call,
            condense: kind == CallKind::Condense,
        },
        false,
    )?;
    let llm = ctx.llm.clone();
    let provider = ctx.model.provider;
    let answer = tokio::select! {
        () = ctx.cancel.cancelled() => None,
        () = tokio::time::sleep(ctx.pool.time_left()) => Some(Err(None)),
        r = async move {
            let mut ignore = |_: StreamDelta<'_>| {};
            llm.chat(provider, &req, &mut ignore).await
        } => Some(r.map_err(Some)),
    };
    let response = match answer {
        None => {
            ctx.pool.release(reservation);
            return Ok(Asked::End(Ended::cancelled()));
        }
        Some(Err(None)) => {
            ctx.pool.release(reservation);
            return Ok(Asked::End(Ended::failed("timeout")));
        }
        Some(Err(Some(e))) => {
            ctx.pool.release(reservation);
            emit_llm_error(ctx, call, &e)?;
            let reason = match e.kind {
                LlmErrorKind::ImagesRejected => return Ok(Asked::ImagesRejected),
                LlmErrorKind::Config => "error",
                _ => "provider_error",
            };
            return Ok(Asked::End(Ended::failed(reason)));
        }
        Some(Ok(r)) => r,
    };
    let cost = ctx.llm.cost(&ctx.model, &response.usage);
    ctx.pool.settle(reservation, &response.usage, cost);
    ctx.journal.emit(
        EventKind::LlmResponse {
            call,
            text: response.text.clone(),
            tool_calls: response.tool_calls.clone(),
            finish: response.finish.clone(),
            usage: response.usage,
            cost_usd: cost,
            latency_ms: response.latency_ms,
            attempts: response.attempts,
            request_id: response.request_id.clone(),
        },
        false,
    )?;
    Ok(Asked::Answer(response))
}

fn emit_llm_error(ctx: &mut RunContext, call: u32, e: &LlmError) -> Result<(), ServiceError> {
    ctx.journal.emit(
        EventKind::LlmError {
            call,
            kind: e.wire_name().to_string(),
            message: e.message.clone(),
            status: e.status,
            attempts: e.attempts,
        },
        false,
    )?;
    Ok(())
}

async fn steps(ctx: &mut RunContext, start: Start) -> Result<Ended, ServiceError> {
    let budgets = ctx.pool.budgets().clone();
    let (sandbox, mut messages, resumed) = match start {
        Start::Fresh(task) => {
            begin(ctx, &task)?;
            let sandbox = prepare_sandbox(ctx).await?;
            let messages = vec![Message {
                role: Role::User,
                content: vec![Part::Text(task)],
            }];
            (sandbox, messages, None)
        }
        Start::Forked { sandbox, messages } => (sandbox, messages, None),
        Start::Resumed(r) => {
            let (sandbox, event) =
                durable::reopen(&ctx.service, &ctx.caller, &ctx.sandbox, &r).await?;
            durable::record_reopened(&mut ctx.journal, &sandbox, event)?;
            let mut r = *r;
            (
                sandbox.id,
                std::mem::take(&mut r.messages),
                Some((r, sandbox.tools_unknown)),
            )
        }
    };
    let cell_timeout = Timeout::from_secs(budgets.cell_timeout_secs)?;
    let specs = tools::specs();
    let mut vision = true;
    let mut call = resumed.as_ref().map_or(0, |(r, _)| r.calls);
    let mut attempts = resumed.as_ref().map_or(0, |(r, _)| r.attempts);
    let first = resumed.as_ref().map_or(1, |(r, _)| r.step + 1);
    // A resumed run's next step may have its answer recorded already: it is used, not asked
    // again. Tool calls that started before the stop, with no snapshot to go back to, are
    // not run again: their effect is unknown, and the model is told so.
    let (mut recorded, mut tools_unknown) = match resumed {
        Some((r, unknown)) => (r.next_response.map(|n| n.response), unknown),
        None => (None, false),
    };
    // One step's request: the whole conversation, and no tools once the answer is forced.
    let (model_name, stream) = (ctx.model.model.clone(), ctx.stream);
    let step_request = |messages: &[Message], forced: bool| ChatRequest {
        model: model_name.clone(),
        system: Some(SYSTEM_TOOLS.to_string()),
        messages: messages.to_vec(),
        tools: if forced { Vec::new() } else { specs.clone() },
        max_tokens: budgets.max_output_tokens,
        temperature: None,
        stream,
    };
    for iteration in first..=budgets.max_iterations + 1 {
        if ctx.cancel.is_cancelled() {
            return Ok(Ended::cancelled());
        }
        if ctx.pool.time_left().is_zero() {
            return Ok(Ended::failed("timeout"));
        }
        let forced = iteration > budgets.max_iterations;
        if forced {
            messages.push(Message {
                role: Role::User,
                content: vec![Part::Text(FORCE_ANSWER.into())],
            });
        }
        ctx.journal.next_step();
        let reused = recorded.take();
        if reused.is_none() {
            match condense_if_needed(ctx, &mut messages, &specs, &mut call).await? {
                Ok(()) => {}
                Err(ended) => return Ok(ended),
            }
        }
        // What this step adds to the conversation starts here.
        let mark = messages.len();
        let asked = match reused {
            Some(r) => Asked::Answer(r),
            None => {
                call += 1;
                ask(ctx, call, step_request(&messages, forced), CallKind::Step).await?
            }
        };
        let response = match asked {
            Asked::Answer(r) => r,
            Asked::End(ended) => return Ok(ended),
            Asked::ImagesRejected if vision && has_images(&messages) => {
                // Once per run: the images go, the step is asked again without them.
                vision = false;
                strip_images(&mut messages);
                ctx.journal.emit(
                    EventKind::Warning {
                        message: format!(
                            "{} refused images: vision is off for the rest of this run",
                            ctx.model
                        ),
                    },
                    false,
                )?;
                call += 1;
                match ask(ctx, call, step_request(&messages, forced), CallKind::Step).await? {
                    Asked::Answer(r) => r,
                    Asked::End(ended) => return Ok(ended),
                    Asked::ImagesRejected => return Ok(Ended::failed("provider_error")),
                }
            }
            Asked::ImagesRejected => return Ok(Ended::failed("provider_error")),
        };
        if forced {
            // The last call: a failed check cannot be answered any more.
            let answer = response.text;
            return Ok(
                match answer_given(ctx, &sandbox, &mut attempts, "forced", &answer).await? {
                    Ok(ended) => ended,
                    Err(_) => Ended::validation_failed(answer),
                },
            );
        }
        if response.tool_calls.is_empty() {
            let answer = response.text;
            match answer_given(ctx, &sandbox, &mut attempts, "text", &answer).await? {
                Ok(ended) => return Ok(ended),
                Err(feedback) => {
                    messages.push(Message {
                        role: Role::Assistant,
                        content: vec![Part::Text(answer)],
                    });
                    messages.push(Message {
                        role: Role::User,
                        content: vec![Part::Text(feedback)],
                    });
                    // The check ran a command in the sandbox.
                    commit_step(ctx, &sandbox, true, &messages[mark..]).await?;
                    continue;
                }
            }
        }
        let mut content = Vec::new();
        if !response.text.is_empty() {
            content.push(Part::Text(response.text.clone()));
        }
        content.extend(response.tool_calls.iter().cloned().map(Part::ToolCall));
        messages.push(Message {
            role: Role::Assistant,
            content,
        });
        let mut results = Vec::new();
        let mut final_answer = None;
        let unknown = std::mem::take(&mut tools_unknown);
        let mut mutated = false;
        for tc in &response.tool_calls {
            mutated |= durable::MUTATING_TOOLS.contains(&tc.name.as_str());
            ctx.pool.count_tool_call();
            ctx.journal.emit(
                EventKind::ToolCall {
                    call_id: tc.id.clone(),
                    name: tc.name.clone(),
                    arguments: tc.arguments.clone(),
                },
                false,
            )?;
            let started = Instant::now();
            let outcome = match tc.name.as_str() {
                name if unknown && durable::MUTATING_TOOLS.contains(&name) => tools::Outcome {
                    text: durable::UNKNOWN_AFTER_RESTART.into(),
                    is_error: true,
                    ..tools::Outcome::default()
                },
                FINAL_ANSWER => match tc.arguments.get("answer") {
                    Some(a) => {
                        let answer = a.as_str().map_or_else(|| a.to_string(), str::to_string);
                        match answer_given(ctx, &sandbox, &mut attempts, "final", &answer).await? {
                            Ok(ended) => {
                                final_answer = Some(ended);
                                tools::Outcome {
                                    text: "the answer is recorded; the run ends".into(),
                                    ..tools::Outcome::default()
                                }
                            }
                            Err(feedback) => tools::Outcome {
                                text: feedback,
                                is_error: true,
                                ..tools::Outcome::default()
                            },
                        }
                    }
                    None => tools::Outcome {
                        text: "invalid arguments: argument 'answer' is required".into(),
                        is_error: true,
                        ..tools::Outcome::default()
                    },
                },
                SUB_COMPLETE | SUB_COMPLETE_BATCHED => match sub_calls(ctx, &mut call, tc).await? {
                    Ok(o) => o,
                    Err(ended) => return Ok(ended),
                },
                _ => {
                    let sandbox = tools::Sandbox {
                        service: &ctx.service,
                        caller: &ctx.caller,
                        id: &sandbox,
                        cell_timeout,
                    };
                    let cancel = ctx.cancel.clone();
                    tokio::select! {
                        () = cancel.cancelled() => {
                            // The kernel's state stays; only the cell stops.
                            let _ = ctx.service.interrupt_context(&ctx.caller, sandbox.id, "python").await;
                            return Ok(Ended::cancelled());
                        }
                        o = sandbox.run(&tc.name, &tc.arguments) => o,
                    }
                }
            };
            let (text, truncated) = tools::truncate(&outcome.text, tools::MAX_RESULT_CHARS);
            let full_text = truncated
                .then(|| keep_artifact(&ctx.journal, "text/plain", "txt", outcome.text.as_bytes()))
                .flatten();
            let images = keep_images(&ctx.journal, &outcome.images);
            ctx.journal.emit(
                EventKind::ToolResult {
                    call_id: tc.id.clone(),
                    name: tc.name.clone(),
                    is_error: outcome.is_error,
                    text: text.clone(),
                    truncated,
                    full_text,
                    images,
                    duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                },
                false,
            )?;
            let mut parts = vec![Part::Text(text)];
            if vision {
                parts.extend(outcome.images.into_iter().map(Part::Image));
            }
            results.push(Part::ToolResult(ToolResult {
                call_id: tc.id.clone(),
                content: parts,
                is_error: outcome.is_error,
            }));
        }
        messages.push(Message {
            role: Role::User,
            content: results,
        });
        commit_step(ctx, &sandbox, mutated, &messages[mark..]).await?;
        if let Some(ended) = final_answer {
            return Ok(ended);
        }
    }
    Ok(Ended::failed(Exhausted::Iterations.reason()))
}

/// Counts the step, takes its snapshot when the policy wants one (`mutated`: it changed the
/// sandbox) and commits it with the tree's totals and the messages it `added`.
async fn commit_step(
    ctx: &mut RunContext,
    sandbox: &SandboxId,
    mutated: bool,
    added: &[Message],
) -> Result<(), ServiceError> {
    let snapshot = if durable::wants_snapshot(ctx.durability.policy, mutated) {
        let (service, owner, run) = (&ctx.service, &ctx.caller.owner, &ctx.journal.record.id);
        let step = ctx.journal.step();
        match durable::snapshot_step(service, owner, sandbox, run, step).await {
            Ok(s) => Some(s),
            Err(e) => {
                ctx.journal.emit(
                    EventKind::Warning {
                        message: format!(
                            "step {step}'s snapshot failed ({}: {}): a resume or fork from this step has none",
                            e.code(),
                            e.message
                        ),
                    },
                    false,
                )?;
                None
            }
        }
    } else {
        None
    };
    ctx.pool.count_step();
    let usage = ctx.pool.usage();
    ctx.journal.record.totals = serde_json::to_value(&usage).unwrap_or(Value::Null);
    let messages = durable::externalize(added, &ctx.journal.artifacts_dir());
    ctx.journal.emit(
        EventKind::StepCommitted {
            usage,
            snapshot,
            messages,
        },
        true,
    )?;
    Ok(())
}

/// The model gave `answer`: how the run ends, or what the model is told (`Err`) when the
/// run's check failed with attempts left.
async fn answer_given(
    ctx: &mut RunContext,
    sandbox: &SandboxId,
    attempts: &mut u32,
    reason: &str,
    answer: &str,
) -> Result<Result<Ended, String>, ServiceError> {
    let (service, caller, cancel) = (&ctx.service, &ctx.caller, &ctx.cancel);
    let journal = &mut ctx.journal;
    let given = validate::Given {
        validate: ctx.validate.as_ref(),
        sandbox,
        reason,
        answer,
    };
    validate::answer_given(service, caller, cancel, given, attempts, |e| {
        journal.emit(e, false).map(drop)
    })
    .await
}

/// Keeps `bytes` as a file beside the trajectory (`None` when it cannot be written: the
/// trajectory then says less, the run goes on).
pub(crate) fn keep_artifact(
    journal: &Journal,
    media_type: &str,
    ext: &str,
    bytes: &[u8],
) -> Option<ArtifactRef> {
    let dir = journal.artifacts_dir();
    let n = std::fs::read_dir(&dir).map_or(0, Iterator::count) + 1;
    let path = dir.join(format!("step{}-{n}.{ext}", journal.step()));
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, bytes))
        .ok()?;
    Some(ArtifactRef {
        media_type: media_type.to_string(),
        path: path.display().to_string(),
        bytes: bytes.len() as u64,
    })
}

/// Keeps a tool's images as files beside the trajectory.
pub(crate) fn keep_images(journal: &Journal, images: &[sandcell_llm::Image]) -> Vec<ArtifactRef> {
    images
        .iter()
        .filter_map(|image| {
            let bytes = tools::image_bytes(image)?;
            let ext = image.media_type.rsplit('/').next().unwrap_or("bin");
            keep_artifact(journal, &image.media_type, ext, &bytes)
        })
        .collect()
}

/// A condensation due: the call that writes the summary, and where it goes.
pub(crate) struct Condensing {
    /// The conversation's estimated size now, in tokens.
    before: u64,
    /// The first message kept whole.
    tail_start: usize,
    /// The call that writes the summary.
    pub request: ChatRequest,
}

/// The condensing call due for `messages` (`None`: none is), when the conversation (with
/// `system` and `specs`) nears the model's context window. The first message (the task) and
/// the last [`KEEP_STEPS`] steps stay whole; a step is an assistant message and the one
/// after it.
pub(crate) fn condensing(
    llm: &Llm,
    model: &ModelRef,
    stream: bool,
    max_output_tokens: u32,
    system: &str,
    messages: &[Message],
    specs: &[ToolSpec],
) -> Option<Condensing> {
    let window = llm
        .config()
        .prices
        .get(model)
        .and_then(|p| p.context_window)
        .unwrap_or(DEFAULT_CONTEXT_WINDOW);
    let before = sandcell_llm::estimate_input_tokens(Some(system), messages, specs);
    if (before as f64) < f64::from(window) * CONDENSE_AT {
        return None;
    }
    let tail_start = messages.len().saturating_sub(2 * KEEP_STEPS);
    if tail_start <= 1 || messages[tail_start].role != Role::Assistant {
        return None;
    }
    let request = ChatRequest {
        model: model.model.clone(),
        system: Some(CONDENSE_SYSTEM.to_string()),
        messages: vec![Message {
            role: Role::User,
            content: vec![Part::Text(render(&messages[1..tail_start]))],
        }],
        tools: Vec::new(),
        max_tokens: max_output_tokens.min(4096),
        temperature: None,
        stream,
    };
    Some(Condensing {
        before,
        tail_start,
        request,
    })
}

/// Puts `summary` in place of the steps `plan` condensed; the `condensed` event to record.
pub(crate) fn condense(
    messages: &mut Vec<Message>,
    plan: Condensing,
    summary: String,
    system: &str,
    specs: &[ToolSpec],
) -> EventKind {
    let replaced = plan.tail_start - 1;
    messages.splice(1..plan.tail_start, [summary_message(&summary)]);
    EventKind::Condensed {
        summary,
        messages_replaced: replaced,
        tokens_before: plan.before,
        tokens_after: sandcell_llm::estimate_input_tokens(Some(system), messages, specs),
    }
}

/// The message that stands for condensed steps.
pub(crate) fn summary_message(summary: &str) -> Message {
    Message {
        role: Role::User,
        content: vec![Part::Text(format!(
            "Summary of the earlier steps (condensed to fit the context window):\n{summary}"
        ))],
    }
}

/// Condenses older steps into a summary when the conversation nears the model's context
/// window (see [`condensing`]).
async fn condense_if_needed(
    ctx: &mut RunContext,
    messages: &mut Vec<Message>,
    specs: &[ToolSpec],
    call: &mut u32,
) -> Result<Result<(), Ended>, ServiceError> {
    let Some(plan) = condensing(
        &ctx.llm,
        &ctx.model,
        ctx.stream,
        ctx.pool.budgets().max_output_tokens,
        SYSTEM_TOOLS,
        messages,
        specs,
    ) else {
        return Ok(Ok(()));
    };
    *call += 1;
    let summary = match ask(ctx, *call, plan.request.clone(), CallKind::Condense).await? {
        Asked::Answer(r) => r.text,
        Asked::End(ended) => return Ok(Err(ended)),
        Asked::ImagesRejected => return Ok(Err(Ended::failed("provider_error"))),
    };
    let event = condense(messages, plan, summary, SYSTEM_TOOLS, specs);
    ctx.journal.emit(event, false)?;
    Ok(Ok(()))
}

/// Messages as plain text, for the condensing call.
fn render(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        let who = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        for p in &m.content {
            let line = match p {
                Part::Text(t) => format!("{who}: {t}"),
                Part::Image(_) => format!("{who}: [an image]"),
                Part::ToolCall(c) => format!("assistant called {}({})", c.name, c.arguments),
                Part::ToolResult(r) => {
                    let text: Vec<&str> = r
                        .content
                        .iter()
                        .filter_map(|p| match p {
                            Part::Text(t) => Some(t.as_str()),
                            _ => None,
                        })
                        .collect();
                    format!(
                        "result{}: {}",
                        if r.is_error { " (error)" } else { "" },
                        text.join("\n")
                    )
                }
            };
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

pub(crate) fn has_images(messages: &[Message]) -> bool {
    messages.iter().any(|m| {
        m.content.iter().any(|p| match p {
            Part::Image(_) => true,
            Part::ToolResult(r) => r.content.iter().any(|p| matches!(p, Part::Image(_))),
            _ => false,
        })
    })
}

/// Replaces every image with a note, for a model that refuses them.
pub(crate) fn strip_images(messages: &mut [Message]) {
    let note = || Part::Text("[an image was here; this model does not take images]".into());
    for m in messages {
        for p in &mut m.content {
            match p {
                Part::Image(_) => *p = note(),
                Part::ToolResult(r) => {
                    for q in &mut r.content {
                        if matches!(q, Part::Image(_)) {
                            *q = note();
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// `sub_complete` and `sub_complete_batched`: model calls without tools, drawn from the
/// run tree's pool (and its sub-call budget).
async fn sub_calls(
    ctx: &mut RunContext,
    call: &mut u32,
    tc: &ToolCall,
) -> Result<Result<tools::Outcome, Ended>, ServiceError> {
    let prompts: Vec<String> = if tc.name == SUB_COMPLETE {
        match tc.arguments.get("prompt").and_then(Value::as_str) {
            Some(p) => vec![p.to_string()],
            None => return Ok(Ok(bad_args("argument 'prompt' (a string) is required"))),
        }
    } else {
        match tc.arguments.get("prompts").and_then(Value::as_array) {
            Some(a) if !a.is_empty() => a
                .iter()
                .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
                .collect(),
            _ => {
                return Ok(Ok(bad_args(
                    "argument 'prompts' (a non-empty list) is required",
                )));
            }
        }
    };
    let model = match tc.arguments.get("model").and_then(Value::as_str) {
        Some(m) => match m.parse::<ModelRef>() {
            Ok(m) => m,
            Err(e) => return Ok(Ok(bad_args(&e.message))),
        },
        None => ctx.model.clone(),
    };
    let budgets = ctx.pool.budgets().clone();
    // A batch the sub-call budget cannot hold is refused whole, before anything is reserved
    // (a reservation given back unused would still count as a call).
    let used = ctx.pool.usage().sub_calls;
    if u64::from(used) + prompts.len() as u64 > u64::from(budgets.max_sub_calls) {
        return Ok(Ok(bad_args(&format!(
            "the run's sub-call budget does not allow {} more ({used} of {} used): answer with what you have",
            prompts.len(),
            budgets.max_sub_calls
        ))));
    }
    // Reserve and record every call first (in order), then send them together.
    let price = ctx.llm.config().prices.get(&model).cloned();
    let mut pending = Vec::new();
    for prompt in &prompts {
        *call += 1;
        let req = ChatRequest {
            model: model.model.clone(),
            system: None,
            messages: vec![Message {
                role: Role::User,
                content: vec![Part::Text(prompt.clone())],
            }],
            tools: Vec::<ToolSpec>::new(),
            max_tokens: budgets.max_output_tokens,
            temperature: None,
            stream: ctx.stream,
        };
        let estimate = req.estimated_input_tokens();
        let reservation = match ctx
            .pool
            .reserve(estimate, req.max_tokens, price.as_ref(), true)
        {
            Ok(r) => r,
            Err(Exhausted::SubCalls) => {
                for (_, _, r) in pending {
                    ctx.pool.release(r);
                }
                return Ok(Ok(bad_args(
                    "the run's sub-call budget is spent: answer with what you have",
                )));
            }
            Err(which) => {
                for (_, _, r) in pending {
                    ctx.pool.release(r);
                }
                return Ok(Err(Ended::failed(which.reason())));
            }
        };
        let mut req = req;
        req.max_tokens = reservation.max_tokens;
        ctx.journal.emit(
            EventKind::LlmRequest {
                call: *call,
                model: model.to_string(),
                messages: 1,
                tools: Vec::new(),
                max_tokens: req.max_tokens,
                prompt_estimate: estimate,
                sub_call: true,
                condense: false,
            },
            false,
        )?;
        pending.push((*call, req, reservation));
    }
    let llm = ctx.llm.clone();
    let provider = model.provider;
    let requests: Vec<ChatRequest> = pending.iter().map(|(_, r, _)| r.clone()).collect();
    let answers = tokio::select! {
        () = ctx.cancel.cancelled() => None,
        a = join_all(requests.iter().map(|req| {
            let llm = llm.clone();
            async move {
                let mut ignore = |_: StreamDelta<'_>| {};
                llm.chat(provider, req, &mut ignore).await
            }
        })) => Some(a),
    };
    let Some(answers) = answers else {
        for (_, _, r) in pending {
            ctx.pool.release(r);
        }
        return Ok(Err(Ended::cancelled()));
    };
    let mut texts = Vec::new();
    let mut any_error = false;
    for ((n, _, reservation), answer) in pending.into_iter().zip(answers) {
        match answer {
            Ok(r) => {
                let cost = ctx.llm.cost(&model, &r.usage);
                ctx.pool.settle(reservation, &r.usage, cost);
                ctx.journal.emit(
                    EventKind::LlmResponse {
                        call: n,
                        text: r.text.clone(),
                        tool_calls: Vec::new(),
                        finish: r.finish.clone(),
                        usage: r.usage,
                        cost_usd: cost,
                        latency_ms: r.latency_ms,
                        attempts: r.attempts,
                        request_id: r.request_id.clone(),
                    },
                    false,
                )?;
                texts.push(r.text);
            }
            Err(e) => {
                ctx.pool.release(reservation);
                emit_llm_error(ctx, n, &e)?;
                any_error = true;
                texts.push(format!("[sub-call failed: {}]", e.message));
            }
        }
    }
    let text = if tc.name == SUB_COMPLETE {
        texts.pop().unwrap_or_default()
    } else {
        serde_json::to_string(&texts).unwrap_or_default()
    };
    Ok(Ok(tools::Outcome {
        text,
        images: Vec::new(),
        is_error: any_error,
    }))
}

fn bad_args(message: &str) -> tools::Outcome {
    tools::Outcome {
        text: format!("invalid arguments: {message}"),
        images: Vec::new(),
        is_error: true,
    }
}

/// The usage recorded in a run's totals.
pub fn usage_of(totals: &Value) -> RunUsage {
    serde_json::from_value(totals.clone()).unwrap_or_default()
}
