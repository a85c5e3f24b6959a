//! Command-line parsing and the shared engine setup.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, FromArgMatches, Parser, Subcommand};
use sandcell_backend_process::{ProcessBackend, ProcessBackendConfig};
use sandcell_engine::Engine;

use crate::client::{self, ClientArgs};
use crate::daemon;
use crate::{agent, bench, doctor, memory, repl, run};

/// Stateful, isolated sandboxes for AI agents.
#[derive(Debug, Parser)]
#[command(name = "sandcell", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const RUN_ABOUT: &str =
    "Run code or a command in a fresh sandbox, print its output, exit status and timings";

#[derive(Debug, Subcommand)]
enum Command {
    #[command(about = RUN_ABOUT)]
    Run(run::RunArgs),
    /// An interactive session with a Python, Node.js, Bash or R kernel in a fresh sandbox.
    Repl(repl::ReplArgs),
    /// Show which isolation features this host supports, and why not.
    Doctor(doctor::DoctorArgs),
    /// Measure Sandcell against the alternatives, side by side in one run.
    Bench(bench::BenchArgs),
    /// Run the daemon: the REST API (and docs at /docs) on 127.0.0.1:7070.
    Serve(daemon::ServeArgs),
    /// Serve MCP tools on stdio (sandboxes in this process, or through a running daemon).
    Mcp(crate::mcp::McpArgs),
    /// Write a commented config file with every default.
    Init(daemon::InitArgs),
    /// The daemon's settings.
    #[command(subcommand)]
    Config(daemon::ConfigCommand),
    /// API keys of the daemon.
    #[command(subcommand)]
    Key(daemon::KeyCommand),
    /// Sandboxes of the running daemon.
    Sandbox {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: client::SandboxCommand,
    },
    /// Run a command in a sandbox of the running daemon.
    Exec {
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        args: client::ExecArgs,
    },
    /// Run code in a kernel of a sandbox of the running daemon.
    Code {
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        args: client::CodeArgs,
    },
    /// Files of a sandbox of the running daemon.
    Files {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: client::FilesCommand,
    },
    /// Processes of a sandbox of the running daemon.
    Ps {
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        args: client::PsArgs,
    },
    /// Snapshots of the running daemon's sandboxes: take, list, show, delete, fork.
    Snapshot {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: client::SnapshotCommand,
    },
    /// Run an agent: a model that writes code, runs it in a sandbox and goes on until it
    /// answers, within budgets (exit 0 when it succeeded, 1 when it ended otherwise). It
    /// goes through the daemon when one runs, else in this process.
    Agent(agent::AgentArgs),
    /// A completion in repl mode: the input (--context-file) is the kernel variable `context`,
    /// and the model's code may call the model again (llm_query, rlm_query) before FINAL(…).
    Complete(agent::AgentArgs),
    /// Agent runs: list them, show one, cancel one (of the daemon).
    #[command(subcommand)]
    Runs(agent::RunsCommand),
    /// An agent run's trajectory (`sandcell logs RUN [--json] [-f]`), or the recent runs.
    Logs(agent::LogsArgs),
    /// Threads: conversations that persist across agent runs (`sandcell agent --thread T`).
    #[command(subcommand)]
    Threads(agent::ThreadsCommand),
    /// Memories of a sandbox (--sandbox ID) or your own: add, search (ranked), list, show,
    /// delete. Through the daemon when one runs, else on the home's store.
    #[command(subcommand)]
    Memory(memory::MemoryCommand),
    /// Images templates are built on (in the home's store): import from a file, list,
    /// inspect, remove, make a base ahead, prune.
    #[command(subcommand)]
    Image(crate::image::ImageCommand),
    /// Templates: build one from a Dockerfile into the home's image store.
    #[command(subcommand)]
    Template(crate::template::TemplateCommand),
    /// Named volumes: folders that outlive the sandboxes mounting them (`--volume`).
    #[command(subcommand)]
    Volume(crate::volume::VolumeCommand),
}

/// Parses the arguments and runs the command; errors print as `sandcell: …` (exit 125).
pub fn main() -> ExitCode {
    let command = match parse_run_alone() {
        Some(run) => Command::Run(run),
        None => Cli::parse().command,
    };
    match run_command(command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandcell: {e:#}");
            ExitCode::from(125)
        }
    }
}

/// `sandcell run …` parsed against its own arguments only. Building the whole command tree
/// (daemon, client, bench…) costs `run`, which starts a sandbox per invocation, ~150 KB of
/// heap whose page faults its forked launcher and agent pay again (docs/benchmarks.md).
fn parse_run_alone() -> Option<run::RunArgs> {
    let mut args = std::env::args_os();
    let bin = args.next()?;
    if args.next()? != "run" {
        return None;
    }
    // After augment_args, which would put RunArgs' own doc comment in its place.
    let command = run::RunArgs::augment_args(clap::Command::new("run").bin_name("sandcell run"))
        .about(RUN_ABOUT)
        .long_about(None);
    let matches = command.get_matches_from(std::iter::once(bin).chain(args));
    Some(run::RunArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()))
}

fn run_command(command: Command) -> anyhow::Result<ExitCode> {
    let client_rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("start the async runtime")
    };
    let command = match command {
        Command::Serve(args) => return daemon::serve(args).map(|()| ExitCode::SUCCESS),
        Command::Mcp(args) => return crate::mcp::mcp(args).map(|()| ExitCode::SUCCESS),
        Command::Init(args) => return daemon::init(args).map(|()| ExitCode::SUCCESS),
        Command::Config(cmd) => return daemon::config_command(cmd).map(|()| ExitCode::SUCCESS),
        Command::Key(cmd) => return daemon::key_command(cmd).map(|()| ExitCode::SUCCESS),
        Command::Agent(args) => return agent::agent(args),
        Command::Complete(mut args) => {
            if args.mode.as_deref().is_some_and(|m| m != "repl") {
                anyhow::bail!("sandcell complete runs in repl mode; use sandcell agent for tools");
            }
            args.mode = Some("repl".into());
            return agent::agent(args);
        }
        Command::Runs(cmd) => return agent::runs(cmd),
        Command::Logs(args) => return agent::logs(args),
        Command::Threads(cmd) => return agent::threads(cmd),
        Command::Memory(cmd) => return memory::memory(cmd),
        Command::Image(cmd) => return crate::image::image(cmd),
        Command::Template(cmd) => return crate::template::template(cmd),
        Command::Volume(cmd) => return crate::volume::volume(cmd),
        Command::Sandbox { client, command } => {
            return client_rt()?.block_on(client::sandbox(&client, command));
        }
        Command::Exec { client, args } => {
            return client_rt()?.block_on(client::exec(&client, args));
        }
        Command::Code { client, args } => {
            return client_rt()?.block_on(client::code(&client, args));
        }
        Command::Files { client, command } => {
            return client_rt()?.block_on(client::files(&client, command));
        }
        Command::Ps { client, args } => return client_rt()?.block_on(client::ps(&client, args)),
        Command::Snapshot { client, command } => {
            return client_rt()?.block_on(client::snapshot(&client, command));
        }
        other => other,
    };
    // `run` forks its launcher before the async runtime exists (see ProcessBackend::prefork).
    let one_shot = match &command {
        Command::Run(args) => Some(run::prepare(args)?),
        _ => None,
    };
    let backend = ProcessBackend::new(backend_config()?);
    if let Some(prepared) = &one_shot {
        // Best effort: without it the launcher is executed instead.
        let _ = backend.prefork(crate::serve_guest, &prepared.id, &prepared.spec);
    }
    let mut engine = Engine::builder().backend(backend).egress(egress_hub()?);
    if one_shot.is_none() {
        engine = engine.backend(gvisor_backend()?);
    }
    let engine = engine.build();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    // Each command's future on its own: one future for all would be as large as the largest
    // (the benchmarks'), and `run` would copy it around its stack, page-faulting it in.
    match (command, one_shot) {
        (Command::Run(args), prepared) => {
            let prepared = prepared.context("run was not prepared")?;
            rt.block_on(run::run(args, prepared, engine))
        }
        (Command::Repl(args), _) => rt.block_on(Box::pin(repl::repl(args, engine))),
        (Command::Doctor(args), _) => rt.block_on(Box::pin(doctor::doctor(args, engine))),
        (Command::Bench(args), _) => rt.block_on(Box::pin(bench::bench(args, engine))),
        (_, _) => anyhow::bail!("this command runs without the embedded engine"),
    }
}

/// The engine of a service (daemon, embedded MCP or agent): both backends, the process one
/// with `process`, and the egress proxies' settings.
pub fn service_engine(
    mut process: ProcessBackendConfig,
    config: &sandcell_service::config::Config,
) -> anyhow::Result<Engine> {
    // A service's sandboxes may have their policy changed live.
    process.loopback_egress = true;
    Ok(Engine::builder()
        .backend(ProcessBackend::new(process))
        .backend(gvisor_backend()?)
        .egress(egress_hub()?.with_upstream_ca(config.network.upstream_ca()))
        .build())
}

/// How sandboxes' egress proxies resolve names: the host's resolver, or for tests the names
/// `SANDCELL_TEST_RESOLVE` maps (`name=IP` pinned, `name~IP` answered as DNS would), honoured
/// only with `SANDCELL_TEST=1` so a stray variable cannot redirect a production service.
/// With `SANDCELL_TEST_RESOLVE_ONLY=1` too, other names do not resolve at all (a fuzzer's
/// generated host names never reach the machine's resolver).
pub fn egress_hub() -> anyhow::Result<sandcell_engine::egress::EgressHub> {
    use sandcell_egress::{Limits, Resolver, StaticResolver, SystemResolver};
    use std::sync::Arc;
    let system: Arc<dyn Resolver> = Arc::new(SystemResolver);
    let resolver = match std::env::var("SANDCELL_TEST_RESOLVE") {
        Ok(spec) if !spec.trim().is_empty() => {
            if !test_resolver_allowed() {
                anyhow::bail!(
                    "SANDCELL_TEST_RESOLVE maps host names for tests only; set SANDCELL_TEST=1 too \
                     (never on a production service)"
                );
            }
            let mapped = StaticResolver::parse(&spec)
                .map_err(|e| anyhow::anyhow!("SANDCELL_TEST_RESOLVE: {e}"))?;
            eprintln!(
                "sandcell: warning: egress names are mapped by SANDCELL_TEST_RESOLVE={spec} (tests only)"
            );
            if std::env::var("SANDCELL_TEST_RESOLVE_ONLY").as_deref() == Ok("1") {
                Arc::new(mapped)
            } else {
                Arc::new(mapped.with_fallback(system))
            }
        }
        _ => system,
    };
    Ok(sandcell_engine::egress::EgressHub::new(
        resolver,
        Limits::default(),
    ))
}

/// Whether the test-only settings may be used (`SANDCELL_TEST=1`).
pub fn test_resolver_allowed() -> bool {
    std::env::var("SANDCELL_TEST").as_deref() == Ok("1")
}

/// Whether the test-only name mapping is in force.
pub fn test_resolver_set() -> bool {
    std::env::var("SANDCELL_TEST_RESOLVE").is_ok_and(|s| !s.trim().is_empty())
}

pub fn backend_config() -> anyhow::Result<ProcessBackendConfig> {
    let exe = std::env::current_exe().context("find the sandcell binary")?;
    Ok(ProcessBackendConfig::new(exe))
}

/// The `gvisor` backend over the same runtime folder as the process backend's.
pub fn gvisor_backend() -> anyhow::Result<sandcell_backend_gvisor::GvisorBackend> {
    let exe = std::env::current_exe().context("find the sandcell binary")?;
    Ok(sandcell_backend_gvisor::GvisorBackend::new(
        sandcell_backend_gvisor::GvisorBackendConfig::new(
            exe,
            sandcell_backend_process::default_runtime_dir(),
        ),
    ))
}
