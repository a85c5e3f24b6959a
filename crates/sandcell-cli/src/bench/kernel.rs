//! `sandcell bench kernel`: the Python kernel through the embedded engine, `x = 1` round
//! trips in a warm kernel and create-to-first-result, next to a `python3 -c` process per
//! call in the sandbox and on the host; and the table (or JSON) they print.

use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::bail;
use sandcell_engine::{Engine, SandboxSpec};
use sandcell_protocol::{ExecRequest, Language, RunCodeRequest};
use serde_json::json;

use crate::bench::host::{PYTHON, check};
use crate::bench::stats::quantile;

/// `bench kernel`.
pub(super) async fn kernel(
    engine: Engine,
    runs: usize,
    cold_runs: usize,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    if runs < 10 || cold_runs < 3 {
        bail!("--runs must be at least 10 and --cold-runs at least 3");
    }
    let trivial = |context: Option<&str>| RunCodeRequest {
        context: context.map(str::to_string),
        language: Some(Language::Python),
        code: "x = 1".into(),
        timeout_ms: None,
    };
    // Warm: one sandbox, one kernel, many round trips.
    let sb = engine.create(SandboxSpec::default()).await?;
    for _ in 0..20 {
        sb.run_code(trivial(None)).await?;
    }
    let mut warm = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let r = sb.run_code(trivial(Some("python"))).await?;
        warm.push(t.elapsed());
        if !r.ok() {
            bail!("x = 1 failed: {:?}", r.done);
        }
    }
    // The same statement as a fresh interpreter per call, inside the same sandbox.
    let mut per_call_inside = Vec::new();
    for _ in 0..cold_runs {
        let t = Instant::now();
        let out = sb.exec(ExecRequest::argv([PYTHON, "-c", "x = 1"])).await?;
        per_call_inside.push(t.elapsed());
        if !out.result.success() {
            bail!("python3 -c failed: {}", out.result.message);
        }
    }
    sb.destroy().await?;
    // Cold: a new sandbox, then the first result of a new kernel; with the kernel started
    // during creation (`warm_kernels`, what `run` and `repl` ask for) and without.
    let mut cold = Vec::with_capacity(cold_runs);
    let mut cold_lazy = Vec::with_capacity(cold_runs);
    let mut host = Vec::with_capacity(cold_runs);
    for _ in 0..cold_runs {
        for (warm_kernel, samples) in [(true, &mut cold), (false, &mut cold_lazy)] {
            let mut spec = SandboxSpec::default();
            if warm_kernel {
                spec.warm_kernels = vec![Language::Python];
            }
            let t = Instant::now();
            let sb = engine.create(spec).await?;
            let r = sb.run_code(trivial(None)).await?;
            samples.push(t.elapsed());
            sb.destroy().await?;
            if !r.ok() {
                bail!("x = 1 failed: {:?}", r.done);
            }
        }
        let t = Instant::now();
        check(Command::new(PYTHON).args(["-c", "x = 1"]), "python3 -c")?;
        host.push(t.elapsed());
    }
    let rows = [
        ("warm kernel round trip (x = 1, Engine API)", &warm),
        (
            "python3 -c 'x = 1' per call, in the sandbox",
            &per_call_inside,
        ),
        ("cold: create (kernel warmed) + first result", &cold),
        ("cold: create, then start kernel + first result", &cold_lazy),
        ("python3 -c 'x = 1' on the host (no sandbox)", &host),
    ];
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|(name, s)| {
                json!({"scenario": name, "runs": s.len(), "median_ms": quantile(s, 0.5),
                       "p90_ms": quantile(s, 0.9), "p99_ms": quantile(s, 0.99)})
            })
            .collect();
        println!("{}", json!({ "kernel": out }));
        return Ok(ExitCode::SUCCESS);
    }
    println!("python kernel benchmark; milliseconds");
    println!(
        "{:<46} {:>6} {:>9} {:>9} {:>9}",
        "scenario", "runs", "median", "p90", "p99"
    );
    for (name, s) in rows {
        println!(
            "{:<46} {:>6} {:>9.3} {:>9.3} {:>9.3}",
            name,
            s.len(),
            quantile(s, 0.5),
            quantile(s, 0.9),
            quantile(s, 0.99)
        );
    }
    let ratio = quantile(&per_call_inside, 0.5) / quantile(&warm, 0.5).max(1e-9);
    println!("a warm kernel answers {ratio:.0}x faster than a python3 process per call");
    Ok(ExitCode::SUCCESS)
}
