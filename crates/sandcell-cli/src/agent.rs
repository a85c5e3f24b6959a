//! `sandcell agent` (a run in tools mode), `sandcell runs` and `sandcell logs`: the agent
//! runtime from the command line. A run goes embedded here, in this process, on the same
//! home and store as the daemon, so its record and trajectory are where `sandcell logs` and
//! the daemon look.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use sandcell_agent::Runner;
use sandcell_agent::event::{Event, EventKind};
use sandcell_api::SandboxId;
use sandcell_api::runs::{BudgetsInput, RunInfo, RunMode, StartRun};
use sandcell_store::Store;
use serde_json::json;

use crate::daemon::ConfigArgs;

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
    /// Print one JSON object at the end: run_id, status, reason, answer, usage.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
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
    #[command(flatten)]
    pub config: ConfigArgs,
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
    };
    let live = std::io::stderr().is_terminal() && !args.json;
    let json_out = args.json;
    runtime()?.block_on(async move {
        let engine = sandcell_engine::Engine::builder()
            .backend(sandcell_backend_process::ProcessBackend::new(
                crate::cli::backend_config()?,
            ))
            .backend(crate::cli::gvisor_backend()?)
            .build();
        let embedded = sandcell_server::embedded(config, engine)
            .await
            .context("start the embedded engine")?;
        let outcome = run_embedded(&embedded, req, live).await;
        // The run's sandbox ends with this process: nothing else could reach it.
        embedded.shutdown().await;
        let info = outcome?;
        if json_out {
            println!("{}", serde_json::to_string_pretty(&summary(&info))?);
        } else {
            print_result(&info);
        }
        Ok(if info.status == "succeeded" {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    })
}

async fn run_embedded(
    embedded: &sandcell_server::Embedded,
    req: StartRun,
    live: bool,
) -> anyhow::Result<RunInfo> {
    let caller = embedded
        .admin_caller()
        .context("look up the admin key")?
        .context("the admin key in the home is unknown or revoked")?;
    let runner = Arc::new(Runner::from_service(embedded.service())?);
    runner.settle_interrupted()?;
    let started = runner.start(&caller, req).await?;
    if live && let Some(mut rx) = runner.subscribe(&caller, &started.id)? {
        // Events written before the subscription are in the store; the live ones repeat
        // some of them, told apart by number.
        let mut shown = 0;
        for e in runner.events(&caller, &started.id, 0, 0)? {
            if let Ok(e) = serde_json::from_value::<Event>(e) {
                shown = e.seq;
                show(&e);
            }
        }
        while let Ok(e) = rx.recv().await {
            if e.seq > shown {
                shown = e.seq;
                show(&e);
            }
            if matches!(e.kind, EventKind::RunFinished { .. }) {
                break;
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

/// `sandcell runs …`.
pub fn runs(command: RunsCommand) -> anyhow::Result<ExitCode> {
    match command {
        RunsCommand::List {
            limit,
            json,
            config,
        } => {
            let store = open_store(&config)?;
            let runs: Vec<RunInfo> = store
                .list_runs(None, limit, None)?
                .iter()
                .map(sandcell_agent::run_info)
                .collect();
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
        RunsCommand::Status { run, json, config } => {
            let store = open_store(&config)?;
            let record = store
                .get_run(&run)?
                .with_context(|| format!("no run {run}"))?;
            let info = sandcell_agent::run_info(&record);
            if json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                println!("{}", serde_json::to_string_pretty(&summary(&info))?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `sandcell logs [RUN]`.
pub fn logs(args: LogsArgs) -> anyhow::Result<ExitCode> {
    let Some(run) = args.run else {
        return runs(RunsCommand::List {
            limit: 20,
            json: args.json,
            config: args.config,
        });
    };
    let store = open_store(&args.config)?;
    store
        .get_run(&run)?
        .with_context(|| format!("no run {run}"))?;
    let mut after = 0;
    loop {
        let page = store.run_events(&run, after, 0)?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for e in &page {
            if args.json {
                println!("{}", e.event);
            } else if let Ok(ev) = serde_json::from_value::<Event>(e.event.clone()) {
                println!("{}", describe(&ev));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// An event in a line of text, for `sandcell logs RUN`.
fn describe(e: &Event) -> String {
    let what = match &e.kind {
        EventKind::RunStarted { task, model, .. } => format!("started · {model} · {task}"),
        EventKind::SandboxReady { sandbox_id, .. } => format!("sandbox {sandbox_id}"),
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
        EventKind::StepCommitted { usage } => format!(
            "step done · {} in / {} out",
            usage.input_tokens, usage.output_tokens
        ),
        EventKind::Warning { message } => format!("warning: {message}"),
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
