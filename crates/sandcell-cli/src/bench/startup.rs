//! `sandcell bench startup`: Sandcell's sandbox start-up next to plain exec and bubblewrap,
//! measured interleaved in one run so the figures are comparable: the scenarios, how each
//! is started and timed, and the table (or JSON) they print.

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_engine::{Engine, SandboxSpec};
use sandcell_protocol::ExecRequest;
use serde_json::json;

use crate::bench::host::{PYTHON, check, find_on_path};
use crate::bench::stats::quantile;

/// One thing being timed.
enum Scenario {
    Plain(Vec<String>),
    Engine(Vec<String>),
    Cli(Vec<String>),
    Bwrap(Vec<String>),
}

struct Row {
    name: String,
    program: &'static str,
    scenario: Scenario,
    samples: Vec<Duration>,
}

/// `bench startup`.
pub(super) async fn startup(
    engine: Engine,
    runs: usize,
    gap_ms: u64,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    if runs < 3 {
        bail!("--runs must be at least 3");
    }
    let exe = std::env::current_exe().context("find the sandcell binary")?;
    let bwrap = find_on_path("bwrap");
    let programs: [(&'static str, Vec<String>); 2] = [
        ("true", vec!["/bin/true".into()]),
        (
            "python3 -c pass",
            vec![PYTHON.into(), "-c".into(), "pass".into()],
        ),
    ];
    let mut rows = Vec::new();
    for (program, argv) in &programs {
        rows.push(row("plain exec", program, Scenario::Plain(argv.clone())));
        rows.push(row(
            "sandcell (engine: create+exec+destroy)",
            program,
            Scenario::Engine(argv.clone()),
        ));
        rows.push(row(
            "sandcell run (CLI)",
            program,
            Scenario::Cli(argv.clone()),
        ));
        if bwrap.is_some() {
            rows.push(row(
                "bwrap --unshare-all",
                program,
                Scenario::Bwrap(argv.clone()),
            ));
        }
    }
    // Warm-up: page cache, dynamic loader, first-use costs.
    for r in &mut rows {
        measure(&engine, &exe, bwrap.as_deref(), &r.scenario).await?;
    }
    for _ in 0..runs {
        for r in &mut rows {
            if gap_ms > 0 {
                tokio::time::sleep(Duration::from_millis(gap_ms)).await;
            }
            let d = measure(&engine, &exe, bwrap.as_deref(), &r.scenario).await?;
            r.samples.push(d);
        }
    }
    report(&rows, runs, gap_ms, bwrap.is_some(), as_json);
    Ok(ExitCode::SUCCESS)
}

fn row(name: &str, program: &'static str, scenario: Scenario) -> Row {
    Row {
        name: name.to_string(),
        program,
        scenario,
        samples: Vec::new(),
    }
}

async fn measure(
    engine: &Engine,
    exe: &Path,
    bwrap: Option<&Path>,
    s: &Scenario,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    match s {
        Scenario::Plain(argv) => check(Command::new(&argv[0]).args(&argv[1..]), "plain exec")?,
        Scenario::Engine(argv) => {
            let sb = engine.create(SandboxSpec::default()).await?;
            let created = start.elapsed();
            let out = sb.exec(ExecRequest::argv(argv.clone())).await?;
            let executed = start.elapsed();
            sb.destroy().await?;
            if std::env::var_os("SANDCELL_BENCH_PHASES").is_some() {
                let ms = |d: Duration| d.as_secs_f64() * 1000.0;
                eprintln!(
                    "phases: create {:.2} (launch {:.2}, handshake {:.2}) exec {:.2} destroy {:.2}",
                    ms(created),
                    sb.timings().launch_ms,
                    sb.timings().handshake_ms,
                    ms(executed - created),
                    ms(start.elapsed() - executed)
                );
            }
            if !out.result.success() {
                bail!(
                    "sandboxed {} failed: {}",
                    argv.join(" "),
                    out.result.message
                );
            }
        }
        Scenario::Cli(argv) => check(
            Command::new(exe).args(["run", "-q", "--"]).args(argv),
            "sandcell run",
        )?,
        Scenario::Bwrap(argv) => {
            let mut cmd = Command::new(bwrap.unwrap_or(Path::new("bwrap")));
            cmd.args([
                "--unshare-all",
                "--die-with-parent",
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
                "--symlink",
                "usr/bin",
                "/bin",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--tmpfs",
                "/tmp",
            ]);
            check(cmd.args(argv), "bwrap")?
        }
    }
    Ok(start.elapsed())
}

fn report(rows: &[Row], runs: usize, gap_ms: u64, have_bwrap: bool, as_json: bool) {
    let median_of = |program: &str, prefix: &str| {
        rows.iter()
            .find(|r| r.program == program && r.name.starts_with(prefix))
            .map(|r| quantile(&r.samples, 0.5))
    };
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "scenario": r.name, "program": r.program, "runs": r.samples.len(),
                    "median_ms": quantile(&r.samples, 0.5), "p90_ms": quantile(&r.samples, 0.9),
                })
            })
            .collect();
        println!("{}", json!({ "startup": out }));
        return;
    }
    println!(
        "startup benchmark: {runs} runs per scenario, interleaved, {gap_ms} ms apart; milliseconds"
    );
    println!(
        "{:<42} {:<16} {:>8} {:>8} {:>12} {:>10}",
        "scenario", "program", "median", "p90", "vs plain", "vs bwrap"
    );
    for r in rows {
        let med = quantile(&r.samples, 0.5);
        let plain = median_of(r.program, "plain exec").unwrap_or(med);
        let vs_plain = format!("{:+.2} ms", med - plain);
        let vs_bwrap =
            median_of(r.program, "bwrap").map_or("-".to_string(), |b| format!("{:.2}x", med / b));
        println!(
            "{:<42} {:<16} {:>8.2} {:>8.2} {:>12} {:>10}",
            r.name,
            r.program,
            med,
            quantile(&r.samples, 0.9),
            vs_plain,
            vs_bwrap
        );
    }
    if !have_bwrap {
        println!("(bwrap not found: install bubblewrap to compare; benches/startup.sh does)");
    }
}
