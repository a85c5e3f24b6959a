//! Command-line parsing and the shared engine setup.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sandcell_backend_process::{ProcessBackend, ProcessBackendConfig};
use sandcell_engine::Engine;

use crate::{bench, doctor, run};

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
    /// Show which isolation features this host supports, and why not.
    Doctor(doctor::DoctorArgs),
    /// Measure Sandcell against the alternatives, side by side in one run.
    Bench(bench::BenchArgs),
}

/// Parses the arguments and runs the command; errors print as `sandcell: …` (exit 125).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")
        .and_then(|rt| {
            rt.block_on(async {
                match cli.command {
                    Command::Run(args) => run::run(args).await,
                    Command::Doctor(args) => doctor::doctor(args).await,
                    Command::Bench(args) => bench::bench(args).await,
                }
            })
        });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandcell: {e:#}");
            ExitCode::from(125)
        }
    }
}

/// The engine with the backends this binary offers.
pub fn engine() -> anyhow::Result<Engine> {
    let exe = std::env::current_exe().context("find the sandcell binary")?;
    Ok(Engine::builder()
        .backend(ProcessBackend::new(ProcessBackendConfig::new(exe)))
        .build())
}
