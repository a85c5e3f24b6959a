//! How the tools reach Sandcell: the typed operations they need ([`Sandcell`]), over the
//! service in this process ([`InProcess`]: no HTTP, no JSON bodies) or a daemon's REST API
//! ([`Remote`], `sandcell mcp --daemon`). Either way the tools get the service's validation,
//! ownership, limits and errors unchanged.

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::StreamExt;
use sandcell_agent::Runner;
use sandcell_api::SandboxId;
use sandcell_api::code::{
    CodeInput, CodeResult, ContextView, SetVariables, VariableNames, VariablesView,
};
use sandcell_api::exec::{ExecInput, ExecOutput};
use sandcell_api::memories::{
    AddMemory, InferJob, InferMemories, ListMemories, Memory, MemoryList, SearchMemories,
};
use sandcell_api::runs::{ForkRun, RunInfo, StartRun};
use sandcell_api::sandboxes::{CreateSandbox, SandboxInfo, SandboxList};
use sandcell_api::snapshots::{
    CreateSnapshot, ForkResult, ForkSnapshot, SnapshotInfo, SnapshotList,
};
use sandcell_api::templates::{BuildEvent, BuildInfo, StartBuild, TemplateList};
use sandcell_api::transfer::{CreateExport, ExportInfo, ExportList, ImportRequest, ImportResult};
use sandcell_client::{Client, ClientError, Method};
use sandcell_service::memory::Scope;
use sandcell_service::{Caller, Service, ServiceError};
use serde_json::Value;

/// A failed operation, as the service reports it: `{code, message, details}`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CallError {
    /// The stable, machine-readable code (`not_found`, `invalid_argument`, …).
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// More about it; `Null` when none.
    pub details: Value,
}

impl CallError {
    /// An error with this code and message.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
            details: Value::Null,
        }
    }
}

impl From<ServiceError> for CallError {
    fn from(e: ServiceError) -> Self {
        Self {
            code: e.code().to_string(),
            message: e.message,
            details: e.details,
        }
    }
}

impl From<sandcell_api::ValidationError> for CallError {
    fn from(e: sandcell_api::ValidationError) -> Self {
        Self::new("invalid_argument", e.0)
    }
}

impl From<ClientError> for CallError {
    fn from(e: ClientError) -> Self {
        if let Some(body) = e.body() {
            return Self {
                code: body.code.clone(),
                message: body.message.clone(),
                details: body.details.clone(),
            };
        }
        match &e {
            ClientError::Transport { what, source } => Self::new(
                "unreachable",
                format!("the sandcell daemon could not be reached ({what}): {source}"),
            ),
            other => Self::new("internal", other.to_string()),
        }
    }
}

/// What operations return.
pub type CallResult<T> = Result<T, CallError>;

/// The first bytes of a file, and how long it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHead {
    /// At most the limit asked for.
    pub bytes: Vec<u8>,
    /// The whole file's length.
    pub size: u64,
}

/// Appends `chunk` to `head` up to `limit` bytes, counting every byte.
fn take(head: &mut FileHead, chunk: &[u8], limit: usize) {
    let room = limit.saturating_sub(head.bytes.len());
    head.bytes
        .extend_from_slice(&chunk[..room.min(chunk.len())]);
    head.size += chunk.len() as u64;
}

/// The memories a call works on: a sandbox's, or the caller's own.
fn scope(sandbox: Option<&SandboxId>) -> Scope<'_> {
    sandbox.map_or(Scope::Owner, Scope::Sandbox)
}

/// The operations the tools call, each acting as one caller (the transport's).
#[async_trait]
pub trait Sandcell: Send + Sync {
    /// Creates a sandbox (or restores one from a snapshot).
    async fn create_sandbox(&self, req: CreateSandbox) -> CallResult<SandboxInfo>;
    /// One sandbox.
    async fn get_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo>;
    /// The active sandboxes, at most `limit`.
    async fn list_sandboxes(&self, limit: u32) -> CallResult<SandboxList>;
    /// Ends a sandbox.
    async fn delete_sandbox(&self, id: &SandboxId) -> CallResult<()>;
    /// Freezes a sandbox.
    async fn pause_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo>;
    /// Thaws a sandbox.
    async fn resume_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo>;
    /// Runs a command to its end.
    async fn exec(&self, id: &SandboxId, input: ExecInput) -> CallResult<ExecOutput>;
    /// Runs code in a kernel to its end.
    async fn run_code(&self, id: &SandboxId, input: CodeInput) -> CallResult<CodeResult>;
    /// A sandbox's kernels.
    async fn list_contexts(&self, id: &SandboxId) -> CallResult<Vec<ContextView>>;
    /// Variables of a kernel (`names`: all when `None`).
    async fn get_variables(
        &self,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> CallResult<VariablesView>;
    /// Sets variables in a kernel.
    async fn set_variables(
        &self,
        id: &SandboxId,
        context: &str,
        req: SetVariables,
    ) -> CallResult<VariableNames>;
    /// Deletes variables of a kernel (`names`: all user variables when `None`).
    async fn clear_variables(
        &self,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> CallResult<VariableNames>;
    /// Puts a file or folder into a sandbox.
    async fn import(&self, id: &SandboxId, req: ImportRequest) -> CallResult<ImportResult>;
    /// Clones a git repository into a sandbox (on the host).
    async fn git_clone(
        &self,
        id: &SandboxId,
        req: sandcell_api::git::GitClone,
    ) -> CallResult<sandcell_api::git::GitCloneResult>;
    /// The first `limit` bytes of a file in a sandbox, and its length.
    async fn read_file(&self, id: &SandboxId, path: &str, limit: usize) -> CallResult<FileHead>;
    /// Copies a file or folder out of a sandbox into the service's keeping.
    async fn create_export(&self, id: &SandboxId, req: CreateExport) -> CallResult<ExportInfo>;
    /// The caller's exports (of one sandbox when given).
    async fn list_exports(&self, sandbox: Option<&SandboxId>) -> CallResult<ExportList>;
    /// Deletes an export.
    async fn delete_export(&self, export_id: &str) -> CallResult<()>;
    /// Takes a snapshot of a sandbox.
    async fn create_snapshot(
        &self,
        id: &SandboxId,
        req: CreateSnapshot,
    ) -> CallResult<SnapshotInfo>;
    /// Makes sandboxes from a snapshot.
    async fn fork_snapshot(&self, snapshot_id: &str, req: ForkSnapshot) -> CallResult<ForkResult>;
    /// The caller's snapshots (of one sandbox when given).
    async fn list_snapshots(&self, sandbox: Option<&SandboxId>) -> CallResult<SnapshotList>;
    /// Starts an agent run (answers at once unless `req.wait`).
    async fn start_run(&self, req: StartRun) -> CallResult<RunInfo>;
    /// One agent run.
    async fn get_run(&self, run_id: &str) -> CallResult<RunInfo>;
    /// The last `n` events of a run's trajectory, oldest first.
    async fn last_run_events(&self, run_id: &str, n: u32) -> CallResult<Vec<Value>>;
    /// Cancels a run; its ended record.
    async fn cancel_run(&self, run_id: &str) -> CallResult<RunInfo>;
    /// A new run from one of a run's committed steps (answers at once unless `req.wait`).
    async fn fork_run(&self, run_id: &str, req: ForkRun) -> CallResult<RunInfo>;
    /// Takes up a run a stopped process left unfinished; answers at once.
    async fn resume_run(&self, run_id: &str) -> CallResult<RunInfo>;
    /// Remembers something for a sandbox (`Some`) or for the caller as an owner (`None`).
    async fn add_memory(&self, sandbox: Option<&SandboxId>, req: AddMemory) -> CallResult<Memory>;
    /// A scope's memories matching the query's words, most relevant first, with scores.
    async fn search_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: SearchMemories,
    ) -> CallResult<MemoryList>;
    /// A page of a scope's memories, newest first.
    async fn list_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: ListMemories,
    ) -> CallResult<MemoryList>;
    /// Forgets any memory of the caller's, a sandbox's included (its id names it).
    async fn delete_memory(&self, memory_id: &str) -> CallResult<()>;
    /// Starts extracting facts from a text with the configured model into a scope's memories.
    async fn infer_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: InferMemories,
    ) -> CallResult<InferJob>;
    /// Any infer job of the caller's, a sandbox's included (its id names it).
    async fn get_infer_job(&self, job_id: &str) -> CallResult<InferJob>;
    /// Starts a template build (waits for its end with `req.wait`).
    async fn start_build(&self, req: StartBuild) -> CallResult<BuildInfo>;
    /// A build.
    async fn get_build(&self, build_id: &str) -> CallResult<BuildInfo>;
    /// A build's last `n` log events.
    async fn last_build_events(&self, build_id: &str, n: usize) -> CallResult<Vec<BuildEvent>>;
    /// The templates.
    async fn list_templates(&self) -> CallResult<TemplateList>;
    /// The base URL clients outside this process can reach (for download links), if any.
    fn public_base(&self) -> Option<String>;
}

/// The service in this process, called directly as `caller`.
#[derive(Clone)]
pub struct InProcess {
    service: Arc<Service>,
    /// The agent runs over the service, or why there are none.
    runner: Result<Arc<Runner>, CallError>,
    caller: Caller,
}

impl InProcess {
    /// Operations on `service` acting as `caller`, with agent runs of their own over it
    /// (from the service's `[agent]` settings). A process whose other front ends start runs
    /// too should share one runner: [`InProcess::with_runner`].
    pub fn new(service: Arc<Service>, caller: Caller) -> Self {
        let runner = Runner::from_service(service.clone())
            .map(Arc::new)
            .map_err(CallError::from);
        Self {
            service,
            runner,
            caller,
        }
    }

    /// Operations on `service` and the agent runs of `runner`, acting as `caller`.
    pub fn with_runner(service: Arc<Service>, runner: Arc<Runner>, caller: Caller) -> Self {
        Self {
            service,
            runner: Ok(runner),
            caller,
        }
    }

    fn runner(&self) -> CallResult<&Arc<Runner>> {
        self.runner.as_ref().map_err(Clone::clone)
    }
}

#[async_trait]
impl Sandcell for InProcess {
    async fn create_sandbox(&self, req: CreateSandbox) -> CallResult<SandboxInfo> {
        Ok(self.service.create_sandbox(&self.caller, req).await?)
    }

    async fn get_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo> {
        Ok(self.service.get_sandbox(&self.caller, id)?)
    }

    async fn list_sandboxes(&self, limit: u32) -> CallResult<SandboxList> {
        let req = sandcell_service::sandboxes::ListSandboxes {
            limit,
            ..Default::default()
        };
        Ok(self.service.list_sandboxes(&self.caller, req)?)
    }

    async fn delete_sandbox(&self, id: &SandboxId) -> CallResult<()> {
        Ok(self.service.delete_sandbox(&self.caller, id).await?)
    }

    async fn pause_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo> {
        Ok(self.service.pause_sandbox(&self.caller, id).await?)
    }

    async fn resume_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo> {
        Ok(self.service.resume_sandbox(&self.caller, id).await?)
    }

    async fn exec(&self, id: &SandboxId, input: ExecInput) -> CallResult<ExecOutput> {
        Ok(self.service.exec(&self.caller, id, input).await?)
    }

    async fn run_code(&self, id: &SandboxId, input: CodeInput) -> CallResult<CodeResult> {
        Ok(self.service.run_code(&self.caller, id, input).await?)
    }

    async fn list_contexts(&self, id: &SandboxId) -> CallResult<Vec<ContextView>> {
        Ok(self.service.list_contexts(&self.caller, id).await?)
    }

    async fn get_variables(
        &self,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> CallResult<VariablesView> {
        Ok(self
            .service
            .get_variables(&self.caller, id, context, names)
            .await?)
    }

    async fn set_variables(
        &self,
        id: &SandboxId,
        context: &str,
        req: SetVariables,
    ) -> CallResult<VariableNames> {
        Ok(self
            .service
            .set_variables(&self.caller, id, context, req)
            .await?)
    }

    async fn clear_variables(
        &self,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> CallResult<VariableNames> {
        Ok(self
            .service
            .clear_variables(&self.caller, id, context, names)
            .await?)
    }

    async fn import(&self, id: &SandboxId, req: ImportRequest) -> CallResult<ImportResult> {
        Ok(self.service.import(&self.caller, id, req).await?)
    }

    async fn git_clone(
        &self,
        id: &SandboxId,
        req: sandcell_api::git::GitClone,
    ) -> CallResult<sandcell_api::git::GitCloneResult> {
        Ok(self.service.git_clone(&self.caller, id, req).await?)
    }

    async fn read_file(&self, id: &SandboxId, path: &str, limit: usize) -> CallResult<FileHead> {
        let mut download = self.service.download_file(&self.caller, id, path).await?;
        // Longer than asked for: its length is all that is wanted, no need to read it.
        if let Some(length) = download.length.filter(|l| *l > limit as u64) {
            return Ok(FileHead {
                bytes: Vec::new(),
                size: length,
            });
        }
        let mut head = FileHead {
            bytes: Vec::new(),
            size: 0,
        };
        while let Some(chunk) = download.chunks.next().await {
            take(&mut head, &chunk?, limit);
        }
        Ok(head)
    }

    async fn create_export(&self, id: &SandboxId, req: CreateExport) -> CallResult<ExportInfo> {
        Ok(self.service.create_export(&self.caller, id, req).await?)
    }

    async fn list_exports(&self, sandbox: Option<&SandboxId>) -> CallResult<ExportList> {
        Ok(self.service.list_exports(&self.caller, sandbox)?)
    }

    async fn delete_export(&self, export_id: &str) -> CallResult<()> {
        Ok(self.service.delete_export(&self.caller, export_id).await?)
    }

    async fn create_snapshot(
        &self,
        id: &SandboxId,
        req: CreateSnapshot,
    ) -> CallResult<SnapshotInfo> {
        Ok(self.service.create_snapshot(&self.caller, id, req).await?)
    }

    async fn fork_snapshot(&self, snapshot_id: &str, req: ForkSnapshot) -> CallResult<ForkResult> {
        Ok(self
            .service
            .fork_snapshot(&self.caller, snapshot_id, req)
            .await?)
    }

    async fn list_snapshots(&self, sandbox: Option<&SandboxId>) -> CallResult<SnapshotList> {
        Ok(self.service.list_snapshots(&self.caller, sandbox)?)
    }

    async fn start_run(&self, req: StartRun) -> CallResult<RunInfo> {
        Ok(self.runner()?.start(&self.caller, req).await?)
    }

    async fn get_run(&self, run_id: &str) -> CallResult<RunInfo> {
        Ok(self.runner()?.get(&self.caller, run_id)?)
    }

    async fn last_run_events(&self, run_id: &str, n: u32) -> CallResult<Vec<Value>> {
        Ok(self.runner()?.last_events(&self.caller, run_id, n)?)
    }

    async fn cancel_run(&self, run_id: &str) -> CallResult<RunInfo> {
        Ok(self.runner()?.cancel(&self.caller, run_id).await?)
    }

    async fn fork_run(&self, run_id: &str, req: ForkRun) -> CallResult<RunInfo> {
        Ok(self.runner()?.fork(&self.caller, run_id, req).await?)
    }

    async fn resume_run(&self, run_id: &str) -> CallResult<RunInfo> {
        Ok(self.runner()?.resume(&self.caller, run_id, false).await?)
    }

    async fn add_memory(&self, sandbox: Option<&SandboxId>, req: AddMemory) -> CallResult<Memory> {
        Ok(self
            .service
            .add_memory(&self.caller, scope(sandbox), req)
            .await?)
    }

    async fn search_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: SearchMemories,
    ) -> CallResult<MemoryList> {
        Ok(self
            .service
            .search_memories(&self.caller, scope(sandbox), req)
            .await?)
    }

    async fn list_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: ListMemories,
    ) -> CallResult<MemoryList> {
        Ok(self
            .service
            .list_memories(&self.caller, scope(sandbox), req)?)
    }

    async fn delete_memory(&self, memory_id: &str) -> CallResult<()> {
        Ok(self
            .service
            .delete_memory(&self.caller, Scope::Owner, memory_id)?)
    }

    async fn infer_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: InferMemories,
    ) -> CallResult<InferJob> {
        Ok(self
            .service
            .infer_memories(&self.caller, scope(sandbox), req)
            .await?)
    }

    async fn get_infer_job(&self, job_id: &str) -> CallResult<InferJob> {
        Ok(self
            .service
            .get_infer_job(&self.caller, Scope::Owner, job_id)?)
    }

    async fn start_build(&self, req: StartBuild) -> CallResult<BuildInfo> {
        Ok(self.service.start_build(&self.caller, req).await?)
    }

    async fn get_build(&self, build_id: &str) -> CallResult<BuildInfo> {
        Ok(self.service.build_info(build_id)?)
    }

    async fn last_build_events(&self, build_id: &str, n: usize) -> CallResult<Vec<BuildEvent>> {
        let all = self.service.build_log(build_id, 0, usize::MAX)?.events;
        Ok(tail(all.into_iter().map(|e| e.event).collect(), n))
    }

    async fn list_templates(&self) -> CallResult<TemplateList> {
        Ok(self.service.list_templates().await?)
    }

    /// None: links are made from the MCP request's own Host when it came over HTTP.
    fn public_base(&self) -> Option<String> {
        None
    }
}

/// The last `n` of `items`.
fn tail<T>(mut items: Vec<T>, n: usize) -> Vec<T> {
    let cut = items.len().saturating_sub(n);
    items.drain(..cut);
    items
}

/// A daemon's REST API, through the typed client (acting with the client's key).
#[derive(Clone)]
pub struct Remote {
    client: Client,
}

impl Remote {
    /// Operations on the daemon `client` talks to.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl Sandcell for Remote {
    async fn create_sandbox(&self, req: CreateSandbox) -> CallResult<SandboxInfo> {
        Ok(self.client.create_sandbox(&req).await?)
    }

    async fn get_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo> {
        Ok(self.client.sandbox(id).await?)
    }

    async fn list_sandboxes(&self, limit: u32) -> CallResult<SandboxList> {
        let req = sandcell_client::ListSandboxes {
            limit: Some(limit),
            ..Default::default()
        };
        Ok(self.client.list_sandboxes(&req).await?)
    }

    async fn delete_sandbox(&self, id: &SandboxId) -> CallResult<()> {
        Ok(self.client.delete_sandbox(id).await?)
    }

    async fn pause_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo> {
        Ok(self.client.pause_sandbox(id).await?)
    }

    async fn resume_sandbox(&self, id: &SandboxId) -> CallResult<SandboxInfo> {
        Ok(self.client.resume_sandbox(id).await?)
    }

    async fn exec(&self, id: &SandboxId, input: ExecInput) -> CallResult<ExecOutput> {
        Ok(self.client.exec(id, &input).await?)
    }

    async fn run_code(&self, id: &SandboxId, input: CodeInput) -> CallResult<CodeResult> {
        Ok(self.client.run_code(id, &input).await?)
    }

    async fn list_contexts(&self, id: &SandboxId) -> CallResult<Vec<ContextView>> {
        Ok(self.client.contexts(id).await?)
    }

    async fn get_variables(
        &self,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> CallResult<VariablesView> {
        Ok(self.client.variables(id, context, names.as_deref()).await?)
    }

    async fn set_variables(
        &self,
        id: &SandboxId,
        context: &str,
        req: SetVariables,
    ) -> CallResult<VariableNames> {
        Ok(self.client.set_variables(id, context, &req).await?)
    }

    async fn clear_variables(
        &self,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> CallResult<VariableNames> {
        Ok(self
            .client
            .clear_variables(id, context, names.as_deref())
            .await?)
    }

    async fn import(&self, id: &SandboxId, req: ImportRequest) -> CallResult<ImportResult> {
        Ok(self.client.import(id, &req).await?)
    }

    async fn git_clone(
        &self,
        id: &SandboxId,
        req: sandcell_api::git::GitClone,
    ) -> CallResult<sandcell_api::git::GitCloneResult> {
        Ok(self.client.git_clone(id, &req).await?)
    }

    async fn read_file(&self, id: &SandboxId, path: &str, limit: usize) -> CallResult<FileHead> {
        let mut head = FileHead {
            bytes: Vec::new(),
            size: 0,
        };
        self.client
            .read_file(id, path, |chunk| {
                take(&mut head, chunk, limit);
                Ok(())
            })
            .await?;
        Ok(head)
    }

    async fn create_export(&self, id: &SandboxId, req: CreateExport) -> CallResult<ExportInfo> {
        Ok(self.client.create_export(id, &req).await?)
    }

    async fn list_exports(&self, sandbox: Option<&SandboxId>) -> CallResult<ExportList> {
        // The client's `exports` lists them all: the filter is the route's own query.
        let pairs: Vec<(&str, &str)> = sandbox
            .map(|s| ("sandbox_id", s.as_str()))
            .into_iter()
            .collect();
        let path = format!("/v1/exports{}", sandcell_client::query(&pairs));
        Ok(self.client.call(Method::GET, &path, None::<&()>).await?)
    }

    async fn delete_export(&self, export_id: &str) -> CallResult<()> {
        Ok(self.client.delete_export(export_id).await?)
    }

    async fn create_snapshot(
        &self,
        id: &SandboxId,
        req: CreateSnapshot,
    ) -> CallResult<SnapshotInfo> {
        Ok(self.client.create_snapshot(id, &req).await?)
    }

    async fn fork_snapshot(&self, snapshot_id: &str, req: ForkSnapshot) -> CallResult<ForkResult> {
        Ok(self.client.fork_snapshot(snapshot_id, &req).await?)
    }

    async fn list_snapshots(&self, sandbox: Option<&SandboxId>) -> CallResult<SnapshotList> {
        Ok(self
            .client
            .snapshots(sandbox.map(SandboxId::as_str))
            .await?)
    }

    async fn start_run(&self, req: StartRun) -> CallResult<RunInfo> {
        Ok(self.client.start_run(&req).await?)
    }

    async fn get_run(&self, run_id: &str) -> CallResult<RunInfo> {
        Ok(self.client.run(run_id).await?)
    }

    async fn last_run_events(&self, run_id: &str, n: u32) -> CallResult<Vec<Value>> {
        let mut events = self.client.run_events(run_id, 0).await?;
        let keep = events.len().saturating_sub(n as usize);
        Ok(events.split_off(keep))
    }

    async fn cancel_run(&self, run_id: &str) -> CallResult<RunInfo> {
        Ok(self.client.cancel_run(run_id).await?)
    }

    async fn fork_run(&self, run_id: &str, req: ForkRun) -> CallResult<RunInfo> {
        Ok(self.client.fork_run(run_id, &req).await?)
    }

    async fn resume_run(&self, run_id: &str) -> CallResult<RunInfo> {
        Ok(self.client.resume_run(run_id).await?)
    }

    async fn add_memory(&self, sandbox: Option<&SandboxId>, req: AddMemory) -> CallResult<Memory> {
        Ok(self
            .client
            .add_memory(sandbox.map(SandboxId::as_str), &req)
            .await?)
    }

    async fn search_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: SearchMemories,
    ) -> CallResult<MemoryList> {
        Ok(self
            .client
            .search_memories(sandbox.map(SandboxId::as_str), &req)
            .await?)
    }

    async fn list_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: ListMemories,
    ) -> CallResult<MemoryList> {
        Ok(self
            .client
            .memories(sandbox.map(SandboxId::as_str), &req)
            .await?)
    }

    async fn delete_memory(&self, memory_id: &str) -> CallResult<()> {
        // Without a sandbox the route takes any of the caller's memories.
        Ok(self.client.delete_memory(None, memory_id).await?)
    }

    async fn infer_memories(
        &self,
        sandbox: Option<&SandboxId>,
        req: InferMemories,
    ) -> CallResult<InferJob> {
        Ok(self
            .client
            .infer_memories(sandbox.map(SandboxId::as_str), &req)
            .await?)
    }

    async fn get_infer_job(&self, job_id: &str) -> CallResult<InferJob> {
        // Without a sandbox the route takes any of the caller's jobs.
        Ok(self.client.infer_job(None, job_id).await?)
    }

    async fn start_build(&self, req: StartBuild) -> CallResult<BuildInfo> {
        Ok(self.client.start_build(&req).await?)
    }

    async fn get_build(&self, build_id: &str) -> CallResult<BuildInfo> {
        Ok(self.client.build(build_id).await?)
    }

    async fn last_build_events(&self, build_id: &str, n: usize) -> CallResult<Vec<BuildEvent>> {
        let info = self.client.build(build_id).await?;
        let mut events = Vec::new();
        // A build that goes on is read up to now, not followed.
        if info.state.is_final() {
            let mut stream = self.client.follow_build(build_id, 0).await?;
            while let Some(e) = stream.next().await {
                events.push(e?.event);
            }
        }
        Ok(tail(events, n))
    }

    async fn list_templates(&self) -> CallResult<TemplateList> {
        Ok(self.client.templates().await?)
    }

    fn public_base(&self) -> Option<String> {
        Some(self.client.base_url().trim_end_matches('/').to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_head_keeps_the_limit_and_counts_everything() {
        let mut head = FileHead {
            bytes: Vec::new(),
            size: 0,
        };
        take(&mut head, b"hello ", 8);
        take(&mut head, b"world", 8);
        assert_eq!((head.bytes.as_slice(), head.size), (&b"hello wo"[..], 11));
    }

    #[test]
    fn client_errors_keep_the_daemons_code_message_and_details() {
        let e: CallError = ClientError::Api {
            status: 409,
            body: sandcell_client::parse_error_body(
                br#"{"code":"has_children","message":"snapshot sn-1 has children","details":{"children":["sn-2"]}}"#,
            ),
        }
        .into();
        assert_eq!(e.to_string(), "has_children: snapshot sn-1 has children");
        assert_eq!(e.details["children"][0], "sn-2");
        let e: CallError = ClientError::Decode {
            route: "/v1/sandboxes".into(),
            message: "missing field `id`".into(),
        }
        .into();
        assert_eq!(e.code, "internal");
    }

    #[tokio::test]
    async fn a_daemon_that_cannot_be_reached_is_unreachable() {
        // Port 1 on loopback: nothing listens there.
        let client = Client::builder("http://127.0.0.1:1").build().unwrap();
        let e = Remote::new(client)
            .get_sandbox(&"sb-0123456789abcdef".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.code, "unreachable", "{e}");
        assert!(
            e.message
                .starts_with("the sandcell daemon could not be reached"),
            "{e}"
        );
    }

    #[test]
    fn service_errors_keep_their_code_message_and_details() {
        let e: CallError = ServiceError::not_found("sandbox", "sb-x")
            .with_details(serde_json::json!({"id": "sb-x"}))
            .into();
        assert_eq!(e.to_string(), "not_found: no sandbox 'sb-x'");
        assert_eq!(e.details["id"], "sb-x");
    }
}
