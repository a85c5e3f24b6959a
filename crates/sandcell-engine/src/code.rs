//! Code in language kernels: executions (streamed and collected), contexts, variables.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sandcell_protocol::{
    CodeDone, CodeError, CodeStatus, Completeness, ContextInfo, GuestMessage, HostCall,
    HostCallErrorKind, HostCallResult, HostMessage, Language, MAX_PENDING_HOST_CALLS, MimeBundle,
    RunCodeRequest, VariableInfo, Variables,
};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::client::{Call, Reply};
use crate::error::EngineError;
use crate::host_call::{HostCallHandler, HostCallRequest, NO_HANDLER};
use crate::sandbox::{Sandbox, unexpected};

/// How long the host waits past an execution's own timeout (the agent interrupts, then
/// kills within a few seconds) before it stops trusting the agent.
const WATCHDOG_GRACE: Duration = Duration::from_secs(10);

/// One event of a running execution, in the order it happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    /// Text on stdout.
    Stdout { text: String },
    /// Text on stderr.
    Stderr { text: String },
    /// Rich output shown during the execution.
    Display { data: MimeBundle },
    /// The value of the cell's last expression.
    Result { data: MimeBundle },
    /// An error the code raised (or the kernel's death).
    Error(CodeError),
    /// The end; nothing follows.
    Done(CodeDone),
}

/// Rich output of an execution: a display or the result, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CodeOutput {
    /// `display` or `result`.
    pub kind: OutputKind,
    /// The MIME bundle.
    pub data: MimeBundle,
}

/// Which rich output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// Shown during the execution.
    Display,
    /// The last expression's value.
    Result,
}

/// A finished execution.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CodeRun {
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
    /// Displays and the result, in order.
    pub outputs: Vec<CodeOutput>,
    /// The error, when one was raised.
    pub error: Option<CodeError>,
    /// How it ended.
    pub done: CodeDone,
}

impl CodeRun {
    /// The last expression's value.
    pub fn result(&self) -> Option<&MimeBundle> {
        self.outputs
            .iter()
            .find(|o| o.kind == OutputKind::Result)
            .map(|o| &o.data)
    }

    /// The result's `text/plain`.
    pub fn result_text(&self) -> Option<&str> {
        self.result()?.get("text/plain")?.as_str()
    }

    /// Whether it ran to the end without an error.
    pub fn ok(&self) -> bool {
        self.done.status == CodeStatus::Ok
    }

    /// Base64 `image/png` values of every output, in order.
    pub fn png_images(&self) -> Vec<&str> {
        self.outputs
            .iter()
            .filter_map(|o| o.data.get("image/png")?.as_str())
            .collect()
    }
}

/// A running execution.
pub struct CodeStream {
    sandbox: Sandbox,
    call: Call,
    /// The sandbox's OOM kills when the execution started (explains a SIGKILL crash).
    oom_before: Option<u64>,
    timeout_ms: Option<u64>,
    done: bool,
    /// Answers the execution's host calls (none: they are unavailable).
    handler: Option<Arc<dyn HostCallHandler>>,
    /// Host calls being answered; aborted when the execution ends (or the stream is dropped).
    host_calls: JoinSet<()>,
}

impl CodeStream {
    /// The request id of the execution.
    pub fn request_id(&self) -> u32 {
        self.call.id
    }

    /// The next event; `None` after `Done`. Host calls of the code are answered meanwhile
    /// (they are not events).
    pub async fn next(&mut self) -> Option<Result<CodeEvent, EngineError>> {
        if self.done {
            return None;
        }
        let reply = loop {
            let reply = if self.host_calls.is_empty() {
                let limit = self
                    .timeout_ms
                    .map(|t| Duration::from_millis(t) + WATCHDOG_GRACE);
                match self.call.next_within(limit).await {
                    Some(reply) => reply,
                    None => {
                        self.finish();
                        return Some(Err(EngineError::Unresponsive(format!(
                            "the agent did not end an execution {}s past its timeout",
                            WATCHDOG_GRACE.as_secs()
                        ))));
                    }
                }
            } else {
                // While the host answers, the agent holds the execution's timeout, and so
                // does the watchdog: it starts again once nothing is pending.
                tokio::select! {
                    reply = self.call.next() => reply,
                    _ = self.host_calls.join_next() => continue,
                }
            };
            match reply {
                Reply::Message(GuestMessage::HostCall(call)) => self.host_call(call).await,
                other => break other,
            }
        };
        let event = match reply {
            Reply::Message(GuestMessage::CodeStream { name, text }) if name == "stderr" => {
                CodeEvent::Stderr { text }
            }
            Reply::Message(GuestMessage::CodeStream { text, .. }) => CodeEvent::Stdout { text },
            Reply::Message(GuestMessage::CodeDisplay { data, .. }) => CodeEvent::Display { data },
            Reply::Message(GuestMessage::CodeResult { data, .. }) => CodeEvent::Result { data },
            Reply::Message(GuestMessage::CodeError(e)) => CodeEvent::Error(e),
            Reply::Message(GuestMessage::CodeDone(done)) => {
                self.finish();
                let mut done = *done;
                self.explain_crash(&mut done);
                CodeEvent::Done(done)
            }
            Reply::Message(GuestMessage::Error(e)) => {
                self.finish();
                return Some(Err(EngineError::Guest(e)));
            }
            Reply::Message(other) => {
                self.finish();
                return Some(Err(unexpected(other)));
            }
            Reply::Data(_) => {
                self.finish();
                return Some(Err(EngineError::Connection(
                    "unexpected data chunk in an execution".into(),
                )));
            }
            Reply::Closed(reason) => {
                self.finish();
                return Some(Err(self.sandbox.gone(reason)));
            }
        };
        Some(Ok(event))
    }

    /// The execution is over: nothing more is read, and answers still being worked on are
    /// abandoned (nobody waits for them).
    fn finish(&mut self) {
        self.done = true;
        self.host_calls.abort_all();
    }

    /// Starts answering a host call of the code (or answers it at once when it cannot be).
    async fn host_call(&mut self, call: HostCall) {
        let id = self.call.id;
        let refused = match &self.handler {
            None => Some(HostCallResult::error(
                HostCallErrorKind::Unavailable,
                NO_HANDLER,
            )),
            // The agent holds calls to the same bound; a host does not trust it to.
            Some(_) if self.host_calls.len() >= MAX_PENDING_HOST_CALLS => {
                Some(HostCallResult::error(
                    HostCallErrorKind::InvalidArgument,
                    format!(
                        "at most {MAX_PENDING_HOST_CALLS} host calls may wait at once in one execution"
                    ),
                ))
            }
            Some(_) => None,
        };
        if let Some(result) = refused {
            let reply = HostMessage::HostCallReply {
                call: call.call,
                result,
            };
            // A connection gone shows as the execution's end.
            let _ = self.sandbox.client().send(id, &reply).await;
            return;
        }
        let Some(handler) = self.handler.clone() else {
            return;
        };
        let sandbox = self.sandbox.clone();
        let number = call.call;
        let request = HostCallRequest {
            call: call.call,
            method: call.method,
            payload: call.payload,
        };
        self.host_calls.spawn(async move {
            let result = HostCallResult::from(handler.call(request).await);
            let reply = HostMessage::HostCallReply {
                call: number,
                result,
            };
            let _ = sandbox.client().send(id, &reply).await;
        });
    }

    /// A kernel killed by SIGKILL while the sandbox's OOM counter rose died of memory.
    fn explain_crash(&self, done: &mut CodeDone) {
        if done.status != CodeStatus::Crashed || done.crash_signal != Some(9) {
            return;
        }
        let after = self.sandbox.oom_kills();
        let oom = after
            .unwrap_or(0)
            .saturating_sub(self.oom_before.unwrap_or(0));
        if oom > 0 {
            let why = "killed by the out-of-memory killer: the sandbox reached its memory limit";
            done.crash = Some(why.to_string());
            done.notice = Some(format!(
                "the kernel died ({why}); its state is lost and the next execution starts a \
                 fresh one"
            ));
        }
    }

    /// Waits for the end, gathering everything.
    pub async fn collect(mut self) -> Result<CodeRun, EngineError> {
        let (mut stdout, mut stderr) = (String::new(), String::new());
        let mut outputs = Vec::new();
        let mut error = None;
        while let Some(event) = self.next().await {
            match event? {
                CodeEvent::Stdout { text } => stdout.push_str(&text),
                CodeEvent::Stderr { text } => stderr.push_str(&text),
                CodeEvent::Display { data } => outputs.push(CodeOutput {
                    kind: OutputKind::Display,
                    data,
                }),
                CodeEvent::Result { data } => outputs.push(CodeOutput {
                    kind: OutputKind::Result,
                    data,
                }),
                CodeEvent::Error(e) => error = Some(e),
                CodeEvent::Done(done) => {
                    return Ok(CodeRun {
                        stdout,
                        stderr,
                        outputs,
                        error,
                        done,
                    });
                }
            }
        }
        Err(EngineError::Connection(
            "the execution ended without a done event".into(),
        ))
    }
}

/// Checks a code request before it is sent.
fn validate(req: &RunCodeRequest) -> Result<(), EngineError> {
    if req.context.is_none() && req.language.is_none() {
        return Err(EngineError::InvalidRequest(
            "name a context or a language to run code in".into(),
        ));
    }
    sandcell_api::rules::check_code(&req.code).map_err(|e| EngineError::InvalidRequest(e.0))?;
    if req.timeout_ms == Some(0) {
        return Err(EngineError::InvalidRequest(
            "timeout_ms must be positive".into(),
        ));
    }
    Ok(())
}

impl Sandbox {
    /// Runs code in a kernel and streams its events. Its host calls (`llm_query`, …) are
    /// answered unavailable: see [`Self::run_code_stream_with`].
    pub async fn run_code_stream(&self, req: RunCodeRequest) -> Result<CodeStream, EngineError> {
        self.run_code_stream_with(req, None).await
    }

    /// As [`Self::run_code_stream`], `handler` answering the code's host calls (the stream
    /// answers them as it is read: read it to the end).
    pub async fn run_code_stream_with(
        &self,
        mut req: RunCodeRequest,
        handler: Option<Arc<dyn HostCallHandler>>,
    ) -> Result<CodeStream, EngineError> {
        self.check_alive().await?;
        validate(&req)?;
        if req.timeout_ms.is_none() {
            req.timeout_ms = self.spec().limits.exec_timeout_ms;
        }
        let timeout_ms = req.timeout_ms;
        let call = self
            .client()
            .request(&HostMessage::RunCode(req))
            .await
            .map_err(|e| self.map_closed(e))?;
        // Read while the agent hands the code to the kernel (off the round trip's path): it
        // cannot have run into the memory limit within these microseconds.
        let oom_before = self.oom_kills();
        Ok(CodeStream {
            sandbox: self.clone(),
            call,
            oom_before,
            timeout_ms,
            done: false,
            handler,
            host_calls: JoinSet::new(),
        })
    }

    /// Runs code in a kernel and waits for the end.
    pub async fn run_code(&self, req: RunCodeRequest) -> Result<CodeRun, EngineError> {
        self.run_code_stream(req).await?.collect().await
    }

    /// Runs code in a kernel and waits for the end, `handler` answering its host calls.
    pub async fn run_code_with(
        &self,
        req: RunCodeRequest,
        handler: Arc<dyn HostCallHandler>,
    ) -> Result<CodeRun, EngineError> {
        self.run_code_stream_with(req, Some(handler))
            .await?
            .collect()
            .await
    }

    /// Runs code in the default context of `language`.
    pub async fn run(&self, language: Language, code: &str) -> Result<CodeRun, EngineError> {
        self.run_code(RunCodeRequest {
            context: None,
            language: Some(language),
            code: code.to_string(),
            timeout_ms: None,
        })
        .await
    }

    /// Starts a new context (its kernel is started at once).
    pub async fn create_context(
        &self,
        language: Language,
        cwd: Option<String>,
        env: BTreeMap<String, String>,
    ) -> Result<ContextInfo, EngineError> {
        for (k, v) in &env {
            crate::spec::validate_env(k, v).map_err(EngineError::InvalidRequest)?;
        }
        // Kernels can take a while to start (R); the shared call timeout covers it.
        match self
            .simple_call(HostMessage::CreateContext { language, cwd, env })
            .await?
        {
            GuestMessage::Context { context } => Ok(context),
            other => Err(unexpected(other)),
        }
    }

    /// Every context of the sandbox.
    pub async fn list_contexts(&self) -> Result<Vec<ContextInfo>, EngineError> {
        match self.simple_call(HostMessage::ListContexts).await? {
            GuestMessage::Contexts { contexts } => Ok(contexts),
            other => Err(unexpected(other)),
        }
    }

    /// Stops a context's kernel and forgets the context.
    pub async fn destroy_context(&self, context: &str) -> Result<(), EngineError> {
        self.ok_call(HostMessage::DestroyContext {
            context: context.into(),
        })
        .await
    }

    /// Interrupts the context's running execution; its state is kept.
    pub async fn interrupt(&self, context: &str) -> Result<(), EngineError> {
        self.ok_call(HostMessage::Interrupt {
            context: context.into(),
        })
        .await
    }

    /// Replaces the context's kernel with a fresh one: its state is cleared.
    pub async fn restart_context(&self, context: &str) -> Result<ContextInfo, EngineError> {
        match self
            .simple_call(HostMessage::RestartContext {
                context: context.into(),
            })
            .await?
        {
            GuestMessage::Context { context } => Ok(context),
            other => Err(unexpected(other)),
        }
    }

    /// Whether `code` is a complete cell for `context` (or the default context of
    /// `language`).
    pub async fn is_complete(
        &self,
        context: Option<&str>,
        language: Option<Language>,
        code: &str,
    ) -> Result<(Completeness, Option<String>), EngineError> {
        match self
            .simple_call(HostMessage::IsComplete {
                context: context.map(str::to_string),
                language,
                code: code.to_string(),
            })
            .await?
        {
            GuestMessage::Completeness { status, indent } => Ok((status, indent)),
            other => Err(unexpected(other)),
        }
    }

    /// Reads variables as JSON (every user variable when `names` is `None`).
    pub async fn get_variables(
        &self,
        context: &str,
        names: Option<Vec<String>>,
    ) -> Result<Variables, EngineError> {
        match self
            .simple_call(HostMessage::GetVariables {
                context: context.into(),
                names,
            })
            .await?
        {
            GuestMessage::Variables(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    /// Sets variables from JSON values; returns the names set.
    pub async fn set_variables(
        &self,
        context: &str,
        values: BTreeMap<String, serde_json::Value>,
    ) -> Result<Vec<String>, EngineError> {
        match self
            .simple_call(HostMessage::SetVariables {
                context: context.into(),
                values,
            })
            .await?
        {
            GuestMessage::VariableNames { names } => Ok(names),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes variables (every user variable when `names` is `None`); returns the names.
    pub async fn clear_variables(
        &self,
        context: &str,
        names: Option<Vec<String>>,
    ) -> Result<Vec<String>, EngineError> {
        match self
            .simple_call(HostMessage::ClearVariables {
                context: context.into(),
                names,
            })
            .await?
        {
            GuestMessage::VariableNames { names } => Ok(names),
            other => Err(unexpected(other)),
        }
    }

    /// The context's user variables.
    pub async fn list_variables(&self, context: &str) -> Result<Vec<VariableInfo>, EngineError> {
        match self
            .simple_call(HostMessage::ListVariables {
                context: context.into(),
            })
            .await?
        {
            GuestMessage::VariableList { variables } => Ok(variables),
            other => Err(unexpected(other)),
        }
    }

    async fn ok_call(&self, msg: HostMessage) -> Result<(), EngineError> {
        match self.simple_call(msg).await? {
            GuestMessage::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}
