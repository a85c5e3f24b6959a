//! `sandcell bench daemon`: the daemon over real HTTP on loopback. It starts its own
//! `sandcell serve` on a temporary home and measures, in one run: exec and Python `x = 1`
//! round trips in a warm sandbox, side by side with the same calls through the embedded
//! engine; pause/resume and snapshot/restore/fork on each backend `GET /v1/system` reports
//! available; create-to-first-result cold and from a warm pool, next to a `python3 -c`
//! process on the host; and many concurrent clients doing exec for a while (throughput,
//! latency, errors). The daemon gets SIGTERM at the end and must leave no sandbox running.
//!
//! This module checks the arguments and runs the scenarios in order. `server` starts, calls
//! and stops the daemon; one module per scenario measures (`round_trips`, `pause`,
//! `snapshots`, `creates`, `load` with `cpu`); each gives `row::Row`s (the load test its
//! `load::Load`), which `report` prints. `requests` builds what the scenarios send.
//! No submodule uses this one.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use sandcell_engine::Engine;

mod args;
mod cpu;
mod creates;
mod load;
mod pause;
mod report;
mod requests;
mod round_trips;
mod row;
pub(super) mod server;
mod snapshots;

pub use args::DaemonArgs;
use creates::creates;
use load::{Load, load};
use pause::pause_resume;
use report::report;
use round_trips::round_trips;
use row::Row;
use server::{DEFAULT_BACKEND, Daemon};
use snapshots::snapshots;

/// Runs `sandcell bench daemon`.
pub async fn daemon(args: DaemonArgs, engine: Engine) -> anyhow::Result<ExitCode> {
    if args.runs < 10 || args.cold_runs < 3 {
        bail!("--runs must be at least 10 and --cold-runs at least 3");
    }
    if args.clients == 0 || args.sandboxes == 0 || args.duration_secs == 0 {
        bail!("--clients, --sandboxes and --duration-secs must be at least 1");
    }
    if args.pool > 64 {
        bail!("--pool must be at most 64");
    }
    progress("starting `sandcell serve` on a temporary home");
    let mut daemon = Daemon::start(args.pool).await?;
    let measured = measure(&daemon, &engine, &args).await;
    if measured.is_err() {
        eprintln!("{}", daemon.log_tail(30));
    }
    progress("stopping the daemon (SIGTERM)");
    let stopped = daemon.stop(&engine).await;
    drop(daemon);
    let (rows, pool_hits, load) = measured?;
    stopped?;
    Ok(report(&args, &rows, pool_hits, &load))
}

fn progress(what: &str) {
    eprintln!("bench daemon: {what}");
}

/// Every scenario, in order; the rows, the pool hits, the load test.
async fn measure(
    d: &Daemon,
    engine: &Engine,
    args: &DaemonArgs,
) -> anyhow::Result<(Vec<Row>, Option<u64>, Load)> {
    progress(&format!(
        "round trips: {} each of exec and x = 1, HTTP and embedded, interleaved",
        args.runs
    ));
    let mut rows = round_trips(d, engine, args.runs).await?;
    let backends = d.backends().await?;
    let pauses = (args.runs / 10).max(10);
    for b in &backends {
        if !b.supports_pause {
            progress(&format!(
                "pause and resume: not on {} (no pause here)",
                b.kind
            ));
            continue;
        }
        let embedded = (b.kind == DEFAULT_BACKEND).then_some(engine);
        progress(&format!(
            "pause and resume on {}: {pauses} each, HTTP{}, with a busy kernel",
            b.kind,
            if embedded.is_some() {
                " and embedded"
            } else {
                ""
            }
        ));
        rows.extend(pause_resume(d, embedded, &b.kind, pauses).await?);
    }
    let snaps = args.cold_runs.clamp(3, 10);
    for b in &backends {
        if !b.snapshots {
            progress(&format!("snapshots: not on {} (no snapshots here)", b.kind));
            continue;
        }
        progress(&format!(
            "snapshots on {}: {snaps} each of snapshot and restore with 5 MB and 100 MB of \
             Python state, and a fork of 10",
            b.kind
        ));
        rows.extend(snapshots(d, &b.kind, false, snaps).await?);
        if b.kind == "process" && b.criu {
            progress(&format!(
                "snapshots on process with CRIU (checkpointable): {snaps} each of snapshot and \
                 restore with 5 MB and 100 MB of Python state, and a fork of 10"
            ));
            rows.extend(snapshots(d, &b.kind, true, snaps).await?);
        }
    }
    progress(&format!(
        "create to first result: {} each, cold{}",
        args.cold_runs,
        if args.pool > 0 {
            " and from the pool"
        } else {
            ""
        }
    ));
    let (creates, pool_hits) = creates(d, engine, args.cold_runs, args.pool).await?;
    rows.extend(creates);
    progress(&format!(
        "load: {} clients doing exec for {} s on {} sandboxes",
        args.clients, args.duration_secs, args.sandboxes
    ));
    let load = load(
        d,
        args.clients,
        args.sandboxes,
        Duration::from_secs(args.duration_secs),
    )
    .await?;
    Ok((rows, pool_hits, load))
}
