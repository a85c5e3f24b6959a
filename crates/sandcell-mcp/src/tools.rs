//! The MCP tools: sessions (sandboxes), code in live kernels, terminal commands, variables,
//! files in and out, pause/resume, snapshots and forks. Each tool is one or a few REST calls;
//! every failure comes back as a tool error (`isError`) with the API's code and message.

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
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{Api, ApiReply, ApiRequest};
use crate::args::{self, Dependencies, Dependency, ExportFile, ImportFile};
use crate::output;

/// The label every session made through MCP carries.
pub const SESSION_LABEL: &str = "mcp";

/// The MCP server: tools over one [`Api`].
#[derive(Clone)]
pub struct SandcellMcp {
    api: Arc<dyn Api>,
    tool_router: ToolRouter<Self>,
    /// The session tools use when a call names none: made on first need, one per
    /// connection (per MCP session over HTTP).
    default_session: Arc<tokio::sync::Mutex<Option<String>>>,
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
}

/// Network policy of a session.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Loopback only: programs in the session may talk to each other over 127.0.0.1.
    Loopback,
    /// No network sockets at all.
    Off,
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
    /// Network policy (default loopback).
    pub network: Option<Network>,
    /// Seconds the session may live (default: the server's setting, 2 hours).
    pub timeout_secs: Option<u64>,
    /// Seconds without use before the session is reclaimed (default: the server's, 30 minutes).
    pub idle_timeout_secs: Option<u64>,
    /// Environment variables for everything run in the session.
    pub env: Option<BTreeMap<String, String>>,
    /// Start from this snapshot (made by `snapshot_session`) instead of empty.
    pub snapshot_id: Option<String>,
    /// Backend: `process` (default) or `gvisor` (stronger isolation, full-memory snapshots).
    pub backend: Option<String>,
    /// On the process backend, where the server has a working CRIU: snapshots keep every
    /// process with its memory (the session then runs without Landlock).
    pub checkpointable: Option<bool>,
    /// Packages the session needs, by their install name (`pandas`, `scikit-learn` for
    /// python; `lodash` for node; `ggplot2` for r): a list of names, or a map of name to
    /// version (`{"pandas": "2.2.3", "matplotlib": ""}`; `""` for any version, else exactly
    /// that one). Each is checked in the session's runtime; sandboxes cannot download packages
    /// (no network beyond loopback), so when any is not installed on the server (or not in
    /// the version asked) the session is not made and the error names them.
    pub dependencies: Option<Dependencies>,
}

/// A session to act on.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    /// The session id returned by `create_session` (`sb-…`).
    pub session_id: String,
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

type ToolResult = Result<CallToolResult, ErrorData>;

#[tool_router]
impl SandcellMcp {
    /// A server whose tools call `api`.
    pub fn new(api: Arc<dyn Api>) -> Self {
        Self {
            api,
            tool_router: Self::tool_router(),
            default_session: Arc::default(),
        }
    }

    /// Every tool, as `tools/list` shows it.
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.tool_router.list_all()
    }

    #[tool(
        description = "Create a sandboxed session: an isolated Linux sandbox with a live kernel whose state persists across calls. Returns its session_id. Sessions end after their idle timeout (30 min by default) or lifetime, or with destroy_session."
    )]
    async fn create_session(
        &self,
        Parameters(p): Parameters<CreateSession>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let runtime = p.runtime.unwrap_or(Runtime::Python);
        // Checked before anything is made: a bad name or version is the caller's to fix.
        let deps = match p.dependencies.map(Dependencies::resolve).transpose() {
            Ok(d) => d.unwrap_or_default(),
            Err(msg) => return Ok(tool_error(&format!("invalid_argument: {msg}"))),
        };
        if let (Runtime::Bash, Some(d)) = (runtime, deps.iter().find(|d| d.version.is_some())) {
            return Ok(tool_error(&format!(
                "invalid_argument: {}: bash dependencies are commands, whose versions cannot be checked; give \"\" for any",
                d.name
            )));
        }
        let mut body = json!({"labels": { SESSION_LABEL: "true" }});
        // A restore takes the snapshot's template (the API refuses another): named only when
        // the caller names one.
        if p.snapshot_id.is_none() || p.runtime.is_some() {
            body["template"] = json!(runtime.name());
        }
        let mut limits = serde_json::Map::new();
        if let Some(m) = p.memory_mb {
            limits.insert("memory_mb".into(), json!(m));
        }
        if let Some(c) = p.cpus {
            limits.insert("cpus".into(), json!(c));
        }
        if !limits.is_empty() {
            body["limits"] = Value::Object(limits);
        }
        set_opt(
            &mut body,
            "network",
            p.network.map(|n| match n {
                Network::Loopback => "loopback",
                Network::Off => "off",
            }),
        );
        set_opt(&mut body, "timeout_secs", p.timeout_secs);
        set_opt(&mut body, "idle_timeout_secs", p.idle_timeout_secs);
        set_opt(&mut body, "env", p.env);
        set_opt(&mut body, "snapshot_id", p.snapshot_id);
        set_opt(&mut body, "backend", p.backend);
        set_opt(&mut body, "checkpointable", p.checkpointable);
        let reply = self
            .post(key.as_deref(), "/v1/sandboxes".into(), body)
            .await?;
        if !reply.ok() {
            return Ok(api_failure(&reply));
        }
        if !deps.is_empty() {
            let id = reply.body["id"].as_str().unwrap_or_default().to_string();
            // Restored: the packages are looked up in the snapshot's runtime.
            let runtime = match (p.runtime, reply.body["template"].as_str()) {
                (Some(r), _) => r,
                (None, Some("node")) => Runtime::Node,
                (None, Some("bash")) => Runtime::Bash,
                (None, Some("r")) => Runtime::R,
                _ => Runtime::Python,
            };
            if let Some(failure) = self
                .check_dependencies(key.as_deref(), &id, runtime, &deps)
                .await?
            {
                let path = format!("/v1/sandboxes/{}", seg(&id));
                let _ = self
                    .api_call(key.as_deref(), http::Method::DELETE, path, None)
                    .await;
                return Ok(failure);
            }
        }
        Ok(output::session_created(&reply.body))
    }

    #[tool(
        description = "Run code in a session's live kernel (python, node, bash or r). Variables, imports and definitions persist between calls. Returns stdout, stderr, the value of the last expression, rich outputs (plots come back as images) and errors with tracebacks."
    )]
    async fn execute_code(
        &self,
        Parameters(p): Parameters<ExecuteCode>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let lang = p.language.unwrap_or(Runtime::Python);
        let (session, created) = match self.session_or_default(key.as_deref(), p.session_id).await {
            Ok(s) => s,
            Err(failure) => return Ok(failure),
        };
        let result = self
            .run_code(key.as_deref(), &session, lang, p.code, p.timeout_secs)
            .await?;
        Ok(announce(result, &session, created))
    }

    #[tool(
        description = "Run Python code in a session (created when session_id is omitted; its id is returned). State persists between calls: define a variable in one call and use it in the next. matplotlib figures come back as images."
    )]
    async fn execute_python(
        &self,
        Parameters(p): Parameters<ExecutePython>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let (session, created) = match self.session_or_default(key.as_deref(), p.session_id).await {
            Ok(s) => s,
            Err(failure) => return Ok(failure),
        };
        let result = self
            .run_code(
                key.as_deref(),
                &session,
                Runtime::Python,
                p.code,
                p.timeout_secs,
            )
            .await?;
        Ok(announce(result, &session, created))
    }

    #[tool(
        description = "Run a shell command in a session (bash -c, working directory /workspace). Returns stdout, stderr, the exit code and how it ended (exited, killed by a signal, timed out, out of memory)."
    )]
    async fn execute_terminal(
        &self,
        Parameters(p): Parameters<ExecuteTerminal>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let (session, created) = match self.session_or_default(key.as_deref(), p.session_id).await {
            Ok(s) => s,
            Err(failure) => return Ok(failure),
        };
        let mut body = json!({"cmd": p.command});
        set_opt(&mut body, "cwd", p.cwd);
        set_opt(&mut body, "env", p.env);
        set_opt(&mut body, "timeout_secs", p.timeout_secs);
        let path = format!("/v1/sandboxes/{}/exec", seg(&session));
        let reply = self.post(key.as_deref(), path, body).await?;
        if !reply.ok() {
            return Ok(api_failure(&reply));
        }
        Ok(announce(
            output::exec_result(&reply.body),
            &session,
            created,
        ))
    }

    #[tool(
        description = "Read variables of a session's kernel as JSON (values that are not JSON come as their type and repr)."
    )]
    async fn get_repl_context(
        &self,
        Parameters(p): Parameters<GetContext>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        self.variables(
            key.as_deref(),
            &p.session_id,
            p.language,
            p.names,
            http::Method::GET,
            None,
        )
        .await
    }

    #[tool(description = "Set variables in a session's kernel from JSON values.")]
    async fn set_repl_context(
        &self,
        Parameters(p): Parameters<SetContext>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let values = json!({"values": p.variables});
        self.variables(
            key.as_deref(),
            &p.session_id,
            p.language,
            None,
            http::Method::PUT,
            Some(values),
        )
        .await
    }

    #[tool(
        description = "Delete variables from a session's kernel (all user variables by default)."
    )]
    async fn clear_repl_context(
        &self,
        Parameters(p): Parameters<ClearContext>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        self.variables(
            key.as_deref(),
            &p.session_id,
            p.language,
            p.names,
            http::Method::DELETE,
            None,
        )
        .await
    }

    #[tool(
        description = "List your active sessions (also ones made in earlier connections: reconnect to one by passing its session_id)."
    )]
    async fn list_sessions(&self, ctx: RequestContext<RoleServer>) -> ToolResult {
        let key = caller_key(&ctx);
        let reply = self
            .get(key.as_deref(), "/v1/sandboxes?limit=200".into())
            .await?;
        if !reply.ok() {
            return Ok(api_failure(&reply));
        }
        Ok(output::session_list(&reply.body))
    }

    #[tool(
        description = "End a session: its processes stop and its files are gone (exports stay)."
    )]
    async fn destroy_session(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let path = format!("/v1/sandboxes/{}", seg(&p.session_id));
        let reply = self
            .api_call(key.as_deref(), http::Method::DELETE, path, None)
            .await?;
        if !reply.ok() {
            return Ok(api_failure(&reply));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "session {} destroyed",
            p.session_id
        ))]))
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
        let key = caller_key(&ctx);
        if p.files.is_empty() {
            return Ok(tool_error("invalid_argument: files is empty"));
        }
        let mut lines = Vec::new();
        for f in p.files {
            // Every shape comes down to the API's one: a target path and one source.
            let (body, temporary) = match f {
                ImportFile::Put(put) => (json!(put), None),
                ImportFile::Copy(c) => {
                    (json!({"path": c.destination, "host_path": c.source}), None)
                }
                ImportFile::FromSession(from) => {
                    let (id, made) = match self
                        .export_of(key.as_deref(), &from.session_id, &from.path)
                        .await
                    {
                        Ok(e) => e,
                        Err(failure) => return Ok(failure),
                    };
                    let body = json!({"path": from.destination, "export_id": id});
                    (body, made.then_some(id))
                }
            };
            let path = format!("/v1/sandboxes/{}/import", seg(&p.session_id));
            let reply = self.post(key.as_deref(), path, body).await;
            if let Some(id) = temporary {
                // Made for this copy only: the caller did not ask the server to keep it.
                let path = format!("/v1/exports/{}", seg(&id));
                let _ = self
                    .api_call(key.as_deref(), http::Method::DELETE, path, None)
                    .await;
            }
            let reply = reply?;
            if !reply.ok() {
                return Ok(api_failure(&reply));
            }
            lines.push(reply.body.to_string());
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(
            lines.join("\n"),
        )]))
    }

    #[tool(
        description = "Export files or folders from a session: the server keeps a copy after the session ends. Returns each export's id (usable by import_files in another session) and a download link when the server has a URL; with include_content, the contents too."
    )]
    async fn export_files(
        &self,
        Parameters(p): Parameters<ExportFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let mut paths = p.paths.unwrap_or_default();
        paths.extend(p.files.unwrap_or_default().into_iter().map(|f| f.source));
        if paths.is_empty() {
            return Ok(tool_error(
                "invalid_argument: nothing to export: give paths ([\"data.csv\"]) or files ([{\"source\": \"data.csv\"}])",
            ));
        }
        let base = request_base(&ctx).or_else(|| self.api.public_base());
        let include = p.include_content.unwrap_or(base.is_none());
        let mut content = Vec::new();
        for path in paths {
            let url = format!("/v1/sandboxes/{}/exports", seg(&p.session_id));
            let reply = self
                .post(key.as_deref(), url, json!({"path": path}))
                .await?;
            if !reply.ok() {
                return Ok(api_failure(&reply));
            }
            let mut export = reply.body.clone();
            if let (Some(base), Some(signed)) = (&base, export["signed_url"].as_str()) {
                export["download_url"] = json!(format!("{base}{signed}"));
            } else if let Some(obj) = export.as_object_mut() {
                obj.remove("download_url");
                obj.remove("signed_url");
            }
            content.push(ContentBlock::text(export.to_string()));
            if include {
                let file = format!(
                    "/v1/sandboxes/{}/files/content?path={}",
                    seg(&p.session_id),
                    seg(&path)
                );
                let got = self.get(key.as_deref(), file).await?;
                content.push(output::file_content(&path, &got));
            }
        }
        Ok(CallToolResult::success(content))
    }

    #[tool(
        description = "Pause a session: every process is frozen (no CPU), memory and state are kept, and its idle clock stops. Resume it with resume_session."
    )]
    async fn pause_session(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let path = format!("/v1/sandboxes/{}/pause", seg(&p.session_id));
        let reply = self.post(key.as_deref(), path, json!({})).await?;
        Ok(json_or_failure(&reply))
    }

    #[tool(description = "Resume a paused session where it stopped.")]
    async fn resume_session(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let path = format!("/v1/sandboxes/{}/resume", seg(&p.session_id));
        let reply = self.post(key.as_deref(), path, json!({})).await?;
        Ok(json_or_failure(&reply))
    }

    #[tool(
        description = "Take a durable snapshot of a session (its files and its kernels' variables; on the gvisor backend every process with its memory). Returns the snapshot id and its fidelity."
    )]
    async fn snapshot_session(
        &self,
        Parameters(p): Parameters<SnapshotSession>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let mut body = json!({});
        set_opt(&mut body, "name", p.name);
        set_opt(&mut body, "description", p.description);
        set_opt(&mut body, "tags", p.tags);
        let path = format!("/v1/sandboxes/{}/snapshots", seg(&p.session_id));
        let reply = self.post(key.as_deref(), path, body).await?;
        Ok(json_or_failure(&reply))
    }

    #[tool(
        description = "Make new independent sessions from a snapshot (count of them, default 1). Each fork gets its own id and random state; changes in one are not seen by the others. Returns their session ids and what was restored."
    )]
    async fn fork_snapshot(
        &self,
        Parameters(p): Parameters<ForkSnapshot>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let body = json!({
            "count": p.count.unwrap_or(1),
            "labels": { SESSION_LABEL: "true" },
        });
        let path = format!("/v1/snapshots/{}/fork", seg(&p.snapshot_id));
        let reply = self.post(key.as_deref(), path, body).await?;
        Ok(json_or_failure(&reply))
    }

    #[tool(description = "List your snapshots (of one session when session_id is given).")]
    async fn list_snapshots(
        &self,
        Parameters(p): Parameters<ListSnapshots>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let key = caller_key(&ctx);
        let path = match p.session_id {
            Some(id) => format!("/v1/snapshots?sandbox={}", seg(&id)),
            None => "/v1/snapshots".into(),
        };
        let reply = self.get(key.as_deref(), path).await?;
        Ok(json_or_failure(&reply))
    }
}

impl SandcellMcp {
    /// `session` when given; else this connection's default session, made now (with `true`)
    /// when there is none yet or the one there was has ended.
    async fn session_or_default(
        &self,
        key: Option<&str>,
        session: Option<String>,
    ) -> Result<(String, bool), CallToolResult> {
        if let Some(id) = session {
            return Ok((id, false));
        }
        let mut slot = self.default_session.lock().await;
        if let Some(id) = slot.clone() {
            let alive = self
                .get(key, format!("/v1/sandboxes/{}", seg(&id)))
                .await
                .is_ok_and(|r| {
                    r.ok()
                        && matches!(
                            r.body["state"].as_str(),
                            Some("running" | "paused" | "creating")
                        )
                });
            if alive {
                return Ok((id, false));
            }
        }
        let body = json!({"template": "python", "labels": {SESSION_LABEL: "true"}});
        let reply = self
            .post(key, "/v1/sandboxes".into(), body)
            .await
            .map_err(|e| tool_error(&e.message))?;
        if !reply.ok() {
            return Err(api_failure(&reply));
        }
        let id = reply.body["id"].as_str().unwrap_or_default().to_string();
        *slot = Some(id.clone());
        Ok((id, true))
    }

    /// Checks that every package in `deps` is installed for `runtime` in session `id` (in the
    /// version asked, if any); the tool error naming the others when some are not.
    async fn check_dependencies(
        &self,
        key: Option<&str>,
        id: &str,
        runtime: Runtime,
        deps: &[Dependency],
    ) -> Result<Option<CallToolResult>, ErrorData> {
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
        let body = json!({"code": code, "language": runtime.name()});
        let path = format!("/v1/sandboxes/{}/code", seg(id));
        let reply = self.post(key, path, body).await?;
        if !reply.ok() {
            return Ok(Some(api_failure(&reply)));
        }
        let unmet = args::unmet(deps, reply.body["stdout"].as_str().unwrap_or_default());
        if unmet.is_empty() {
            return Ok(None);
        }
        Ok(Some(tool_error(&format!(
            "missing_dependencies: {} not installed for {} on this server, and sandboxes cannot download packages (no network beyond loopback); use what is installed, or ask the server's operator to add them",
            unmet.join(", "),
            runtime.name()
        ))))
    }

    /// An export of `path` in session `from` to import from: the newest one that session
    /// made with export_files (it outlives the session), else one made now (`true`: delete
    /// it once imported).
    async fn export_of(
        &self,
        key: Option<&str>,
        from: &str,
        path: &str,
    ) -> Result<(String, bool), CallToolResult> {
        let wanted = args::absolute(path);
        let list = format!("/v1/exports?sandbox_id={}", seg(from));
        let listed = self
            .get(key, list)
            .await
            .map_err(|e| tool_error(&e.message))?;
        // A list that fails (a malformed id) falls through: the export below says why. The
        // newest by its time (RFC 3339, same width: comparable as text), whatever the order.
        if listed.ok()
            && let Some(id) = listed.body["exports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["path"].as_str().map(args::absolute).as_deref() == Some(&wanted))
                .max_by_key(|e| e["created_at"].as_str().unwrap_or_default().to_string())
                .and_then(|e| e["id"].as_str())
        {
            return Ok((id.to_string(), false));
        }
        let url = format!("/v1/sandboxes/{}/exports", seg(from));
        let reply = self
            .post(key, url, json!({"path": path}))
            .await
            .map_err(|e| tool_error(&e.message))?;
        if !reply.ok() {
            return Err(api_failure(&reply));
        }
        match reply.body["id"].as_str() {
            Some(id) => Ok((id.to_string(), true)),
            None => Err(tool_error("internal: the export's answer has no id")),
        }
    }

    async fn run_code(
        &self,
        key: Option<&str>,
        session: &str,
        lang: Runtime,
        code: String,
        timeout_secs: Option<f64>,
    ) -> ToolResult {
        let mut body = json!({"code": code, "language": lang.name()});
        set_opt(&mut body, "timeout_secs", timeout_secs);
        let path = format!("/v1/sandboxes/{}/code", seg(session));
        let reply = self.post(key, path, body).await?;
        if !reply.ok() {
            return Ok(api_failure(&reply));
        }
        Ok(output::code_result(&reply.body))
    }

    /// A request on the variables of `session`'s default `language` kernel, for `names`
    /// (all when `None` or empty).
    async fn variables(
        &self,
        key: Option<&str>,
        session: &str,
        language: Option<Runtime>,
        names: Option<Vec<String>>,
        method: http::Method,
        body: Option<Value>,
    ) -> ToolResult {
        let context = match self.context_of(key, session, language).await {
            Ok(c) => c,
            Err(failure) => return Ok(failure),
        };
        let mut path = format!(
            "/v1/sandboxes/{}/contexts/{}/variables",
            seg(session),
            seg(&context)
        );
        if let Some(names) = names.filter(|n| !n.is_empty()) {
            path.push_str(&format!("?names={}", seg(&names.join(","))));
        }
        let reply = self.api_call(key, method, path, body).await?;
        Ok(json_or_failure(&reply))
    }

    /// The id of the default context of `language` in `session` (the kernel `execute_code`
    /// uses), or the tool error to answer.
    async fn context_of(
        &self,
        key: Option<&str>,
        session: &str,
        language: Option<Runtime>,
    ) -> Result<String, CallToolResult> {
        let lang = language.unwrap_or(Runtime::Python).name();
        let path = format!("/v1/sandboxes/{}/contexts", seg(session));
        let reply = match self.get(key, path).await {
            Ok(r) => r,
            Err(e) => return Err(tool_error(&e.message)),
        };
        if !reply.ok() {
            return Err(api_failure(&reply));
        }
        let contexts = reply.body["contexts"]
            .as_array()
            .or_else(|| reply.body.as_array())
            .cloned()
            .unwrap_or_default();
        default_context_id(&contexts, lang).ok_or_else(|| {
            tool_error(&format!(
                "no_context: session {session} has no {lang} kernel yet; run some {lang} code with execute_code first"
            ))
        })
    }

    async fn get(&self, key: Option<&str>, path: String) -> Result<ApiReply, ErrorData> {
        self.api_call(key, http::Method::GET, path, None).await
    }

    async fn post(
        &self,
        key: Option<&str>,
        path: String,
        body: Value,
    ) -> Result<ApiReply, ErrorData> {
        self.api_call(key, http::Method::POST, path, Some(body))
            .await
    }

    async fn api_call(
        &self,
        key: Option<&str>,
        method: http::Method,
        path: String,
        json: Option<Value>,
    ) -> Result<ApiReply, ErrorData> {
        self.api
            .call(ApiRequest {
                method,
                path,
                json,
                key,
            })
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }
}

impl ServerHandler for SandcellMcp {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info.name = "sandcell".into();
        info.server_info.version = env!("CARGO_PKG_VERSION").into();
        info.instructions = Some(
            "Sandcell sandboxes: create_session (or execute_python without a session_id), then run code with execute_code / execute_python and shell commands with execute_terminal in that session; state persists between calls. Destroy sessions you no longer need.".into(),
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

/// The API key the MCP request came with (HTTP), if any; else the transport's own is used.
fn caller_key(ctx: &RequestContext<RoleServer>) -> Option<String> {
    let parts = ctx.extensions.get::<http::request::Parts>()?;
    let headers = &parts.headers;
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.to_string());
    }
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
}

/// The base URL the MCP request came to (HTTP), for links the client can follow.
fn request_base(ctx: &RequestContext<RoleServer>) -> Option<String> {
    let parts = ctx.extensions.get::<http::request::Parts>()?;
    let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
    Some(format!("http://{host}"))
}

/// The id of `lang`'s default context among `contexts` (as `GET …/contexts` lists them),
/// else of any context of `lang`. The server marks no context as default: a language's
/// default context is the one named after the language (`python`).
fn default_context_id(contexts: &[Value], lang: &str) -> Option<String> {
    contexts
        .iter()
        .find(|c| c["language"] == lang && c["id"] == lang)
        .or_else(|| contexts.iter().find(|c| c["language"] == lang))
        .and_then(|c| c["id"].as_str().map(str::to_string))
}

/// A path segment or query value, percent-encoded.
fn seg(s: &str) -> String {
    serde_urlencoded::to_string([("", s)])
        .map(|e| e.trim_start_matches('=').to_string())
        .unwrap_or_default()
}

fn set_opt<T: serde::Serialize>(body: &mut Value, key: &str, value: Option<T>) {
    if let Some(v) = value {
        body[key] = json!(v);
    }
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

/// The tool error for an API answer that was not 2xx: its code and message.
fn api_failure(reply: &ApiReply) -> CallToolResult {
    let code = reply.body["code"].as_str().unwrap_or("error");
    let message = reply.body["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&reply.bytes).into_owned());
    tool_error(&format!("{code}: {message} (HTTP {})", reply.status))
}

fn json_or_failure(reply: &ApiReply) -> CallToolResult {
    if !reply.ok() {
        return api_failure(reply);
    }
    CallToolResult::success(vec![ContentBlock::text(output::truncate(
        &reply.body.to_string(),
        output::RESULT_LIMIT,
    ))])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_context_is_the_one_named_after_its_language() {
        // What the server lists: a context made with `POST /contexts` (listed first here)
        // and the language's default one, whose id is the language's name.
        let contexts = vec![
            json!({"id": "ctx-1a2b3c", "language": "python", "busy": false}),
            json!({"id": "python", "language": "python", "busy": false}),
            json!({"id": "node", "language": "node", "busy": false}),
        ];
        assert_eq!(
            default_context_id(&contexts, "python").as_deref(),
            Some("python")
        );
        assert_eq!(
            default_context_id(&contexts, "node").as_deref(),
            Some("node")
        );
        // No default context yet: any of the language's.
        assert_eq!(
            default_context_id(&contexts[..1], "python").as_deref(),
            Some("ctx-1a2b3c")
        );
        assert_eq!(default_context_id(&contexts, "r"), None);
    }
}
