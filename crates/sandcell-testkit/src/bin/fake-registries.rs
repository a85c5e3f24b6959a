//! `fake-registries`: the fake package registries as a process, for end-to-end tests of the
//! real daemon (which run in another process) and for the benchmark.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sandcell_testkit::registries::FakeRegistries;

/// Fake package registries on 127.0.0.1: a PEP 503 simple index (/simple/), an npm registry
/// (/sandcell-fake), a dumb-HTTP git repository (/repo.git), /echo and /bytes/<n>, on one
/// HTTPS and one plain-HTTP port, whatever the Host header says.
///
/// Prints one JSON line once both ports accept connections:
///
///   {"https":"127.0.0.1:P","http":"127.0.0.1:Q","ca":"/tmp/…/ca.pem"}
///
/// then serves until SIGINT or SIGTERM, and removes its temporary files (the CA file too)
/// as it exits.
#[derive(Parser, Debug)]
#[command(name = "fake-registries", verbatim_doc_comment)]
struct Args {
    /// A DNS name the server certificate covers (repeatable); 127.0.0.1 is always covered.
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,

    /// Appends every request received as a JSON line {"tls", "method", "host", "path",
    /// "query"}.
    #[arg(long, value_name = "FILE.jsonl")]
    log: Option<PathBuf>,
}

/// The line printed once the servers are up.
#[derive(serde::Serialize)]
struct Ready {
    https: String,
    http: String,
    ca: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fake-registries: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-registries: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    // Installed first: a signal that arrives right after the line is printed still cleans up.
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot watch for SIGTERM: {e}"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch for SIGINT: {e}"))?;
    let names: Vec<&str> = args.names.iter().map(String::as_str).collect();
    let fake = FakeRegistries::start_with_log(&names, args.log.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    let ready = Ready {
        https: fake.https_addr().to_string(),
        http: fake.http_addr().to_string(),
        ca: fake.ca_pem_path().to_path_buf(),
    };
    let line = serde_json::to_string(&ready).map_err(|e| format!("cannot encode: {e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(out);
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    fake.shutdown().await;
    Ok(())
}
