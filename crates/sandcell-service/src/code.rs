//! Code in language kernels whose state persists, collected or followed as typed events;
//! contexts (made, listed, deleted, interrupted, restarted) and their variables; and the
//! context records kept in the store (a context's history outlives its sandbox).

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use sandcell_api::code::{
    CodeDoneInfo, CodeErrorInfo, CodeInput, CodeResult, CodeStreamEvent, CodeText, ContextView,
    CreateContext, RichData, RichOutput, SetVariables, VariableNames, VariablesView, bundle,
};
use sandcell_api::sandboxes::Lang;
use sandcell_api::time::rfc3339;
use sandcell_api::{SandboxId, Timeout};
use sandcell_engine::{CodeEvent, CodeRun, HostCallHandler, OutputKind};
use sandcell_protocol::{CodeDone, Language, RunCodeRequest};
use sandcell_store::ContextRecord;

use crate::exec::{Events, stream_error};
use crate::{Caller, Service, ServiceResult};

/// The engine request a code input asks for (default language `python` unless a context
/// is named), checked: code size, timeout.
pub fn run_code_request(input: &CodeInput) -> ServiceResult<RunCodeRequest> {
    let timeout_ms = input.timeout_secs.map(Timeout::as_ms);
    Ok(RunCodeRequest {
        context: input.context.clone(),
        language: match (&input.context, input.language) {
            (Some(_), l) => l.map(Into::into),
            (None, l) => Some(l.unwrap_or(Lang::Python).into()),
        },
        code: input.code.to_string(),
        timeout_ms,
    })
}

/// A finished execution as the API shows it.
pub fn code_result(r: &CodeRun) -> CodeResult {
    CodeResult {
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

/// The record of a context as it starts.
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

/// A recorded context of a sandbox that no longer runs.
fn recorded_context(r: &ContextRecord) -> ContextView {
    let language = match r.language.as_str() {
        "node" => Lang::Node,
        "bash" => Lang::Bash,
        "r" => Lang::R,
        _ => Lang::Python,
    };
    ContextView {
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

impl Service {
    /// Records the context a run used, the first time this service sees it (a language's
    /// default context is made by its first run, not by a request of its own).
    fn record_context_seen(&self, owner: &str, sandbox_id: &str, done: &CodeDone) {
        let key = (sandbox_id.to_string(), done.context.clone());
        if self.seen_contexts.contains(&key) {
            return;
        }
        let record = context_record(owner, sandbox_id, &done.context, done.language, None);
        // The run's answer does not hang on its history: a failed write is logged and
        // retried by the next run.
        match self.store.insert_context_if_absent(&record) {
            Ok(_) => self.seen_contexts.insert(key),
            Err(e) => tracing::warn!(sandbox = sandbox_id, error = %e, "record a context"),
        }
    }

    /// Runs code in a kernel of the caller's sandbox `id` and returns when it ends. The
    /// context's state persists.
    pub async fn run_code(
        &self,
        caller: &Caller,
        id: &SandboxId,
        input: CodeInput,
    ) -> ServiceResult<CodeResult> {
        self.run_code_with(caller, id, input, None).await
    }

    /// [`Service::run_code`], with the cell's host calls (an agent run's `llm_query` and the
    /// like) answered by `handler`; without one they are refused as unavailable.
    pub async fn run_code_with(
        &self,
        caller: &Caller,
        id: &SandboxId,
        input: CodeInput,
        handler: Option<Arc<dyn HostCallHandler>>,
    ) -> ServiceResult<CodeResult> {
        let req = run_code_request(&input)?;
        let sandbox = self.running_sandbox(caller, id)?;
        let start = Instant::now();
        let run = match handler {
            Some(h) => sandbox.run_code_with(req, h).await?,
            None => sandbox.run_code(req).await?,
        };
        self.metrics.code_latency.observe(start.elapsed());
        self.record_context_seen(&caller.owner, id, &run.done);
        Ok(code_result(&run))
    }

    /// Runs code and follows it: `stdout`/`stderr`, `display`/`result`, the code's `error`,
    /// then `done` (or a [`CodeStreamEvent::Failed`]). The context is recorded at `done`.
    pub async fn run_code_stream(
        self: &Arc<Self>,
        caller: &Caller,
        id: &SandboxId,
        input: CodeInput,
    ) -> ServiceResult<Events<CodeStreamEvent>> {
        let req = run_code_request(&input)?;
        let sandbox = self.running_sandbox(caller, id)?;
        let stream = sandbox.run_code_stream(req).await?;
        let seen = (Arc::clone(self), caller.owner.clone(), id.to_string());
        Ok(
            futures_util::stream::unfold(Some((stream, seen)), |state| async move {
                let (mut stream, seen) = state?;
                let event = match stream.next().await? {
                    Ok(CodeEvent::Stdout { text }) => CodeStreamEvent::Stdout(CodeText { text }),
                    Ok(CodeEvent::Stderr { text }) => CodeStreamEvent::Stderr(CodeText { text }),
                    Ok(CodeEvent::Display { data }) => CodeStreamEvent::Display(RichData {
                        data: bundle(&data),
                    }),
                    Ok(CodeEvent::Result { data }) => CodeStreamEvent::Result(RichData {
                        data: bundle(&data),
                    }),
                    Ok(CodeEvent::Error(e)) => CodeStreamEvent::Error(CodeErrorInfo::from(&e)),
                    Ok(CodeEvent::Done(d)) => {
                        let (service, owner, id) = &seen;
                        service.record_context_seen(owner, id, &d);
                        return Some((CodeStreamEvent::Done(CodeDoneInfo::from(&d)), None));
                    }
                    Err(e) => return Some((CodeStreamEvent::Failed(stream_error(e)), None)),
                };
                Some((event, Some((stream, seen))))
            })
            .boxed(),
        )
    }

    /// Starts a new context (a kernel of its own) in the caller's sandbox `id`; recorded
    /// before it is acknowledged (unrecorded, it is not kept).
    pub async fn create_context(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: CreateContext,
    ) -> ServiceResult<ContextView> {
        let sandbox = self.running_sandbox(caller, id)?;
        let ctx = sandbox
            .create_context(req.language.into(), req.cwd.clone(), req.env)
            .await?;
        let record = context_record(&caller.owner, id, &ctx.id, ctx.language, req.cwd);
        if let Err(e) = self.store.insert_context(&record) {
            let _ = sandbox.destroy_context(&ctx.id).await;
            return Err(e.into());
        }
        self.seen_contexts.insert((id.to_string(), ctx.id.clone()));
        let mut view = ContextView::from(&ctx);
        view.created_at = Some(rfc3339(record.created_at));
        Ok(view)
    }

    /// The contexts of the caller's sandbox `id`: live ones while it runs, the recorded
    /// ones (with how they ended) once it no longer does.
    pub async fn list_contexts(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<Vec<ContextView>> {
        let record = self.fleet.get(&caller.owner, id)?;
        let recorded = self.store.list_contexts(id)?;
        if !record.state.is_active() {
            return Ok(recorded.iter().map(recorded_context).collect());
        }
        let sandbox = self.running_sandbox(caller, id)?;
        let list = sandbox.list_contexts().await?;
        Ok(list
            .iter()
            .map(|c| {
                let mut view = ContextView::from(c);
                view.created_at = recorded
                    .iter()
                    .find(|r| r.id == c.id && r.ended_at.is_none())
                    .map(|r| rfc3339(r.created_at));
                view
            })
            .collect())
    }

    /// Stops a context's kernel and forgets it (its record ends, `deleted`).
    pub async fn delete_context(
        &self,
        caller: &Caller,
        id: &SandboxId,
        context: &str,
    ) -> ServiceResult<()> {
        let sandbox = self.running_sandbox(caller, id)?;
        sandbox.destroy_context(context).await?;
        self.store
            .end_context(id, context, sandcell_engine::fleet::now_ms(), "deleted")?;
        self.seen_contexts
            .remove(&(id.to_string(), context.to_string()));
        Ok(())
    }

    /// Interrupts the context's running execution; its state stays.
    pub async fn interrupt_context(
        &self,
        caller: &Caller,
        id: &SandboxId,
        context: &str,
    ) -> ServiceResult<()> {
        let sandbox = self.running_sandbox(caller, id)?;
        Ok(sandbox.interrupt(context).await?)
    }

    /// Replaces the context's kernel with a fresh one (clean state).
    pub async fn restart_context(
        &self,
        caller: &Caller,
        id: &SandboxId,
        context: &str,
    ) -> ServiceResult<ContextView> {
        let sandbox = self.running_sandbox(caller, id)?;
        let ctx = sandbox.restart_context(context).await?;
        Ok(ContextView::from(&ctx))
    }

    /// Reads the context's variables (all of them when `names` is `None`), as JSON where
    /// they convert exactly.
    pub async fn get_variables(
        &self,
        caller: &Caller,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> ServiceResult<VariablesView> {
        let sandbox = self.running_sandbox(caller, id)?;
        Ok(sandbox.get_variables(context, names).await?.into())
    }

    /// Sets the context's variables from JSON values.
    pub async fn set_variables(
        &self,
        caller: &Caller,
        id: &SandboxId,
        context: &str,
        req: SetVariables,
    ) -> ServiceResult<VariableNames> {
        let sandbox = self.running_sandbox(caller, id)?;
        let names = sandbox.set_variables(context, req.values).await?;
        Ok(VariableNames { names })
    }

    /// Deletes the context's variables (all of them when `names` is `None`).
    pub async fn clear_variables(
        &self,
        caller: &Caller,
        id: &SandboxId,
        context: &str,
        names: Option<Vec<String>>,
    ) -> ServiceResult<VariableNames> {
        let sandbox = self.running_sandbox(caller, id)?;
        let names = sandbox.clear_variables(context, names).await?;
        Ok(VariableNames { names })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcell_api::Code;

    #[test]
    fn code_inputs_are_checked_once() {
        let req = run_code_request(&CodeInput {
            code: Code::new("1 + 1").unwrap(),
            timeout_secs: Some(Timeout::from_secs(0.25).unwrap()),
            ..CodeInput::default()
        })
        .unwrap();
        assert_eq!(
            (req.language, req.timeout_ms),
            (Some(Language::Python), Some(250))
        );
        let in_context = run_code_request(&CodeInput {
            code: Code::new("x").unwrap(),
            context: Some("ctx-1".into()),
            ..CodeInput::default()
        })
        .unwrap();
        assert_eq!(in_context.language, None);
    }

    #[test]
    fn code_operations_check_before_reaching_a_sandbox() {
        let (service, caller, _home) = crate::exec::testing::service();
        crate::exec::testing::block_on(async {
            let e = service
                .list_contexts(&caller, &crate::exec::testing::sid("sb-1a2b"))
                .await
                .unwrap_err();
            assert_eq!(e.code(), "not_found");
            let e = service
                .interrupt_context(&caller, &crate::exec::testing::sid("sb-1a2b"), "python")
                .await
                .unwrap_err();
            assert_eq!(e.code(), "not_found");
        });
    }

    #[test]
    fn recorded_contexts_show_how_they_ended() {
        let mut r = context_record("alice", "sb-1", "ctx-1", Language::Bash, None);
        r.ended_at = Some(0);
        r.end_reason = Some("deleted".into());
        let v = recorded_context(&r);
        assert_eq!(v.language, Lang::Bash);
        assert_eq!(v.ended_at.as_deref(), Some("1970-01-01T00:00:00.000Z"));
        assert_eq!(v.end_reason.as_deref(), Some("deleted"));
    }
}
