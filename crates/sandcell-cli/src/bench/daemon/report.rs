//! The table (or JSON) `bench daemon` prints: the scenarios, the HTTP overhead, the pool
//! hits, the load test and the targets; and the exit code.

use std::process::ExitCode;

use serde_json::json;

use super::args::DaemonArgs;
use super::load::Load;
use super::row::Row;
use crate::bench::stats::{mean, quantile};

/// Prints the table (or JSON); fails the command when the load test saw errors.
pub(super) fn report(
    args: &DaemonArgs,
    rows: &[Row],
    pool_hits: Option<u64>,
    load: &Load,
) -> ExitCode {
    let row = |key: &str| rows.iter().find(|r| r.key == key);
    let overhead = |http: &str, embedded: &str| {
        let (h, e) = (row(http)?.median(), row(embedded)?.median());
        Some((h - e, h / e.max(1e-9)))
    };
    let exec_overhead = overhead("exec_http", "exec_embedded");
    let code_overhead = overhead("code_http", "code_embedded");
    let load_median = quantile(&load.latencies, 0.5);
    let load_p99 = quantile(&load.latencies, 0.99);
    let mut targets = vec![
        ("python `x = 1` over HTTP, median", "code_http", 0.5),
        (
            "create + first result, cold, median",
            "create_cold_http",
            25.0,
        ),
    ];
    targets.push(("pause, HTTP, median", "pause_http", 5.0));
    targets.push(("resume, HTTP, median", "resume_http", 5.0));
    if args.pool > 0 {
        targets.push((
            "create + first result, warm pool, median",
            "create_pool_http",
            5.0,
        ));
    }
    let mut targets: Vec<(&str, f64, f64)> = targets
        .into_iter()
        .filter_map(|(name, key, limit)| Some((name, limit, row(key)?.median())))
        .collect();
    if let (Some(snap), Some(restore)) = (row("snapshot_5mb_gvisor"), row("restore_5mb_gvisor")) {
        targets.push((
            "snapshot + restore of the 5 MB kernel on gvisor, sum of medians",
            300.0,
            snap.median() + restore.median(),
        ));
    }
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    if args.json {
        let cpu = load.cpu.as_ref().map(|c| {
            json!({"cores": c.cores, "daemon_cores": c.daemon, "client_cores": c.client,
                   "sandboxes_cores": c.sandboxes, "machine_cores": c.machine})
        });
        let out = json!({
            "daemon": {
                "build": build,
                "settings": {
                    "runs": args.runs, "cold_runs": args.cold_runs, "clients": args.clients,
                    "duration_secs": args.duration_secs, "sandboxes": args.sandboxes,
                    "pool": args.pool,
                },
                "scenarios": rows.iter().map(Row::json).collect::<Vec<_>>(),
                "http_overhead": {
                    "exec": exec_overhead.map(|(d, r)| json!({"added_ms": d, "ratio": r})),
                    "code": code_overhead.map(|(d, r)| json!({"added_ms": d, "ratio": r})),
                },
                "pool": pool_hits.map(|h| json!({"requests": args.cold_runs, "hits": h})),
                "load": {
                    "clients": load.clients, "sandboxes": load.sandboxes,
                    "duration_secs": load.elapsed.as_secs_f64(),
                    "requests": load.latencies.len() as u64 + load.errors,
                    "ok": load.latencies.len(), "errors": load.errors,
                    "first_errors": load.first_errors,
                    "throughput_per_sec": load.throughput(),
                    "median_ms": load_median, "p99_ms": load_p99,
                    "mean_ms": mean(&load.latencies), "cpu": cpu,
                },
                "targets": targets.iter().map(|(name, limit, value)| json!({
                    "target": name, "limit_ms": limit, "value_ms": value, "met": value <= limit,
                })).chain(std::iter::once(json!({
                    "target": "load test errors", "limit": 0, "value": load.errors,
                    "met": load.errors == 0,
                }))).collect::<Vec<_>>(),
            }
        });
        println!("{out}");
    } else {
        println!("daemon benchmark: HTTP/1.1 keep-alive on loopback ({build} build); milliseconds");
        if cfg!(debug_assertions) {
            println!("(a debug build: build with --release for figures worth publishing)");
        }
        let width = rows
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(48);
        println!(
            "{:<width$} {:>6} {:>9} {:>9} {:>9}",
            "scenario", "runs", "median", "p99", "mean"
        );
        for r in rows {
            println!(
                "{:<width$} {:>6} {:>9.3} {:>9.3} {:>9.3}",
                r.name,
                r.samples.len(),
                r.median(),
                r.p99(),
                mean(&r.samples)
            );
        }
        for (what, o) in [("exec `true`", exec_overhead), ("x = 1", code_overhead)] {
            if let Some((added, ratio)) = o {
                println!(
                    "HTTP vs embedded, {what}: +{added:.3} ms per call ({ratio:.2}x the median)"
                );
            }
        }
        if let Some(h) = pool_hits {
            println!(
                "warm pool: {h} of {} pool creations were hits (sandcell_pool_requests_total)",
                args.cold_runs
            );
        }
        println!(
            "load: {} clients, exec `true` on {} sandboxes for {:.1} s: {} requests, {:.0} req/s, \
             median {:.3} ms, p99 {:.3} ms, {} errors",
            load.clients,
            load.sandboxes,
            load.elapsed.as_secs_f64(),
            load.latencies.len() as u64 + load.errors,
            load.throughput(),
            load_median,
            load_p99,
            load.errors
        );
        for e in &load.first_errors {
            println!("  error: {e}");
        }
        if let Some(c) = &load.cpu {
            let sandboxes = c.sandboxes.unwrap_or(0.0);
            println!(
                "  cpu during the load, in cores of {}: daemon {:.2}, this client {:.2}, \
                 in the sandboxes {}, the rest of the machine {:.2} (busy {:.2} in all)",
                c.cores,
                c.daemon,
                c.client,
                c.sandboxes
                    .map_or("unknown".to_string(), |s| format!("{s:.2}")),
                (c.machine - c.daemon - c.client - sandboxes).max(0.0),
                c.machine
            );
        }
        println!("targets:");
        for (name, limit, value) in &targets {
            println!(
                "  {name} <= {limit} ms: {value:.3} ms, {}",
                if value <= limit { "met" } else { "MISSED" }
            );
        }
        println!(
            "  load test without errors: {}",
            if load.errors == 0 { "met" } else { "MISSED" }
        );
    }
    if pool_hits.is_some_and(|h| h < args.cold_runs as u64) {
        eprintln!("bench daemon: some warm-pool creations were not pool hits");
    }
    if load.errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
