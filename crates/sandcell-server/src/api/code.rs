//! `/v1/sandboxes/{id}/code` and `/contexts`: code in language kernels whose state persists,
//! collected or streamed; contexts, interrupts, restarts and variables.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use sandcell_engine::{CodeEvent, CodeRun, CodeStream, OutputKind};
use sandcell_protocol::{CodeDone, CodeError, ContextInfo, Language, RunCodeRequest, Variables};
use sandcell_store::ContextRecord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::exec::json_event;
use super::extract::{ApiJson, ApiPath, check_sandbox_id, query_pairs};
use super::types::{Lang, rfc3339};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// Code to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeInput {
    /// The code.
    pub code: String,
    /// Its language (default `python`; ignored when `context` is given).
    pub language: Option<Lang>,
    /// A context made with `POST /contexts` (default: the language's own context).
    pub context: Option<String>,
    /// Seconds before the execution is interrupted (the kernel is killed if it does not
    /// yield).
    pub timeout_secs: Option<f64>,
}

impl CodeInput {
    fn request(&self) -> Result<RunCodeRequest, ApiError> {
        if self.code.len() > 16 << 20 {
            return Err(ApiError::invalid("code is over 16 MiB"));
        }
        let timeout_ms = self
            .timeout_secs
            .map(|t| {
                if t.is_finite() && t > 0.0 && t <= 7.0 * 86_400.0 {
                    Ok((t * 1000.0).ceil() as u64)
                } else {
                    Err(ApiError::invalid(format!(
                        "timeout_secs {t} must be positive and at most 7 days"
                    )))
                }
            })
            .transpose()?;
        Ok(RunCodeRequest {
            context: self.context.clone(),
            language: match (&self.context, self.language) {
                (Some(_), l) => l.map(Into::into),
                (None, l) => Some(l.unwrap_or(Lang::Python).into()),
            },
            code: self.code.clone(),
            timeout_ms,
        })
    }
}

/// A finished execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeResult {
    /// Everything printed to stdout.
    pub stdout: String,
    /// Everything printed to stderr.
    pub stderr: String,
    /// Rich outputs in order: displays and the result, each a MIME bundle.
    pub outputs: Vec<RichOutput>,
    /// The value of the last expression, as a MIME bundle (`text/plain`, `image/png`, …).
    #[schema(value_type = Option<Object>)]
    pub result: Option<serde_json::Value>,
    /// The error the code raised.
    pub error: Option<CodeErrorInfo>,
    /// How it ended.
    pub done: CodeDoneInfo,
}

/// One rich output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RichOutput {
    /// `display` or `result`.
    pub kind: String,
    /// MIME type → content (text, or base64 for images).
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

/// An error raised by code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeErrorInfo {
    /// Its type name (`ZeroDivisionError`).
    pub name: String,
    /// Its message.
    pub value: String,
    /// Traceback lines pointing at the user's code.
    pub traceback: Vec<String>,
}

impl From<&CodeError> for CodeErrorInfo {
    fn from(e: &CodeError) -> Self {
        Self {
            name: e.ename.clone(),
            value: e.evalue.clone(),
            traceback: e.traceback.clone(),
        }
    }
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeDoneInfo {
    /// The context it ran in.
    pub context: String,
    /// Its language.
    pub language: Lang,
    /// `ok`, `error`, `interrupted`, `timeout` or `crashed`.
    pub status: String,
    /// Executions of this kernel so far.
    pub execution_count: u64,
    /// Wall time in milliseconds.
    pub duration_ms: f64,
    /// Bash: the cell's exit status.
    pub exit_code: Option<i32>,
    /// The context's state is gone (its kernel died or was killed).
    pub state_lost: bool,
    /// This ran in a fresh kernel because the previous one had died.
    pub kernel_restarted: bool,
    /// Why the kernel died, when it did.
    pub crash: Option<String>,
    /// A note for people (kernel restarted, output cut, …).
    pub notice: Option<String>,
    /// Files created or changed in `/workspace/outputs`.
    pub artifacts: Vec<ArtifactInfo>,
    /// Output bytes dropped past the limit.
    pub stdout_dropped: u64,
    /// Output bytes dropped past the limit.
    pub stderr_dropped: u64,
}

/// A file the code wrote to the outputs folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactInfo {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// MIME type from its name.
    pub mime: String,
}

impl From<&CodeDone> for CodeDoneInfo {
    fn from(d: &CodeDone) -> Self {
        Self {
            context: d.context.clone(),
            language: d.language.into(),
            status: d.status.as_str().to_string(),
            execution_count: d.execution_count,
            duration_ms: d.duration_ms,
            exit_code: d.exit_code,
            state_lost: d.state_lost,
            kernel_restarted: d.kernel_restarted,
            crash: d.crash.clone(),
            notice: d.notice.clone(),
            artifacts: d
                .artifacts
                .iter()
                .map(|a| ArtifactInfo {
                    path: a.path.clone(),
                    size: a.size,
                    mime: a.mime.clone(),
                })
                .collect(),
            stdout_dropped: d.stdout_dropped,
            stderr_dropped: d.stderr_dropped,
        }
    }
}

fn bundle(data: &sandcell_protocol::MimeBundle) -> serde_json::Value {
    serde_json::to_value(data).unwrap_or_default()
}

impl From<&CodeRun> for CodeResult {
    fn from(r: &CodeRun) -> Self {
        Self {
            stdout: r.stdout.clone(),
            stderr: r.stderr.clone(),
            outputs: r
                .outputs
                .iter()
                .map(|o| RichOutput {
                    kind: match o.kind {
                        OutputKind::Display => "display",
                        OutputKind::Result => "result",
                    }
                    .to_string(),
                    data: bundle(&o.data),
                })
                .collect(),
            result: r.result().map(bundle),
            error: r.error.as_ref().map(CodeErrorInfo::from),
            done: CodeDoneInfo::from(&r.done),
        }
    }
}

/// Runs code in a kernel and returns when it ends. The context's state persists.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CodeInput,
    responses(
        (status = 200, description = "It ran (see `done.status`)", body = CodeResult),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn run(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(input): ApiJson<CodeInput>,
) -> ApiResult<Json<CodeResult>> {
    check_sandbox_id(&id)?;
    let req = input.request()?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let start = Instant::now();
    let run = sandbox.run_code(req).await?;
    s.metrics.code_latency.observe(start.elapsed());
    record_context_seen(&s, &caller.owner, &id, &run.done);
    Ok(Json(CodeResult::from(&run)))
}

/// Runs code and streams its events as they happen: `stdout`/`stderr` (`{"text"}`),
/// `display`/`result` (`{"data": bundle}`), `error` (`{"name","value","traceback"}`), then
/// `done` (like `done` of the collected result), or an `error` event with an error `code`.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/code/stream", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CodeInput,
    responses(
        (status = 200, description = "Server-sent events", content_type = "text/event-stream", body = super::exec::SseEvent),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn run_stream(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(input): ApiJson<CodeInput>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    check_sandbox_id(&id)?;
    let req = input.request()?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let stream = sandbox.run_code_stream(req).await?;
    let seen = move |done: &CodeDone| record_context_seen(&s, &caller.owner, &id, done);
    Ok(Sse::new(code_events(stream, seen)).keep_alive(KeepAlive::default()))
}

/// Records the context a run used, the first time this service sees it (a language's
/// default context is made by its first run, not by a request of its own).
fn record_context_seen(s: &AppState, owner: &str, sandbox_id: &str, done: &CodeDone) {
    let key = (sandbox_id.to_string(), done.context.clone());
    if s.seen_contexts.contains(&key) {
        return;
    }
    let record = context_record(owner, sandbox_id, &done.context, done.language, None);
    // The run's answer does not hang on its history: a failed write is logged and retried
    // by the next run.
    match s.store.insert_context_if_absent(&record) {
        Ok(_) => s.seen_contexts.insert(key),
        Err(e) => tracing::warn!(sandbox = sandbox_id, error = %e, "record a context"),
    }
}

fn context_record(
    owner: &str,
    sandbox_id: &str,
    id: &str,
    language: Language,
    cwd: Option<String>,
) -> ContextRecord {
    ContextRecord {
        sandbox_id: sandbox_id.to_string(),
        id: id.to_string(),
        owner: owner.to_string(),
        language: language.as_str().to_string(),
        cwd,
        created_at: sandcell_engine::fleet::now_ms(),
        ended_at: None,
        end_reason: None,
    }
}

fn code_events(
    stream: CodeStream,
    seen: impl Fn(&CodeDone) + Send + 'static,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(Some((stream, seen)), |state| async move {
        let (mut stream, seen) = state?;
        let event = match stream.next().await? {
            Ok(CodeEvent::Stdout { text }) => {
                json_event("stdout", &serde_json::json!({ "text": text }))
            }
            Ok(CodeEvent::Stderr { text }) => {
                json_event("stderr", &serde_json::json!({ "text": text }))
            }
            Ok(CodeEvent::Display { data }) => {
                json_event("display", &serde_json::json!({ "data": bundle(&data) }))
            }
            Ok(CodeEvent::Result { data }) => {
                json_event("result", &serde_json::json!({ "data": bundle(&data) }))
            }
            Ok(CodeEvent::Error(e)) => json_event("error", &CodeErrorInfo::from(&e)),
            Ok(CodeEvent::Done(d)) => {
                seen(&d);
                return Some((Ok(json_event("done", &CodeDoneInfo::from(&d))), None));
            }
            Err(e) => {
                let err = ApiError::from(e);
                return Some((Ok(json_event("error", err.body())), None));
            }
        };
        Some((Ok(event), Some((stream, seen))))
    })
}

/// `POST /contexts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// The language of its kernel.
    pub language: Lang,
    /// Working directory of its kernel (default `/workspace`).
    pub cwd: Option<String>,
    /// Extra environment of its kernel.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A context: one kernel and its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ContextView {
    /// Its id (a language's default context is named after it: `python`).
    pub id: String,
    /// Its language.
    pub language: Lang,
    /// The kernel's pid in the sandbox, while it runs.
    pub pid: Option<i32>,
    /// Executions so far in the current kernel.
    pub execution_count: u64,
    /// An execution is running.
    pub busy: bool,
    /// When it was made (RFC 3339), as recorded.
    pub created_at: Option<String>,
    /// When it ended (RFC 3339): only in the list of a sandbox that is no longer running.
    pub ended_at: Option<String>,
    /// Why it ended.
    pub end_reason: Option<String>,
}

impl From<&ContextInfo> for ContextView {
    fn from(c: &ContextInfo) -> Self {
        Self {
            id: c.id.clone(),
            language: c.language.into(),
            pid: c.pid,
            execution_count: c.execution_count,
            busy: c.busy,
            created_at: None,
            ended_at: None,
            end_reason: None,
        }
    }
}

impl ContextView {
    /// A recorded context of a sandbox that no longer runs.
    fn recorded(r: &ContextRecord) -> Self {
        let language = match r.language.as_str() {
            "node" => Lang::Node,
            "bash" => Lang::Bash,
            "r" => Lang::R,
            _ => Lang::Python,
        };
        Self {
            id: r.id.clone(),
            language,
            pid: None,
            execution_count: 0,
            busy: false,
            created_at: Some(rfc3339(r.created_at)),
            ended_at: r.ended_at.map(rfc3339),
            end_reason: r.end_reason.clone(),
        }
    }
}

/// Starts a new context (a kernel of its own).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateContext,
    responses(
        (status = 201, body = ContextView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_context(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<CreateContext>,
) -> ApiResult<(StatusCode, Json<ContextView>)> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let ctx = sandbox
        .create_context(req.language.into(), req.cwd.clone(), req.env)
        .await?;
    // Recorded before it is acknowledged; unrecorded, it is not kept.
    let record = context_record(&caller.owner, &id, &ctx.id, ctx.language, req.cwd);
    if let Err(e) = s.store.insert_context(&record) {
        let _ = sandbox.destroy_context(&ctx.id).await;
        return Err(e.into());
    }
    s.seen_contexts.insert((id, ctx.id.clone()));
    let mut view = ContextView::from(&ctx);
    view.created_at = Some(rfc3339(record.created_at));
    Ok((StatusCode::CREATED, Json(view)))
}

/// Lists the contexts.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = Vec<ContextView>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_contexts(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Vec<ContextView>>> {
    check_sandbox_id(&id)?;
    let record = s.fleet.get(&caller.owner, &id)?;
    let recorded = s.store.list_contexts(&id)?;
    if !record.state.is_active() {
        // What it ran, from the records.
        return Ok(Json(recorded.iter().map(ContextView::recorded).collect()));
    }
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let list = sandbox.list_contexts().await?;
    Ok(Json(
        list.iter()
            .map(|c| {
                let mut view = ContextView::from(c);
                view.created_at = recorded
                    .iter()
                    .find(|r| r.id == c.id && r.ended_at.is_none())
                    .map(|r| rfc3339(r.created_at));
                view
            })
            .collect(),
    ))
}

/// Stops a context's kernel and forgets it.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/contexts/{context}", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "Context id")),
    responses(
        (status = 204, description = "Gone"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_context(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    sandbox.destroy_context(&context).await?;
    s.store
        .end_context(&id, &context, sandcell_engine::fleet::now_ms(), "deleted")?;
    s.seen_contexts.remove(&(id, context));
    Ok(StatusCode::NO_CONTENT)
}

/// Interrupts the context's running execution; its state stays.
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts/{context}/interrupt", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "Context id")),
    responses(
        (status = 204, description = "Interrupted (or nothing was running)"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn interrupt(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    sandbox.interrupt(&context).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replaces the context's kernel with a fresh one (clean state).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/contexts/{context}/restart", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "Context id")),
    responses(
        (status = 200, body = ContextView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn restart(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(String, String)>,
) -> ApiResult<Json<ContextView>> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let ctx = sandbox.restart_context(&context).await?;
    Ok(Json(ContextView::from(&ctx)))
}

/// Values of a context's variables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VariablesView {
    /// Values that convert to JSON exactly.
    #[schema(value_type = Object)]
    pub values: BTreeMap<String, serde_json::Value>,
    /// The others: their type and repr.
    #[schema(value_type = Object)]
    pub unrepresentable: BTreeMap<String, serde_json::Value>,
    /// Requested names that do not exist.
    pub missing: Vec<String>,
}

impl From<Variables> for VariablesView {
    fn from(v: Variables) -> Self {
        Self {
            values: v.values,
            unrepresentable: v
                .unrepresentable
                .into_iter()
                .map(|(k, u)| (k, serde_json::json!({"type": u.type_name, "repr": u.repr})))
                .collect(),
            missing: v.missing,
        }
    }
}

/// `PUT /variables`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetVariables {
    /// Name → JSON value.
    #[schema(value_type = Object)]
    pub values: BTreeMap<String, serde_json::Value>,
}

/// Variable names changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VariableNames {
    /// The names.
    pub names: Vec<String>,
}

fn names_param(raw: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    let mut names: Option<Vec<String>> = None;
    for (k, v) in query_pairs(raw)? {
        if k != "names" {
            return Err(ApiError::invalid(format!(
                "unknown query parameter '{k}' (names)"
            )));
        }
        names.get_or_insert_with(Vec::new).extend(
            v.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from),
        );
    }
    Ok(names)
}

/// Reads variables (all of them without `names`), as JSON where they convert exactly.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/contexts/{context}/variables", tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("context" = String, Path, description = "Context id (`python` for the default Python context)"),
        ("names" = Option<String>, Query, description = "Comma-separated names (default: all)"),
    ),
    responses(
        (status = 200, body = VariablesView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_variables(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(String, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<VariablesView>> {
    check_sandbox_id(&id)?;
    let names = names_param(raw.as_deref())?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let vars = sandbox.get_variables(&context, names).await?;
    Ok(Json(vars.into()))
}

/// Sets variables from JSON values.
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/contexts/{context}/variables", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path, description = "Context id")),
    request_body = SetVariables,
    responses(
        (status = 200, body = VariableNames),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_variables(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(String, String)>,
    ApiJson(req): ApiJson<SetVariables>,
) -> ApiResult<Json<VariableNames>> {
    check_sandbox_id(&id)?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let names = sandbox.set_variables(&context, req.values).await?;
    Ok(Json(VariableNames { names }))
}

/// Deletes variables (all of them without `names`).
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/contexts/{context}/variables", tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("context" = String, Path, description = "Context id"),
        ("names" = Option<String>, Query, description = "Comma-separated names (default: all)"),
    ),
    responses(
        (status = 200, body = VariableNames),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn clear_variables(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, context)): ApiPath<(String, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<VariableNames>> {
    check_sandbox_id(&id)?;
    let names = names_param(raw.as_deref())?;
    let sandbox = s.fleet.sandbox(&caller.owner, &id)?;
    let names = sandbox.clear_variables(&context, names).await?;
    Ok(Json(VariableNames { names }))
}
