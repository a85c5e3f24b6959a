//! Command-line parsing and the shared engine setup.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sandcell_backend_process::{ProcessBackend, ProcessBackendConfig};
use sandcell_engine::Engine;

use crate::{bench, doctor, repl, run};

/// Stateful, isolated sandboxes for AI agents.
#[derive(Debug, Parser)]
#[command(name = "sandcell", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run code or a command in a fresh sandbox, print its output, exit status and timings.
    Run(run::RunArgs),
    /// An interactive session with a Python, Node.js, Bash or R kernel in a fresh sandbox.
    Repl(repl::ReplArgs),
    /// Show which isolation features this host supports, and why not.
    Doctor(doctor::DoctorArgs),
    /// Measure Sandcell against the alternatives, side by side in one run.
    Bench(bench::BenchArgs),
}

/// Parses the arguments and runs the command; errors print as `sandcell: …` (exit 125).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run_command(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandcell: {e:#}");
            ExitCode::from(125)
        }
    }
}

fn run_command(command: Command) -> anyhow::Result<ExitCode> {
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
    let engine = Engine::builder().backend(backend).build();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    rt.block_on(async {
        match (command, one_shot) {
            (Command::Run(args), prepared) => {
                let prepared = prepared.context("run was not prepared")?;
                run::run(args, prepared, engine).await
            }
            (Command::Repl(args), _) => repl::repl(args, engine).await,
            (Command::Doctor(args), _) => doctor::doctor(args, engine).await,
            (Command::Bench(args), _) => bench::bench(args, engine).await,
        }
    })
}

pub fn backend_config() -> anyhow::Result<ProcessBackendConfig> {
    let exe = std::env::current_exe().context("find the sandcell binary")?;
    Ok(ProcessBackendConfig::new(exe))
}
