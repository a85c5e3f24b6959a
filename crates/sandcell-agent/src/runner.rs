//! Runs as a resource: start (in the background, or waiting for the end), get, list, read
//! and follow the trajectory, cancel. Every front end (REST, MCP, the CLI embedded or through
//! the daemon) calls these typed operations; each checks the caller owns the run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use sandcell_api::runs::{
    Budgets, ForkRun, ForkedFrom, RunInfo, RunList, RunMode, SnapshotPolicy, StartRun, StepSandbox,
    Validate,
};
use sandcell_api::time::rfc3339;
use sandcell_llm::{Llm, ModelRef};
use sandcell_service::caller::new_record_id;
use sandcell_service::{Caller, ErrorKind, Service, ServiceError, ServiceResult};
use sandcell_store::{RunEventRecord, RunRecord};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::budget::Pool;
use crate::event::{Event, EventKind};
use crate::journal::{Journal, now_ms};
use crate::run::{Durability, RunContext, SandboxPlan, Start, drive, usage_of};
use crate::settings::AgentDefaults;

/// The longest task or context a run takes, in bytes.
pub const MAX_TASK_BYTES: usize = 8 * 1024 * 1024;

/// What a run was started with, kept in its record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunSettings {
    pub(crate) budgets: Budgets,
    pub(crate) stream: bool,
    pub(crate) template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) validate: Option<Validate>,
    #[serde(default)]
    pub(crate) snapshots: SnapshotPolicy,
    /// The sandbox the caller gave (none: the run made its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) given_sandbox: Option<String>,
    #[serde(default)]
    pub(crate) keep_sandbox: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) forked_from: Option<ForkedFrom>,
    #[serde(default)]
    pub(crate) keep_snapshots: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) thread_id: Option<String>,
}

/// Where a run that starts from a history got it.
pub(crate) enum History {
    /// A fork of a run at a step.
    Fork {
        from_run_id: String,
        from_step: u32,
        restored_from: Option<String>,
    },
    /// A thread's earlier runs.
    Thread {
        thread_id: String,
        from_run_id: Option<String>,
        restored_from: Option<String>,
    },
}

/// A run to start from a history (see [`Runner::launch`]).
pub(crate) struct Launch {
    pub task: String,
    pub model: ModelRef,
    pub settings: RunSettings,
    /// The sandbox, ready, and whose it is.
    pub sandbox: sandcell_api::SandboxId,
    pub plan: SandboxPlan,
    pub history: History,
    /// The conversation so far, the new task included.
    pub messages: Vec<sandcell_llm::Message>,
    pub wait: bool,
    /// A repl-mode run's kernel and input (`None`: a tools-mode run).
    pub repl: Option<ReplOrigin>,
}

/// Where a repl-mode fork's kernel state comes from.
pub(crate) struct ReplOrigin {
    /// The original's kernel context, brought back by the step snapshot.
    pub kernel: Option<String>,
    /// The original's input, to load into a new kernel if that one is gone.
    pub input: String,
}

/// A fork or a step's sandbox asked of a step with no snapshot to restore.
fn no_snapshot(id: &str, step: u32) -> ServiceError {
    ServiceError::new(
        ErrorKind::InvalidState,
        format!(
            "run {id} has no step snapshot at or before step {step} (its snapshots were off, or the sandbox was the caller's and nothing had been saved yet)"
        ),
    )
}

/// A run in this process.
#[derive(Debug, Clone)]
struct Live {
    cancel: CancellationToken,
    events: broadcast::Sender<Event>,
    done: watch::Receiver<bool>,
}

/// The runs going on in this process, top-level and sub-runs alike: what cancels each, its
/// live events and its end. Shared by the runner and every run it starts, so a sub-run
/// (`rlm_query`) can be followed and cancelled by its own id.
#[derive(Debug, Default)]
pub struct LiveRuns(Mutex<HashMap<String, Live>>);

/// A run's place in [`LiveRuns`]: dropped when the run has ended, which removes it and wakes
/// whoever waits for its end.
#[derive(Debug)]
pub struct LiveEntry {
    runs: Arc<LiveRuns>,
    id: String,
    done: watch::Sender<bool>,
}

impl Drop for LiveEntry {
    fn drop(&mut self) {
        self.runs.map().remove(&self.id);
        let _ = self.done.send(true);
    }
}

impl LiveRuns {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers run `id`, cancelled by `cancel`; its live events go to `events`.
    pub fn register(
        self: &Arc<Self>,
        id: &str,
        cancel: CancellationToken,
        events: broadcast::Sender<Event>,
    ) -> LiveEntry {
        let (done_tx, done) = watch::channel(false);
        self.map().insert(
            id.to_string(),
            Live {
                cancel,
                events,
                done,
            },
        );
        LiveEntry {
            runs: self.clone(),
            id: id.to_string(),
            done: done_tx,
        }
    }

    fn get(&self, id: &str) -> Option<Live> {
        self.map().get(id).cloned()
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.map().contains_key(id)
    }
}

/// The runs of one service.
#[derive(Debug)]
pub struct Runner {
    pub(crate) service: Arc<Service>,
    llm: Arc<Llm>,
    pub(crate) defaults: AgentDefaults,
    pub(crate) live: Arc<LiveRuns>,
}

/// A run as the API shows it.
pub fn run_info(r: &RunRecord) -> RunInfo {
    let settings: Option<RunSettings> = serde_json::from_value(r.settings.clone()).ok();
    let forked_from = settings.as_ref().and_then(|s| s.forked_from.clone());
    RunInfo {
        id: r.id.clone(),
        status: r.status.clone(),
        reason: r.reason.clone(),
        answer: r.answer.clone(),
        task: r.task.clone(),
        model: r.model.clone(),
        mode: if r.mode == "repl" {
            RunMode::Repl
        } else {
            RunMode::Tools
        },
        sandbox_id: r.sandbox_id.clone(),
        parent_id: r.parent_id.clone(),
        root_id: r.root_id.clone(),
        depth: r.depth,
        budgets: settings.map_or_else(
            || Budgets {
                max_iterations: 0,
                max_depth: 0,
                max_sub_calls: 0,
                token_budget: None,
                cost_limit_usd: 0.0,
                timeout_secs: 0.0,
                cell_timeout_secs: 0.0,
                max_output_tokens: 0,
            },
            |s| s.budgets,
        ),
        usage: usage_of(&r.totals),
        created_at: rfc3339(r.created_at),
        ended_at: r.ended_at.map(rfc3339),
        forked_from,
    }
}

impl Runner {
    /// Runs over `service`, asking the models through `llm`.
    pub fn new(service: Arc<Service>, llm: Arc<Llm>, defaults: AgentDefaults) -> Self {
        Self {
            service,
            llm,
            defaults,
            live: Arc::default(),
        }
    }

    /// Runs over `service` with its `[agent]` settings and the process's environment.
    pub fn from_service(service: Arc<Service>) -> ServiceResult<Self> {
        let agent = &service.config.agent;
        let llm = Llm::new(crate::settings::llm_config(agent, |k| {
            std::env::var(k).ok()
        }))
        .map_err(|e| ServiceError::internal(format!("the model client: {e}")))?;
        let defaults = AgentDefaults::from_config(agent);
        Ok(Self::new(service, Arc::new(llm), defaults))
    }

    /// The caller's run `id`.
    pub(crate) fn own(&self, caller: &Caller, id: &str) -> ServiceResult<RunRecord> {
        sandcell_api::rules::check_record_id(id, "run", "a run")?;
        match self.service.store.get_run(id)? {
            Some(r) if r.owner == caller.owner || caller.admin => Ok(r),
            _ => Err(ServiceError::not_found("run", id)),
        }
    }

    /// Starts a run; returns at once (the run goes on in the background) unless `req.wait`,
    /// then when it has ended.
    pub async fn start(self: &Arc<Self>, caller: &Caller, req: StartRun) -> ServiceResult<RunInfo> {
        if req.task.trim().is_empty() {
            return Err(ServiceError::invalid("'task' is empty"));
        }
        if req.task.len() > MAX_TASK_BYTES {
            return Err(ServiceError::invalid(format!(
                "'task' of {} bytes is over the {} MiB limit",
                req.task.len(),
                MAX_TASK_BYTES >> 20
            )));
        }
        let mode = req.mode.unwrap_or(self.defaults.mode);
        if let Some(context) = &req.context {
            if mode != RunMode::Repl {
                return Err(ServiceError::invalid(
                    "'context' is the input of repl mode; give mode \"repl\" (or put it in the task)",
                ));
            }
            if context.len() > MAX_TASK_BYTES {
                return Err(ServiceError::invalid(format!(
                    "'context' of {} bytes is over the {} MiB limit",
                    context.len(),
                    MAX_TASK_BYTES >> 20
                )));
            }
        }
        let model_text = req.model.clone().or_else(|| self.defaults.model.clone()).ok_or_else(|| {
            ServiceError::invalid(
                "no model: name one as provider/model (e.g. openai/gpt-4o-mini) or set agent.model in the settings",
            )
        })?;
        let model: ModelRef = model_text
            .parse()
            .map_err(|e: sandcell_llm::LlmError| ServiceError::invalid(e.message))?;
        let budgets = self.defaults.budgets(&req.budgets)?;
        self.check_key(&model)?;
        if let Some(thread) = req.thread_id.clone() {
            if mode != RunMode::Tools {
                return Err(ServiceError::invalid(
                    "a run on a thread is a tools-mode run (mode \"repl\" is not for threads yet)",
                ));
            }
            if req.sandbox_id.is_some() {
                return Err(ServiceError::invalid(
                    "'thread_id' and 'sandbox_id' both name a sandbox: a thread's runs work in the thread's; give one",
                ));
            }
            return self
                .start_on_thread(caller, &thread, req, model, budgets)
                .await;
        }
        let plan = match (&req.sandbox_id, &req.template) {
            (Some(id), _) => {
                self.service.get_sandbox(caller, id)?;
                SandboxPlan::Existing(id.clone())
            }
            (None, t) => SandboxPlan::Create {
                template: t.clone().unwrap_or_else(|| "python".to_string()),
                keep: req.keep_sandbox,
            },
        };
        let id = new_record_id("run")?;
        let now = now_ms();
        let settings = RunSettings {
            budgets: budgets.clone(),
            stream: self.defaults.stream,
            template: req.template.clone(),
            validate: req.validate.clone(),
            snapshots: req.snapshots.unwrap_or(self.defaults.snapshots),
            given_sandbox: req.sandbox_id.as_ref().map(ToString::to_string),
            keep_sandbox: req.keep_sandbox,
            forked_from: None,
            keep_snapshots: req.keep_snapshots,
            thread_id: None,
        };
        let record = RunRecord {
            id: id.clone(),
            owner: caller.owner.clone(),
            root_id: id.clone(),
            parent_id: None,
            depth: 0,
            mode: mode.as_str().to_string(),
            model: model.to_string(),
            task: req.task.clone(),
            sandbox_id: req.sandbox_id.as_ref().map(ToString::to_string),
            status: "running".into(),
            reason: None,
            answer: None,
            settings: serde_json::to_value(&settings).unwrap_or(Value::Null),
            totals: serde_json::to_value(sandcell_api::runs::RunUsage::default())
                .unwrap_or(Value::Null),
            created_at: now,
            updated_at: now,
            ended_at: None,
        };
        let (events, _) = broadcast::channel(1024);
        let journal = Journal::create(
            self.service.store.clone(),
            &self.service.config.home,
            record,
            events.clone(),
        )?;
        let cancel = CancellationToken::new();
        let entry = self.live.register(&id, cancel.clone(), events);
        let ctx = RunContext {
            service: self.service.clone(),
            llm: self.llm.clone(),
            caller: caller.clone(),
            model,
            stream: settings.stream,
            pool: Arc::new(Pool::new(budgets)),
            cancel,
            journal,
            sandbox: plan,
            runs: self.live.clone(),
            validate: req.validate,
            durability: Durability {
                policy: settings.snapshots,
                prune: self.defaults.prune_snapshots && !settings.keep_snapshots,
            },
        };
        let task = req.task;
        let context = req.context;
        tokio::spawn(async move {
            match mode {
                RunMode::Tools => drop(drive(ctx, task).await),
                RunMode::Repl => drop(crate::repl::drive_repl(ctx, task, context).await),
            }
            drop(entry);
        });
        if req.wait {
            return self.wait(caller, &id).await;
        }
        self.get(caller, &id)
    }

    /// Refused before a sandbox is made: the official endpoints need a key.
    pub(crate) fn check_key(&self, model: &ModelRef) -> ServiceResult<()> {
        let provider = self.llm.config().provider(model.provider);
        if provider.api_key.is_none() && provider.is_official(model.provider) {
            return Err(ServiceError::invalid(format!(
                "no key for {}: set ${} (or point agent.{}.base_url at a server that needs none)",
                model.provider.name(),
                provider.key_env,
                model.provider.name()
            )));
        }
        Ok(())
    }

    /// The caller's run `id` as its events leave it at the end of its committed step `step`,
    /// with its settings.
    fn at_step(
        &self,
        caller: &Caller,
        id: &str,
        step: u32,
    ) -> ServiceResult<(RunRecord, RunSettings, crate::durable::Rebuilt)> {
        let record = self.own(caller, id)?;
        let settings: RunSettings = serde_json::from_value(record.settings.clone())
            .map_err(|e| ServiceError::internal(format!("run {id}'s settings: {e}")))?;
        let events = crate::durable::all_events(&self.service.store, id)?;
        let committed = |e: &Value| e["type"] == "step_committed";
        let Some(cut) = events
            .iter()
            .position(|e| committed(e) && e["step"].as_u64() == Some(u64::from(step)))
        else {
            let last = events
                .iter()
                .filter(|e| committed(e))
                .filter_map(|e| e["step"].as_u64())
                .max()
                .unwrap_or(0);
            return Err(ServiceError::invalid(format!(
                "'from_step' {step}: run {id} has committed steps 1 to {last}"
            )));
        };
        let rebuilt = crate::durable::rebuild(&events[..=cut])
            .map_err(|e| ServiceError::internal(format!("run {id} cannot be rebuilt: {e}")))?;
        Ok((record, settings, rebuilt))
    }

    /// A new sandbox from run `id`'s snapshot `snapshot` of step `step`; one pruned when the
    /// run ended is said to be.
    async fn restore_step(
        &self,
        caller: &Caller,
        id: &str,
        step: u32,
        snapshot: &str,
    ) -> ServiceResult<sandcell_api::snapshots::Forked> {
        let opts = sandcell_engine::fleet::CreateOptions::default();
        match self
            .service
            .restore_snapshot(caller, snapshot, &opts, &[])
            .await
        {
            Err(e) if e.kind == ErrorKind::NotFound => Err(ServiceError::new(
                ErrorKind::InvalidState,
                format!(
                    "step {step}'s snapshot of run {id} ({snapshot}) was pruned when the run ended; runs keep them all with agent.prune_step_snapshots = false"
                ),
            )),
            other => other,
        }
    }

    /// A new sandbox of the caller's as run `id`'s was at the end of step `step`, restored
    /// from the newest step snapshot at or before it; no run starts.
    pub async fn step_sandbox(
        &self,
        caller: &Caller,
        id: &str,
        step: u32,
    ) -> ServiceResult<StepSandbox> {
        let (_, _, rebuilt) = self.at_step(caller, id, step)?;
        let Some((at, snap)) = rebuilt.snapshot else {
            return Err(no_snapshot(id, step));
        };
        let made = self.restore_step(caller, id, at, &snap.snapshot_id).await?;
        Ok(StepSandbox {
            sandbox_id: made.sandbox.id,
            snapshot_id: snap.snapshot_id,
            snapshot_step: at,
            not_carried: snap.not_carried,
        })
    }

    /// Forks the caller's run `id` at step `req.from_step`: a new run whose history is the
    /// original's steps up to it and whose sandbox is restored from that step's snapshot;
    /// the original is never changed. Returns at once unless `req.wait`.
    pub async fn fork(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        req: ForkRun,
    ) -> ServiceResult<RunInfo> {
        if let Some(t) = &req.task {
            if t.trim().is_empty() {
                return Err(ServiceError::invalid("'task' is empty"));
            }
            if t.len() > MAX_TASK_BYTES {
                return Err(ServiceError::invalid(format!(
                    "'task' of {} bytes is over the {} MiB limit",
                    t.len(),
                    MAX_TASK_BYTES >> 20
                )));
            }
        }
        let (original, settings, rebuilt) = self.at_step(caller, id, req.from_step)?;
        let model_text = req.model.clone().unwrap_or_else(|| original.model.clone());
        let model: ModelRef = model_text
            .parse()
            .map_err(|e: sandcell_llm::LlmError| ServiceError::invalid(e.message))?;
        let budgets = self.defaults.budgets(&req.budgets)?;
        self.check_key(&model)?;
        let template = settings
            .template
            .clone()
            .unwrap_or_else(|| "python".to_string());
        // The sandbox as the original left it at that step.
        let (sandbox, restored_from) = match &rebuilt.snapshot {
            Some((at, snap)) => {
                let made = self
                    .restore_step(caller, id, *at, &snap.snapshot_id)
                    .await?;
                (
                    sandcell_api::SandboxId::parse(made.sandbox.id)?,
                    Some(snap.snapshot_id.clone()),
                )
            }
            // Nothing had changed the sandbox the original made: a new one is that state.
            None if settings.given_sandbox.is_none()
                && settings.snapshots != SnapshotPolicy::Off =>
            {
                let plan = SandboxPlan::Create {
                    template: template.clone(),
                    keep: false,
                };
                (
                    crate::run::open_sandbox(&self.service, caller, &plan)
                        .await?
                        .0,
                    None,
                )
            }
            None => return Err(no_snapshot(id, req.from_step)),
        };
        let made = sandbox.clone();
        let started = self
            .start_fork(
                caller,
                req,
                original,
                settings,
                rebuilt,
                model,
                budgets,
                template,
                sandbox,
                restored_from,
            )
            .await;
        if started.is_err() {
            let _ = self.service.delete_sandbox(caller, &made).await;
        }
        started
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_fork(
        self: &Arc<Self>,
        caller: &Caller,
        req: ForkRun,
        original: RunRecord,
        settings: RunSettings,
        rebuilt: crate::durable::Rebuilt,
        model: ModelRef,
        budgets: Budgets,
        template: String,
        sandbox: sandcell_api::SandboxId,
        restored_from: Option<String>,
    ) -> ServiceResult<RunInfo> {
        let forked_from = ForkedFrom {
            run_id: original.id.clone(),
            step: req.from_step,
        };
        let fork_settings = RunSettings {
            budgets,
            stream: settings.stream,
            template: Some(template.clone()),
            validate: req.validate.clone().or(settings.validate.clone()),
            snapshots: settings.snapshots,
            given_sandbox: None,
            keep_sandbox: req.keep_sandbox,
            forked_from: Some(forked_from),
            keep_snapshots: false,
            thread_id: None,
        };
        let repl = match rebuilt.mode {
            RunMode::Tools => None,
            RunMode::Repl => Some(ReplOrigin {
                kernel: rebuilt.kernel.clone(),
                input: crate::repl::read_input(rebuilt.input.as_ref(), &original.task)?,
            }),
        };
        let mut messages = rebuilt.messages;
        if let Some(t) = &req.task {
            messages.push(sandcell_llm::Message::user(t.clone()));
        }
        self.launch(
            caller,
            Launch {
                task: req.task.clone().unwrap_or_else(|| original.task.clone()),
                model,
                settings: fork_settings,
                plan: SandboxPlan::Create {
                    template,
                    keep: req.keep_sandbox,
                },
                sandbox,
                history: History::Fork {
                    from_run_id: original.id.clone(),
                    from_step: req.from_step,
                    restored_from,
                },
                messages,
                wait: req.wait,
                repl,
            },
        )
        .await
    }

    /// Records a run that starts from a history (a fork's, a thread's) in a sandbox made
    /// for it, and starts it in the background (or waits for its end).
    pub(crate) async fn launch(
        self: &Arc<Self>,
        caller: &Caller,
        l: Launch,
    ) -> ServiceResult<RunInfo> {
        let id = new_record_id("run")?;
        let now = now_ms();
        let budgets = l.settings.budgets.clone();
        let mode = if l.repl.is_some() {
            RunMode::Repl
        } else {
            RunMode::Tools
        };
        let record = RunRecord {
            id: id.clone(),
            owner: caller.owner.clone(),
            root_id: id.clone(),
            parent_id: None,
            depth: 0,
            mode: mode.as_str().to_string(),
            model: l.model.to_string(),
            task: l.task.clone(),
            sandbox_id: Some(l.sandbox.to_string()),
            status: "running".into(),
            reason: None,
            answer: None,
            settings: serde_json::to_value(&l.settings).unwrap_or(Value::Null),
            totals: serde_json::to_value(sandcell_api::runs::RunUsage::default())
                .unwrap_or(Value::Null),
            created_at: now,
            updated_at: now,
            ended_at: None,
        };
        let (events, _) = broadcast::channel(1024);
        let mut journal = Journal::create(
            self.service.store.clone(),
            &self.service.config.home,
            record,
            events.clone(),
        )?;
        // A repl fork keeps its input as a file of its own (its task may be another): a
        // resume of the fork reads it there.
        let input = match &l.repl {
            Some(origin) => Some(
                crate::run::keep_artifact(&journal, "text/plain", "txt", origin.input.as_bytes())
                    .ok_or_else(|| {
                    ServiceError::internal("the run's input could not be kept as a file")
                })?,
            ),
            None => None,
        };
        journal.emit(
            EventKind::RunStarted {
                task: l.task.clone(),
                mode,
                model: l.model.to_string(),
                budgets: budgets.clone(),
                parent_run_id: None,
                validate: l.settings.validate.clone(),
                forked_from: l.settings.forked_from.clone(),
                input: input.clone(),
            },
            false,
        )?;
        let messages = crate::durable::externalize(&l.messages, &journal.artifacts_dir());
        let history = match l.history {
            History::Fork {
                from_run_id,
                from_step,
                restored_from,
            } => EventKind::Forked {
                from_run_id,
                from_step,
                messages,
                restored_from,
            },
            History::Thread {
                thread_id,
                from_run_id,
                restored_from,
            } => EventKind::ThreadHistory {
                thread_id,
                from_run_id,
                messages,
                restored_from,
            },
        };
        journal.emit(history, false)?;
        let created = matches!(l.plan, SandboxPlan::Create { .. });
        crate::run::sandbox_ready(&mut journal, &l.sandbox, created)?;
        let cancel = CancellationToken::new();
        let entry = self.live.register(&id, cancel.clone(), events);
        let ctx = RunContext {
            service: self.service.clone(),
            llm: self.llm.clone(),
            caller: caller.clone(),
            model: l.model,
            stream: l.settings.stream,
            pool: Arc::new(Pool::new(budgets)),
            cancel,
            journal,
            sandbox: l.plan,
            runs: self.live.clone(),
            validate: l.settings.validate.clone(),
            durability: Durability {
                policy: l.settings.snapshots,
                prune: self.defaults.prune_snapshots && !l.settings.keep_snapshots,
            },
        };
        let (sandbox, messages) = (l.sandbox, l.messages);
        let repl = l.repl.map(|origin| crate::repl::ReplStart::Forked {
            sandbox: sandbox.clone(),
            messages: messages.clone(),
            kernel: origin.kernel,
            input,
            task: l.task,
        });
        tokio::spawn(async move {
            drop(match repl {
                Some(start) => crate::repl::drive_repl_from(ctx, start).await,
                None => crate::run::drive_from(ctx, Start::Forked { sandbox, messages }).await,
            });
            drop(entry);
        });
        if l.wait {
            return self.wait(caller, &id).await;
        }
        self.get(caller, &id)
    }

    /// The caller's run.
    pub fn get(&self, caller: &Caller, id: &str) -> ServiceResult<RunInfo> {
        Ok(run_info(&self.own(caller, id)?))
    }

    /// The caller's runs, newest first.
    pub fn list(&self, caller: &Caller, limit: u32) -> ServiceResult<RunList> {
        let owner = (!caller.admin).then_some(caller.owner.as_str());
        let runs = self.service.store.list_runs(owner, limit, None)?;
        Ok(RunList {
            runs: runs.iter().map(run_info).collect(),
        })
    }

    /// Events of the caller's run after number `after`, at most `limit`.
    pub fn events(
        &self,
        caller: &Caller,
        id: &str,
        after: u64,
        limit: u32,
    ) -> ServiceResult<Vec<Value>> {
        self.own(caller, id)?;
        Ok(self
            .service
            .store
            .run_events(id, after, limit)?
            .into_iter()
            .map(|e: RunEventRecord| e.event)
            .collect())
    }

    /// Live events of a run running in this process (`None`: it is not running here).
    pub fn subscribe(
        &self,
        caller: &Caller,
        id: &str,
    ) -> ServiceResult<Option<broadcast::Receiver<Event>>> {
        self.own(caller, id)?;
        Ok(self.live.get(id).map(|l| l.events.subscribe()))
    }

    /// Cancels the caller's run: its model call stops, its cell is interrupted (the kernel's
    /// state kept); returns once its end is recorded.
    pub async fn cancel(&self, caller: &Caller, id: &str) -> ServiceResult<RunInfo> {
        let record = self.own(caller, id)?;
        let live = self.live.get(id);
        match live {
            Some(l) => {
                l.cancel.cancel();
                let mut done = l.done;
                let _ = done.wait_for(|d| *d).await;
                self.get(caller, id)
            }
            None if record.status == "running" => Err(ServiceError::new(
                ErrorKind::InvalidState,
                format!("run {id} is not running in this process"),
            )),
            None => Ok(run_info(&record)),
        }
    }

    /// Waits for the caller's run to end.
    pub async fn wait(&self, caller: &Caller, id: &str) -> ServiceResult<RunInfo> {
        let live = self.live.get(id).map(|l| l.done);
        if let Some(mut done) = live {
            let _ = done.wait_for(|d| *d).await;
        }
        self.get(caller, id)
    }

    /// The caller's run's events after number `after`, as a stream: the stored ones, then,
    /// for a run going on in this process, the live ones as they come, until `run_finished`
    /// (a run that has ended, or runs elsewhere, gives what is stored and ends). No event
    /// comes twice and none is missed: the subscription is taken before the store is read,
    /// events are told apart by their number, and a follower that falls behind the live
    /// channel reads what it missed from the store.
    pub fn follow(
        &self,
        caller: &Caller,
        id: &str,
        after: u64,
    ) -> ServiceResult<impl futures_util::Stream<Item = Value> + Send + 'static> {
        self.own(caller, id)?;
        let live = self.live.get(id).map(|l| l.events.subscribe());
        let follower = Follower {
            store: self.service.store.clone(),
            run: id.to_string(),
            last: after,
            ready: std::collections::VecDeque::new(),
            live,
            reread: true,
            finished: false,
        };
        Ok(futures_util::stream::unfold(follower, |mut f| async move {
            f.next().await.map(|v| (v, f))
        }))
    }

    /// The last `n` events of the caller's run (fewer when it has fewer), in order.
    pub fn last_events(&self, caller: &Caller, id: &str, n: u32) -> ServiceResult<Vec<Value>> {
        self.own(caller, id)?;
        let last = self.service.store.last_run_seq(id)?;
        self.events(caller, id, last.saturating_sub(u64::from(n)), n.max(1))
    }

    /// Resumes the caller's run `id`, which a process that stopped left unfinished (still
    /// `running`, or `failed` with reason `interrupted`): it goes on from its last committed
    /// step (see `durable`). Returns at once unless `wait`.
    pub async fn resume(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        wait: bool,
    ) -> ServiceResult<RunInfo> {
        let record = self.own(caller, id)?;
        self.resume_record(record)?;
        if wait {
            return self.wait(caller, id).await;
        }
        self.get(caller, id)
    }

    /// Starts `record` again in the background, after checking it can be.
    fn resume_record(self: &Arc<Self>, mut record: RunRecord) -> ServiceResult<()> {
        let id = record.id.clone();
        let state = |m: String| ServiceError::new(ErrorKind::InvalidState, m);
        if self.live.contains(&id) {
            return Err(state(format!("run {id} is running in this process")));
        }
        let interrupted =
            record.status == "failed" && record.reason.as_deref() == Some("interrupted");
        if record.status != "running" && !interrupted {
            return Err(state(format!(
                "run {id} has ended ({}, {}): only a run a stop interrupted can be resumed; fork it to go on from one of its steps",
                record.status,
                record.reason.as_deref().unwrap_or("-")
            )));
        }
        if record.depth > 0 {
            return Err(state(format!(
                "run {id} is a sub-run: it goes on with its parent; resume run {}",
                record.root_id
            )));
        }
        let settings: RunSettings = serde_json::from_value(record.settings.clone())
            .map_err(|e| ServiceError::internal(format!("run {id}'s settings: {e}")))?;
        let model: ModelRef = record
            .model
            .parse()
            .map_err(|e: sandcell_llm::LlmError| ServiceError::invalid(e.message))?;
        let records = crate::durable::all_event_records(&self.service.store, &id)?;
        let ran = crate::durable::time_run(&records);
        let events: Vec<Value> = records.into_iter().map(|e| e.event).collect();
        let rebuilt = crate::durable::rebuild(&events)
            .map_err(|e| ServiceError::internal(format!("run {id} cannot be rebuilt: {e}")))?;
        let pool = Pool::resumed(settings.budgets.clone(), &rebuilt.usage, ran);
        for (usage, cost) in &rebuilt.spent_after {
            pool.count_spent(usage, *cost);
        }
        let plan = match &settings.given_sandbox {
            Some(given) => SandboxPlan::Existing(sandcell_api::SandboxId::parse(given.clone())?),
            None => SandboxPlan::Create {
                template: settings
                    .template
                    .clone()
                    .unwrap_or_else(|| "python".to_string()),
                keep: settings.keep_sandbox,
            },
        };
        record.status = "running".into();
        record.reason = None;
        record.ended_at = None;
        record.updated_at = now_ms();
        // Running from now: whoever reads the run after this answer sees it so.
        self.service.store.update_run(&record)?;
        let caller = Caller {
            owner: record.owner.clone(),
            key_id: "resume".into(),
            admin: false,
            request_id: None,
        };
        let (events_tx, _) = broadcast::channel(1024);
        let journal = Journal::reopen(
            self.service.store.clone(),
            &self.service.config.home,
            record,
            events_tx.clone(),
            rebuilt.seq,
            rebuilt.step,
        );
        let cancel = CancellationToken::new();
        let entry = self.live.register(&id, cancel.clone(), events_tx);
        let ctx = RunContext {
            service: self.service.clone(),
            llm: self.llm.clone(),
            caller,
            model,
            stream: settings.stream,
            pool: Arc::new(pool),
            cancel,
            journal,
            sandbox: plan,
            runs: self.live.clone(),
            validate: settings.validate.clone(),
            durability: Durability {
                policy: settings.snapshots,
                prune: self.defaults.prune_snapshots && !settings.keep_snapshots,
            },
        };
        tokio::spawn(async move {
            let rebuilt = Box::new(rebuilt);
            drop(match rebuilt.mode {
                RunMode::Tools => crate::run::drive_from(ctx, Start::Resumed(rebuilt)).await,
                RunMode::Repl => {
                    crate::repl::drive_repl_from(ctx, crate::repl::ReplStart::Resumed(rebuilt))
                        .await
                }
            });
            drop(entry);
        });
        Ok(())
    }

    /// At a start: resumes the top-level runs a process that is gone left
    /// `running`, and marks the others failed (`interrupted`; a sub-run goes on with its
    /// parent, which starts its step again). Returns (resumed, settled).
    pub fn resume_interrupted(self: &Arc<Self>) -> ServiceResult<(usize, usize)> {
        let (mut resumed, mut settled) = (0, 0);
        for r in self.service.store.runs_with_status("running")? {
            if self.live.contains(&r.id) {
                continue;
            }
            let id = r.id.clone();
            match self.resume_record(r) {
                Ok(()) => resumed += 1,
                Err(e) => {
                    tracing::info!(run = %id, reason = %e.message, "an interrupted run is not resumed");
                    settled += self.settle(&id)?;
                }
            }
        }
        Ok((resumed, settled))
    }

    /// Marks runs left `running` by a process that is gone failed (`interrupted`); `sandcell
    /// runs resume RUN` takes one up again.
    pub fn settle_interrupted(&self) -> ServiceResult<usize> {
        let mut n = 0;
        for r in self.service.store.runs_with_status("running")? {
            if !self.live.contains(&r.id) {
                n += self.settle(&r.id)?;
            }
        }
        Ok(n)
    }

    /// Marks run `id` failed (`interrupted`) if it is still `running`.
    fn settle(&self, id: &str) -> ServiceResult<usize> {
        match self.service.store.get_run(id)? {
            Some(mut r) if r.status == "running" => {
                r.status = "failed".into();
                r.reason = Some("interrupted".into());
                r.ended_at = Some(now_ms());
                r.updated_at = now_ms();
                self.service.store.update_run(&r)?;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

/// One follower of a run's events (see [`Runner::follow`]).
struct Follower {
    store: Arc<sandcell_store::Store>,
    run: String,
    /// The number of the last event handed out.
    last: u64,
    ready: std::collections::VecDeque<Value>,
    /// The live events (`None`: the run does not go on in this process, or has ended).
    live: Option<broadcast::Receiver<Event>>,
    /// The store has events not read yet.
    reread: bool,
    /// `run_finished` was handed out or queued.
    finished: bool,
}

impl Follower {
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.ready.pop_front() {
                return Some(v);
            }
            if self.finished {
                return None;
            }
            if self.reread {
                if self.read_stored() {
                    continue;
                }
                self.reread = false;
            }
            let rx = self.live.as_mut()?;
            match rx.recv().await {
                Ok(e) if e.seq <= self.last => {}
                Ok(e) if e.seq == self.last + 1 => {
                    self.last = e.seq;
                    self.finished = e.kind.name() == "run_finished";
                    match serde_json::to_value(&e) {
                        Ok(v) => self.ready.push_back(v),
                        // Stored as it was written: read it from there.
                        Err(_) => self.reread = true,
                    }
                }
                // Behind the live channel: what was missed is in the store.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.reread = true,
                Err(broadcast::error::RecvError::Closed) => {
                    // The run has ended: its last events are in the store.
                    self.live = None;
                    self.reread = true;
                }
            }
        }
    }

    /// Queues the next page of stored events; whether there was one.
    fn read_stored(&mut self) -> bool {
        let page = match self.store.run_events(&self.run, self.last, 0) {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(run = %self.run, error = %e, "reading a run's events failed; the follower ends");
                self.live = None;
                return false;
            }
        };
        if page.is_empty() {
            return false;
        }
        for e in page {
            self.last = e.seq;
            self.finished |= e.kind == "run_finished";
            self.ready.push_back(e.event);
        }
        true
    }
}
