//! `sandcell bench startup`: Sandcell's sandbox start-up next to plain exec and bubblewrap,
//! measured interleaved in one run so the figures are comparable.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use sandcell_engine::{Engine, SandboxSpec};
use sandcell_protocol::{ExecRequest, Language, RunCodeRequest};
use serde_json::json;

mod daemon;

/// Arguments of `sandcell bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Debug, Subcommand)]
enum BenchWhat {
    /// Create a sandbox and run `true` / `python3 -c pass`, against plain exec and bubblewrap.
    Startup {
        /// Runs per scenario (at least 50 for the published figures).
        #[arg(long, default_value_t = 50)]
        runs: usize,
        /// Pause before each sample, in milliseconds: 0 measures back-to-back starts, 50
        /// measures starts that come apart (kernel state such as RCU has gone idle).
        #[arg(long, default_value_t = 0)]
        gap_ms: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Python kernel: `x = 1` round trips in a warm kernel, and create-sandbox to the first
    /// result, against a `python3 -c` process per call.
    Kernel {
        /// Warm round trips (at least 1000 for the published figures).
        #[arg(long, default_value_t = 1000)]
        runs: usize,
        /// Cold starts (a new sandbox each).
        #[arg(long, default_value_t = 30)]
        cold_runs: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The daemon over HTTP on loopback: exec and `x = 1` round trips (against the embedded
    /// engine), create-to-first-result cold and from a warm pool, many concurrent clients.
    Daemon(daemon::DaemonArgs),
}

pub(crate) const PYTHON: &str = "/usr/bin/python3";

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

/// Runs `sandcell bench`.
pub async fn bench(args: BenchArgs, engine: Engine) -> anyhow::Result<ExitCode> {
    match args.what {
        BenchWhat::Startup { runs, gap_ms, json } => startup(engine, runs, gap_ms, json).await,
        BenchWhat::Kernel {
            runs,
            cold_runs,
            json,
        } => kernel(engine, runs, cold_runs, json).await,
        BenchWhat::Daemon(args) => daemon::daemon(args, engine).await,
    }
}

/// `bench kernel`.
async fn kernel(
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

/// `bench startup`.
async fn startup(
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

fn check(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

pub(crate) fn quantile(samples: &[Duration], q: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return 0.0;
    }
    let idx = ((ms.len() - 1) as f64 * q).round() as usize;
    ms[idx.min(ms.len() - 1)]
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
        let vs_plain = format!("+{:.2} ms", med - plain);
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
