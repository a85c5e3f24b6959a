//! The MCP tools: sessions (sandboxes), code in live kernels, terminal commands, variables,
//! files in and out, pause/resume, snapshots and forks, memories (add, or infer facts with
//! the server's model; search, list, delete, infer status), and agent runs (start, status, cancel, fork, resume). Each tool is one or a few typed
//! operations of a [`Sandcell`]; every failure comes back as a tool error (`isError`) with the
//! service's code and message.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_router};
use sandcell_agent::Runner;
use sandcell_api::code::{CodeInput, ContextView, SetVariables};
use sandcell_api::exec::ExecInput;
use sandcell_api::memories::{
    AddMemory, Category, InferMemories, ListMemories, MemoryQuery, MemoryText, SearchMemories,
};
use sandcell_api::runs::{BudgetsInput, ForkRun, StartRun, Validate};
use sandcell_api::sandboxes::{CreateSandbox, Lang, LimitsInput};
use sandcell_api::snapshots::{CreateSnapshot, ForkSnapshot as ForkRequest, VolumeCarry};
use sandcell_api::templates::StartBuild;
use sandcell_api::transfer::{CreateExport, ImportRequest};
use sandcell_api::volumes::MountInput;
use sandcell_api::{Code, SandboxId, Seconds, Tags, Timeout};
use sandcell_service::{Caller, Service};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::{self, Dependencies, Dependency, ExportFile, ImportFile};
use crate::output;
use crate::sandcell::{CallError, InProcess, Sandcell};

/// The label every session made through MCP carries.
pub const SESSION_LABEL: &str = "mcp";

/// How the tools of one server reach Sandcell.
#[derive(Clone)]
enum Reach {
    /// The same way for every call (stdio: the embedded service as its admin, or a daemon).
    Fixed(Arc<dyn Sandcell>),
    /// The service in this process (and the agent runs over it), as the caller each HTTP
    /// request authenticated as (the server's `/mcp`).
    AsRequestCaller(Arc<Service>, Arc<Runner>),
}

/// The MCP server: tools over a [`Sandcell`].
#[derive(Clone)]
pub struct SandcellMcp {
    reach: Reach,
    tool_router: ToolRouter<Self>,
    /// The session tools use when a call names none: made on first need, one per
    /// connection (per MCP session over HTTP).
    default_session: Arc<tokio::sync::Mutex<Option<SandboxId>>>,
}

impl std::fmt::Debug for SandcellMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandcellMcp").finish_non_exhaustive()
    }
}

/// A kernel language.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// Python 3 (IPython-like: the last expression's value is the result).
    Python,
    /// Node.js (a persistent vm context; promises are awaited).
    Node,
    /// Bash (a persistent shell: variables, functions and cwd carry over).
    Bash,
    /// R.
    R,
}

impl Runtime {
    fn name(self) -> &'static str {
        match self {
            Runtime::Python => "python",
            Runtime::Node => "node",
            Runtime::Bash => "bash",
            Runtime::R => "r",
        }
    }

    fn lang(self) -> Lang {
        match self {
            Runtime::Python => Lang::Python,
            Runtime::Node => Lang::Node,
            Runtime::Bash => Lang::Bash,
            Runtime::R => Lang::R,
        }
    }
}

/// `create_session`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The kernel started with the session (default python). Other languages start on first use.
    pub runtime: Option<Runtime>,
    /// Memory limit in MiB for the whole session (default 512).
    pub memory_mb: Option<u64>,
    /// CPU limit in CPUs, e.g. 1.5 (default: not limited).
    pub cpus: Option<f64>,
    /// What the session's network reaches (default loopback): `off` (no sockets), `loopback`
    /// (programs in the session talk over 127.0.0.1 only), `full` (any public host through
    /// the egress proxy) or `allow:HOST[,HOST…]` (only these: `pypi.org`, `*.example.com`,
    /// `host:443`). Programs reach allowed hosts through the HTTP_PROXY / ALL_PROXY set in
    /// the session.
    pub network: Option<String>,
    /// Seconds the session may live (default: the server's setting, 2 hours).
    pub timeout_secs: Option<u64>,
    /// Seconds without use before the session is reclaimed (default: the server's, 30 minutes).
    pub idle_timeout_secs: Option<u64>,
    /// Environment variables for everything run in the session.
    pub env: Option<BTreeMap<String, String>>,
    /// Start from this snapshot (made by `snapshot_session`) instead of empty.
    pub snapshot_id: Option<String>,
    /// An image of the server's store as the session's system instead of the server's own
    /// (`debian:bookworm`, or an image the operator imported: `sandcell image ls`); its
    /// programs and interpreters are the image's, and `runtime` starts only when named.
    pub image: Option<String>,
    /// Backend: `process` (default) or `gvisor` (stronger isolation, full-memory snapshots).
    pub backend: Option<String>,
    /// On the process backend, where the server has a working CRIU: snapshots keep every
    /// process with its memory (the session then runs without Landlock).
    pub checkpointable: Option<bool>,
    /// Packages the session needs, by their install name (`pandas`, `scikit-learn` for
    /// python; `lodash` for node; `ggplot2` for r): a list of names, or a map of name to
    /// version (`{"pandas": "2.2.3", "matplotlib": ""}`; `""` for any version, else exactly
    /// that one). Each is checked in the session's runtime; those missing are installed from
    /// the package registries the server allows (pip, npm, R; cached for later sessions).
    /// When one cannot be installed the session is not made and the error names it.
    pub dependencies: Option<Dependencies>,
    /// Folders mounted into the session: host folders the server allows
    /// (`mounts.allowed_paths`) and named volumes, which outlive the session (made on first
    /// use).
    pub mounts: Option<Vec<SessionMount>>,
}

/// One folder mounted into a session.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionMount {
    /// A host folder (absolute) the server allows; give this or `volume`.
    pub host_path: Option<String>,
    /// A named volume of yours; give this or `host_path`.
    pub volume: Option<String>,
    /// Where it appears: `/workspace`, or a folder below `/workspace`, `/home/sandbox` or
    /// `/tmp`.
    pub path: String,
    /// `ro` (host folders' default), `rw` (volumes' default) or `overlay` (read-only below,
    /// the session's writes kept apart).
    pub mode: Option<String>,
}

impl SessionMount {
    fn input(self) -> Result<MountInput, CallError> {
        let mode = self
            .mode
            .map(|m| serde_json::from_value(serde_json::Value::String(m.clone())))
            .transpose()
            .map_err(|_| {
                CallError::new(
                    "invalid_argument",
                    "mount mode must be one of ro, rw, overlay".to_string(),
                )
            })?;
        Ok(MountInput {
            host_path: self.host_path,
            volume: self.volume,
            path: self.path,
            mode,
        })
    }
}

/// A session to act on.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    /// The session id returned by `create_session` (`sb-…`).
    pub session_id: String,
}

/// `git_clone`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitCloneArgs {
    /// The session id.
    pub session_id: String,
    /// The repository's https:// (or http://) URL.
    pub url: String,
    /// Where in the session (default /workspace/<repository name>).
    pub path: Option<String>,
    /// The branch or tag to check out (default: the remote's default branch).
    pub branch: Option<String>,
    /// Only this many commits of history.
    pub depth: Option<u32>,
}

/// `execute_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteCode {
    /// The session id (default: this connection's default session, made on first use).
    pub session_id: Option<String>,
    /// The code. State (variables, imports, functions) persists between calls, like notebook cells.
    pub code: String,
    /// Its language (default python).
    pub language: Option<Runtime>,
    /// Seconds before the execution is interrupted (default: the server's limit).
    pub timeout_secs: Option<f64>,
}

/// `execute_python`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutePython {
    /// Python code; state persists between calls in the same session.
    pub code: String,
    /// The session id (default: this connection's default session, made on first use; its
    /// id is in the answer).
    pub session_id: Option<String>,
    /// Seconds before the execution is interrupted.
    pub timeout_secs: Option<f64>,
}

/// `execute_terminal`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteTerminal {
    /// The session id (default: this connection's default session, made on first use).
    pub session_id: Option<String>,
    /// A shell command line, run by `bash -c` (each call is a fresh shell; use `execute_code`
    /// with language bash for a persistent one).
    pub command: String,
    /// Working directory (default /workspace).
    pub cwd: Option<String>,
    /// Extra environment variables.
    pub env: Option<BTreeMap<String, String>>,
    /// Seconds before the command is killed.
    pub timeout_secs: Option<f64>,
}

/// `get_repl_context`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetContext {
    /// The session id.
    pub session_id: String,
    /// Only these variables (default: all).
    pub names: Option<Vec<String>>,
    /// Whose kernel (default python).
    pub language: Option<Runtime>,
}

/// `set_repl_context`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetContext {
    /// The session id.
    pub session_id: String,
    /// Variable name -> JSON value, set in the kernel.
    pub variables: BTreeMap<String, Value>,
    /// Whose kernel (default python).
    pub language: Option<Runtime>,
}

/// `clear_repl_context`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearContext {
    /// The session id.
    pub session_id: String,
    /// Only these variables (default: all user variables).
    pub names: Option<Vec<String>>,
    /// Whose kernel (default python).
    pub language: Option<Runtime>,
}

/// `import_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportFiles {
    /// The session id.
    pub session_id: String,
    /// The files, each in one of three shapes: `path` with exactly one of `text`, `base64`,
    /// `host_path`, `export_id`; `{source, destination}` (a host path inside the import
    /// allow-list); or `{session_id, path, destination}` (a file or folder of another session:
    /// the copy its export_files kept, else as it is now).
    #[serde(deserialize_with = "args::import_files")]
    pub files: Vec<ImportFile>,
}

/// `export_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportFiles {
    /// The session id.
    pub session_id: String,
    /// Files or folders to export (a folder comes as a tar archive).
    pub paths: Option<Vec<String>>,
    /// The same as `paths`, as entries `{"source": "data.csv"}`; either or both may be given.
    pub files: Option<Vec<ExportFile>>,
    /// Also return each file's contents in the answer (text, or base64 for binary; files up
    /// to 1 MiB). Default: only when no download link can be given.
    pub include_content: Option<bool>,
}

/// `snapshot_session`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSession {
    /// The session id.
    pub session_id: String,
    /// A name for the snapshot.
    pub name: Option<String>,
    /// What it holds.
    pub description: Option<String>,
    /// Tags: name -> value.
    pub tags: Option<BTreeMap<String, String>>,
    /// Keep a copy of each named volume the session mounts (a session made from the
    /// snapshot then gets new volumes filled from the copies); default false: they are
    /// mounted again as they are then.
    pub copy_volumes: Option<bool>,
}

/// `fork_snapshot`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSnapshot {
    /// The snapshot id (`sn-…`).
    pub snapshot_id: String,
    /// How many independent sessions to make from it (default 1, at most 16).
    pub count: Option<u32>,
}

/// `list_snapshots`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSnapshots {
    /// Only this session's snapshots.
    pub session_id: Option<String>,
}

/// `agent_run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentRun {
    /// What the agent should do, in plain words.
    pub task: String,
    /// `provider/model`, e.g. `openai/gpt-4o-mini` or `anthropic/claude-sonnet-4-5` (default:
    /// the server's agent.model).
    pub model: Option<String>,
    /// Run in this existing session: the agent starts from its kernels' state (default: a new
    /// python session of its own).
    pub session_id: Option<String>,
    /// The same as `session_id` (the name the REST API uses).
    pub sandbox_id: Option<String>,
    /// Model calls that may use tools (default 10, at most 50).
    pub max_iterations: Option<u32>,
    /// Input plus output tokens the run may use (default: no limit).
    pub token_budget: Option<u64>,
    /// US dollars the run may spend (default 2, at most 10).
    pub cost_limit_usd: Option<f64>,
    /// Seconds the run may take in all (default 300, at most 600).
    pub timeout_secs: Option<f64>,
    /// A command that checks the final answer in the session (e.g. `pytest -q`): exit 0
    /// ends the run `validated`; otherwise the agent reads the failure and tries again.
    pub validate_command: Option<String>,
    /// Answers the agent may give before a failing check ends the run (default 3, at most 10).
    pub validate_max_attempts: Option<u32>,
    /// Keep the snapshot of every step when the run ends (default: only the last step's),
    /// so that agent_fork can go on from any of its steps later.
    pub keep_snapshots: Option<bool>,
}

/// `agent_fork`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentFork {
    /// The run to fork (`run-…`); it is not changed.
    pub run_id: String,
    /// Its step to go on from (1 for the first; `agent_status` shows the steps): the fork
    /// keeps the conversation up to the end of that step, and its session is restored from
    /// that step's snapshot.
    pub from_step: u32,
    /// A new instruction for the model after that history (default: it goes on with the
    /// original task).
    pub task: Option<String>,
    /// Another `provider/model` for the fork (default: the original's).
    pub model: Option<String>,
}

/// `memory_add`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryAdd {
    /// What to remember, in plain words (one fact per memory: search finds memories by
    /// their words). At most 64 KiB.
    pub text: String,
    /// A category to filter by later: lowercase letters, digits, `-`, `_`, `.` (default
    /// `general`).
    pub category: Option<String>,
    /// Name -> value pairs kept and shown with it (at most 64).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Remember it for this session (`sb-…`): searches of that session find it, and sessions
    /// made from its later snapshots start with it. Default: your own memory, not tied to
    /// any session.
    pub session_id: Option<String>,
    /// Instead of keeping `text` as it is, have the server's model extract the facts in it
    /// (in the background), each kept as a memory; returns a job_id to follow with
    /// memory_infer_status.
    pub infer: Option<bool>,
}

/// `memory_infer_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryInferStatus {
    /// The job's id (`inf-…`), as memory_add with infer gave it.
    pub job_id: String,
}

/// `memory_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySearch {
    /// The words to look for; memories matching more of them, and rarer ones, rank first.
    /// Punctuation and search operators are taken as plain words.
    pub query: String,
    /// At most this many results (1 to 100, default 10).
    pub limit: Option<u32>,
    /// Only memories of this category.
    pub category: Option<String>,
    /// Search this session's memories (default: your own).
    pub session_id: Option<String>,
}

/// `memory_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryListArgs {
    /// List this session's memories (default: your own).
    pub session_id: Option<String>,
    /// Only memories of this category.
    pub category: Option<String>,
    /// At most this many (1 to 1000, default 100).
    pub limit: Option<u32>,
    /// Where to go on: the `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// `memory_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryDelete {
    /// The memory's id (`mem-…`), as memory_add, memory_search or memory_list gave it.
    pub memory_id: String,
}

/// A run to act on.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRef {
    /// The run id returned by `agent_run` (`run-…`).
    pub run_id: String,
}

/// `template_build`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateBuild {
    /// The template's name, `name[:tag]` (lower-case letters, digits, `.`, `_`, `-`).
    pub name: String,
    /// The Dockerfile: FROM (debian:<suite> or an image of the server), RUN, COPY, ADD, ENV,
    /// ARG, WORKDIR, USER, LABEL, SHELL, CMD, ENTRYPOINT, `RUN --mount=type=cache`.
    pub dockerfile: String,
    /// The build context's files, path (relative) -> text content, for COPY and ADD.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Build arguments (`ARG`).
    #[serde(default)]
    pub build_args: BTreeMap<String, String>,
    /// Run every step, even cached ones.
    #[serde(default)]
    pub no_cache: bool,
    /// Wait for the build to end (default true); false: answer at once with its build_id.
    pub wait: Option<bool>,
}

/// A build to look at.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildRef {
    /// The build id returned by `template_build` (`bld-…`).
    pub build_id: String,
}

/// Log events a build's answer shows.
const BUILD_EVENTS: usize = 40;

/// The context files as a tar archive, base64-encoded.
fn context_archive(files: &BTreeMap<String, String>) -> Result<Option<String>, CallError> {
    use base64::Engine as _;
    if files.is_empty() {
        return Ok(None);
    }
    let mut tar = tar::Builder::new(Vec::new());
    for (path, text) in files {
        let clean = path.trim_start_matches("./");
        if clean.is_empty() || clean.starts_with('/') || clean.split('/').any(|c| c == "..") {
            return Err(CallError::new(
                "invalid_argument",
                format!("files: '{path}' must be a relative path inside the context"),
            ));
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, clean, text.as_bytes())
            .map_err(|e| CallError::new("invalid_argument", format!("files: {path}: {e}")))?;
    }
    let bytes = tar
        .into_inner()
        .map_err(|e| CallError::new("internal", format!("packing the files: {e}")))?;
    Ok(Some(
        base64::engine::general_purpose::STANDARD.encode(bytes),
    ))
}

/// Events of a run `agent_status` summarizes.
const STATUS_EVENTS: u32 = 8;

type ToolResult = Result<CallToolResult, ErrorData>;

/// A tool's answer, or the tool error that ends it early.
type Outcome = Result<CallToolResult, CallToolResult>;

/// Either way, what the model reads.
fn answer(outcome: Outcome) -> ToolResult {
    Ok(outcome.unwrap_or_else(|failure| failure))
}

/// A failed operation, as the model reads it: the service's code and message.
impl From<CallError> for CallToolResult {
    fn from(e: CallError) -> Self {
        tool_error(&e.to_string())
    }
}

/// The labels every session made through MCP carries.
fn session_labels() -> Tags {
    // A fixed label within the tag rule: refusing it would be a bug here.
    Tags::try_from([(SESSION_LABEL, "true")]).expect("the session label obeys the tag rule")
}

/// A session id from a tool's arguments, checked.
fn session_id(id: &str) -> Result<SandboxId, CallError> {
    Ok(SandboxId::parse(id)?)
}

/// An optional session id from a tool's arguments, checked.
fn optional_session(id: Option<&str>) -> Result<Option<SandboxId>, CallError> {
    id.map(session_id).transpose()
}

/// An optional memory category from a tool's arguments, checked.
fn optional_category(category: Option<String>) -> Result<Option<Category>, CallError> {
    Ok(category.map(Category::new).transpose()?)
}

#[tool_router]
impl SandcellMcp {
    /// A server whose tools call `sandcell`.
    pub fn new(sandcell: Arc<dyn Sandcell>) -> Self {
        Self::with(Reach::Fixed(sandcell))
    }

    /// A server whose tools call `service` (and the agent runs of `runner`) in this process,
    /// each as the caller its HTTP request was authenticated as (the [`Caller`] in the
    /// request's extensions).
    pub fn as_request_caller(service: Arc<Service>, runner: Arc<Runner>) -> Self {
        Self::with(Reach::AsRequestCaller(service, runner))
    }

    fn with(reach: Reach) -> Self {
        Self {
            reach,
            tool_router: Self::tool_router(),
            default_session: Arc::default(),
        }
    }

    /// Every tool, as `tools/list` shows it.
    pub fn tools() -> Vec<rmcp::model::Tool> {
        Self::tool_router().list_all()
    }

    #[tool(
        description = "Create a sandboxed session: an isolated Linux sandbox with a live kernel whose state persists across calls. Returns its session_id. Sessions end after their idle timeout (30 min by default) or lifetime, or with destroy_session."
    )]
    async fn create_session(
        &self,
        Parameters(p): Parameters<CreateSession>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(self.make_session(p, &ctx).await)
    }

    #[tool(
        description = "Run code in a session's live kernel (python, node, bash or r). Variables, imports and definitions persist between calls. Returns stdout, stderr, the value of the last expression, rich outputs (plots come back as images) and errors with tracebacks."
    )]
    async fn execute_code(
        &self,
        Parameters(p): Parameters<ExecuteCode>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let lang = p.language.unwrap_or(Runtime::Python);
        answer(
            self.code_in_session(&ctx, p.session_id, lang, p.code, p.timeout_secs)
                .await,
        )
    }

    #[tool(
        description = "Run Python code in a session (created when session_id is omitted; its id is returned). State persists between calls: define a variable in one call and use it in the next. matplotlib figures come back as images."
    )]
    async fn execute_python(
        &self,
        Parameters(p): Parameters<ExecutePython>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            self.code_in_session(&ctx, p.session_id, Runtime::Python, p.code, p.timeout_secs)
                .await,
        )
    }

    #[tool(
        description = "Run a shell command in a session (bash -c, working directory /workspace). Returns stdout, stderr, the exit code and how it ended (exited, killed by a signal, timed out, out of memory)."
    )]
    async fn execute_terminal(
        &self,
        Parameters(p): Parameters<ExecuteTerminal>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(self.command_in_session(p, &ctx).await)
    }

    #[tool(
        description = "Read variables of a session's kernel as JSON (values that are not JSON come as their type and repr)."
    )]
    async fn get_repl_context(
        &self,
        Parameters(p): Parameters<GetContext>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let context = context_of(&*api, &session_id(&p.session_id)?, p.language).await?;
                let names = p.names.filter(|n| !n.is_empty());
                let view = api
                    .get_variables(&session_id(&p.session_id)?, &context, names)
                    .await?;
                Ok(output::json_result(&view))
            }
            .await,
        )
    }

    #[tool(description = "Set variables in a session's kernel from JSON values.")]
    async fn set_repl_context(
        &self,
        Parameters(p): Parameters<SetContext>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let context = context_of(&*api, &session_id(&p.session_id)?, p.language).await?;
                let req = SetVariables {
                    values: p.variables,
                };
                let set = api
                    .set_variables(&session_id(&p.session_id)?, &context, req)
                    .await?;
                Ok(output::json_result(&set))
            }
            .await,
        )
    }

    #[tool(
        description = "Delete variables from a session's kernel (all user variables by default)."
    )]
    async fn clear_repl_context(
        &self,
        Parameters(p): Parameters<ClearContext>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let context = context_of(&*api, &session_id(&p.session_id)?, p.language).await?;
                let names = p.names.filter(|n| !n.is_empty());
                let cleared = api
                    .clear_variables(&session_id(&p.session_id)?, &context, names)
                    .await?;
                Ok(output::json_result(&cleared))
            }
            .await,
        )
    }

    #[tool(
        description = "List your active sessions (also ones made in earlier connections: reconnect to one by passing its session_id)."
    )]
    async fn list_sessions(&self, ctx: RequestContext<RoleServer>) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                Ok(output::session_list(&api.list_sandboxes(200).await?))
            }
            .await,
        )
    }

    #[tool(
        description = "End a session: its processes stop and its files are gone (exports stay)."
    )]
    async fn destroy_session(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                api.delete_sandbox(&session_id(&p.session_id)?).await?;
                Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                    "session {} destroyed",
                    p.session_id
                ))]))
            }
            .await,
        )
    }

    #[tool(
        description = "Stop a session: the same as destroy_session (the name some agent setups use)."
    )]
    async fn stop_session(
        &self,
        params: Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        self.destroy_session(params, ctx).await
    }

    #[tool(
        description = "Put files into a session. Each file gives a path and one source: text, base64, host_path (a path on the server's host inside its import allow-list; folders too) or export_id (something export_files exported from another session). Also accepted: {source, destination} for a host path, and {session_id, path, destination} for a file of another session."
    )]
    async fn import_files(
        &self,
        Parameters(p): Parameters<ImportFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(self.put_files(p, &ctx).await)
    }

    #[tool(
        description = "Export files or folders from a session: the server keeps a copy after the session ends. Returns each export's id (usable by import_files in another session) and a download link when the server has a URL; with include_content, the contents too."
    )]
    async fn export_files(
        &self,
        Parameters(p): Parameters<ExportFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(self.take_files(p, &ctx).await)
    }

    #[tool(
        description = "Pause a session: every process is frozen (no CPU), memory and state are kept, and its idle clock stops. Resume it with resume_session."
    )]
    async fn pause_session(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                Ok(output::json_result(
                    &api.pause_sandbox(&session_id(&p.session_id)?).await?,
                ))
            }
            .await,
        )
    }

    #[tool(description = "Resume a paused session where it stopped.")]
    async fn resume_session(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                Ok(output::json_result(
                    &api.resume_sandbox(&session_id(&p.session_id)?).await?,
                ))
            }
            .await,
        )
    }

    #[tool(
        description = "Clone a git repository (https) into a session. The clone runs on the server, allowed to reach only the repository's host, and is copied in with its .git (the session's own network policy is unchanged). Returns the path, the commit and the branch."
    )]
    async fn git_clone(
        &self,
        Parameters(p): Parameters<GitCloneArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let req = sandcell_api::git::GitClone {
                    url: p.url,
                    path: p.path,
                    branch: p.branch,
                    depth: p.depth,
                    username: None,
                    password: None,
                };
                let cloned = api.git_clone(&session_id(&p.session_id)?, req).await?;
                Ok(output::json_result(&cloned))
            }
            .await,
        )
    }

    #[tool(
        description = "Take a durable snapshot of a session (its files and its kernels' variables; on the gvisor backend every process with its memory). Returns the snapshot id and its fidelity."
    )]
    async fn snapshot_session(
        &self,
        Parameters(p): Parameters<SnapshotSession>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let req = CreateSnapshot {
                    name: p.name,
                    description: p.description.unwrap_or_default(),
                    tags: Tags::new(p.tags.unwrap_or_default()).map_err(CallError::from)?,
                    volumes: if p.copy_volumes.unwrap_or(false) {
                        VolumeCarry::Copy
                    } else {
                        VolumeCarry::Mount
                    },
                };
                let snapshot = api
                    .create_snapshot(&session_id(&p.session_id)?, req)
                    .await?;
                Ok(output::json_result(&snapshot))
            }
            .await,
        )
    }

    #[tool(
        description = "Make new independent sessions from a snapshot (count of them, default 1). Each fork gets its own id and random state; changes in one are not seen by the others. Returns their session ids and what was restored."
    )]
    async fn fork_snapshot(
        &self,
        Parameters(p): Parameters<ForkSnapshot>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let req = ForkRequest {
                    count: Some(p.count.unwrap_or(1)),
                    labels: session_labels(),
                    ..ForkRequest::default()
                };
                let forks = api.fork_snapshot(&p.snapshot_id, req).await?;
                Ok(output::json_result(&forks))
            }
            .await,
        )
    }

    #[tool(description = "List your snapshots (of one session when session_id is given).")]
    async fn list_snapshots(
        &self,
        Parameters(p): Parameters<ListSnapshots>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let list = api
                    .list_snapshots(
                        p.session_id
                            .as_deref()
                            .map(session_id)
                            .transpose()?
                            .as_ref(),
                    )
                    .await?;
                Ok(output::json_result(&list))
            }
            .await,
        )
    }

    #[tool(
        description = "Start an agent run: a model that writes and runs code in a sandboxed session (live kernels) until it can answer the task, within budgets. Returns at once with the run_id and status running; follow it with agent_status, stop it with agent_cancel."
    )]
    async fn agent_run(
        &self,
        Parameters(p): Parameters<AgentRun>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(self.start_agent(p, &ctx).await)
    }

    #[tool(
        description = "An agent run's status (running, succeeded, failed, cancelled), why it ended, its answer, what it used (tokens, cost, steps), and one line for each of its last events."
    )]
    async fn agent_status(
        &self,
        Parameters(p): Parameters<RunRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let info = api.get_run(&p.run_id).await?;
                let events = api.last_run_events(&p.run_id, STATUS_EVENTS).await?;
                Ok(output::run_status(&info, &events))
            }
            .await,
        )
    }

    #[tool(
        description = "Cancel an agent run: its model call stops and its running code is interrupted (the session's kernel state is kept). Returns the run as it ended."
    )]
    async fn agent_cancel(
        &self,
        Parameters(p): Parameters<RunRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let info = api.cancel_run(&p.run_id).await?;
                Ok(output::run_status(&info, &[]))
            }
            .await,
        )
    }

    #[tool(
        description = "Fork an agent run from one of its steps: a new run starts with the original's conversation up to the end of from_step and a session restored from that step's snapshot, then goes on (with task as a new instruction when given, with another model when given). The original run is not changed. Returns at once with the new run_id and status running; follow it with agent_status. Forking from any step needs the original started with keep_snapshots: an ended run otherwise keeps only its last step's snapshot."
    )]
    async fn agent_fork(
        &self,
        Parameters(p): Parameters<AgentFork>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let req = ForkRun {
                    from_step: p.from_step,
                    task: p.task,
                    model: p.model,
                    ..ForkRun::default()
                };
                Ok(output::run_started(&api.fork_run(&p.run_id, req).await?))
            }
            .await,
        )
    }

    #[tool(
        description = "Resume an agent run that a stopped server left unfinished (agent_status shows it failed with reason interrupted): it goes on from its last completed step, in a session restored from that step's snapshot, with what it had used still counted against its budgets. Returns at once with status running; follow it with agent_status. A run that ended any other way cannot be resumed: fork it with agent_fork instead."
    )]
    async fn agent_resume(
        &self,
        Parameters(p): Parameters<RunRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                Ok(output::run_started(&api.resume_run(&p.run_id).await?))
            }
            .await,
        )
    }

    #[tool(
        description = "Build a template (a reusable environment for sessions) from a Dockerfile: each step runs in a build sandbox with the network limited to the package registries, layers are cached, and the kernels that start in the result are listed. files gives the build context for COPY. Waits for the end unless wait is false (then follow with template_build_status). Then create_session with image: NAME starts sessions on it. Needs an admin key."
    )]
    async fn template_build(
        &self,
        Parameters(p): Parameters<TemplateBuild>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let req = StartBuild {
                    name: p.name,
                    dockerfile: p.dockerfile,
                    context: context_archive(&p.files)?,
                    build_args: p.build_args,
                    no_cache: p.no_cache,
                    wait: p.wait.unwrap_or(true),
                    ..StartBuild::default()
                };
                let info = api.start_build(req).await?;
                let events = api.last_build_events(&info.id, BUILD_EVENTS).await?;
                Ok(output::build_status(&info, &events))
            }
            .await,
        )
    }

    #[tool(
        description = "How a template build goes: its state (queued, running, succeeded, failed, cancelled), the step running, each finished step (cached or not, exit code, seconds), the last lines of its log, and the kernels of the template it made."
    )]
    async fn template_build_status(
        &self,
        Parameters(p): Parameters<BuildRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let info = api.get_build(&p.build_id).await?;
                let events = api.last_build_events(&p.build_id, BUILD_EVENTS).await?;
                Ok(output::build_status(&info, &events))
            }
            .await,
        )
    }

    #[tool(
        description = "List the templates sessions can start on (create_session with image: NAME): name, size, the kernels that start in it, the sessions running on it."
    )]
    async fn template_list(&self, ctx: RequestContext<RoleServer>) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                Ok(output::json_result(&api.list_templates().await?))
            }
            .await,
        )
    }

    #[tool(
        description = "Remember something for later: a fact, a preference, a finding, a decision. With session_id it is that session's memory (sessions later made from its snapshots start with it); without, it is your own memory, not tied to any session and kept after sessions end. Returns its memory_id. Find it again with memory_search. With infer: true the server's model extracts the facts in text in the background, each kept as a memory: it returns a job_id to follow with memory_infer_status."
    )]
    async fn memory_add(
        &self,
        Parameters(p): Parameters<MemoryAdd>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let sandbox = optional_session(p.session_id.as_deref())?;
                let req = AddMemory {
                    text: MemoryText::new(p.text).map_err(CallError::from)?,
                    category: optional_category(p.category)?,
                    metadata: Tags::new(p.metadata.unwrap_or_default()).map_err(CallError::from)?,
                };
                if p.infer == Some(true) {
                    return Ok(output::infer_job(
                        &api.infer_memories(sandbox.as_ref(), InferMemories::from(req))
                            .await?,
                    ));
                }
                Ok(output::memory_added(
                    &api.add_memory(sandbox.as_ref(), req).await?,
                ))
            }
            .await,
        )
    }

    #[tool(
        description = "Search memories, most relevant first, each with its rank and score (higher is better; scores compare only within one search). By their words, and also by meaning when the server has an embedding model (ranking: hybrid; matched_by says how each was found); a warning says when it could only rank by words. Searches one session's memories (session_id) or, without session_id, your own; not both at once."
    )]
    async fn memory_search(
        &self,
        Parameters(p): Parameters<MemorySearch>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let sandbox = optional_session(p.session_id.as_deref())?;
                let req = SearchMemories {
                    query: MemoryQuery::new(p.query).map_err(CallError::from)?,
                    limit: p.limit,
                    category: optional_category(p.category)?,
                };
                Ok(output::memory_results(
                    &api.search_memories(sandbox.as_ref(), req).await?,
                ))
            }
            .await,
        )
    }

    #[tool(
        description = "List memories, newest first: one session's (session_id) or, without session_id, your own. Optionally only one category. When there are more, the answer has next_cursor: pass it as cursor for the next page."
    )]
    async fn memory_list(
        &self,
        Parameters(p): Parameters<MemoryListArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                let sandbox = optional_session(p.session_id.as_deref())?;
                let req = ListMemories {
                    limit: p.limit,
                    cursor: p.cursor,
                    category: optional_category(p.category)?,
                };
                Ok(output::memory_page(
                    &api.list_memories(sandbox.as_ref(), req).await?,
                ))
            }
            .await,
        )
    }

    #[tool(
        description = "How a memory_add with infer: true goes: status queued, running, succeeded (memory_ids: the memories added) or failed (error says why)."
    )]
    async fn memory_infer_status(
        &self,
        Parameters(p): Parameters<MemoryInferStatus>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                Ok(output::infer_job(&api.get_infer_job(&p.job_id).await?))
            }
            .await,
        )
    }

    #[tool(
        description = "Forget a memory by its memory_id (your own or one of your sessions'). Sessions already made from a snapshot taken before keep their copy."
    )]
    async fn memory_delete(
        &self,
        Parameters(p): Parameters<MemoryDelete>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        answer(
            async {
                let api = self.sandcell(&ctx)?;
                api.delete_memory(&p.memory_id).await?;
                Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                    "memory {} deleted",
                    p.memory_id
                ))]))
            }
            .await,
        )
    }
}

impl SandcellMcp {
    /// `agent_run`.
    async fn start_agent(&self, p: AgentRun, ctx: &RequestContext<RoleServer>) -> Outcome {
        let api = self.sandcell(ctx)?;
        let sandbox = match (p.session_id, p.sandbox_id) {
            (Some(a), Some(b)) if a != b => {
                return Err(tool_error(
                    "invalid_argument: session_id and sandbox_id name different sessions; give one",
                ));
            }
            (a, b) => a.or(b).map(|id| session_id(&id)).transpose()?,
        };
        let req = StartRun {
            task: p.task,
            model: p.model,
            sandbox_id: sandbox,
            budgets: BudgetsInput {
                max_iterations: p.max_iterations,
                token_budget: p.token_budget,
                cost_limit_usd: p.cost_limit_usd,
                timeout_secs: p.timeout_secs,
                ..BudgetsInput::default()
            },
            validate: p
                .validate_command
                .map(|c| Validate::new(c, None, p.validate_max_attempts))
                .transpose()
                .map_err(|e| tool_error(&format!("invalid_argument: {}", e.0)))?,
            keep_snapshots: p.keep_snapshots.unwrap_or(false),
            ..StartRun::default()
        };
        Ok(output::run_started(&api.start_run(req).await?))
    }

    /// How this call reaches Sandcell: the server's own way, or as the caller of its HTTP
    /// request.
    fn sandcell(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Arc<dyn Sandcell>, CallToolResult> {
        match &self.reach {
            Reach::Fixed(sandcell) => Ok(sandcell.clone()),
            Reach::AsRequestCaller(service, runner) => {
                // The server lets no request reach `/mcp` without a key it authenticated.
                let caller = ctx
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|parts| parts.extensions.get::<Caller>())
                    .ok_or_else(|| {
                        tool_error("unauthenticated: this request carries no authenticated API key")
                    })?;
                Ok(Arc::new(InProcess::with_runner(
                    service.clone(),
                    runner.clone(),
                    caller.clone(),
                )))
            }
        }
    }

    /// `create_session`.
    async fn make_session(&self, p: CreateSession, ctx: &RequestContext<RoleServer>) -> Outcome {
        let api = self.sandcell(ctx)?;
        let runtime = p.runtime.unwrap_or(Runtime::Python);
        // Checked before anything is made: a bad name or version is the caller's to fix.
        let deps = p
            .dependencies
            .map(Dependencies::resolve)
            .transpose()
            .map_err(|msg| tool_error(&format!("invalid_argument: {msg}")))?
            .unwrap_or_default();
        if let (Runtime::Bash, Some(d)) = (runtime, deps.iter().find(|d| d.version.is_some())) {
            return Err(tool_error(&format!(
                "invalid_argument: {}: bash dependencies are commands, whose versions cannot be checked; give \"\" for any",
                d.name
            )));
        }
        let limits = (p.memory_mb.is_some() || p.cpus.is_some()).then(|| LimitsInput {
            memory_mb: p.memory_mb,
            cpus: p.cpus,
            ..LimitsInput::default()
        });
        // An image's own interpreters: the runtime starts with it only when named.
        let kernels = match (&p.image, p.runtime) {
            (Some(_), Some(r)) => vec![r.lang()],
            _ => Vec::new(),
        };
        let req = CreateSandbox {
            // A restore takes the snapshot's template (the API refuses another): named only
            // when the caller names one.
            template: match &p.image {
                Some(image) => Some(image.clone()),
                None => (p.snapshot_id.is_none() || p.runtime.is_some())
                    .then(|| runtime.name().to_string()),
            },
            kernels,
            limits,
            env: p.env.unwrap_or_default(),
            labels: session_labels(),
            timeout_secs: p
                .timeout_secs
                .map(Seconds::new)
                .transpose()
                .map_err(CallError::from)?,
            idle_timeout_secs: p
                .idle_timeout_secs
                .map(Seconds::new)
                .transpose()
                .map_err(CallError::from)?,
            network: p
                .network
                .as_deref()
                .map(str::parse::<sandcell_api::network::NetworkPolicy>)
                .transpose()
                .map_err(|e| CallError::new("invalid_argument", format!("network: {e}")))?,
            backend: p.backend,
            checkpointable: p.checkpointable.unwrap_or(false),
            snapshot_id: p.snapshot_id,
            mounts: p
                .mounts
                .unwrap_or_default()
                .into_iter()
                .map(SessionMount::input)
                .collect::<Result<_, _>>()?,
            ..CreateSandbox::default()
        };
        let restored = req.snapshot_id.is_some();
        let mut info = api.create_sandbox(req.clone()).await?;
        if !deps.is_empty() {
            // Restored: the packages are looked up in the snapshot's runtime.
            let runtime = match (p.runtime, info.template.as_str()) {
                (Some(r), _) => r,
                (None, "node") => Runtime::Node,
                (None, "bash") => Runtime::Bash,
                (None, "r") => Runtime::R,
                _ => Runtime::Python,
            };
            let id = session_id(&info.id)?;
            let missing = match unmet_dependencies(&*api, &id, runtime, &deps).await {
                Ok(m) => m,
                Err(failure) => {
                    let _ = api.delete_sandbox(&id).await;
                    return Err(failure);
                }
            };
            if !missing.is_empty() {
                let _ = api.delete_sandbox(&id).await;
                let packages = match packages_for(runtime, &missing.deps) {
                    Some(p) if !restored => p,
                    _ => return Err(missing.error(runtime, restored)),
                };
                // Made again, with the missing packages installed from the registries the
                // server allows (cached for the next session that asks for the same).
                let mut again = req;
                again.packages = Some(packages);
                info = api.create_sandbox(again).await.map_err(|e| {
                    tool_error(&format!(
                        "missing_dependencies: {} not installed for {} (installing them failed: {})",
                        missing.names.join(", "),
                        runtime.name(),
                        e.message
                    ))
                })?;
                let id = session_id(&info.id)?;
                match unmet_dependencies(&*api, &id, runtime, &deps).await {
                    Ok(still) if still.is_empty() => {}
                    Ok(still) => {
                        let _ = api.delete_sandbox(&id).await;
                        return Err(still.error(runtime, false));
                    }
                    Err(failure) => {
                        let _ = api.delete_sandbox(&id).await;
                        return Err(failure);
                    }
                }
            }
        }
        Ok(output::session_created(&info))
    }

    /// `execute_code` and `execute_python`.
    async fn code_in_session(
        &self,
        ctx: &RequestContext<RoleServer>,
        session: Option<String>,
        lang: Runtime,
        code: String,
        timeout_secs: Option<f64>,
    ) -> Outcome {
        let api = self.sandcell(ctx)?;
        let (session, created) = self.session_or_default(&*api, session).await?;
        let input = CodeInput {
            code: Code::new(code).map_err(CallError::from)?,
            language: Some(lang.lang()),
            context: None,
            timeout_secs: timeout_secs
                .map(Timeout::from_secs)
                .transpose()
                .map_err(CallError::from)?,
        };
        let result = api.run_code(&session, input).await?;
        Ok(announce(output::code_result(&result), &session, created))
    }

    /// `execute_terminal`.
    async fn command_in_session(
        &self,
        p: ExecuteTerminal,
        ctx: &RequestContext<RoleServer>,
    ) -> Outcome {
        let api = self.sandcell(ctx)?;
        let (session, created) = self.session_or_default(&*api, p.session_id).await?;
        let input = ExecInput {
            cmd: Some(p.command),
            cwd: p.cwd,
            env: p.env.unwrap_or_default(),
            timeout_secs: p
                .timeout_secs
                .map(Timeout::from_secs)
                .transpose()
                .map_err(CallError::from)?,
            ..ExecInput::default()
        };
        let out = api.exec(&session, input).await?;
        Ok(announce(output::exec_result(&out), &session, created))
    }

    /// `import_files`.
    async fn put_files(&self, p: ImportFiles, ctx: &RequestContext<RoleServer>) -> Outcome {
        let api = self.sandcell(ctx)?;
        if p.files.is_empty() {
            return Err(tool_error("invalid_argument: files is empty"));
        }
        let mut lines = Vec::new();
        for f in p.files {
            // Every shape comes down to the service's one: a target path and one source.
            let (req, temporary) = match f {
                ImportFile::Put(put) => (
                    ImportRequest {
                        path: put.path,
                        text: put.text,
                        base64: put.base64,
                        host_path: put.host_path,
                        export_id: put.export_id,
                        mode: None,
                    },
                    None,
                ),
                ImportFile::Copy(c) => (
                    ImportRequest {
                        path: c.destination,
                        host_path: Some(c.source),
                        ..ImportRequest::default()
                    },
                    None,
                ),
                ImportFile::FromSession(from) => {
                    let (id, made) =
                        export_of(&*api, &session_id(&from.session_id)?, &from.path).await?;
                    let req = ImportRequest {
                        path: from.destination,
                        export_id: Some(id.clone()),
                        ..ImportRequest::default()
                    };
                    (req, made.then_some(id))
                }
            };
            let imported = api.import(&session_id(&p.session_id)?, req).await;
            if let Some(id) = temporary {
                // Made for this copy only: the caller did not ask the server to keep it.
                let _ = api.delete_export(&id).await;
            }
            lines.push(output::json(&imported?));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(
            lines.join("\n"),
        )]))
    }

    /// `export_files`.
    async fn take_files(&self, p: ExportFiles, ctx: &RequestContext<RoleServer>) -> Outcome {
        let api = self.sandcell(ctx)?;
        let mut paths = p.paths.unwrap_or_default();
        paths.extend(p.files.unwrap_or_default().into_iter().map(|f| f.source));
        if paths.is_empty() {
            return Err(tool_error(
                "invalid_argument: nothing to export: give paths ([\"data.csv\"]) or files ([{\"source\": \"data.csv\"}])",
            ));
        }
        let base = request_base(ctx).or_else(|| api.public_base());
        let include = p.include_content.unwrap_or(base.is_none());
        let mut content = Vec::new();
        for path in paths {
            let req = CreateExport { path: path.clone() };
            let info = api.create_export(&session_id(&p.session_id)?, req).await?;
            let mut export = serde_json::to_value(&info).unwrap_or_default();
            match (&base, &info.signed_url) {
                (Some(base), Some(signed)) => {
                    export["download_url"] = json!(format!("{base}{signed}"));
                }
                _ => {
                    if let Some(obj) = export.as_object_mut() {
                        obj.remove("download_url");
                        obj.remove("signed_url");
                    }
                }
            }
            content.push(ContentBlock::text(export.to_string()));
            if include {
                let read = api
                    .read_file(
                        &session_id(&p.session_id)?,
                        &path,
                        output::INLINE_FILE_LIMIT,
                    )
                    .await;
                content.push(output::file_content(&path, &read));
            }
        }
        Ok(CallToolResult::success(content))
    }

    /// `session` when given; else this connection's default session, made now (with `true`)
    /// when there is none yet or the one there was has ended.
    async fn session_or_default(
        &self,
        api: &dyn Sandcell,
        session: Option<String>,
    ) -> Result<(SandboxId, bool), CallToolResult> {
        if let Some(id) = session {
            return Ok((session_id(&id)?, false));
        }
        let mut slot = self.default_session.lock().await;
        if let Some(id) = slot.clone() {
            let alive = api
                .get_sandbox(&id)
                .await
                .is_ok_and(|s| matches!(s.state.as_str(), "running" | "paused" | "creating"));
            if alive {
                return Ok((id, false));
            }
        }
        let req = CreateSandbox {
            template: Some(Runtime::Python.name().to_string()),
            labels: session_labels(),
            ..CreateSandbox::default()
        };
        let id = session_id(&api.create_sandbox(req).await?.id)?;
        *slot = Some(id.clone());
        Ok((id, true))
    }
}

/// Packages of `deps` not installed (or not in the version asked).
struct Unmet {
    /// As the listing says them (`name`, `name==2 (installed: 1)`).
    names: Vec<String>,
    /// The dependencies themselves.
    deps: Vec<Dependency>,
}

impl Unmet {
    fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The tool error naming them.
    fn error(&self, runtime: Runtime, restored: bool) -> CallToolResult {
        let why = match (runtime, restored) {
            (Runtime::Bash, _) => "bash dependencies are commands, which are not installed",
            (_, true) => "a session restored from a snapshot keeps the snapshot's packages",
            _ => "R package versions cannot be pinned",
        };
        tool_error(&format!(
            "missing_dependencies: {} not installed for {} ({why}); use what is installed",
            self.names.join(", "),
            runtime.name()
        ))
    }
}

/// The packages to install for `missing` in `runtime` (`None`: it cannot install them).
fn packages_for(
    runtime: Runtime,
    missing: &[Dependency],
) -> Option<sandcell_api::sandboxes::Packages> {
    let spec = |sep: &str| -> Vec<String> {
        missing
            .iter()
            .map(|d| match &d.version {
                Some(v) => format!("{}{sep}{}", d.name, v.trim_start_matches("==")),
                None => d.name.clone(),
            })
            .collect()
    };
    let mut p = sandcell_api::sandboxes::Packages::default();
    match runtime {
        Runtime::Python => p.pip = spec("=="),
        Runtime::Node => p.npm = spec("@"),
        Runtime::R if missing.iter().all(|d| d.version.is_none()) => p.r = spec(""),
        Runtime::R | Runtime::Bash => return None,
    }
    Some(p)
}

/// Which packages of `deps` are not installed for `runtime` in session `id` (in the version
/// asked, if any).
async fn unmet_dependencies(
    api: &dyn Sandcell,
    id: &SandboxId,
    runtime: Runtime,
    deps: &[Dependency],
) -> Result<Unmet, CallToolResult> {
    let names: Vec<&str> = deps.iter().map(|d| d.name.as_str()).collect();
    // The names were checked (`args::valid_package_name`): safe inside a JSON list.
    let list = serde_json::to_string(&names).unwrap_or_default();
    // Each snippet prints `name<TAB>version` per package (version empty when missing, `?`
    // when installed without one to tell), in a scope of its own so that nothing is left
    // in the user's namespace.
    let code = match runtime {
        Runtime::Python => format!(
            "def _sandcell_deps():\n    import importlib.metadata as m\n    for d in {list}:\n        try:\n            v = m.version(d) or '?'\n        except m.PackageNotFoundError:\n            v = ''\n        print(d + '\\t' + v)\n_sandcell_deps()\ndel _sandcell_deps"
        ),
        Runtime::Node => format!(
            "(() => {{ const path = require('path'), fs = require('fs'); for (const d of {list}) {{ let v = ''; try {{ let dir = path.dirname(require.resolve(d)); v = '?'; while (dir !== path.dirname(dir)) {{ const f = path.join(dir, 'package.json'); if (fs.existsSync(f)) {{ const j = JSON.parse(fs.readFileSync(f, 'utf8')); if (j.name === d) {{ v = j.version || '?'; break }} }} dir = path.dirname(dir) }} }} catch (e) {{}} console.log(d + '\\t' + v) }} }})()"
        ),
        Runtime::R => format!(
            "local(for (d in c({})) cat(d, '\\t', if (requireNamespace(d, quietly = TRUE)) as.character(packageVersion(d)) else '', '\\n', sep = ''))",
            list.trim_start_matches('[').trim_end_matches(']')
        ),
        Runtime::Bash => names
            .iter()
            .map(|d| format!("if command -v {d} >/dev/null; then printf '%s\\t?\\n' {d}; else printf '%s\\t\\n' {d}; fi"))
            .collect::<Vec<_>>()
            .join("\n"),
    };
    let input = CodeInput {
        code: Code::new(code).map_err(CallError::from)?,
        language: Some(runtime.lang()),
        context: None,
        timeout_secs: None,
    };
    let listing = api.run_code(id, input).await?;
    let names = args::unmet(deps, &listing.stdout);
    let deps = deps
        .iter()
        .filter(|d| {
            names
                .iter()
                .any(|n| n == &d.name || n.starts_with(&format!("{}==", d.name)))
        })
        .cloned()
        .collect();
    Ok(Unmet { names, deps })
}

/// An export of `path` in session `from` to import from: the newest one that session
/// made with export_files (it outlives the session), else one made now (`true`: delete
/// it once imported).
async fn export_of(
    api: &dyn Sandcell,
    from: &SandboxId,
    path: &str,
) -> Result<(String, bool), CallToolResult> {
    let wanted = args::absolute(path);
    // A list that fails (a malformed id) falls through: the export below says why. The
    // newest by its time (RFC 3339, same width: comparable as text), whatever the order.
    if let Ok(listed) = api.list_exports(Some(from)).await
        && let Some(newest) = listed
            .exports
            .into_iter()
            .filter(|e| args::absolute(&e.path) == wanted)
            .max_by(|a, b| a.created_at.cmp(&b.created_at))
    {
        return Ok((newest.id, false));
    }
    let req = CreateExport {
        path: path.to_string(),
    };
    Ok((api.create_export(from, req).await?.id, true))
}

/// The id of the default context of `language` in `session` (the kernel `execute_code`
/// uses), or the tool error to answer.
async fn context_of(
    api: &dyn Sandcell,
    session: &SandboxId,
    language: Option<Runtime>,
) -> Result<String, CallToolResult> {
    let lang = language.unwrap_or(Runtime::Python);
    let contexts = api.list_contexts(session).await?;
    default_context_id(&contexts, lang).ok_or_else(|| {
        let lang = lang.name();
        tool_error(&format!(
            "no_context: session {session} has no {lang} kernel yet; run some {lang} code with execute_code first"
        ))
    })
}

impl ServerHandler for SandcellMcp {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info.name = "sandcell".into();
        info.server_info.version = env!("CARGO_PKG_VERSION").into();
        info.instructions = Some(
            "Sandcell sandboxes: create_session (or execute_python without a session_id), then run code with execute_code / execute_python and shell commands with execute_terminal in that session; state persists between calls. Destroy sessions you no longer need. agent_run hands a whole task to an agent of the server's own (follow it with agent_status; agent_fork goes on from one of its steps). memory_add and memory_search keep facts for later: a session's, or your own across sessions (memory_add with infer: true has the server's model extract them from a text).".into(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_router.list_all()))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let tcc = ToolCallContext::new(self, request, context);
        match self.tool_router.call(tcc).await {
            // Bad arguments are the model's to fix: a tool error it can read, not a protocol one.
            Err(e) if e.code == ErrorCode::INVALID_PARAMS && self.tool_router.has_route(&name) => {
                Ok(tool_error(&format!("invalid_argument: {}", e.message)).into())
            }
            Ok(CallToolResponse::Complete(mut result)) => {
                mark_argument_errors(&mut result);
                Ok(CallToolResponse::Complete(result))
            }
            other => other,
        }
    }
}

/// Gives argument errors the rmcp layer reports (as tool errors) the `invalid_argument`
/// code every other error of ours starts with.
fn mark_argument_errors(result: &mut CallToolResult) {
    if result.is_error != Some(true) {
        return;
    }
    if let Some(ContentBlock::Text(t)) = result.content.first_mut()
        && t.text.starts_with("failed to deserialize parameters")
    {
        t.text = format!("invalid_argument: {}", t.text);
    }
}

/// The base URL the MCP request came to (HTTP), for links the client can follow.
fn request_base(ctx: &RequestContext<RoleServer>) -> Option<String> {
    let parts = ctx.extensions.get::<http::request::Parts>()?;
    let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
    Some(format!("http://{host}"))
}

/// The id of `lang`'s default context among `contexts`, else of any context of `lang`. The
/// service marks no context as default: a language's default context is the one named after
/// the language (`python`).
fn default_context_id(contexts: &[ContextView], lang: Runtime) -> Option<String> {
    let of_lang = |c: &&ContextView| c.language == lang.lang();
    contexts
        .iter()
        .filter(of_lang)
        .find(|c| c.id == lang.name())
        .or_else(|| contexts.iter().find(of_lang))
        .map(|c| c.id.clone())
}

/// `result` with a first line naming the session, when it was made for this call.
fn announce(mut result: CallToolResult, session: &str, created: bool) -> CallToolResult {
    if created {
        result.content.insert(
            0,
            ContentBlock::text(format!(
                "session_id: {session} (new session, this connection's default: calls without a session_id use it)"
            )),
        );
    }
    result
}

/// A tool error with `text`.
pub fn tool_error(text: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(id: &str, language: &str) -> ContextView {
        serde_json::from_value(json!({
            "id": id, "language": language, "pid": null, "execution_count": 0, "busy": false,
            "created_at": null, "ended_at": null, "end_reason": null
        }))
        .unwrap()
    }

    #[test]
    fn the_default_context_is_the_one_named_after_its_language() {
        // What the service lists: a context made with `POST /contexts` (listed first here)
        // and the language's default one, whose id is the language's name.
        let contexts = vec![
            context("ctx-1a2b3c", "python"),
            context("python", "python"),
            context("node", "node"),
        ];
        assert_eq!(
            default_context_id(&contexts, Runtime::Python).as_deref(),
            Some("python")
        );
        assert_eq!(
            default_context_id(&contexts, Runtime::Node).as_deref(),
            Some("node")
        );
        // No default context yet: any of the language's.
        assert_eq!(
            default_context_id(&contexts[..1], Runtime::Python).as_deref(),
            Some("ctx-1a2b3c")
        );
        assert_eq!(default_context_id(&contexts, Runtime::R), None);
    }

    #[test]
    fn a_failed_operation_reads_as_its_code_and_message() {
        let failure: CallToolResult =
            CallError::new("not_found", "no sandbox 'sb-0123456789abcdef'").into();
        assert_eq!(failure.is_error, Some(true));
        let Some(ContentBlock::Text(t)) = failure.content.first() else {
            panic!("no text: {failure:?}");
        };
        assert_eq!(t.text, "not_found: no sandbox 'sb-0123456789abcdef'");
    }
}
