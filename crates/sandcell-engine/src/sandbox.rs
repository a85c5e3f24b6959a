//! A running sandbox: exec, processes, files, destroy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sandcell_protocol::exec::MAX_BUFFER_BYTES;
use sandcell_protocol::{
    Channel, ExecCommand, ExecExit, ExecRequest, ExecResult, FileEntry, GuestMessage, HostMessage,
    IsolationReport, ProcessInfo,
};
use serde::Serialize;

use crate::backend::{BackendFeatures, BackendInstance, ResourceCounters};
use crate::client::{Call, GuestClient, Reply};
use crate::egress::EgressHandle;
use crate::error::EngineError;
use crate::spec::{NetworkPolicy, SandboxSpec, validate_env};

/// How long the host waits past an exec's own timeout before it stops trusting the agent.
const WATCHDOG_GRACE: Duration = Duration::from_secs(5);
/// Longest a file or process request may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// How long creation took, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timings {
    /// The backend's launch (namespaces, mounts, cgroups).
    pub launch_ms: f64,
    /// The agent's handshake.
    pub handshake_ms: f64,
    /// The whole `create`.
    pub create_ms: f64,
}

struct Inner {
    id: String,
    spec: SandboxSpec,
    client: GuestClient,
    instance: Box<dyn BackendInstance>,
    /// What its backend can do.
    features: BackendFeatures,
    isolation: IsolationReport,
    agent_version: String,
    timings: Timings,
    destroyed: AtomicBool,
    /// Frozen by [`Sandbox::pause`].
    paused: AtomicBool,
    /// Its egress proxy (none when its network is `off`).
    egress: Option<EgressHandle>,
    /// Left to outlive this process ([`Sandbox::detach`]): its egress folder stays for the
    /// next process.
    detached: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(egress) = &self.egress
            && !self.detached.load(Ordering::SeqCst)
        {
            egress.remove();
        }
    }
}

/// A running sandbox. Cheap to clone; every clone is the same sandbox.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

/// Everything an exec produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecOutput {
    /// Captured stdout (up to the exec's limit).
    pub stdout: Vec<u8>,
    /// Captured stderr (up to the exec's limit).
    pub stderr: Vec<u8>,
    /// How it ended.
    pub result: ExecResult,
}

/// One event of a streamed exec.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    /// Bytes on stdout.
    Stdout(Vec<u8>),
    /// Bytes on stderr.
    Stderr(Vec<u8>),
    /// The process ended; no events follow.
    Exit(ExecResult),
}

/// A running exec.
pub struct ExecStream {
    sandbox: Sandbox,
    call: Call,
    pid: i32,
    before: ResourceCounters,
    timeout_ms: Option<u64>,
    stdin_seq: u64,
    done: bool,
}

impl ExecStream {
    /// The process's pid inside the sandbox.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The request id, usable with [`Sandbox::signal_exec`].
    pub fn exec_id(&self) -> u32 {
        self.call.id
    }

    /// Sends bytes to the process's stdin (the request must have set `stdin`).
    pub async fn write_stdin(&mut self, bytes: &[u8]) -> Result<(), EngineError> {
        let client = &self.sandbox.inner.client;
        self.stdin_seq = client
            .send_data(self.call.id, Channel::Stdin, self.stdin_seq, bytes)
            .await?;
        Ok(())
    }

    /// Closes the process's stdin.
    pub async fn close_stdin(&mut self) -> Result<(), EngineError> {
        self.sandbox
            .inner
            .client
            .send(self.call.id, &HostMessage::StdinClose)
            .await
    }

    /// The next event; `None` after `Exit`.
    pub async fn next(&mut self) -> Option<Result<ExecEvent, EngineError>> {
        if self.done {
            return None;
        }
        let limit = self
            .timeout_ms
            .map(|t| Duration::from_millis(t) + WATCHDOG_GRACE);
        let Some(reply) = self.call.next_within(limit).await else {
            let t = self.timeout_ms.unwrap_or_default();
            return Some(Err(self.agent_overdue(t).await));
        };
        let event = match reply {
            Reply::Data(chunk) if chunk.channel == Channel::Stdout => {
                Ok(ExecEvent::Stdout(chunk.bytes))
            }
            Reply::Data(chunk) if chunk.channel == Channel::Stderr => {
                Ok(ExecEvent::Stderr(chunk.bytes))
            }
            Reply::Data(chunk) => Err(EngineError::Connection(format!(
                "unexpected {:?} chunk in an exec",
                chunk.channel
            ))),
            Reply::Message(GuestMessage::ExecExited(exit)) => {
                self.done = true;
                Ok(ExecEvent::Exit(self.sandbox.classify_exit(
                    &self.before,
                    &exit,
                    self.timeout_ms,
                )))
            }
            Reply::Message(GuestMessage::Error(e)) => {
                self.done = true;
                Err(EngineError::Guest(e))
            }
            Reply::Message(other) => Err(EngineError::Connection(format!(
                "unexpected reply {other:?}"
            ))),
            Reply::Closed(reason) => {
                self.done = true;
                Err(self.sandbox.gone(reason))
            }
        };
        Some(event)
    }

    /// Sets the window size of the exec's terminal (the request must have set `pty`).
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<(), EngineError> {
        self.sandbox.resize_pty(self.pid, rows, cols).await
    }

    /// Collects everything until the process ends.
    pub async fn collect(mut self) -> Result<ExecOutput, EngineError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(event) = self.next().await {
            match event? {
                ExecEvent::Stdout(b) => stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
                ExecEvent::Exit(result) => {
                    return Ok(ExecOutput {
                        stdout,
                        stderr,
                        result,
                    });
                }
            }
        }
        Err(EngineError::Connection(
            "exec ended without an exit status".into(),
        ))
    }

    /// The agent missed the exec's deadline by the whole grace period: kill the tree from
    /// here and report the agent as unresponsive.
    async fn agent_overdue(&mut self, timeout_ms: u64) -> EngineError {
        self.done = true;
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            self.sandbox.signal_exec(self.call.id, 9, true),
        )
        .await;
        EngineError::Unresponsive(format!(
            "no exit status {} s after the exec's {timeout_ms} ms timeout; its tree was sent SIGKILL",
            WATCHDOG_GRACE.as_secs()
        ))
    }
}

impl Sandbox {
    #[allow(clippy::too_many_arguments)] // One of each part; called from one place.
    pub(crate) fn new(
        id: String,
        spec: SandboxSpec,
        client: GuestClient,
        instance: Box<dyn BackendInstance>,
        features: BackendFeatures,
        isolation: IsolationReport,
        egress: Option<EgressHandle>,
        agent_version: String,
        timings: Timings,
    ) -> Self {
        let inner = Inner {
            id,
            spec,
            client,
            instance,
            features,
            isolation,
            agent_version,
            timings,
            destroyed: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            egress,
            detached: AtomicBool::new(false),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Its resource use now: memory, CPU time, processes (from its cgroup where it has one).
    pub fn usage(&self) -> ResourceCounters {
        self.inner.instance.usage()
    }

    /// What another process needs to reach this sandbox again ([`crate::Engine::reattach`]);
    /// `Null` when its backend cannot.
    pub fn runtime(&self) -> serde_json::Value {
        self.inner.instance.runtime()
    }

    /// Lets the sandbox outlive this process: dropping the last handle no longer ends it.
    pub fn detach(&self) {
        self.inner.detached.store(true, Ordering::SeqCst);
        self.inner.instance.detach();
    }

    /// What its network reaches now (its spec's policy, or the one set since with
    /// [`Self::set_network`]).
    pub fn network(&self) -> NetworkPolicy {
        match &self.inner.egress {
            Some(egress) => egress.policy(),
            None => self.inner.spec.network.clone(),
        }
    }

    /// Changes what its network reaches: the next connection through its egress proxy is
    /// decided under `policy` (open ones stay). `off` is fixed when a sandbox is made (its
    /// processes cannot get the sockets back), so changes to or from it are refused.
    pub fn set_network(&self, policy: NetworkPolicy) -> Result<(), EngineError> {
        let now = self.network();
        match &self.inner.egress {
            _ if policy == now => Ok(()),
            Some(egress) if policy != NetworkPolicy::Off => {
                egress.set_policy(policy);
                Ok(())
            }
            _ if now == NetworkPolicy::Off || policy == NetworkPolicy::Off => {
                Err(EngineError::InvalidRequest(format!(
                    "network '{now}' cannot become '{policy}' on a running sandbox: 'off' is set \
                     when a sandbox is made (its processes have no inet sockets, or have them \
                     already); create a new sandbox instead"
                )))
            }
            _ => Err(EngineError::InvalidRequest(format!(
                "sandbox {} has no egress proxy (its backend binds none), so its network \
                 stays '{now}'",
                self.inner.id
            ))),
        }
    }

    /// Connections open through its egress proxy now.
    pub fn egress_connections(&self) -> u32 {
        self.inner
            .egress
            .as_ref()
            .map_or(0, EgressHandle::open_connections)
    }

    /// Gives its egress proxy `secrets` (see [`EgressHandle::set_secrets`]).
    pub fn set_secrets(&self, secrets: sandcell_egress::Secrets) -> Result<(), EngineError> {
        match &self.inner.egress {
            Some(egress) => egress.set_secrets(secrets),
            None => Err(EngineError::InvalidRequest(format!(
                "sandbox {} has no egress proxy (its network is 'off'): it cannot use secrets",
                self.inner.id
            ))),
        }
    }

    /// Bytes its egress proxy carried, both directions (0 without one).
    pub fn egress_bytes(&self) -> u64 {
        self.inner.egress.as_ref().map_or(0, EgressHandle::bytes)
    }

    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The spec it was created from.
    pub fn spec(&self) -> &SandboxSpec {
        &self.inner.spec
    }

    /// The isolation it actually got, feature by feature.
    pub fn isolation(&self) -> &IsolationReport {
        &self.inner.isolation
    }

    /// The guest agent's version.
    pub fn agent_version(&self) -> &str {
        &self.inner.agent_version
    }

    /// How long creation took.
    pub fn timings(&self) -> Timings {
        self.inner.timings
    }

    /// The pid of the sandbox's first process on the host.
    pub fn host_pid(&self) -> Option<i32> {
        self.inner.instance.host_pid()
    }

    /// The agent's connection.
    pub(crate) fn client(&self) -> &GuestClient {
        &self.inner.client
    }

    /// Current resource counters.
    pub fn counters(&self) -> ResourceCounters {
        self.inner.instance.counters()
    }

    /// OOM kills in the sandbox so far (one read; `None` when the backend cannot tell).
    pub(crate) fn oom_kills(&self) -> Option<u64> {
        self.inner.instance.oom_kills()
    }

    /// Classifies an exit with how much the resource counters rose since `before`.
    pub(crate) fn classify_exit(
        &self,
        before: &ResourceCounters,
        exit: &ExecExit,
        timeout_ms: Option<u64>,
    ) -> ExecResult {
        // Only the two counters that explain an exit (each read is on every exec's critical
        // path); the OOM one on every exit, since a shell survives its child's OOM kill.
        let after = ResourceCounters {
            oom_kills: self.inner.instance.oom_kills(),
            pids_limit_hits: self.inner.instance.pids_limit_hits(),
            ..ResourceCounters::default()
        };
        let delta = |a: Option<u64>, b: Option<u64>| a.unwrap_or(0).saturating_sub(b.unwrap_or(0));
        let oom_kills = delta(after.oom_kills, before.oom_kills);
        let pids_limit_hits = delta(after.pids_limit_hits, before.pids_limit_hits);
        ExecResult::classify(exit, oom_kills, pids_limit_hits, timeout_ms)
    }

    /// Starts a process and streams its output. With `req.pty` set it runs on a new
    /// pseudo-terminal: its output is one stdout stream, [`ExecStream::write_stdin`] types into
    /// it and [`ExecStream::resize`] sets its size. Background requests are refused: start
    /// those with [`Sandbox::spawn`].
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream, EngineError> {
        self.check_alive().await?;
        let req = prepare_exec(&self.inner.spec, req)?;
        let call = self
            .inner
            .client
            .request(&HostMessage::Exec(req.clone()))
            .await
            .map_err(|e| self.map_closed(e))?;
        self.exec_started(call, &req).await
    }

    /// Follows an exec request already sent on `call` (prepared by [`prepare_exec`]).
    pub(crate) async fn exec_started(
        &self,
        mut call: Call,
        req: &ExecRequest,
    ) -> Result<ExecStream, EngineError> {
        // Read while the agent spawns: the process cannot have run into a limit yet.
        let before = self.inner.instance.counters();
        let pid = match call.message().await.map_err(|e| self.map_closed(e))? {
            GuestMessage::ExecStarted { pid } => pid,
            other => {
                return Err(EngineError::Connection(format!(
                    "unexpected exec reply {other:?}"
                )));
            }
        };
        Ok(ExecStream {
            sandbox: self.clone(),
            call,
            pid,
            before,
            timeout_ms: req.timeout_ms,
            stdin_seq: 0,
            done: false,
        })
    }

    /// Runs a process to completion and returns its output and how it ended.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, EngineError> {
        self.exec_stream(req).await?.collect().await
    }

    /// Runs a process with `stdin` as its standard input.
    pub async fn exec_with_stdin(
        &self,
        mut req: ExecRequest,
        stdin: &[u8],
    ) -> Result<ExecOutput, EngineError> {
        req.stdin = true;
        let mut stream = self.exec_stream(req).await?;
        stream.write_stdin(stdin).await?;
        stream.close_stdin().await?;
        stream.collect().await
    }

    /// Sends a signal to an exec's process, or with `tree` to its whole process tree.
    pub async fn signal_exec(
        &self,
        exec_id: u32,
        signal: i32,
        tree: bool,
    ) -> Result<(), EngineError> {
        self.expect_ok(HostMessage::Signal {
            exec_id: Some(exec_id),
            pid: None,
            signal,
            tree,
        })
        .await
    }

    /// Sends a signal to a process by its pid inside the sandbox.
    pub async fn kill_process(&self, pid: i32, signal: i32, tree: bool) -> Result<(), EngineError> {
        self.expect_ok(HostMessage::Signal {
            exec_id: None,
            pid: Some(pid),
            signal,
            tree,
        })
        .await
    }

    /// The sandbox's processes.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, EngineError> {
        match self.simple_call(HostMessage::ListProcesses).await? {
            GuestMessage::Processes { processes } => Ok(processes),
            other => Err(unexpected(other)),
        }
    }

    /// Writes a file (creating parent directories), replacing it atomically.
    pub async fn write_file(
        &self,
        path: &str,
        bytes: &[u8],
        mode: Option<u32>,
    ) -> Result<FileEntry, EngineError> {
        self.upload(path, bytes, mode, false).await
    }

    /// Appends to a file, creating it when missing.
    pub async fn append_file(&self, path: &str, bytes: &[u8]) -> Result<FileEntry, EngineError> {
        self.upload(path, bytes, None, true).await
    }

    async fn upload(
        &self,
        path: &str,
        bytes: &[u8],
        mode: Option<u32>,
        append: bool,
    ) -> Result<FileEntry, EngineError> {
        let mut upload = self.begin_upload(path, mode, append).await?;
        upload.write(bytes).await?;
        upload.finish().await
    }

    /// Reads a whole file.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, EngineError> {
        self.begin_download(path).await?.read_to_end().await
    }

    /// Lists a directory.
    pub async fn list_dir(&self, path: &str) -> Result<Vec<FileEntry>, EngineError> {
        match self
            .simple_call(HostMessage::ListDir {
                path: path.to_string(),
            })
            .await?
        {
            GuestMessage::Listing { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// Describes one path (a final symlink is not followed).
    pub async fn stat(&self, path: &str) -> Result<FileEntry, EngineError> {
        self.entry_call(HostMessage::Stat {
            path: path.to_string(),
        })
        .await
    }

    /// Creates a directory and its missing parents.
    pub async fn make_dir(&self, path: &str) -> Result<FileEntry, EngineError> {
        self.entry_call(HostMessage::MakeDir {
            path: path.to_string(),
        })
        .await
    }

    /// Removes a file, a symlink or a directory (non-empty only with `recursive`).
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), EngineError> {
        self.expect_ok(HostMessage::Remove {
            path: path.to_string(),
            recursive,
        })
        .await
    }

    /// Renames a path.
    pub async fn rename(&self, from: &str, to: &str) -> Result<FileEntry, EngineError> {
        self.entry_call(HostMessage::Rename {
            from: from.to_string(),
            to: to.to_string(),
        })
        .await
    }

    /// Kills everything in the sandbox and waits until it is gone. Idempotent.
    pub async fn destroy(&self) -> Result<(), EngineError> {
        if self.inner.destroyed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let result = self.inner.instance.destroy().await;
        if let Some(egress) = &self.inner.egress {
            egress.remove();
        }
        result
    }

    /// Sends the kill and returns without waiting for the teardown to finish (a one-shot
    /// caller about to exit does not need to watch the namespaces go). Idempotent.
    pub fn kill(&self) {
        if !self.inner.destroyed.swap(true, Ordering::SeqCst) {
            self.inner.instance.kill();
        }
    }

    /// Whether `destroy` or `kill` was called.
    pub fn is_destroyed(&self) -> bool {
        self.inner.destroyed.load(Ordering::SeqCst)
    }

    /// Whether the sandbox can no longer answer: destroyed, or its agent's connection closed.
    pub fn is_gone(&self) -> bool {
        self.is_destroyed() || self.inner.client.closed_reason().is_some()
    }

    async fn entry_call(&self, msg: HostMessage) -> Result<FileEntry, EngineError> {
        match self.simple_call(msg).await? {
            GuestMessage::Entry { entry } => Ok(entry),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn expect_ok(&self, msg: HostMessage) -> Result<(), EngineError> {
        match self.simple_call(msg).await? {
            GuestMessage::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn simple_call(&self, msg: HostMessage) -> Result<GuestMessage, EngineError> {
        self.check_alive().await?;
        let mut call = self
            .inner
            .client
            .request(&msg)
            .await
            .map_err(|e| self.map_closed(e))?;
        self.with_timeout(call.message()).await
    }

    pub(crate) async fn with_timeout<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, EngineError>>,
    ) -> Result<T, EngineError> {
        tokio::pin!(fut);
        loop {
            match tokio::time::timeout(CALL_TIMEOUT, &mut fut).await {
                Ok(r) => return r.map_err(|e| self.map_closed(e)),
                // A paused agent cannot answer: the wait starts again when it runs.
                Err(_) if self.is_paused() => {}
                Err(_) => {
                    return Err(EngineError::Unresponsive(format!(
                        "no reply within {CALL_TIMEOUT:?}"
                    )));
                }
            }
        }
    }

    /// Fails when the sandbox is gone; resumes it when it is paused (asked to do something,
    /// a paused sandbox wakes up).
    pub(crate) async fn check_alive(&self) -> Result<(), EngineError> {
        if self.is_destroyed() {
            return Err(self.gone("it was destroyed".into()));
        }
        if let Some(reason) = self.inner.client.closed_reason() {
            return Err(self.gone(reason));
        }
        if self.is_paused() {
            self.resume().await?;
        }
        Ok(())
    }

    /// Freezes every process in the sandbox, its agent included: they use no CPU and keep
    /// their memory, open files and state until [`Sandbox::resume`] (or anything asked of
    /// the sandbox, which resumes it). Pausing a paused sandbox does nothing.
    pub async fn pause(&self) -> Result<(), EngineError> {
        if self.is_destroyed() {
            return Err(self.gone("it was destroyed".into()));
        }
        if self.is_paused() {
            return Ok(());
        }
        self.inner.instance.pause().await?;
        self.inner.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Lets a paused sandbox's processes run on from where they stopped.
    pub async fn resume(&self) -> Result<(), EngineError> {
        if self.is_destroyed() {
            return Err(self.gone("it was destroyed".into()));
        }
        self.inner.instance.resume().await?;
        self.inner.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// What its backend can do.
    pub fn features(&self) -> BackendFeatures {
        self.inner.features
    }

    /// The backend's handle of this sandbox.
    pub(crate) fn backend_instance(&self) -> &dyn BackendInstance {
        self.inner.instance.as_ref()
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.inner.paused.load(Ordering::SeqCst)
    }

    pub(crate) fn map_closed(&self, e: EngineError) -> EngineError {
        match e {
            EngineError::Connection(reason) if self.inner.client.closed_reason().is_some() => {
                self.gone(reason)
            }
            other => other,
        }
    }

    pub(crate) fn gone(&self, reason: String) -> EngineError {
        let reason = if self.is_destroyed() {
            "it was destroyed".to_string()
        } else {
            reason
        };
        let counters = self.inner.instance.counters();
        let hint = if counters.oom_kills.unwrap_or(0) > 0 {
            " (the memory limit was hit: the oom killer ended the agent)"
        } else if counters.pids_limit_hits.unwrap_or(0) > 0 {
            " (the process limit was hit: the sandbox could not start a task it needed)"
        } else {
            ""
        };
        EngineError::SandboxGone {
            id: self.inner.id.clone(),
            reason: format!("{reason}{hint}"),
        }
    }
}

pub(crate) fn unexpected(msg: GuestMessage) -> EngineError {
    EngineError::Connection(format!("unexpected reply {msg:?}"))
}

/// Checks a foreground exec request and fills in the sandbox's defaults (env, timeout).
pub(crate) fn prepare_exec(
    spec: &SandboxSpec,
    mut req: ExecRequest,
) -> Result<ExecRequest, EngineError> {
    if req.background {
        // Its request would never end: a background process is followed with `attach`.
        return Err(EngineError::InvalidRequest(
            "a background exec has no output stream: start it with spawn and follow it with attach"
                .into(),
        ));
    }
    validate_exec(&req)?;
    for (k, v) in &spec.env {
        req.env.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if req.cwd.is_none() {
        req.cwd.clone_from(&spec.workdir);
    }
    if req.timeout_ms.is_none() {
        req.timeout_ms = spec.limits.exec_timeout_ms;
    }
    Ok(req)
}

/// Checks a background exec request and fills in the sandbox's environment. The sandbox's
/// exec timeout does not apply: a background process runs until it ends or is killed,
/// unless the request sets its own timeout.
pub(crate) fn prepare_spawn(
    spec: &SandboxSpec,
    mut req: ExecRequest,
) -> Result<ExecRequest, EngineError> {
    req.background = true;
    validate_exec(&req)?;
    for (k, v) in &spec.env {
        req.env.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if req.cwd.is_none() {
        req.cwd.clone_from(&spec.workdir);
    }
    Ok(req)
}

fn validate_exec(req: &ExecRequest) -> Result<(), EngineError> {
    let bad = |m: &str| Err(EngineError::InvalidRequest(m.to_string()));
    match &req.command {
        ExecCommand::Argv(argv) if argv.is_empty() => return bad("argv is empty"),
        ExecCommand::Argv(argv) if argv.iter().any(|a| a.contains('\0')) => {
            return bad("an argument contains a NUL byte");
        }
        ExecCommand::Argv(argv) if argv[0].is_empty() => return bad("the program name is empty"),
        ExecCommand::Shell(line) if line.contains('\0') => {
            return bad("the command contains a NUL byte");
        }
        _ => {}
    }
    for (k, v) in &req.env {
        validate_env(k, v).map_err(EngineError::InvalidRequest)?;
    }
    if req
        .cwd
        .as_deref()
        .is_some_and(|c| c.contains('\0') || c.is_empty())
    {
        return bad("cwd is empty or contains a NUL byte");
    }
    if req.timeout_ms == Some(0) {
        return bad("timeout must be positive");
    }
    if req.buffer_bytes.is_some_and(|n| n > MAX_BUFFER_BYTES) {
        return Err(EngineError::InvalidRequest(format!(
            "buffer_bytes is over the limit of {MAX_BUFFER_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with_timeout(ms: u64) -> SandboxSpec {
        let mut spec = SandboxSpec::default();
        spec.limits.exec_timeout_ms = Some(ms);
        spec.env.insert("FROM_SPEC".into(), "1".into());
        spec
    }

    #[test]
    fn a_foreground_exec_gets_the_sandbox_timeout_and_refuses_background() {
        let spec = spec_with_timeout(500);
        let req = prepare_exec(&spec, ExecRequest::shell("true")).unwrap();
        assert_eq!(req.timeout_ms, Some(500));
        assert_eq!(req.env.get("FROM_SPEC").map(String::as_str), Some("1"));
        let mut bg = ExecRequest::shell("true");
        bg.background = true;
        let err = prepare_exec(&spec, bg).unwrap_err();
        assert!(err.to_string().contains("spawn"), "{err}");
    }

    #[test]
    fn a_spawn_is_background_and_keeps_only_its_own_timeout() {
        let spec = spec_with_timeout(500);
        let req = prepare_spawn(&spec, ExecRequest::shell("true")).unwrap();
        assert!(req.background);
        assert_eq!(req.timeout_ms, None);
        assert_eq!(req.env.get("FROM_SPEC").map(String::as_str), Some("1"));
        let mut own = ExecRequest::shell("true");
        own.timeout_ms = Some(20);
        assert_eq!(prepare_spawn(&spec, own).unwrap().timeout_ms, Some(20));
        let mut huge = ExecRequest::shell("true");
        huge.buffer_bytes = Some(MAX_BUFFER_BYTES + 1);
        assert!(prepare_spawn(&spec, huge).is_err());
    }
}
