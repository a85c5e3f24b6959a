//! `repl` mode (recursive language models): the run's input is the Python variable `context`
//! in a kernel of its own; the model sees only its type, length and start, and answers with
//! code blocks that run there. The code may call the model again (`llm_query`,
//! `llm_query_batched`), hand a piece to a sub-run one level deeper (`rlm_query`) and give
//! the answer (`FINAL`, `FINAL_VAR`). Those calls reach this run as host calls over the
//! sandbox's existing connection (`sandcell_engine::host_call`): the sandbox needs no network
//! and never sees a key. Sub-calls draw from the run tree's pool (`sub_call = true`) and are
//! recorded as `llm_request`/`llm_response` events; each code block is a `tool_call` named
//! `repl`, each sub-run a `tool_call` named `rlm_query` naming the child run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sandcell_api::code::{CodeInput, CreateContext};
use sandcell_api::runs::{RunMode, RunUsage, SnapshotPolicy, Validate};
use sandcell_api::sandboxes::Lang;
use sandcell_api::{Code, SandboxId, Timeout};
use sandcell_engine::host_call::{HostCallError, HostCallErrorKind};
use sandcell_engine::{HostCallFuture, HostCallHandler, HostCallRequest};
use sandcell_llm::{
    ChatRequest, ChatResponse, Llm, LlmError, LlmErrorKind, Message, ModelRef, Part, Role,
    StreamDelta,
};
use sandcell_service::caller::new_record_id;
use sandcell_service::{Caller, Service, ServiceError};
use sandcell_store::RunRecord;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::budget::{Exhausted, Pool, Reservation};
use crate::durable;
use crate::event::{ArtifactRef, Event, EventKind};
use crate::journal::{Journal, now_ms};
use crate::run::{self, Asked, CallKind, Ended, RunContext, SandboxPlan};
use crate::runner::{LiveEntry, LiveRuns};
use crate::tools;
use crate::validate;

/// Characters of `context` the model is shown.
pub const CONTEXT_PREVIEW_CHARS: usize = 500;
/// Characters of the task the model is shown (the rest is in `context` when it is the input).
pub const TASK_SHOWN_CHARS: usize = 20_000;
/// Characters of one code block's output the model reads; the rest is cut with a marker.
pub const BLOCK_OUTPUT_CHARS: usize = tools::MAX_RESULT_CHARS;
/// The tool name code blocks are recorded under.
pub const REPL_TOOL: &str = "repl";
/// The tool name sub-runs are recorded under.
pub const RLM_QUERY: &str = "rlm_query";

/// Languages a fenced block may be marked with to run.
const RUNNABLE: [&str; 4] = ["python", "py", "python3", "repl"];

/// What the model is told in `repl` mode, with the run tree's limits.
pub fn system_prompt(max_sub_calls: u32, max_depth: u32, depth: u32) -> String {
    let deeper = max_depth.saturating_sub(depth);
    format!(
        "You answer a query with the help of a Python REPL: a live kernel whose variables \
persist between your replies. The input to work on is in the variable `context`; you are \
shown only its start, so look at it, split it and process it with code.

Write Python code in ```python blocks (```repl works too). Every block of your reply runs, in \
order, and you then see its output; long output is cut, so print what you need to read \
(sizes, samples, summaries), not whole texts. The code can call:
- llm_query(prompt: str) -> str: ask a language model (no tools). It sees only the prompt, so \
put the text it needs into it; it can take large pieces.
- llm_query_batched(prompts: list[str]) -> list[str]: many independent questions at once, \
answered concurrently (much faster than a loop of llm_query).
- rlm_query(prompt: str) -> str: hand a sub-problem to a sub-agent like you, with its own \
REPL in which `context` is the prompt.
- FINAL(answer): give your final answer; the run ends after the block.
- FINAL_VAR(name): give the value of the variable called `name` as the final answer, e.g. \
FINAL_VAR('answer').
Limits: {max_sub_calls} model sub-calls in the whole run; sub-agents {deeper} level(s) below \
this one (past that, rlm_query is a plain llm_query). A call the run's budget no longer \
allows raises SandcellBudgetError. Work step by step: inspect the context, split it, use \
sub-calls on the pieces, combine the results, then call FINAL or FINAL_VAR. A reply without a \
code block is taken as your final answer."
    )
}

/// What the model is told when it has used all its steps.
const FORCE_ANSWER: &str = "You have used all the steps of this run. Reply now with your final \
answer in plain text, from what you have found; code will not run any more.";

/// The first user message: the task (cut when long) and a description of `context`.
pub fn first_message(task: &str, context: &str, context_is_task: bool) -> String {
    let (shown, cut) = head(task, TASK_SHOWN_CHARS);
    let mut text = shown.to_string();
    if cut {
        text.push_str("\n[… the task goes on; all of it is in `context`]");
    }
    let chars = context.chars().count();
    let lines = context.lines().count();
    let (preview, more) = head(context, CONTEXT_PREVIEW_CHARS);
    text.push_str(&format!(
        "\n\n{}Your input is in the Python variable `context`: a str of {chars} characters \
         ({lines} lines). ",
        if context_is_task {
            "(The task is your input.) "
        } else {
            ""
        }
    ));
    if more {
        text.push_str(&format!(
            "Its first {CONTEXT_PREVIEW_CHARS} characters:\n<<<\n{preview}\n>>>\nThe rest is \
             only in `context`: read it with code."
        ));
    } else {
        text.push_str(&format!("All of it:\n<<<\n{preview}\n>>>"));
    }
    text
}

/// The first `max` characters of `text`, and whether there was more.
fn head(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    }
}

/// The code of every runnable fenced block (```` ```python ````, ```` ```py ````,
/// ```` ```python3 ````, ```` ```repl ````) of a reply, in order; a block left open (an
/// answer cut short) is not run.
pub fn code_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, bool, Vec<&str>)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let fence = line.len() - trimmed.len();
                    let lang = info.split_whitespace().next().unwrap_or("");
                    let runs = RUNNABLE.contains(&lang.to_ascii_lowercase().as_str());
                    open = Some((fence, runs, Vec::new()));
                }
            }
            Some((fence, runs, body)) => {
                if trimmed.trim_end() == "```" {
                    if *runs {
                        let indent = *fence;
                        let code: Vec<&str> = body
                            .iter()
                            .map(|l| {
                                // A block indented in a list: its lines lose that indent.
                                let strip = l.len() - l.trim_start().len();
                                &l[strip.min(indent)..]
                            })
                            .collect();
                        let code = code.join("\n");
                        if !code.trim().is_empty() {
                            blocks.push(code);
                        }
                    }
                    open = None;
                } else {
                    body.push(line);
                }
            }
        }
    }
    blocks
}

/// A text reply as an answer: `FINAL(…)` around all of it is taken off.
fn text_answer(text: &str) -> String {
    let t = text.trim();
    t.strip_prefix("FINAL(")
        .and_then(|r| r.strip_suffix(')'))
        .map_or_else(|| t.to_string(), |inner| inner.trim().to_string())
}

/// A reservation that goes back to the pool unless it is settled (a call cancelled, or its
/// task aborted when its cell ended, still gives its reservation back).
struct Held {
    pool: Arc<Pool>,
    reservation: Option<Reservation>,
}

impl Held {
    fn max_tokens(&self) -> u32 {
        self.reservation.as_ref().map_or(0, |r| r.max_tokens)
    }

    fn settle(mut self, usage: &sandcell_llm::Usage, cost: Option<f64>) {
        if let Some(r) = self.reservation.take() {
            self.pool.settle(r, usage, cost);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            self.pool.release(r);
        }
    }
}

/// One repl run, shared by its loop and the host calls of its cells.
struct Repl {
    service: Arc<Service>,
    llm: Arc<Llm>,
    caller: Caller,
    model: ModelRef,
    stream: bool,
    pool: Arc<Pool>,
    cancel: CancellationToken,
    journal: Mutex<Journal>,
    /// Model calls of this run, numbered (its own and its sub-calls).
    calls: AtomicU32,
    /// Sub-runs started, numbered.
    sub_runs: AtomicU32,
    /// What `FINAL` / `FINAL_VAR` gave.
    answer: Mutex<Option<String>>,
    /// The run's sandbox, once ready.
    sandbox_id: OnceLock<SandboxId>,
    /// The runs going on in this process, where sub-runs register.
    runs: Arc<LiveRuns>,
    /// How its final answer is checked.
    validate: Option<Validate>,
    /// Its step snapshots.
    durability: run::Durability,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Answers the host calls of this run's cells.
struct Host(Arc<Repl>);

impl HostCallHandler for Host {
    fn call(&self, request: HostCallRequest) -> HostCallFuture {
        let repl = self.0.clone();
        Box::pin(async move { repl.host_call(request).await })
    }
}

fn refused(kind: HostCallErrorKind, message: impl Into<String>) -> HostCallError {
    HostCallError::new(kind, message)
}

fn budget_refusal(which: Exhausted) -> HostCallError {
    let what = match which {
        Exhausted::SubCalls => "sub-call budget",
        Exhausted::Tokens => "token budget",
        Exhausted::Cost => "cost limit",
        Exhausted::Iterations => "iteration budget",
        Exhausted::Depth => "depth limit",
    };
    refused(
        HostCallErrorKind::Budget,
        format!(
            "the run's {what} is spent ({}): answer with what you have",
            which.reason()
        ),
    )
}

fn not_recorded(e: &ServiceError) -> HostCallError {
    refused(
        HostCallErrorKind::Failed,
        format!("the run's trajectory could not be written: {}", e.message),
    )
}

fn prompt_of(payload: &Value) -> Result<String, HostCallError> {
    payload
        .get("prompt")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            refused(
                HostCallErrorKind::InvalidArgument,
                "'prompt' (a str) is required",
            )
        })
}

impl Repl {
    fn emit(&self, kind: EventKind, with_record: bool) -> Result<Event, ServiceError> {
        lock(&self.journal).emit(kind, with_record)
    }

    /// Keeps a cut output whole as a file beside the trajectory.
    fn keep_text(&self, text: &str) -> Option<ArtifactRef> {
        run::keep_artifact(&lock(&self.journal), "text/plain", "txt", text.as_bytes())
    }

    /// Counts the step, takes its snapshot when the policy wants one (`mutated`: it ran
    /// code or a check) and commits it with the tree's totals and the messages it `added`.
    async fn commit_step(
        &self,
        sandbox: &SandboxId,
        mutated: bool,
        added: &[Message],
    ) -> Result<(), ServiceError> {
        let (run_id, step) = {
            let j = lock(&self.journal);
            (j.record.id.clone(), j.step())
        };
        let snapshot = if durable::wants_snapshot(self.durability.policy, mutated) {
            let owner = &self.caller.owner;
            match durable::snapshot_step(&self.service, owner, sandbox, &run_id, step).await {
                Ok(s) => Some(s),
                Err(e) => {
                    self.emit(
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
        self.pool.count_step();
        let usage = self.pool.usage();
        let mut j = lock(&self.journal);
        let messages = durable::externalize(added, &j.artifacts_dir());
        j.record.totals = serde_json::to_value(&usage).unwrap_or(Value::Null);
        j.emit(
            EventKind::StepCommitted {
                usage,
                snapshot,
                messages,
            },
            true,
        )?;
        Ok(())
    }

    /// The model gave `answer`: how the run ends, or what it is told when the run's check
    /// failed with attempts left (`Err`).
    async fn answer_given(
        &self,
        sandbox: &SandboxId,
        attempts: &mut u32,
        reason: &str,
        answer: &str,
    ) -> Result<Result<Ended, String>, ServiceError> {
        let given = validate::Given {
            validate: self.validate.as_ref(),
            sandbox,
            reason,
            answer,
        };
        validate::answer_given(
            &self.service,
            &self.caller,
            &self.cancel,
            given,
            attempts,
            |e| self.emit(e, false).map(drop),
        )
        .await
    }

    fn next_call(&self) -> u32 {
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn depth(&self) -> u32 {
        lock(&self.journal).record.depth
    }

    fn reserve(&self, req: &ChatRequest, sub_call: bool) -> Result<Held, Exhausted> {
        let price = self.llm.config().prices.get(&self.model).cloned();
        let r = self.pool.reserve(
            req.estimated_input_tokens(),
            req.max_tokens,
            price.as_ref(),
            sub_call,
        )?;
        Ok(Held {
            pool: self.pool.clone(),
            reservation: Some(r),
        })
    }

    fn llm_request_event(&self, call: u32, req: &ChatRequest, kind: CallKind) -> EventKind {
        EventKind::LlmRequest {
            call,
            model: self.model.to_string(),
            messages: req.messages.len(),
            tools: Vec::new(),
            max_tokens: req.max_tokens,
            prompt_estimate: req.estimated_input_tokens(),
            sub_call: kind == CallKind::Sub,
            condense: kind == CallKind::Condense,
        }
    }

    fn llm_response_event(&self, call: u32, r: &ChatResponse, cost: Option<f64>) -> EventKind {
        EventKind::LlmResponse {
            call,
            text: r.text.clone(),
            tool_calls: r.tool_calls.clone(),
            finish: r.finish.clone(),
            usage: r.usage,
            cost_usd: cost,
            latency_ms: r.latency_ms,
            attempts: r.attempts,
            request_id: r.request_id.clone(),
        }
    }

    fn llm_error_event(call: u32, e: &LlmError) -> EventKind {
        EventKind::LlmError {
            call,
            kind: e.wire_name().to_string(),
            message: e.message.clone(),
            status: e.status,
            attempts: e.attempts,
        }
    }

    /// One step's model call: reserved, recorded, asked, settled.
    async fn ask(&self, mut req: ChatRequest, kind: CallKind) -> Result<Asked, ServiceError> {
        let held = match self.reserve(&req, false) {
            Ok(h) => h,
            Err(which) => return Ok(Asked::End(Ended::failed(which.reason()))),
        };
        req.max_tokens = held.max_tokens();
        let call = self.next_call();
        self.emit(self.llm_request_event(call, &req, kind), false)?;
        let llm = self.llm.clone();
        let provider = self.model.provider;
        let answer = tokio::select! {
            () = self.cancel.cancelled() => return Ok(Asked::End(Ended::cancelled())),
            () = tokio::time::sleep(self.pool.time_left()) => return Ok(Asked::End(Ended::failed("timeout"))),
            r = async move {
                let mut ignore = |_: StreamDelta<'_>| {};
                llm.chat(provider, &req, &mut ignore).await
            } => r,
        };
        match answer {
            Ok(r) => {
                let cost = self.llm.cost(&self.model, &r.usage);
                held.settle(&r.usage, cost);
                self.emit(self.llm_response_event(call, &r, cost), false)?;
                Ok(Asked::Answer(r))
            }
            Err(e) => {
                drop(held);
                self.emit(Self::llm_error_event(call, &e), false)?;
                Ok(match e.kind {
                    LlmErrorKind::ImagesRejected => Asked::ImagesRejected,
                    LlmErrorKind::Config => Asked::End(Ended::failed("error")),
                    _ => Asked::End(Ended::failed("provider_error")),
                })
            }
        }
    }

    async fn host_call(self: Arc<Self>, req: HostCallRequest) -> Result<Value, HostCallError> {
        match req.method.as_str() {
            "llm_query" => {
                let prompt = prompt_of(&req.payload)?;
                let mut answers = self.sub_calls(vec![prompt]).await?;
                Ok(Value::String(answers.pop().unwrap_or_default()))
            }
            "llm_query_batched" => {
                // Every prompt a str, or none is asked: answers must line up with prompts.
                let prompts: Vec<String> = req
                    .payload
                    .get("prompts")
                    .and_then(Value::as_array)
                    .and_then(|a| {
                        a.iter()
                            .map(|p| p.as_str().map(str::to_string))
                            .collect::<Option<Vec<String>>>()
                    })
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| {
                        refused(
                            HostCallErrorKind::InvalidArgument,
                            "'prompts' (a non-empty list of str) is required",
                        )
                    })?;
                Ok(json!(self.sub_calls(prompts).await?))
            }
            RLM_QUERY => {
                let prompt = prompt_of(&req.payload)?;
                self.rlm_query(prompt).await.map(Value::String)
            }
            "final" => {
                let answer = match req.payload.get("answer") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => {
                        return Err(refused(
                            HostCallErrorKind::InvalidArgument,
                            "'answer' is required",
                        ));
                    }
                };
                *lock(&self.answer) = Some(answer);
                Ok(Value::Null)
            }
            other => Err(refused(
                HostCallErrorKind::UnknownMethod,
                format!(
                    "no host method {other:?} (llm_query, llm_query_batched, rlm_query, final)"
                ),
            )),
        }
    }

    /// Model calls without tools for the code (`llm_query`, `llm_query_batched`): all
    /// reserved and recorded first, in order, then sent together.
    async fn sub_calls(&self, prompts: Vec<String>) -> Result<Vec<String>, HostCallError> {
        if self.cancel.is_cancelled() {
            return Err(refused(
                HostCallErrorKind::Cancelled,
                "the run was cancelled",
            ));
        }
        if self.pool.time_left().is_zero() {
            return Err(refused(
                HostCallErrorKind::Budget,
                "the run's time is up (timeout)",
            ));
        }
        // A batch the sub-call budget cannot hold is refused whole, before anything is
        // reserved (a reservation given back unused still counts as a call in the totals).
        let budgets = self.pool.budgets();
        let used = self.pool.usage().sub_calls;
        if u64::from(used) + prompts.len() as u64 > u64::from(budgets.max_sub_calls) {
            return Err(refused(
                HostCallErrorKind::Budget,
                format!(
                    "the run's sub-call budget does not allow {} more (budget:sub_calls: {used}                      of {} used): answer with what you have",
                    prompts.len(),
                    budgets.max_sub_calls
                ),
            ));
        }
        let max_output = budgets.max_output_tokens;
        let mut pending = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            let mut req = ChatRequest {
                model: self.model.model.clone(),
                system: None,
                messages: vec![Message {
                    role: Role::User,
                    content: vec![Part::Text(prompt)],
                }],
                tools: Vec::new(),
                max_tokens: max_output,
                temperature: None,
                stream: self.stream,
            };
            // Reservations made so far go back (dropped) if one is refused.
            let held = self.reserve(&req, true).map_err(budget_refusal)?;
            req.max_tokens = held.max_tokens();
            let call = self.next_call();
            self.emit(self.llm_request_event(call, &req, CallKind::Sub), false)
                .map_err(|e| not_recorded(&e))?;
            pending.push((call, req, held));
        }
        let llm = self.llm.clone();
        let provider = self.model.provider;
        let answers = tokio::select! {
            () = self.cancel.cancelled() => {
                return Err(refused(HostCallErrorKind::Cancelled, "the run was cancelled"));
            }
            () = tokio::time::sleep(self.pool.time_left()) => {
                return Err(refused(HostCallErrorKind::Budget, "the run's time is up (timeout)"));
            }
            a = join_all(pending.iter().map(|(_, req, _)| {
                let llm = llm.clone();
                async move {
                    let mut ignore = |_: StreamDelta<'_>| {};
                    llm.chat(provider, req, &mut ignore).await
                }
            })) => a,
        };
        let mut texts = Vec::with_capacity(answers.len());
        let mut failures = Vec::new();
        for ((call, _, held), answer) in pending.into_iter().zip(answers) {
            match answer {
                Ok(r) => {
                    let cost = self.llm.cost(&self.model, &r.usage);
                    held.settle(&r.usage, cost);
                    self.emit(self.llm_response_event(call, &r, cost), false)
                        .map_err(|e| not_recorded(&e))?;
                    texts.push(r.text);
                }
                Err(e) => {
                    drop(held);
                    self.emit(Self::llm_error_event(call, &e), false)
                        .map_err(|e| not_recorded(&e))?;
                    failures.push(format!(
                        "call {}: {}",
                        texts.len() + failures.len() + 1,
                        e.message
                    ));
                    texts.push(String::new());
                }
            }
        }
        if !failures.is_empty() {
            return Err(refused(
                HostCallErrorKind::Failed,
                format!("the model failed: {}", failures.join("; ")),
            ));
        }
        Ok(texts)
    }

    /// A sub-run one level deeper with `prompt` as its task and its `context`; past the run
    /// tree's depth limit, a plain sub-call.
    async fn rlm_query(&self, prompt: String) -> Result<String, HostCallError> {
        let depth = self.depth();
        let max_depth = self.pool.budgets().max_depth;
        if depth >= max_depth {
            self.emit(
                EventKind::Warning {
                    message: format!(
                        "rlm_query at depth {depth}: the run tree's max_depth ({max_depth}) \
                         allows no deeper run; answered with a plain llm_query"
                    ),
                },
                false,
            )
            .map_err(|e| not_recorded(&e))?;
            let mut answers = self.sub_calls(vec![prompt]).await?;
            return Ok(answers.pop().unwrap_or_default());
        }
        if self.cancel.is_cancelled() {
            return Err(refused(
                HostCallErrorKind::Cancelled,
                "the run was cancelled",
            ));
        }
        // A sub-run is a sub-call of the tree (its own model calls are its steps).
        self.pool.take_sub_call().map_err(budget_refusal)?;
        // Cancelled when the run is, and when this call is abandoned (its cell ended): the
        // sub-run then records its end and cleans up on its own.
        let child_cancel = self.cancel.child_token();
        let _abandoned = child_cancel.clone().drop_guard();
        let (child, _registered) = self
            .child(&prompt, child_cancel)
            .map_err(|e| not_recorded(&e))?;
        let child_id = child.journal.record.id.clone();
        let n = self.sub_runs.fetch_add(1, Ordering::SeqCst) + 1;
        let call_id = format!("rlm-{n}");
        let (shown, _) = tools::truncate(&prompt, 2_000);
        self.emit(
            EventKind::ToolCall {
                call_id: call_id.clone(),
                name: RLM_QUERY.to_string(),
                arguments: json!({"prompt": shown, "child_run_id": child_id, "depth": depth + 1}),
            },
            false,
        )
        .map_err(|e| not_recorded(&e))?;
        let started = Instant::now();
        let task = prompt.clone();
        let ended = match tokio::spawn(drive_repl(child, task, Some(prompt))).await {
            Ok(ended) => ended,
            // Its task panicked or was aborted: nothing recorded its end but the store.
            Err(e) => {
                tracing::error!(run = %child_id, error = %e, "a sub-run stopped before its end");
                Ended::failed("error")
            }
        };
        let succeeded = ended.status == "succeeded";
        let text = match (&ended.answer, succeeded) {
            (Some(a), true) => a.clone(),
            _ => format!(
                "sub-run {child_id} ended {} ({})",
                ended.status, ended.reason
            ),
        };
        let (shown, truncated) = tools::truncate(&text, tools::MAX_RESULT_CHARS);
        let full_text = truncated.then(|| self.keep_text(&text)).flatten();
        self.emit(
            EventKind::ToolResult {
                call_id,
                name: RLM_QUERY.to_string(),
                is_error: !succeeded,
                text: shown,
                truncated,
                full_text,
                images: Vec::new(),
                duration_ms: millis(started.elapsed()),
            },
            false,
        )
        .map_err(|e| not_recorded(&e))?;
        if succeeded {
            return Ok(ended.answer.unwrap_or_default());
        }
        let kind = if ended.status == "cancelled" {
            HostCallErrorKind::Cancelled
        } else if ended.reason.starts_with("budget:") || ended.reason == "timeout" {
            HostCallErrorKind::Budget
        } else {
            HostCallErrorKind::Failed
        };
        Err(refused(kind, text))
    }

    /// A sub-run's context: recorded as a run one level below this one, in the same tree,
    /// sandbox and pool, and registered with the runs of this process (followed and
    /// cancelled by its own id) until the returned entry is dropped.
    fn child(
        &self,
        prompt: &str,
        cancel: CancellationToken,
    ) -> Result<(RunContext, LiveEntry), ServiceError> {
        let parent = lock(&self.journal).record.clone();
        let sandbox = self
            .sandbox_id
            .get()
            .cloned()
            .ok_or_else(|| ServiceError::internal("a sub-run before the run's sandbox"))?;
        let now = now_ms();
        let record = RunRecord {
            id: new_record_id("run")?,
            owner: parent.owner,
            root_id: parent.root_id,
            parent_id: Some(parent.id),
            depth: parent.depth + 1,
            mode: RunMode::Repl.as_str().to_string(),
            model: parent.model,
            task: prompt.to_string(),
            sandbox_id: Some(sandbox.to_string()),
            status: "running".into(),
            reason: None,
            answer: None,
            settings: parent.settings,
            totals: serde_json::to_value(RunUsage::default()).unwrap_or(Value::Null),
            created_at: now,
            updated_at: now,
            ended_at: None,
        };
        let (live, _) = tokio::sync::broadcast::channel(1024);
        let entry = self.runs.register(&record.id, cancel.clone(), live.clone());
        let journal = Journal::create(
            self.service.store.clone(),
            &self.service.config.home,
            record,
            live,
        )?;
        let ctx = RunContext {
            service: self.service.clone(),
            llm: self.llm.clone(),
            caller: self.caller.clone(),
            model: self.model.clone(),
            stream: self.stream,
            pool: self.pool.clone(),
            cancel,
            journal,
            sandbox: SandboxPlan::Existing(sandbox),
            runs: self.runs.clone(),
            // What a sub-run answers goes to its parent's code, which checks it if it likes.
            validate: None,
            // The parent's step is what a resume starts again, from the parent's snapshot.
            durability: run::Durability {
                policy: SnapshotPolicy::Off,
                prune: false,
            },
        };
        Ok((ctx, entry))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs a `repl`-mode run to the end and records how it ended; the run's record says the
/// same. `context` is its input (`None`: the task itself). A sub-run (depth > 0) works in a
/// context of its own that it removes at its end; a top-level run's context stays, for
/// whoever looks at the sandbox afterwards.
pub async fn drive_repl(ctx: RunContext, task: String, context: Option<String>) -> Ended {
    drive_repl_from(ctx, ReplStart::Fresh { task, context }).await
}

/// How a repl run starts.
#[derive(Debug)]
pub enum ReplStart {
    /// Afresh: its task, and its input (`None`: the task itself).
    Fresh {
        /// The task.
        task: String,
        /// The input.
        context: Option<String>,
    },
    /// Again after its process stopped, from what its trajectory recorded.
    Resumed(Box<durable::Rebuilt>),
    /// A fork, its start recorded: this conversation, in this sandbox.
    Forked {
        /// The sandbox, ready (restored from the original's step snapshot).
        sandbox: SandboxId,
        /// The history, the description of the input first.
        messages: Vec<Message>,
        /// The original's kernel context, which the snapshot brought back.
        kernel: Option<String>,
        /// Where the input is kept (`None`: the task is the input).
        input: Option<ArtifactRef>,
        /// The original's task.
        task: String,
    },
}

/// [`drive_repl`], from a fresh start, a resume or a fork.
pub async fn drive_repl_from(ctx: RunContext, start: ReplStart) -> Ended {
    let RunContext {
        service,
        llm,
        caller,
        model,
        stream,
        pool,
        cancel,
        journal,
        sandbox,
        runs,
        validate,
        durability,
    } = ctx;
    let repl = Arc::new(Repl {
        service,
        llm,
        caller,
        model,
        stream,
        pool,
        cancel,
        journal: Mutex::new(journal),
        calls: AtomicU32::new(0),
        sub_runs: AtomicU32::new(0),
        answer: Mutex::new(None),
        sandbox_id: OnceLock::new(),
        runs,
        validate,
        durability,
    });
    let mut kernel = None;
    let ended = match steps(&repl, &sandbox, start, &mut kernel).await {
        Ok(ended) => ended,
        Err(e) => {
            let _ = repl.emit(
                EventKind::Warning {
                    message: format!("the run failed: {}: {}", e.code(), e.message),
                },
                false,
            );
            Ended::failed("error")
        }
    };
    if let Some((sandbox, context)) = kernel
        && repl.depth() > 0
    {
        // Interrupted first: a cell still running (the run was cancelled) holds the context.
        let (service, caller) = (&repl.service, &repl.caller);
        let _ = service.interrupt_context(caller, &sandbox, &context).await;
        let _ = service.delete_context(caller, &sandbox, &context).await;
    }
    // The sandbox goes before `run_finished`: whoever sees the end sees it gone.
    let made = lock(&repl.journal).record.sandbox_id.clone();
    run::release_sandbox(&repl.service, &repl.caller, &sandbox, made.as_deref()).await;
    if repl.durability.prune {
        let run_id = lock(&repl.journal).record.id.clone();
        durable::prune(&repl.service, &repl.caller, &run_id).await;
    }
    run::finish(&mut lock(&repl.journal), repl.pool.usage(), &ended);
    ended
}

async fn prepare_sandbox(repl: &Repl, plan: &SandboxPlan) -> Result<SandboxId, ServiceError> {
    let (id, created) = run::open_sandbox(&repl.service, &repl.caller, plan).await?;
    run::sandbox_ready(&mut lock(&repl.journal), &id, created)?;
    Ok(id)
}

/// Puts `text` in the kernel as `context`: through a file (any size; nothing large crosses a
/// frame or the kernel's request pipe), read by a cell that then removes it.
async fn load_context(
    repl: &Repl,
    sandbox_id: &SandboxId,
    context_id: &str,
    run_id: &str,
    text: String,
) -> Result<(), ServiceError> {
    let (service, caller) = (&repl.service, &repl.caller);
    let body = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(text) });
    let file = service
        .upload_file(
            caller,
            sandbox_id,
            &format!(".sandcell-context-{run_id}.txt"),
            Some(0o600),
            false,
            body,
        )
        .await?;
    let path = serde_json::to_string(&file.path)
        .map_err(|e| ServiceError::internal(format!("a path does not serialize: {e}")))?;
    let code = format!(
        "import os as _sandcell_os\n\
         with open({path}, encoding='utf-8') as _sandcell_f:\n    context = _sandcell_f.read()\n\
         _sandcell_os.remove({path})\n\
         del _sandcell_os, _sandcell_f\n"
    );
    let run = service
        .run_code(
            caller,
            sandbox_id,
            CodeInput {
                code: Code::new(code)?,
                language: None,
                context: Some(context_id.to_string()),
                timeout_secs: Some(Timeout::from_secs(120.0)?),
            },
        )
        .await?;
    match run.error {
        None => Ok(()),
        Some(e) => Err(ServiceError::internal(format!(
            "the input could not be put in the kernel: {}: {}",
            e.name, e.value
        ))),
    }
}

/// Where a repl run's loop starts: its sandbox, kernel context and conversation, and how
/// far a resumed run had got.
struct Begun {
    sandbox: SandboxId,
    context: String,
    messages: Vec<Message>,
    /// The first step to run.
    first: u32,
    /// The first step's messages include the first one (a fresh start: a resume or a fork
    /// rebuilds the conversation from the steps' messages alone).
    first_message_in_step: bool,
    /// The next step's answer, recorded before a stop.
    recorded: Option<ChatResponse>,
    /// Code of the next step had started before a stop and nothing could undo it.
    blocks_unknown: bool,
    attempts: u32,
}

/// The input text: `input` read back from its file, else the task.
pub(crate) fn read_input(input: Option<&ArtifactRef>, task: &str) -> Result<String, ServiceError> {
    match input {
        None => Ok(task.to_string()),
        Some(a) => std::fs::read_to_string(&a.path).map_err(|e| {
            ServiceError::internal(format!("the run's input ({}) cannot be read: {e}", a.path))
        }),
    }
}

/// The kernel context a resumed or forked run goes on in: `known` when the sandbox still
/// has it (its variables are the run's state), else a new one loaded with the input (and a
/// warning when earlier steps' variables are lost).
async fn reattach_kernel(
    repl: &Repl,
    sandbox: &SandboxId,
    known: Option<&str>,
    input: Option<&ArtifactRef>,
    task: &str,
    after_step: u32,
) -> Result<String, ServiceError> {
    if let Some(id) = known {
        let live = repl.service.list_contexts(&repl.caller, sandbox).await?;
        if live.iter().any(|c| c.id == id) {
            repl.emit(
                EventKind::KernelReady {
                    context_id: id.to_string(),
                    fresh: false,
                },
                false,
            )?;
            return Ok(id.to_string());
        }
    }
    if after_step > 0 {
        repl.emit(
            EventKind::Warning {
                message: "the run's kernel is not in its sandbox any more: a new one was started \
                          with the input in `context`; variables of earlier steps are lost"
                    .into(),
            },
            false,
        )?;
    }
    new_kernel(repl, sandbox, read_input(input, task)?).await
}

/// A new kernel context of the run's own, with `input` loaded as `context`, recorded.
async fn new_kernel(
    repl: &Repl,
    sandbox: &SandboxId,
    input: String,
) -> Result<String, ServiceError> {
    let run_id = lock(&repl.journal).record.id.clone();
    // A context of its own (recorded, as any context made through the service): the run's
    // `context` variable and whatever its code defines stay out of the sandbox's default one.
    let info = repl
        .service
        .create_context(
            &repl.caller,
            sandbox,
            CreateContext {
                language: Lang::Python,
                cwd: None,
                env: BTreeMap::new(),
            },
        )
        .await?;
    load_context(repl, sandbox, &info.id, &run_id, input).await?;
    repl.emit(
        EventKind::KernelReady {
            context_id: info.id.clone(),
            fresh: true,
        },
        false,
    )?;
    Ok(info.id)
}

async fn begin(
    repl: &Arc<Repl>,
    plan: &SandboxPlan,
    start: ReplStart,
    kernel: &mut Option<(SandboxId, String)>,
) -> Result<Begun, ServiceError> {
    let depth = repl.depth();
    match start {
        ReplStart::Fresh { task, context } => {
            // A top-level run's input is kept, for a resume or a fork to load again (a
            // sub-run is not resumed alone: its parent's step runs again).
            let input = match &context {
                Some(text) if depth == 0 => Some(
                    run::keep_artifact(&lock(&repl.journal), "text/plain", "txt", text.as_bytes())
                        .ok_or_else(|| {
                            ServiceError::internal("the run's input could not be kept as a file")
                        })?,
                ),
                _ => None,
            };
            let parent = lock(&repl.journal).record.parent_id.clone();
            repl.emit(
                EventKind::RunStarted {
                    task: task.clone(),
                    mode: RunMode::Repl,
                    model: repl.model.to_string(),
                    budgets: repl.pool.budgets().clone(),
                    parent_run_id: parent,
                    validate: repl.validate.clone(),
                    forked_from: None,
                    input,
                },
                false,
            )?;
            if repl.llm.config().prices.get(&repl.model).is_none() && depth == 0 {
                repl.emit(
                    EventKind::Warning {
                        message: format!(
                            "no price is known for {}: its cost is reported as unknown and the cost limit cannot be held (add it to agent.prices)",
                            repl.model
                        ),
                    },
                    false,
                )?;
            }
            let sandbox = prepare_sandbox(repl, plan).await?;
            let _ = repl.sandbox_id.set(sandbox.clone());
            let context_is_task = context.is_none();
            let input = context.unwrap_or_else(|| task.clone());
            let first = first_message(&task, &input, context_is_task);
            let context = new_kernel(repl, &sandbox, input).await?;
            *kernel = Some((sandbox.clone(), context.clone()));
            Ok(Begun {
                sandbox,
                context,
                messages: vec![Message::user(first)],
                first: 1,
                first_message_in_step: true,
                recorded: None,
                blocks_unknown: false,
                attempts: 0,
            })
        }
        ReplStart::Resumed(r) => {
            let (reopened, event) = durable::reopen(&repl.service, &repl.caller, plan, &r).await?;
            durable::record_reopened(&mut lock(&repl.journal), &reopened, event)?;
            let sandbox = reopened.id.clone();
            let _ = repl.sandbox_id.set(sandbox.clone());
            repl.calls.store(r.calls, Ordering::SeqCst);
            repl.sub_runs.store(r.sub_runs, Ordering::SeqCst);
            let context = reattach_kernel(
                repl,
                &sandbox,
                r.kernel.as_deref(),
                r.input.as_ref(),
                &r.task,
                r.step,
            )
            .await?;
            *kernel = Some((sandbox.clone(), context.clone()));
            let r = *r;
            // Stopped before its first step was committed: the conversation starts again.
            let (messages, first_message_in_step) = if r.messages.is_empty() {
                let input = read_input(r.input.as_ref(), &r.task)?;
                let first = first_message(&r.task, &input, r.input.is_none());
                (vec![Message::user(first)], true)
            } else {
                (r.messages, false)
            };
            Ok(Begun {
                sandbox,
                context,
                messages,
                first: r.step + 1,
                first_message_in_step,
                recorded: r.next_response.map(|n| n.response),
                blocks_unknown: reopened.tools_unknown,
                attempts: r.attempts,
            })
        }
        ReplStart::Forked {
            sandbox,
            messages,
            kernel: known,
            input,
            task,
        } => {
            let _ = repl.sandbox_id.set(sandbox.clone());
            // A fork starts after a committed step: a kernel made anew has lost variables.
            let context =
                reattach_kernel(repl, &sandbox, known.as_deref(), input.as_ref(), &task, 1).await?;
            *kernel = Some((sandbox.clone(), context.clone()));
            Ok(Begun {
                sandbox,
                context,
                messages,
                first: 1,
                first_message_in_step: false,
                recorded: None,
                blocks_unknown: false,
                attempts: 0,
            })
        }
    }
}

async fn steps(
    repl: &Arc<Repl>,
    plan: &SandboxPlan,
    start: ReplStart,
    kernel: &mut Option<(SandboxId, String)>,
) -> Result<Ended, ServiceError> {
    let budgets = repl.pool.budgets().clone();
    let depth = repl.depth();
    let Begun {
        sandbox: sandbox_id,
        context: context_id,
        mut messages,
        first,
        mut first_message_in_step,
        mut recorded,
        mut blocks_unknown,
        mut attempts,
    } = begin(repl, plan, start, kernel).await?;
    let system = system_prompt(budgets.max_sub_calls, budgets.max_depth, depth);
    let cell_timeout = Timeout::from_secs(budgets.cell_timeout_secs)?;
    let handler: Arc<dyn HostCallHandler> = Arc::new(Host(repl.clone()));
    let mut vision = true;
    for iteration in first..=budgets.max_iterations + 1 {
        if repl.cancel.is_cancelled() {
            return Ok(Ended::cancelled());
        }
        if repl.pool.time_left().is_zero() {
            return Ok(Ended::failed("timeout"));
        }
        let forced = iteration > budgets.max_iterations;
        if forced {
            messages.push(Message {
                role: Role::User,
                content: vec![Part::Text(FORCE_ANSWER.into())],
            });
        }
        lock(&repl.journal).next_step();
        // A resumed run's next step may have its answer recorded: it is used, not asked again.
        let reused = recorded.take();
        if reused.is_none()
            && let Some(plan) = run::condensing(
                &repl.llm,
                &repl.model,
                repl.stream,
                budgets.max_output_tokens,
                &system,
                &messages,
                &[],
            )
        {
            let summary = match repl.ask(plan.request.clone(), CallKind::Condense).await? {
                Asked::Answer(r) => r.text,
                Asked::End(ended) => return Ok(ended),
                Asked::ImagesRejected => return Ok(Ended::failed("provider_error")),
            };
            let event = run::condense(&mut messages, plan, summary, &system, &[]);
            repl.emit(event, false)?;
        }
        // What this step adds to the conversation starts here (a fresh run's first step
        // also records the first message, which describes the input).
        let mark = if first_message_in_step {
            0
        } else {
            messages.len()
        };
        first_message_in_step = false;
        let step_request = |messages: &[Message]| ChatRequest {
            model: repl.model.model.clone(),
            system: Some(system.clone()),
            messages: messages.to_vec(),
            tools: Vec::new(),
            max_tokens: budgets.max_output_tokens,
            temperature: None,
            stream: repl.stream,
        };
        let asked = match reused {
            Some(r) => Asked::Answer(r),
            None => repl.ask(step_request(&messages), CallKind::Step).await?,
        };
        let response = match asked {
            Asked::Answer(r) => r,
            Asked::End(ended) => return Ok(ended),
            Asked::ImagesRejected if vision && run::has_images(&messages) => {
                // Once per run: the images go, the step is asked again without them.
                vision = false;
                run::strip_images(&mut messages);
                repl.emit(
                    EventKind::Warning {
                        message: format!(
                            "{} refused images: vision is off for the rest of this run",
                            repl.model
                        ),
                    },
                    false,
                )?;
                match repl.ask(step_request(&messages), CallKind::Step).await? {
                    Asked::Answer(r) => r,
                    Asked::End(ended) => return Ok(ended),
                    Asked::ImagesRejected => return Ok(Ended::failed("provider_error")),
                }
            }
            Asked::ImagesRejected => return Ok(Ended::failed("provider_error")),
        };
        if forced {
            // The last call: a failed check cannot be answered any more.
            let answer = text_answer(&response.text);
            return Ok(
                match repl
                    .answer_given(&sandbox_id, &mut attempts, "forced", &answer)
                    .await?
                {
                    Ok(ended) => ended,
                    Err(_) => Ended::validation_failed(answer),
                },
            );
        }
        let blocks = code_blocks(&response.text);
        if blocks.is_empty() {
            let answer = text_answer(&response.text);
            match repl
                .answer_given(&sandbox_id, &mut attempts, "text", &answer)
                .await?
            {
                Ok(ended) => return Ok(ended),
                Err(feedback) => {
                    messages.push(Message {
                        role: Role::Assistant,
                        content: vec![Part::Text(response.text)],
                    });
                    messages.push(Message {
                        role: Role::User,
                        content: vec![Part::Text(feedback)],
                    });
                    // The check ran a command in the sandbox.
                    repl.commit_step(&sandbox_id, true, &messages[mark..])
                        .await?;
                    continue;
                }
            }
        }
        messages.push(Message {
            role: Role::Assistant,
            content: vec![Part::Text(response.text.clone())],
        });
        if std::mem::take(&mut blocks_unknown) {
            // The stop came while this reply's code ran, with no snapshot to go back to.
            messages.push(Message::user(format!(
                "The code blocks of your last reply: {}",
                durable::UNKNOWN_AFTER_RESTART
            )));
            repl.commit_step(&sandbox_id, true, &messages[mark..])
                .await?;
            continue;
        }
        let step = lock(&repl.journal).step();
        let mut feedback = Vec::new();
        let mut images = Vec::new();
        let mut final_answer = None;
        let count = blocks.len();
        for (i, code) in blocks.into_iter().enumerate() {
            let n = i + 1;
            repl.pool.count_tool_call();
            let call_id = format!("step{step}-block{n}");
            repl.emit(
                EventKind::ToolCall {
                    call_id: call_id.clone(),
                    name: REPL_TOOL.to_string(),
                    arguments: json!({ "code": code }),
                },
                false,
            )?;
            let started = Instant::now();
            let input = CodeInput {
                code: Code::new(code)?,
                language: None,
                context: Some(context_id.clone()),
                timeout_secs: Some(cell_timeout),
            };
            let cell =
                repl.service
                    .run_code_with(&repl.caller, &sandbox_id, input, Some(handler.clone()));
            let run = tokio::select! {
                () = repl.cancel.cancelled() => {
                    // The kernel's state stays; only the cell stops.
                    let _ = repl.service.interrupt_context(&repl.caller, &sandbox_id, &context_id).await;
                    return Ok(Ended::cancelled());
                }
                () = tokio::time::sleep(repl.pool.time_left()) => {
                    let _ = repl.service.interrupt_context(&repl.caller, &sandbox_id, &context_id).await;
                    return Ok(Ended::failed("timeout"));
                }
                r = cell => r?,
            };
            let outcome = tools::code_outcome(&run);
            let (text, truncated) = tools::truncate(&outcome.text, BLOCK_OUTPUT_CHARS);
            let full_text = truncated.then(|| repl.keep_text(&outcome.text)).flatten();
            let kept = run::keep_images(&lock(&repl.journal), &outcome.images);
            if vision {
                images.extend(outcome.images);
            }
            repl.emit(
                EventKind::ToolResult {
                    call_id,
                    name: REPL_TOOL.to_string(),
                    is_error: outcome.is_error,
                    text: text.clone(),
                    truncated,
                    full_text,
                    images: kept,
                    duration_ms: millis(started.elapsed()),
                },
                false,
            )?;
            feedback.push(format!("Output of code block {n}:\n{}", text.trim_end()));
            final_answer = lock(&repl.answer).take();
            if final_answer.is_some() {
                break;
            }
            if outcome.is_error && n < count {
                feedback.push(format!(
                    "Code blocks {} to {count} were not run: block {n} raised an error.",
                    n + 1
                ));
                break;
            }
        }
        let mut ended = None;
        if let Some(answer) = final_answer {
            match repl
                .answer_given(&sandbox_id, &mut attempts, "final", &answer)
                .await?
            {
                Ok(e) => ended = Some(e),
                Err(retry) => feedback.push(retry),
            }
        }
        // The images the code showed follow the text that names its blocks.
        let mut content = vec![Part::Text(feedback.join("\n\n"))];
        content.extend(images.into_iter().map(Part::Image));
        messages.push(Message {
            role: Role::User,
            content,
        });
        repl.commit_step(&sandbox_id, true, &messages[mark..])
            .await?;
        if let Some(ended) = ended {
            return Ok(ended);
        }
    }
    Ok(Ended::failed(Exhausted::Iterations.reason()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runnable_blocks_are_found_in_order_and_others_left_alone() {
        let text = "Let me look.\n```python\nprint(len(context))\n```\nThen:\n```repl\nx = 1\n\
                    ```\nOutput looks like:\n```\nnot code\n```\n```bash\nls\n```\n  ```py\n  \
                    y = 2\n    z = 3\n  ```\n```python\nunterminated = True\n";
        assert_eq!(
            code_blocks(text),
            ["print(len(context))", "x = 1", "y = 2\n  z = 3"]
        );
        assert!(code_blocks("no code at all").is_empty());
        assert!(
            code_blocks("```python\n\n```").is_empty(),
            "an empty block runs nothing"
        );
    }

    #[test]
    fn the_model_sees_the_start_of_a_large_context_only() {
        let context = format!("HEAD{}TAIL-MARKER", "x".repeat(1 << 20));
        let msg = first_message("How many x?", &context, false);
        assert!(msg.starts_with("How many x?"));
        assert!(msg.contains(&format!("a str of {} characters", context.len())));
        assert!(msg.contains("HEAD") && !msg.contains("TAIL-MARKER"));
        assert!(msg.len() < 2_000, "{}", msg.len());
        // A short input is shown whole.
        let msg = first_message("Sum it", "1 2 3", false);
        assert!(msg.contains("All of it:\n<<<\n1 2 3\n>>>"), "{msg}");
        // The task as the input: shown up to its limit, and said to be in `context`.
        let long_task = "t".repeat(TASK_SHOWN_CHARS + 10);
        let msg = first_message(&long_task, &long_task, true);
        assert!(msg.contains("all of it is in `context`"));
        assert!(msg.len() < TASK_SHOWN_CHARS + 2_000);
    }

    #[test]
    fn the_system_prompt_names_every_call_and_the_limits() {
        let p = system_prompt(12, 2, 1);
        for name in [
            "llm_query(",
            "llm_query_batched(",
            "rlm_query(",
            "FINAL(",
            "FINAL_VAR(",
            "```python",
            "SandcellBudgetError",
        ] {
            assert!(p.contains(name), "{name}");
        }
        assert!(p.contains("12 model sub-calls") && p.contains("1 level(s) below"));
    }

    #[test]
    fn a_text_answer_loses_a_final_wrapper() {
        assert_eq!(text_answer("  FINAL(42) "), "42");
        assert_eq!(text_answer("The answer is 42."), "The answer is 42.");
    }
}
