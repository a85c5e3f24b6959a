//! `sandcell agent` (a run in tools mode), `sandcell runs` and `sandcell logs`: the agent
//! runtime from the command line. A run goes through the daemon when one runs on the home
//! (or `--url`/`$SANDCELL_API_URL` names one): it is started with `POST /v1/runs` and
//! followed through its event stream, and outlives this process. Without a daemon it goes
//! embedded, in this process, on the same home and store, so its record and trajectory are
//! where `sandcell logs` and the daemon look; it ends with this process.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use sandcell_agent::event::{Event, EventKind};
use sandcell_api::runs::{
    BudgetsInput, CreateThread, ForkRun, RunInfo, RunMode, SnapshotPolicy, StartRun, Validate,
};
use sandcell_api::{SandboxId, Timeout};
use sandcell_client::{Client, Discover};
use sandcell_store::Store;
use serde_json::{Value, json};

use crate::daemon::ConfigArgs;

/// Which daemon to go through (none given and none running on the home: work in this
/// process and on the home's store).
#[derive(Debug, Args, Clone, Default)]
pub struct DaemonArgs {
    /// The daemon's URL (default: $SANDCELL_API_URL, else the daemon running on the home, if
    /// any).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The daemon's API key (default: $SANDCELL_API_KEY, else <home>/admin.key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
}

/// `sandcell agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// What the agent should do.
    pub task: String,
    /// `provider/model` (default: agent.model in the settings).
    #[arg(long, value_name = "PROVIDER/MODEL")]
    pub model: Option<String>,
    /// `tools` (default) or `repl`.
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// Run in this existing sandbox.
    #[arg(long = "sandbox", value_name = "ID")]
    pub sandbox: Option<String>,
    /// Make the run's sandbox from this template (default python).
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// Repl mode: a file whose text becomes the kernel variable `context`.
    #[arg(long, value_name = "FILE")]
    pub context_file: Option<PathBuf>,
    /// Model calls with tools (default 10, at most 50).
    #[arg(long, value_name = "N")]
    pub max_iterations: Option<u32>,
    /// Levels of sub-runs (default 4, at most 5).
    #[arg(long, value_name = "N")]
    pub max_depth: Option<u32>,
    /// Input + output tokens of the whole run (default: no limit).
    #[arg(long, value_name = "N")]
    pub token_budget: Option<u64>,
    /// US dollars the run may spend (default 2, at most 10).
    #[arg(long, value_name = "USD")]
    pub cost_limit: Option<f64>,
    /// Seconds the run may take (default 300, at most 600).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Keep the sandbox the run makes (default: deleted when the run ends).
    #[arg(long)]
    pub keep_sandbox: bool,
    /// Check the final answer by running CMD in the run's sandbox: exit 0 ends the run
    /// `validated`; otherwise the model reads the failure and tries again.
    #[arg(long, value_name = "CMD")]
    pub validate: Option<String>,
    /// Answers the model may give before a failing check ends the run (default 3, at most
    /// 10).
    #[arg(long, value_name = "N", requires = "validate")]
    pub validate_attempts: Option<u32>,
    /// Seconds the check may run (default 60, at most 600).
    #[arg(long, value_name = "SECS", requires = "validate")]
    pub validate_timeout: Option<f64>,
    /// When the run snapshots its sandbox at the end of a step: on_mutation (the default
    /// setting), every_step or off. A step's snapshot is what a resume or a fork starts from.
    #[arg(long, value_name = "POLICY")]
    pub snapshots: Option<String>,
    /// Keep all the run's step snapshots when it ends (default: only the last one and those
    /// in use), so that it can be forked from any step later.
    #[arg(long)]
    pub keep_snapshots: bool,
    /// Run on this thread (an id `th-…`, or a name, made if new): the model sees the
    /// thread's earlier conversation and works in its sandbox.
    #[arg(long, value_name = "THREAD")]
    pub thread: Option<String>,
    /// Print one JSON object at the end: run_id, status, reason, answer, usage.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

/// `sandcell runs`.
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Recent runs, newest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// One run: status, reason, answer, usage.
    Status {
        /// The run.
        run: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Take up a run a stopped process left unfinished: it goes on from its last committed
    /// step (the daemon does this by itself for its own runs when it starts).
    Resume {
        /// The run.
        run: String,
        /// Print one JSON object at the end (as `sandcell agent --json`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Fork a run at one of its steps: a new run whose history is the original's steps up
    /// to it, in a sandbox restored from that step's snapshot (the original is not changed).
    Fork {
        /// The original run.
        run: String,
        /// Its committed step to go on from.
        #[arg(long, value_name = "N")]
        from_step: u32,
        /// A new instruction after the history (default: go on with the original task).
        #[arg(long, value_name = "TASK")]
        task: Option<String>,
        /// Another provider/model (default: the original's).
        #[arg(long)]
        model: Option<String>,
        /// Keep the fork's sandbox when it ends.
        #[arg(long)]
        keep_sandbox: bool,
        /// Print one JSON object at the end (as `sandcell agent --json`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Open a new sandbox of the daemon's as a run's sandbox was at the end of a step,
    /// without starting a run; prints its id.
    Sandbox {
        /// The run.
        run: String,
        /// One of its committed steps.
        #[arg(long, value_name = "N")]
        step: u32,
        /// Print JSON (the sandbox, the snapshot, what it did not carry).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Cancel a run of the daemon: its model call stops, its running code is interrupted
    /// (a run started without a daemon ends with its own process).
    Cancel {
        /// The run.
        run: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
}

/// `sandcell logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The run (default: list recent runs).
    pub run: Option<String>,
    /// One JSON event per line.
    #[arg(long)]
    pub json: bool,
    /// Follow a run that goes on: print its events as they come, until it ends.
    #[arg(long, short)]
    pub follow: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

/// What `--json` prints for a run.
fn summary(info: &RunInfo) -> serde_json::Value {
    json!({
        "run_id": info.id,
        "status": info.status,
        "reason": info.reason,
        "answer": info.answer,
        "model": info.model,
        "sandbox_id": info.sandbox_id,
        "usage": info.usage,
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")
}

/// The daemon to go through: the one named (`--url`, `$SANDCELL_API_URL`), else the one
/// running on the home; `None` when there is neither.
pub(crate) fn daemon_client(d: &DaemonArgs, config: &ConfigArgs) -> anyhow::Result<Option<Client>> {
    let home = config.home();
    let named = d.url.clone().or_else(|| {
        std::env::var("SANDCELL_API_URL")
            .ok()
            .filter(|v| !v.is_empty())
    });
    let url = match named {
        Some(url) => url,
        None => match sandcell_client::running_daemon(&home) {
            Ok(info) => info.url,
            Err(_) => return Ok(None),
        },
    };
    let found = Discover {
        url: Some(url),
        api_key: d.api_key.clone(),
        home: Some(home),
    };
    Ok(Some(found.client()?))
}

/// The exit code of a run that ended so: 0 when it succeeded, else 1.
fn exit_code(info: &RunInfo) -> ExitCode {
    if info.status == "succeeded" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// What `sandcell agent` prints at the end of a run.
fn report(info: &RunInfo, json_out: bool) -> anyhow::Result<ExitCode> {
    if json_out {
        println!("{}", serde_json::to_string_pretty(&summary(info))?);
    } else {
        print_result(info);
    }
    Ok(exit_code(info))
}

/// Runs an agent to its end in this process.
pub fn agent(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let (config, _) = args.config.load(Vec::new())?;
    let mode = match args.mode.as_deref() {
        None => None,
        Some("tools") => Some(RunMode::Tools),
        Some("repl") => Some(RunMode::Repl),
        Some(other) => anyhow::bail!("--mode {other}: expected tools or repl"),
    };
    let context = args
        .context_file
        .as_ref()
        .map(|f| std::fs::read_to_string(f).with_context(|| format!("read {}", f.display())))
        .transpose()?;
    let req = StartRun {
        task: args.task,
        model: args.model,
        mode,
        sandbox_id: args.sandbox.map(SandboxId::parse).transpose()?,
        template: args.template,
        context,
        budgets: BudgetsInput {
            max_iterations: args.max_iterations,
            max_depth: args.max_depth,
            token_budget: args.token_budget,
            cost_limit_usd: args.cost_limit,
            timeout_secs: args.timeout,
            ..BudgetsInput::default()
        },
        wait: false,
        keep_sandbox: args.keep_sandbox,
        validate: args
            .validate
            .map(|command| {
                let timeout = args.validate_timeout.map(Timeout::from_secs).transpose()?;
                Validate::new(command, timeout, args.validate_attempts)
            })
            .transpose()?,
        snapshots: args
            .snapshots
            .as_deref()
            .map(str::parse::<SnapshotPolicy>)
            .transpose()?,
        keep_snapshots: args.keep_snapshots,
        thread_id: None,
    };
    let thread = args.thread.clone();
    let live = std::io::stderr().is_terminal() && !args.json;
    let json_out = args.json;
    if let Some(client) = daemon_client(&args.daemon, &args.config)? {
        if !args.config.set.is_empty() {
            eprintln!(
                "sandcell: --set applies to runs in this process; the daemon's settings apply to this one"
            );
        }
        return runtime()?.block_on(async move {
            let mut req = req;
            if let Some(t) = thread {
                req.thread_id = Some(thread_remote(&client, &t).await?);
            }
            let info = run_remote(&client, req, live).await?;
            report(&info, json_out)
        });
    }
    runtime()?.block_on(async move {
        let engine = crate::cli::service_engine(crate::cli::backend_config()?, &config)?;
        let embedded = sandcell_server::embedded(config, engine)
            .await
            .context("start the embedded engine")?;
        let outcome = run_embedded(&embedded, req, thread, live).await;
        // The run's sandbox ends with this process: nothing else could reach it.
        embedded.shutdown().await;
        report(&outcome?, json_out)
    })
}

/// The id of the daemon's thread `t` (an id, or a name, made if new).
async fn thread_remote(client: &Client, t: &str) -> anyhow::Result<String> {
    let known = client.threads().await.context("list threads")?.threads;
    if let Some(k) = known.into_iter().find(|k| k.id == t || k.name == t) {
        return Ok(k.id);
    }
    let made = CreateThread {
        name: Some(t.to_string()),
    };
    Ok(client
        .create_thread(&made)
        .await
        .context("make the thread")?
        .id)
}

/// `sandcell threads …`.
#[derive(Debug, Subcommand)]
pub enum ThreadsCommand {
    /// The threads, the most recently used first.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Make a thread.
    Create {
        /// Its name.
        name: String,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// One thread, as JSON.
    Show {
        /// Its id.
        thread: String,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Rename a thread.
    Rename {
        /// Its id.
        thread: String,
        /// The new name.
        name: String,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Delete a thread and its sandbox (its runs stay).
    Delete {
        /// Its id.
        thread: String,
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
}

/// `sandcell threads …`: through the daemon, which holds the threads' sandboxes.
pub fn threads(command: ThreadsCommand) -> anyhow::Result<ExitCode> {
    let (config, daemon) = match &command {
        ThreadsCommand::List { config, daemon, .. }
        | ThreadsCommand::Create { config, daemon, .. }
        | ThreadsCommand::Show { config, daemon, .. }
        | ThreadsCommand::Rename { config, daemon, .. }
        | ThreadsCommand::Delete { config, daemon, .. } => (config, daemon),
    };
    let Some(client) = daemon_client(daemon, config)? else {
        bail!(
            "no daemon runs on {}: threads live in the daemon (start one: sandcell daemon start)",
            config.home().display()
        );
    };
    let rt = runtime()?;
    match &command {
        ThreadsCommand::List { json, .. } => {
            let list = rt.block_on(client.threads())?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for t in &list.threads {
                    println!(
                        "{}  {:<24}  runs {:<3}  {}  {}",
                        t.id,
                        t.name,
                        t.runs,
                        t.sandbox_id.as_deref().unwrap_or("-"),
                        t.updated_at
                    );
                }
            }
        }
        ThreadsCommand::Create { name, .. } => {
            let made = CreateThread {
                name: Some(name.clone()),
            };
            println!("{}", rt.block_on(client.create_thread(&made))?.id);
        }
        ThreadsCommand::Show { thread, .. } => {
            let t = rt.block_on(client.thread(thread))?;
            println!("{}", serde_json::to_string_pretty(&t)?);
        }
        ThreadsCommand::Rename { thread, name, .. } => {
            let t = rt.block_on(client.rename_thread(thread, name))?;
            println!("{}", serde_json::to_string_pretty(&t)?);
        }
        ThreadsCommand::Delete { thread, .. } => {
            rt.block_on(client.delete_thread(thread))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts the run on the daemon and follows it to its end (Ctrl-C cancels it).
async fn run_remote(client: &Client, req: StartRun, live: bool) -> anyhow::Result<RunInfo> {
    // Taken before the run starts: a Ctrl-C from then on cancels it rather than leaving it.
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("handle Ctrl-C")?;
    let started = client
        .start_run(&req)
        .await
        .context("start the run on the daemon")?;
    follow_remote(client, &started.id, Some(&mut interrupts), |e| {
        if live && let Ok(e) = serde_json::from_value::<Event>(e.clone()) {
            show(&e);
        }
    })
    .await
}

/// Follows run `id`'s events through the daemon from the first, handing each to `each` once,
/// until the run has ended; a stream that breaks is followed again from the last event seen.
/// With `interrupts`, Ctrl-C cancels the run (whose end then comes as usual) and a second
/// one stops waiting. The run as it ended.
async fn follow_remote(
    client: &Client,
    id: &str,
    interrupts: Option<&mut tokio::signal::unix::Signal>,
    each: impl FnMut(&Value),
) -> anyhow::Result<RunInfo> {
    follow_remote_from(client, id, 0, interrupts, each).await
}

/// [`follow_remote`] from the events numbered after `after`.
async fn follow_remote_from(
    client: &Client,
    id: &str,
    after: u64,
    mut interrupts: Option<&mut tokio::signal::unix::Signal>,
    mut each: impl FnMut(&Value),
) -> anyhow::Result<RunInfo> {
    let mut last = after;
    let mut interrupted = 0;
    let mut take = |e: &Value, last: &mut u64| {
        let seq = e["seq"].as_u64().unwrap_or(0);
        if seq > *last {
            *last = seq;
            each(e);
        }
    };
    loop {
        let mut events = client
            .follow_run(id, last)
            .await
            .with_context(|| format!("follow run {id}"))?;
        loop {
            let next = if let Some(signals) = interrupts.as_deref_mut() {
                tokio::select! {
                    e = events.next() => e,
                    _ = signals.recv() => {
                        interrupted += 1;
                        if interrupted > 1 {
                            bail!("interrupted; run {id} may still be ending: see `sandcell runs status {id}`");
                        }
                        eprintln!("cancelling run {id} (Ctrl-C again to stop waiting)");
                        let (client, id) = (client.clone(), id.to_string());
                        tokio::spawn(async move {
                            if let Err(e) = client.cancel_run(&id).await {
                                eprintln!("sandcell: cancel run {id}: {e}");
                            }
                        });
                        continue;
                    }
                }
            } else {
                events.next().await
            };
            match next {
                Some(Ok(e)) => take(&e, &mut last),
                // Ended, or broken: the run's record says which.
                Some(Err(_)) | None => break,
            }
        }
        let info = client.run(id).await?;
        if info.status != "running" {
            // Whatever a broken stream did not bring.
            for e in client.run_events(id, last).await? {
                take(&e, &mut last);
            }
            return Ok(info);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn run_embedded(
    embedded: &sandcell_server::Embedded,
    mut req: StartRun,
    thread: Option<String>,
    live: bool,
) -> anyhow::Result<RunInfo> {
    let caller = embedded
        .admin_caller()
        .context("look up the admin key")?
        .context("the admin key in the home is unknown or revoked")?;
    // The embedded service settled the runs a dead process left when it started.
    let runner = embedded.runner();
    if let Some(t) = thread {
        let known = runner.list_threads(&caller, 1000)?.threads;
        req.thread_id = Some(match known.into_iter().find(|k| k.id == t || k.name == t) {
            Some(k) => k.id,
            None => {
                let made = CreateThread { name: Some(t) };
                runner.create_thread(&caller, made)?.id
            }
        });
    }
    let started = runner.start(&caller, req).await?;
    if live {
        let events = runner.follow(&caller, &started.id, 0)?;
        futures_util::pin_mut!(events);
        while let Some(e) = events.next().await {
            if let Ok(e) = serde_json::from_value::<Event>(e) {
                show(&e);
            }
        }
    }
    Ok(runner.wait(&caller, &started.id).await?)
}

/// One line per event, for a person watching.
fn show(e: &Event) {
    let line = match &e.kind {
        EventKind::RunStarted { model, .. } => format!("run {} · {model}", e.run_id),
        EventKind::SandboxReady {
            sandbox_id,
            created,
        } => format!(
            "sandbox {sandbox_id}{}",
            if *created { " (new)" } else { "" }
        ),
        EventKind::LlmResponse {
            usage,
            tool_calls,
            text,
            ..
        } => {
            let what = if tool_calls.is_empty() {
                first_line(text)
            } else {
                tool_calls
                    .iter()
                    .map(|c| c.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "step {} · {} in / {} out · {what}",
                e.step, usage.input_tokens, usage.output_tokens
            )
        }
        EventKind::ToolResult { text, is_error, .. } => {
            format!(
                "  {} {}",
                if *is_error { "✗" } else { "→" },
                first_line(text)
            )
        }
        EventKind::Warning { message } => format!("warning: {message}"),
        EventKind::LlmError { message, .. } => format!("model error: {message}"),
        EventKind::Validation {
            attempt,
            max_attempts,
            passed,
            exit_code,
            ..
        } => format!(
            "  check {attempt}/{max_attempts}: {}",
            match (passed, exit_code) {
                (true, _) => "passed".to_string(),
                (false, Some(code)) => format!("failed (exit {code})"),
                (false, None) => "failed".to_string(),
            }
        ),
        EventKind::RunFinished { status, reason, .. } => format!("{status} ({reason})"),
        _ => return,
    };
    eprintln!("{line}");
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > 100 {
        format!("{}…", line.chars().take(100).collect::<String>())
    } else {
        line.to_string()
    }
}

fn print_result(info: &RunInfo) {
    if let Some(answer) = &info.answer {
        println!("{answer}");
    }
    let cost = info
        .usage
        .cost_usd
        .map_or_else(|| "cost unknown".to_string(), |c| format!("${c:.4}"));
    eprintln!(
        "{} ({}) · run {} · {} steps · {} in / {} out tokens · {cost}",
        info.status,
        info.reason.as_deref().unwrap_or("-"),
        info.id,
        info.usage.steps,
        info.usage.input_tokens,
        info.usage.output_tokens,
    );
}

fn open_store(config: &ConfigArgs) -> anyhow::Result<Store> {
    let (config, _) = config.load(Vec::new())?;
    Store::open(&config.database)
        .with_context(|| format!("open the store {}", config.database.display()))
}

/// `sandcell runs …`: through the daemon when one runs, else from the home's store.
pub fn runs(command: RunsCommand) -> anyhow::Result<ExitCode> {
    match command {
        RunsCommand::List {
            limit,
            json,
            config,
            daemon,
        } => {
            let runs: Vec<RunInfo> = match daemon_client(&daemon, &config)? {
                Some(client) => runtime()?.block_on(client.runs(Some(limit)))?.runs,
                None => open_store(&config)?
                    .list_runs(None, limit, None)?
                    .iter()
                    .map(sandcell_agent::run_info)
                    .collect(),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
            } else {
                for r in &runs {
                    println!(
                        "{}  {:<9}  {:<14}  {}  {}",
                        r.id,
                        r.status,
                        r.reason.as_deref().unwrap_or("-"),
                        r.created_at,
                        first_line(&r.task)
                    );
                }
            }
        }
        RunsCommand::Status {
            run,
            json,
            config,
            daemon,
        } => {
            let info = match daemon_client(&daemon, &config)? {
                Some(client) => runtime()?.block_on(client.run(&run))?,
                None => {
                    let record = open_store(&config)?
                        .get_run(&run)?
                        .with_context(|| format!("no run {run}"))?;
                    sandcell_agent::run_info(&record)
                }
            };
            print_info(&info, json)?;
        }
        RunsCommand::Resume {
            run,
            json,
            config,
            daemon,
        } => return go_on(GoOn::Resume(run), json, &config, &daemon),
        RunsCommand::Fork {
            run,
            from_step,
            task,
            model,
            keep_sandbox,
            json,
            config,
            daemon,
        } => {
            let req = ForkRun {
                from_step,
                task,
                model,
                keep_sandbox,
                ..ForkRun::default()
            };
            return go_on(GoOn::Fork(run, req), json, &config, &daemon);
        }
        RunsCommand::Sandbox {
            run,
            step,
            json,
            config,
            daemon,
        } => {
            let made = match daemon_client(&daemon, &config)? {
                Some(client) => runtime()?.block_on(client.step_sandbox(&run, step))?,
                None => bail!(
                    "no daemon runs on {}: the sandbox would end with this command; start one (sandcell daemon start)",
                    config.home().display()
                ),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&made)?);
            } else {
                println!("{}", made.sandbox_id);
            }
        }
        RunsCommand::Cancel {
            run,
            json,
            config,
            daemon,
        } => {
            let Some(client) = daemon_client(&daemon, &config)? else {
                bail!(
                    "no daemon runs on {}: cancel goes through one (a run started without a daemon ends with its own process: Ctrl-C it)",
                    config.home().display()
                );
            };
            let info = runtime()?.block_on(client.cancel_run(&run))?;
            print_info(&info, json)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `sandcell runs resume|fork` asks of a run.
enum GoOn {
    /// Take up the run a stopped process left.
    Resume(String),
    /// Fork the run.
    Fork(String, ForkRun),
}

/// `sandcell runs resume|fork`: through the daemon when one runs, else in this process;
/// follows the run to its end (live in a terminal) and reports it as `sandcell agent` does.
fn go_on(
    what: GoOn,
    json_out: bool,
    config: &ConfigArgs,
    daemon: &DaemonArgs,
) -> anyhow::Result<ExitCode> {
    let live = std::io::stderr().is_terminal() && !json_out;
    let show_live = move |e: &Value| {
        if live && let Ok(e) = serde_json::from_value::<Event>(e.clone()) {
            show(&e);
        }
    };
    if let Some(client) = daemon_client(daemon, config)? {
        return runtime()?.block_on(async move {
            let mut interrupts =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                    .context("handle Ctrl-C")?;
            let (started, after) = match what {
                GoOn::Resume(run) => {
                    let after = client.run_events(&run, 0).await?.len() as u64;
                    (
                        client.resume_run(&run).await.context("resume the run")?,
                        after,
                    )
                }
                GoOn::Fork(run, req) => (
                    client.fork_run(&run, &req).await.context("fork the run")?,
                    0,
                ),
            };
            let info = follow_remote_from(
                &client,
                &started.id,
                after,
                Some(&mut interrupts),
                show_live,
            )
            .await?;
            report(&info, json_out)
        });
    }
    let (config, _) = config.load(Vec::new())?;
    runtime()?.block_on(async move {
        let engine = crate::cli::service_engine(crate::cli::backend_config()?, &config)?;
        let embedded = sandcell_server::embedded(config, engine)
            .await
            .context("start the embedded engine")?;
        let outcome = async {
            let caller = embedded
                .admin_caller()
                .context("look up the admin key")?
                .context("the admin key in the home is unknown or revoked")?;
            let runner = embedded.runner();
            let (id, after) = match what {
                GoOn::Resume(run) => {
                    let after = runner
                        .last_events(&caller, &run, 1)?
                        .first()
                        .and_then(|e| e["seq"].as_u64())
                        .unwrap_or(0);
                    (runner.resume(&caller, &run, false).await?.id, after)
                }
                GoOn::Fork(run, req) => (runner.fork(&caller, &run, req).await?.id, 0),
            };
            if live {
                let events = runner.follow(&caller, &id, after)?;
                futures_util::pin_mut!(events);
                while let Some(e) = events.next().await {
                    show_live(&e);
                }
            }
            Ok::<_, anyhow::Error>(runner.wait(&caller, &id).await?)
        }
        .await;
        // The run's sandbox ends with this process: nothing else could reach it.
        embedded.shutdown().await;
        report(&outcome?, json_out)
    })
}

/// A run for `runs status` and `runs cancel`: all of it as JSON, or its summary.
fn print_info(info: &RunInfo, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(info)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&summary(info))?);
    }
    Ok(())
}

/// `sandcell logs [RUN]`: through the daemon when one runs, else from the home's store.
pub fn logs(args: LogsArgs) -> anyhow::Result<ExitCode> {
    let Some(run) = args.run else {
        return runs(RunsCommand::List {
            limit: 20,
            json: args.json,
            config: args.config,
            daemon: args.daemon,
        });
    };
    let print = |e: &Value| {
        if args.json {
            println!("{e}");
        } else {
            println!("{}", describe_value(e));
        }
    };
    if let Some(client) = daemon_client(&args.daemon, &args.config)? {
        return runtime()?.block_on(async {
            if args.follow {
                follow_remote(&client, &run, None, print).await?;
            } else {
                client.run(&run).await?;
                for e in client.run_events(&run, 0).await? {
                    print(&e);
                }
            }
            Ok(ExitCode::SUCCESS)
        });
    }
    let store = open_store(&args.config)?;
    store
        .get_run(&run)?
        .with_context(|| format!("no run {run}"))?;
    let mut after = 0;
    loop {
        let page = store.run_events(&run, after, 0)?;
        if let Some(last) = page.last() {
            after = last.seq;
            for e in &page {
                print(&e.event);
            }
            continue;
        }
        // A run going on in another process: its events come as that process writes them.
        let going_on = store.get_run(&run)?.is_some_and(|r| r.status == "running");
        if !args.follow || !going_on {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(ExitCode::SUCCESS)
}

/// An event (as JSON) in a line of text; one of a type this build does not know gets its
/// number, time and type.
fn describe_value(e: &Value) -> String {
    match serde_json::from_value::<Event>(e.clone()) {
        Ok(ev) => describe(&ev),
        Err(_) => format!(
            "{:>4} {} step {} · {}",
            e["seq"],
            e["ts"].as_str().unwrap_or_default(),
            e["step"],
            e["type"].as_str().unwrap_or("?")
        ),
    }
}

/// An event in a line of text, for `sandcell logs RUN`.
fn describe(e: &Event) -> String {
    let what = match &e.kind {
        EventKind::RunStarted { task, model, .. } => format!("started · {model} · {task}"),
        EventKind::SandboxReady { sandbox_id, .. } => format!("sandbox {sandbox_id}"),
        EventKind::KernelReady { context_id, fresh } => format!(
            "kernel {context_id}{}",
            if *fresh { "" } else { " (kept its variables)" }
        ),
        EventKind::LlmRequest {
            call, max_tokens, ..
        } => format!("llm request {call} (max {max_tokens} tokens)"),
        EventKind::LlmResponse {
            call,
            text,
            tool_calls,
            usage,
            ..
        } => format!(
            "llm response {call}: {} in / {} out · {}{}",
            usage.input_tokens,
            usage.output_tokens,
            first_line(text),
            tool_calls
                .iter()
                .map(|c| format!(" [{}]", c.name))
                .collect::<String>()
        ),
        EventKind::LlmError { message, .. } => format!("llm error: {message}"),
        EventKind::ToolCall {
            name, arguments, ..
        } => format!("tool call {name} {arguments}"),
        EventKind::ToolResult {
            name,
            text,
            is_error,
            ..
        } => format!(
            "tool result {name}{}: {}",
            if *is_error { " (error)" } else { "" },
            text.trim_end()
        ),
        EventKind::StepCommitted {
            usage, snapshot, ..
        } => format!(
            "step done · {} in / {} out{}",
            usage.input_tokens,
            usage.output_tokens,
            snapshot
                .as_ref()
                .map(|s| format!(" · snapshot {} ({})", s.snapshot_id, s.fidelity))
                .unwrap_or_default()
        ),
        EventKind::ThreadHistory {
            thread_id,
            from_run_id,
            messages,
            restored_from,
        } => format!(
            "on thread {thread_id}{} ({} messages of history){}",
            from_run_id
                .as_ref()
                .map(|r| format!(", after run {r}"))
                .unwrap_or_default(),
            messages.len(),
            restored_from
                .as_ref()
                .map(|s| format!(", its sandbox restored from {s}"))
                .unwrap_or_default()
        ),
        EventKind::Forked {
            from_run_id,
            from_step,
            messages,
            restored_from,
        } => format!(
            "forked from {from_run_id} at step {from_step} ({} messages of history){}",
            messages.len(),
            restored_from
                .as_ref()
                .map(|s| format!(", sandbox restored from {s}"))
                .unwrap_or_default()
        ),
        EventKind::Resumed {
            after_step,
            reused_response,
            restored_from,
            sandbox_id,
            ..
        } => format!(
            "resumed after step {after_step} in {sandbox_id}{}{}",
            restored_from
                .as_ref()
                .map(|s| format!(", restored from {s}"))
                .unwrap_or_default(),
            if *reused_response {
                ", the recorded answer reused"
            } else {
                ""
            }
        ),
        EventKind::Warning { message } => format!("warning: {message}"),
        EventKind::Validation {
            attempt,
            max_attempts,
            command,
            passed,
            exit_code,
            cause,
            ..
        } => format!(
            "validation {attempt}/{max_attempts} `{command}`: {}",
            match (passed, exit_code) {
                (true, _) => "passed".to_string(),
                (false, Some(code)) => format!("failed (exit {code})"),
                (false, None) => format!("failed ({cause})"),
            }
        ),
        EventKind::Condensed {
            messages_replaced, ..
        } => format!("condensed {messages_replaced} older messages into a summary"),
        EventKind::RunFinished {
            status,
            reason,
            answer,
            ..
        } => format!(
            "finished {status} ({reason}){}",
            answer
                .as_ref()
                .map(|a| format!(": {a}"))
                .unwrap_or_default()
        ),
    };
    format!("{:>4} {} step {} · {what}", e.seq, e.ts, e.step)
}
