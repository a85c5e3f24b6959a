//! Threads: conversations that persist across runs. A run on a thread sees the thread's
//! earlier conversation (its latest run's, with that run's answer) and works in the thread's
//! sandbox, or in one restored from the latest run's last step snapshot when that sandbox is
//! gone. Threads are rows in the store: they outlive the process.

use std::sync::Arc;

use sandcell_api::SandboxId;
use sandcell_api::runs::{
    Budgets, CreateThread, RenameThread, RunInfo, StartRun, ThreadInfo, ThreadList,
    check_thread_name,
};
use sandcell_api::time::rfc3339;
use sandcell_llm::{Message, ModelRef};
use sandcell_service::caller::new_record_id;
use sandcell_service::{Caller, ErrorKind, ServiceError, ServiceResult};
use sandcell_store::{StoreError, ThreadRecord};

use crate::journal::now_ms;
use crate::run::SandboxPlan;
use crate::runner::{History, Launch, RunSettings, Runner};

/// A thread as the API shows it.
pub fn thread_info(t: &ThreadRecord) -> ThreadInfo {
    ThreadInfo {
        id: t.id.clone(),
        name: t.name.clone(),
        sandbox_id: t.sandbox_id.clone(),
        last_run_id: t.last_run_id.clone(),
        runs: t.runs,
        created_at: rfc3339(t.created_at),
        updated_at: rfc3339(t.updated_at),
    }
}

fn name_taken(e: StoreError, name: &str) -> ServiceError {
    match e {
        StoreError::AlreadyExists { .. } => ServiceError::new(
            ErrorKind::AlreadyExists,
            format!("a thread named {name:?} exists already"),
        ),
        other => other.into(),
    }
}

impl Runner {
    /// The caller's thread `id` (another owner's is missing).
    fn own_thread(&self, caller: &Caller, id: &str) -> ServiceResult<ThreadRecord> {
        sandcell_api::rules::check_record_id(id, "th", "a thread")?;
        match self.service.store.get_thread(id)? {
            Some(t) if t.owner == caller.owner => Ok(t),
            _ => Err(ServiceError::not_found("thread", id)),
        }
    }

    /// Makes a thread.
    pub fn create_thread(&self, caller: &Caller, req: CreateThread) -> ServiceResult<ThreadInfo> {
        let id = new_record_id("th")?;
        let name = req.name.unwrap_or_else(|| id.clone());
        check_thread_name(&name)?;
        let now = now_ms();
        let t = ThreadRecord {
            id,
            owner: caller.owner.clone(),
            name: name.clone(),
            sandbox_id: None,
            last_run_id: None,
            runs: 0,
            created_at: now,
            updated_at: now,
        };
        self.service
            .store
            .insert_thread(&t)
            .map_err(|e| name_taken(e, &name))?;
        Ok(thread_info(&t))
    }

    /// The caller's thread.
    pub fn get_thread(&self, caller: &Caller, id: &str) -> ServiceResult<ThreadInfo> {
        Ok(thread_info(&self.own_thread(caller, id)?))
    }

    /// The caller's threads, the most recently used first.
    pub fn list_threads(&self, caller: &Caller, limit: u32) -> ServiceResult<ThreadList> {
        let threads = self.service.store.list_threads(&caller.owner, limit)?;
        Ok(ThreadList {
            threads: threads.iter().map(thread_info).collect(),
        })
    }

    /// Renames the caller's thread.
    pub fn rename_thread(
        &self,
        caller: &Caller,
        id: &str,
        req: RenameThread,
    ) -> ServiceResult<ThreadInfo> {
        check_thread_name(&req.name)?;
        let mut t = self.own_thread(caller, id)?;
        t.name = req.name;
        t.updated_at = now_ms();
        self.service
            .store
            .update_thread(&t)
            .map_err(|e| name_taken(e, &t.name))?;
        Ok(thread_info(&t))
    }

    /// Deletes the caller's thread and its sandbox; its runs stay. A thread with a run going
    /// on is refused.
    pub async fn delete_thread(&self, caller: &Caller, id: &str) -> ServiceResult<()> {
        let t = self.own_thread(caller, id)?;
        if let Some(run) = &t.last_run_id
            && self.live.contains(run)
        {
            return Err(busy(&t, run));
        }
        if let Some(sandbox) = t
            .sandbox_id
            .as_deref()
            .and_then(|s| SandboxId::parse(s).ok())
            && self.service.get_sandbox(caller, &sandbox).is_ok()
        {
            self.service.delete_sandbox(caller, &sandbox).await?;
        }
        self.service.store.delete_thread(&t.id)?;
        Ok(())
    }

    /// Starts `req` on thread `thread_id`: its history, its sandbox.
    pub(crate) async fn start_on_thread(
        self: &Arc<Self>,
        caller: &Caller,
        thread_id: &str,
        req: StartRun,
        model: ModelRef,
        budgets: Budgets,
    ) -> ServiceResult<RunInfo> {
        let mut thread = self.own_thread(caller, thread_id)?;
        if let Some(run) = &thread.last_run_id
            && self.live.contains(run)
        {
            return Err(busy(&thread, run));
        }
        // The conversation so far: the latest run's, then its answer.
        let (mut messages, last_snapshot) = match &thread.last_run_id {
            Some(run) => {
                let events = crate::durable::all_events(&self.service.store, run)?;
                let r = crate::durable::rebuild(&events).map_err(|e| {
                    ServiceError::internal(format!("thread {thread_id}'s run {run}: {e}"))
                })?;
                let mut messages = r.messages;
                if let Some(answer) = self
                    .service
                    .store
                    .get_run(run)?
                    .and_then(|record| record.answer)
                {
                    messages.push(Message {
                        role: sandcell_llm::Role::Assistant,
                        content: vec![sandcell_llm::Part::Text(answer)],
                    });
                }
                (messages, r.snapshot.map(|(_, s)| s.snapshot_id))
            }
            None => (Vec::new(), None),
        };
        messages.push(Message::user(req.task.clone()));
        let template = req.template.clone().unwrap_or_else(|| "python".to_string());
        // Its sandbox: the one it has, else one restored from its last snapshot, else new.
        let alive =
            crate::durable::usable_sandbox(&self.service, caller, thread.sandbox_id.as_deref());
        let (sandbox, restored_from) = match (alive, last_snapshot) {
            (Some(id), _) => (id, None),
            (None, Some(snapshot)) => {
                let opts = sandcell_engine::fleet::CreateOptions::default();
                let made = self
                    .service
                    .restore_snapshot(caller, &snapshot, &opts, &[])
                    .await?;
                (SandboxId::parse(made.sandbox.id)?, Some(snapshot))
            }
            (None, None) => {
                let plan = SandboxPlan::Create {
                    template: template.clone(),
                    keep: true,
                };
                (
                    crate::run::open_sandbox(&self.service, caller, &plan)
                        .await?
                        .0,
                    None,
                )
            }
        };
        let settings = RunSettings {
            budgets,
            stream: self.defaults.stream,
            template: Some(template),
            validate: req.validate.clone(),
            snapshots: req.snapshots.unwrap_or(self.defaults.snapshots),
            // The thread's sandbox: no run deletes it.
            given_sandbox: Some(sandbox.to_string()),
            keep_sandbox: true,
            forked_from: None,
            keep_snapshots: req.keep_snapshots,
            thread_id: Some(thread.id.clone()),
        };
        let previous = thread.last_run_id.clone();
        let started = self
            .launch(
                caller,
                Launch {
                    task: req.task,
                    model,
                    settings,
                    plan: SandboxPlan::Existing(sandbox.clone()),
                    sandbox: sandbox.clone(),
                    history: History::Thread {
                        thread_id: thread.id.clone(),
                        from_run_id: previous,
                        restored_from,
                    },
                    messages,
                    wait: false,
                    repl: None,
                },
            )
            .await?;
        thread.sandbox_id = Some(sandbox.to_string());
        thread.last_run_id = Some(started.id.clone());
        thread.runs += 1;
        thread.updated_at = now_ms();
        self.service.store.update_thread(&thread)?;
        if req.wait {
            return self.wait(caller, &started.id).await;
        }
        Ok(started)
    }
}

fn busy(t: &ThreadRecord, run: &str) -> ServiceError {
    ServiceError::new(
        ErrorKind::InvalidState,
        format!(
            "thread {} has a run going on ({run}): wait for it or cancel it",
            t.id
        ),
    )
}
