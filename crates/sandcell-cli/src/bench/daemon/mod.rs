//! `sandcell bench daemon`: the daemon over real HTTP on loopback. It starts its own
//! `sandcell serve` on a temporary home and measures, in one run: exec and Python `x = 1`
//! round trips in a warm sandbox, side by side with the same calls through the embedded
//! engine; pause/resume and snapshot/restore/fork on each backend `GET /v1/system` reports
//! available; create-to-first-result cold and from a warm pool, next to a `python3 -c`
//! process on the host; and many concurrent clients doing exec for a while (throughput,
//! latency, errors). The daemon gets SIGTERM at the end and must leave no sandbox running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use sandcell_api::code::{CodeInput, CodeResult};
use sandcell_api::exec::ExecInput;
use sandcell_api::sandboxes::CreateSandbox;
use sandcell_api::snapshots::{CreateSnapshot, ForkSnapshot};
use sandcell_engine::{Engine, SandboxSpec};
use sandcell_protocol::{ExecRequest, FeatureState, Language, RunCodeRequest};
use serde_json::{Value, json};

use crate::bench::{PYTHON, quantile};

/// Arguments of `sandcell bench daemon`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Round trips per scenario (exec `true` and `x = 1`, over HTTP and embedded).
    #[arg(long, default_value_t = 1000)]
    runs: usize,
    /// Creations per create-to-first-result scenario (cold, from the pool, embedded).
    #[arg(long, default_value_t = 20)]
    cold_runs: usize,
    /// Concurrent clients of the load test.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Length of the load test in seconds.
    #[arg(long, default_value_t = 60)]
    duration_secs: u64,
    /// Sandboxes the load test's clients share (round-robin).
    #[arg(long, default_value_t = 4)]
    sandboxes: usize,
    /// Ready sandboxes in the daemon's python/small warm pool (0: no pool, and no pool
    /// scenario).
    #[arg(long, default_value_t = 2)]
    pool: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The warm pool the daemon keeps (`pools.warm`), as `/metrics` names it.
const POOL: &str = "python/small";
/// How long the daemon gets to write `daemon.json`, answer `/healthz` and fill its pool.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the daemon gets to stop on SIGTERM (it stops every sandbox first).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// How many load-test errors are shown.
const SHOWN_ERRORS: usize = 5;
/// The daemon's default backend: its rows keep their keys without a suffix.
const DEFAULT_BACKEND: &str = "process";

/// One timed scenario.
struct Row {
    key: String,
    name: String,
    samples: Vec<Duration>,
}

impl Row {
    fn new(key: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            name: name.into(),
            samples: Vec::new(),
        }
    }

    /// A row of a scenario run on `backend`: the key gets `_<backend>` (none for the
    /// default backend), the name ` (<backend>)`.
    fn on(backend: &str, key: &str, name: &str) -> Self {
        let key = if backend == DEFAULT_BACKEND {
            key.to_string()
        } else {
            format!("{key}_{backend}")
        };
        Self::new(key, format!("{name} ({backend})"))
    }

    fn median(&self) -> f64 {
        quantile(&self.samples, 0.5)
    }

    fn p99(&self) -> f64 {
        quantile(&self.samples, 0.99)
    }

    fn json(&self) -> Value {
        json!({
            "key": self.key, "scenario": self.name, "runs": self.samples.len(),
            "median_ms": self.median(), "p99_ms": self.p99(), "mean_ms": mean(&self.samples),
        })
    }
}

fn mean(samples: &[Duration]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / samples.len() as f64
}

/// What the load test saw.
struct Load {
    clients: usize,
    sandboxes: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    errors: u64,
    first_errors: Vec<String>,
    cpu: Option<CpuShare>,
}

impl Load {
    fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A backend the daemon can run here (`GET /v1/system`).
struct Backend {
    kind: String,
    supports_pause: bool,
    /// Its snapshots carry more than nothing (`checkpoint_fidelity` is not `none`).
    snapshots: bool,
    /// It has a working CRIU (checkpointable sandboxes: process-fidelity snapshots).
    criu: bool,
}

/// Where the CPU went during the load test, in cores (1.0 = one core busy all the time).
struct CpuShare {
    daemon: f64,
    client: f64,
    /// Inside the load test's sandboxes (their cgroups), when the host reports it.
    sandboxes: Option<f64>,
    machine: f64,
    cores: usize,
}

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

/// The spec the daemon's `{"template": "python", "env": env}` stands for, for the embedded
/// engine, so both sides run the same sandbox.
fn python_spec(env: &[(&str, &str)]) -> anyhow::Result<SandboxSpec> {
    let req = CreateSandbox {
        template: Some("python".into()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..CreateSandbox::default()
    };
    sandcell_service::sandboxes::spec_of(&req).map_err(|e| anyhow!("the python template: {e}"))
}

/// A `python` sandbox with `env` (and on `backend`, checkpointable when asked).
fn python_sandbox(
    env: &[(&str, &str)],
    backend: Option<&str>,
    checkpointable: bool,
) -> CreateSandbox {
    CreateSandbox {
        template: Some("python".into()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        backend: backend.map(str::to_string),
        checkpointable,
        ..CreateSandbox::default()
    }
}

/// Python code in the default context.
fn python(code: &str) -> CodeInput {
    CodeInput {
        code: code.into(),
        ..CodeInput::default()
    }
}

fn x_equals_1(code: &str) -> RunCodeRequest {
    RunCodeRequest {
        context: None,
        language: Some(Language::Python),
        code: code.into(),
        timeout_ms: None,
    }
}

/// Exec `true` and `x = 1` in one warm sandbox over HTTP and in one through the embedded
/// engine, interleaved so that both see the same machine.
async fn round_trips(d: &Daemon, engine: &Engine, runs: usize) -> anyhow::Result<Vec<Row>> {
    // The env keeps this sandbox out of the warm pool (the pool stays full and idle).
    let env = [("SANDCELL_BENCH", "round-trips")];
    let id = d.create(&python_sandbox(&env, None, false)).await?;
    let sb = engine
        .create(python_spec(&env)?)
        .await
        .context("create an embedded sandbox")?;
    let exec_body = ExecInput {
        argv: Some(vec!["true".into()]),
        ..ExecInput::default()
    };
    let code_body = python("x = 1");
    let mut rows = vec![
        Row::new("exec_http", "exec `true`, HTTP"),
        Row::new("exec_embedded", "exec `true`, embedded engine"),
        Row::new("code_http", "python `x = 1`, HTTP"),
        Row::new("code_embedded", "python `x = 1`, embedded engine"),
        // Where the HTTP share goes: the floor (no key, no sandbox), then a key check and a
        // record read.
        Row::new("healthz_http", "GET /healthz, HTTP (no key, no sandbox)"),
        Row::new("get_http", "GET /v1/sandboxes/{id}, HTTP (key, record)"),
    ];
    let warmup = (runs / 10).clamp(10, 100);
    for i in 0..warmup + runs {
        let t = Instant::now();
        d.exec_ok(&id, &exec_body).await?;
        let exec_http = t.elapsed();

        let t = Instant::now();
        let out = sb
            .exec(ExecRequest::argv(["true"]))
            .await
            .context("embedded exec")?;
        let exec_embedded = t.elapsed();
        if !out.result.success() {
            bail!("embedded `true` failed: {}", out.result.message);
        }

        let t = Instant::now();
        d.code_ok(&id, &code_body).await?;
        let code_http = t.elapsed();

        let t = Instant::now();
        let run = sb
            .run_code(x_equals_1("x = 1"))
            .await
            .context("embedded x = 1")?;
        let code_embedded = t.elapsed();
        if !run.ok() {
            bail!("embedded x = 1 failed: {:?}", run.done);
        }

        let t = Instant::now();
        d.healthz().await?;
        let healthz = t.elapsed();

        let t = Instant::now();
        d.api.sandbox(&id).await?;
        let get = t.elapsed();

        if i >= warmup {
            let samples = [
                exec_http,
                exec_embedded,
                code_http,
                code_embedded,
                healthz,
                get,
            ];
            for (row, s) in rows.iter_mut().zip(samples) {
                row.samples.push(s);
            }
        }
    }
    sb.destroy().await.context("destroy the embedded sandbox")?;
    d.delete(&id).await?;
    Ok(rows)
}

/// Pause and resume of a sandbox on `backend` whose Python kernel holds state and whose
/// loop is busy, over HTTP and, given an `engine`, through the embedded engine (its default
/// backend); after each resume the kernel must answer.
async fn pause_resume(
    d: &Daemon,
    engine: Option<&Engine>,
    backend: &str,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let env = [("SANDCELL_BENCH", "pause")];
    let id = d
        .create(&python_sandbox(&env, Some(backend), false))
        .await?;
    let sb = match engine {
        Some(engine) => Some(
            engine
                .create(python_spec(&env)?)
                .await
                .context("create an embedded sandbox")?,
        ),
        None => None,
    };
    // Something to freeze: a process that wakes up every millisecond.
    let busy = "import subprocess; subprocess.Popen(['sh', '-c', 'while :; do sleep 0.001; done'])";
    d.code_ok(&id, &python(busy)).await?;
    let mut rows = vec![
        Row::on(backend, "pause_http", "pause, HTTP"),
        Row::on(backend, "resume_http", "resume, HTTP"),
    ];
    if let Some(sb) = &sb {
        sb.run_code(x_equals_1(busy))
            .await
            .context("embedded busy loop")?;
        rows.extend([
            Row::on(backend, "pause_embedded", "pause, embedded engine"),
            Row::on(backend, "resume_embedded", "resume, embedded engine"),
        ]);
    }
    for i in 0..runs + 2 {
        let t = Instant::now();
        d.api.pause_sandbox(&id).await?;
        let pause_http = t.elapsed();
        let t = Instant::now();
        d.api.resume_sandbox(&id).await?;
        let resume_http = t.elapsed();
        d.code_ok(&id, &python("x = 1")).await?;
        let mut samples = vec![pause_http, resume_http];

        if let Some(sb) = &sb {
            let t = Instant::now();
            sb.pause().await.context("embedded pause")?;
            let pause_embedded = t.elapsed();
            let t = Instant::now();
            sb.resume().await.context("embedded resume")?;
            let resume_embedded = t.elapsed();
            sb.run_code(x_equals_1("x = 1"))
                .await
                .context("embedded x = 1 after resume")?;
            samples.extend([pause_embedded, resume_embedded]);
        }
        // The first two are warm-up.
        if i >= 2 {
            for (row, sample) in rows.iter_mut().zip(samples) {
                row.samples.push(sample);
            }
        }
    }
    if let Some(sb) = sb {
        sb.destroy().await.context("destroy the embedded sandbox")?;
    }
    d.delete(&id).await?;
    Ok(rows)
}

/// Snapshot and restore (`POST /v1/sandboxes` with `snapshot_id`, until the restored
/// kernel answers) of a Python sandbox on `backend` holding ~5 MB and ~100 MB of state, and
/// one fork of 10 sandboxes (its wall time is one sample); the sizes the API gives for the
/// snapshots (`size`: what they take on disk) go in the row names.
async fn snapshots(
    d: &Daemon,
    backend: &str,
    checkpointable: bool,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    // Rows of checkpointable sandboxes are told apart by their backend label.
    let label_backend = if checkpointable {
        format!("{backend}-criu")
    } else {
        backend.to_string()
    };
    let backend_label = label_backend.as_str();
    for (label, mb) in [("5 MB", 5), ("100 MB", 100)] {
        let body = python_sandbox(
            &[("SANDCELL_BENCH", "snapshot")],
            Some(backend),
            checkpointable,
        );
        let id = d.create(&body).await?;
        let code = format!(
            "state = bytearray({mb} * 2**20)\nfor i in range(0, len(state), 4096): state[i] = i % 251"
        );
        d.code_ok(&id, &python(&code)).await?;
        let mut snap_samples = Vec::new();
        let mut restore_samples = Vec::new();
        let mut size = 0;
        let mut last = String::new();
        for _ in 0..runs {
            let t = Instant::now();
            let v = d
                .api
                .create_snapshot(&id, &CreateSnapshot::default())
                .await?;
            snap_samples.push(t.elapsed());
            size = v.size;
            let snap = v.id;
            let t = Instant::now();
            let restored = d
                .create(&CreateSandbox {
                    snapshot_id: Some(snap.clone()),
                    ..CreateSandbox::default()
                })
                .await?;
            d.code_ok(&restored, &python("len(state)")).await?;
            restore_samples.push(t.elapsed());
            d.delete(&restored).await?;
            if !last.is_empty() {
                d.api.delete_snapshot(&last).await?;
            }
            last = snap;
        }
        let row = |key: &str, what: &str, samples: Vec<Duration>| Row {
            samples,
            ..Row::on(
                backend_label,
                &format!("{key}_{mb}mb"),
                &format!("{what}, python {label}, {} MB on disk", size >> 20),
            )
        };
        let snap_row = row("snapshot", "snapshot", snap_samples);
        let restore_row = row("restore", "restore to first result", restore_samples);
        if mb == 5 {
            // Ten sandboxes from one snapshot in one request.
            let mut fork_row = Row::on(
                backend_label,
                "fork_10",
                "fork of 10 from the 5 MB snapshot, wall time",
            );
            let t = Instant::now();
            let forked = d
                .api
                .fork_snapshot(
                    &last,
                    &ForkSnapshot {
                        count: Some(10),
                        ..ForkSnapshot::default()
                    },
                )
                .await?;
            fork_row.samples.push(t.elapsed());
            for f in &forked.sandboxes {
                d.delete(&f.sandbox.id).await?;
            }
            rows.extend([snap_row, restore_row, fork_row]);
        } else {
            rows.extend([snap_row, restore_row]);
        }
        d.api.delete_snapshot(&last).await?;
        d.delete(&id).await?;
    }
    Ok(rows)
}

/// Create-to-first-result (`1+1`): cold over HTTP, from the warm pool over HTTP, cold
/// through the embedded engine, and a `python3 -c` process on the host. Before each sample
/// the pool is full again, so no refill runs during a measurement. Returns the rows and how
/// many of the pool creations were pool hits.
async fn creates(
    d: &Daemon,
    engine: &Engine,
    runs: usize,
    pool: usize,
) -> anyhow::Result<(Vec<Row>, Option<u64>)> {
    let cold_body = python_sandbox(&[("A", "1")], None, false);
    let pool_body = python_sandbox(&[], None, false);
    let spec = python_spec(&[("A", "1")])?;
    let mut cold = Row::new("create_cold_http", "create + first result, cold, HTTP");
    let mut pooled = Row::new("create_pool_http", "create + first result, warm pool, HTTP");
    let mut embedded = Row::new(
        "create_cold_embedded",
        "create + first result, cold, embedded engine",
    );
    let mut host = Row::new("python3_host", "python3 -c 'print(1+1)' on the host");
    let mut hits = 0;
    // The first round warms up and is not kept.
    for i in 0..=runs {
        let keep = i > 0;
        d.wait_pool_full(pool).await?;
        let t = Instant::now();
        let id = d.create(&cold_body).await?;
        d.first_result(&id).await?;
        let took = t.elapsed();
        d.delete(&id).await?;
        if keep {
            cold.samples.push(took);
        }

        if pool > 0 {
            d.wait_pool_full(pool).await?;
            let before = d
                .metric("sandcell_pool_requests_total{result=\"hit\"}")
                .await?;
            let t = Instant::now();
            let id = d.create(&pool_body).await?;
            d.first_result(&id).await?;
            let took = t.elapsed();
            let after = d
                .metric("sandcell_pool_requests_total{result=\"hit\"}")
                .await?;
            d.delete(&id).await?;
            if keep {
                pooled.samples.push(took);
                if after > before {
                    hits += 1;
                }
            }
        }

        d.wait_pool_full(pool).await?;
        let t = Instant::now();
        let sb = engine
            .create(spec.clone())
            .await
            .context("create an embedded sandbox")?;
        let run = sb
            .run_code(x_equals_1("1+1"))
            .await
            .context("embedded 1+1")?;
        let took = t.elapsed();
        sb.destroy().await.context("destroy the embedded sandbox")?;
        if run.result_text() != Some("2") {
            bail!("embedded 1+1 gave {:?}", run.result_text());
        }
        if keep {
            embedded.samples.push(took);
        }

        let t = Instant::now();
        let out = Command::new(PYTHON)
            .args(["-c", "print(1+1)"])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {PYTHON} on the host"))?;
        let took = t.elapsed();
        if !out.status.success() || out.stdout != b"2\n" {
            bail!("python3 -c 'print(1+1)' on the host failed: {}", out.status);
        }
        if keep {
            host.samples.push(took);
        }
    }
    let mut rows = vec![cold];
    if pool > 0 {
        rows.push(pooled);
    }
    rows.extend([embedded, host]);
    Ok((rows, (pool > 0).then_some(hits)))
}

/// `clients` clients each doing exec `true` in a loop for `duration`, on `sandboxes` shared
/// sandboxes (client `i`'s `n`th request goes to sandbox `(i + n) % sandboxes`).
async fn load(
    d: &Daemon,
    clients: usize,
    sandboxes: usize,
    duration: Duration,
) -> anyhow::Result<Load> {
    let mut ids = Vec::with_capacity(sandboxes);
    for _ in 0..sandboxes {
        let default = CreateSandbox {
            template: Some("default".into()),
            ..CreateSandbox::default()
        };
        ids.push(d.create(&default).await?);
    }
    let body = ExecInput {
        argv: Some(vec!["true".into()]),
        ..ExecInput::default()
    };
    let first_errors = Mutex::new(Vec::new());
    let client = |i: usize, until: Instant| {
        let (ids, body, first_errors) = (&ids, &body, &first_errors);
        async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut n = i;
            while Instant::now() < until {
                let t = Instant::now();
                let r = d.exec_ok(&ids[n % ids.len()], body).await;
                let took = t.elapsed();
                n += 1;
                match r {
                    Ok(()) => latencies.push(took),
                    Err(e) => {
                        errors += 1;
                        let mut shown = first_errors.lock().unwrap_or_else(|e| e.into_inner());
                        if shown.len() < SHOWN_ERRORS {
                            shown.push(format!("{e:#}"));
                        }
                    }
                }
            }
            (latencies, errors)
        }
    };
    // Warm-up: every client opens its connection and does a few requests.
    let warm_until = Instant::now() + duration.div_f64(20.0).min(Duration::from_secs(3));
    let warm = futures_util::future::join_all((0..clients).map(|i| client(i, warm_until))).await;
    let warm_errors: u64 = warm.iter().map(|(_, e)| e).sum();
    if warm_errors > 0 {
        bail!(
            "{warm_errors} errors while warming up the load test: {}",
            first_errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .join("; ")
        );
    }
    let sandboxes_before = d.cpu_seconds(&ids).await?;
    let cpu_before = CpuTimes::read(d.pid());
    let start = Instant::now();
    let until = start + duration;
    let results = futures_util::future::join_all((0..clients).map(|i| client(i, until))).await;
    let elapsed = start.elapsed();
    let cpu_after = CpuTimes::read(d.pid());
    let sandboxes_after = d.cpu_seconds(&ids).await?;
    let cpu = cpu_before.zip(cpu_after).map(|(a, b)| {
        let mut share = a.share(&b);
        share.sandboxes = sandboxes_before
            .zip(sandboxes_after)
            .map(|(a, b)| (b - a) / elapsed.as_secs_f64());
        share
    });
    for id in &ids {
        d.delete(id).await?;
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for (l, e) in results {
        latencies.extend(l);
        errors += e;
    }
    Ok(Load {
        clients,
        sandboxes,
        elapsed,
        latencies,
        errors,
        first_errors: first_errors.into_inner().unwrap_or_else(|e| e.into_inner()),
        cpu,
    })
}

/// CPU time so far (in clock ticks): the daemon's, this process's, the machine's.
struct CpuTimes {
    daemon: u64,
    client: u64,
    busy: u64,
    total: u64,
}

impl CpuTimes {
    fn read(daemon_pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3)? + ticks.get(4)?;
        Some(Self {
            daemon: process_ticks(&format!("/proc/{daemon_pid}/stat"))?,
            client: process_ticks("/proc/self/stat")?,
            busy: total.saturating_sub(idle),
            total,
        })
    }

    /// The share of each since `self`, in cores.
    fn share(&self, later: &Self) -> CpuShare {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // /proc/stat counts every core's ticks: one core's worth of time is total / cores.
        let per_core = (later.total.saturating_sub(self.total) as f64 / cores as f64).max(1.0);
        let cores_of = |a: u64, b: u64| b.saturating_sub(a) as f64 / per_core;
        CpuShare {
            daemon: cores_of(self.daemon, later.daemon),
            client: cores_of(self.client, later.client),
            sandboxes: None,
            machine: cores_of(self.busy, later.busy),
            cores,
        }
    }
}

/// utime + stime of a process (`/proc/<pid>/stat` fields 14 and 15).
fn process_ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Field 3 (the state) is the first after the command name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Prints the table (or JSON); fails the command when the load test saw errors.
fn report(args: &DaemonArgs, rows: &[Row], pool_hits: Option<u64>, load: &Load) -> ExitCode {
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

/// A `sandcell serve` of this benchmark, on its own temporary home. Dropping it stops it
/// (SIGTERM, then SIGKILL) if [`Daemon::stop`] did not, and removes the home.
struct Daemon {
    child: Option<Child>,
    pid: u32,
    home: PathBuf,
    url: String,
    /// The daemon's typed client (with the admin key once the daemon wrote it).
    api: sandcell_client::Client,
}

impl Daemon {
    /// Starts it with a warm pool of `pool` python sandboxes and waits until it answers and
    /// the pool is full.
    async fn start(pool: usize) -> anyhow::Result<Self> {
        let home = temp_home()?;
        let mut d = Self {
            child: None,
            pid: 0,
            home,
            url: String::new(),
            api: sandcell_client::Client::builder("http://127.0.0.1:1").build()?,
        };
        let log = std::fs::File::create(d.home.join("daemon.log"))
            .with_context(|| format!("create {}", d.home.join("daemon.log").display()))?;
        let exe = std::env::current_exe().context("find the sandcell binary")?;
        let pools = if pool > 0 {
            format!("pools.warm={POOL}={pool}")
        } else {
            "pools.warm=".into()
        };
        let database = format!("database={}", d.home.join("sandcell.db").display());
        let sets = [
            pools.as_str(),
            "shutdown.sandboxes=stop",
            "limits.max_per_owner=0",
            "limits.max_sandboxes=0",
            // The rest pins what the environment could otherwise change.
            "limits.lifetime_secs=0",
            "limits.idle_timeout_secs=0",
            "unix_socket=",
            "log_format=text",
            database.as_str(),
        ];
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .arg("--home")
            .arg(&d.home)
            .args(["--listen", "127.0.0.1:0"]);
        for s in sets {
            cmd.args(["--set", s]);
        }
        let child = cmd
            .env_remove("SANDCELL_API_URL")
            .env_remove("SANDCELL_API_KEY")
            .env_remove("SANDCELL_HOME")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start sandcell serve")?;
        d.pid = child.id();
        d.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        let info_path = sandcell_api::discovery::daemon_info_path(&d.home);
        d.url = loop {
            d.check_running()?;
            let info: Option<sandcell_api::discovery::DaemonInfo> =
                std::fs::read_to_string(&info_path)
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok());
            if let Some(info) = info.filter(|i| i.pid == d.pid) {
                break info.url;
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon wrote no {} in {START_TIMEOUT:?}\n{}",
                    info_path.display(),
                    d.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        d.api = sandcell_client::Client::builder(d.url.clone())
            .timeout(Duration::from_secs(300))
            .build()?;
        loop {
            d.check_running()?;
            if d.healthz().await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("the daemon at {} never answered /healthz", d.url);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let key_path = sandcell_api::discovery::admin_key_path(&d.home);
        let key = std::fs::read_to_string(&key_path)
            .with_context(|| format!("read {}", key_path.display()))?;
        d.api = d.api.with_api_key(key.trim());
        d.wait_pool_full(pool).await?;
        Ok(d)
    }

    fn pid(&self) -> u32 {
        self.pid
    }

    /// Fails when the daemon has exited.
    fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(child) = &mut self.child
            && let Some(status) = child.try_wait().context("wait for the daemon")?
        {
            self.child = None;
            bail!("the daemon exited with {status}\n{}", self.log_tail(20));
        }
        Ok(())
    }

    /// The last `n` lines of the daemon's log.
    fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(self.home.join("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(n)..].join("\n");
        format!("the daemon's log ends with:\n{tail}")
    }

    /// `GET /healthz`, which must answer 200.
    async fn healthz(&self) -> anyhow::Result<()> {
        let status = self.api.health().await.context("GET /healthz")?;
        if !status.is_success() {
            bail!("GET /healthz answered {status}");
        }
        Ok(())
    }

    /// Creates a sandbox; its id.
    async fn create(&self, req: &CreateSandbox) -> anyhow::Result<String> {
        Ok(self.api.create_sandbox(req).await?.id)
    }

    /// The backends `GET /v1/system` reports available: the default first, then the
    /// others in its order.
    async fn backends(&self) -> anyhow::Result<Vec<Backend>> {
        let system = self.api.system().await.context("GET /v1/system")?;
        let mut backends: Vec<Backend> = system
            .backends
            .iter()
            .filter(|b| b.available)
            .map(|b| Backend {
                kind: b.kind.clone(),
                supports_pause: b.supports_pause,
                snapshots: b.checkpoint_fidelity != "none",
                criu: b
                    .host
                    .features
                    .iter()
                    .any(|f| f.name == "criu" && f.state == FeatureState::Active),
            })
            .collect();
        if backends.is_empty() {
            bail!("GET /v1/system reports no available backend");
        }
        backends.sort_by_key(|b| b.kind != DEFAULT_BACKEND);
        Ok(backends)
    }

    async fn delete(&self, id: &str) -> anyhow::Result<()> {
        Ok(self.api.delete_sandbox(id).await?)
    }

    /// An exec in sandbox `id` that must succeed with `ok`.
    async fn exec_ok(&self, id: &str, req: &ExecInput) -> anyhow::Result<()> {
        let v = self.api.exec(id, req).await?;
        if !v.ok {
            bail!("exec in {id}: the command failed: {}", v.result.message);
        }
        Ok(())
    }

    /// Code in sandbox `id` that must end with status `ok`; the answer.
    async fn code_ok(&self, id: &str, req: &CodeInput) -> anyhow::Result<CodeResult> {
        let v = self.api.run_code(id, req).await?;
        if v.done.status != "ok" {
            bail!("code in {id}: the code did not run: {}", json!(v.done));
        }
        Ok(v)
    }

    /// Runs `1+1` in sandbox `id` and checks the result.
    async fn first_result(&self, id: &str) -> anyhow::Result<()> {
        let v = self.code_ok(id, &python("1+1")).await?;
        let result = v.result.unwrap_or(Value::Null);
        if result["text/plain"] != "2" {
            bail!("1+1 gave {result}");
        }
        Ok(())
    }

    /// One sample of `/metrics` (0 when the series is absent).
    async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let text = self.api.metrics_text().await.context("GET /metrics")?;
        Ok(text
            .lines()
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0))
    }

    /// The CPU seconds the sandboxes `ids` used so far (`None` where cgroups do not say).
    async fn cpu_seconds(&self, ids: &[String]) -> anyhow::Result<Option<f64>> {
        let mut sum = 0.0;
        for id in ids {
            let usage = self.api.sandbox_usage(id).await?;
            let Some(secs) = usage.cpu_seconds else {
                return Ok(None);
            };
            sum += secs;
        }
        Ok(Some(sum))
    }

    /// Waits until the warm pool holds `pool` ready sandboxes.
    async fn wait_pool_full(&self, pool: usize) -> anyhow::Result<()> {
        if pool == 0 {
            return Ok(());
        }
        let series = format!("sandcell_pool_ready{{pool=\"{POOL}\"}}");
        let deadline = Instant::now() + START_TIMEOUT;
        while self.metric(&series).await? < pool as f64 {
            if Instant::now() > deadline {
                bail!("the warm pool did not refill to {pool} in {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// SIGTERM, waits for a clean exit, then checks that no sandbox of its is left running
    /// (one that is gets killed, and the stop fails).
    async fn stop(&mut self, engine: &Engine) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("the daemon is not running");
        };
        terminate(child.id())?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().context("wait for the daemon")? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the daemon did not stop within {STOP_TIMEOUT:?} of SIGTERM (killed)\n{}",
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let left = leftovers(&self.home, engine)?;
        if !status.success() {
            bail!(
                "the daemon exited with {status} on SIGTERM\n{}",
                self.log_tail(20)
            );
        }
        if !left.is_empty() {
            bail!(
                "sandboxes left running after the daemon stopped (now killed): {}",
                left.join(", ")
            );
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = terminate(child.id());
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// A new, private directory under /tmp.
fn temp_home() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir =
        std::env::temp_dir().join(format!("sandcell-bench-{}-{nanos:08x}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// Sends SIGTERM to `pid` (with kill(1): this crate has no libc).
fn terminate(pid: u32) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-s", "TERM", &pid.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("run kill -s TERM")?;
    if !status.success() {
        bail!("kill -s TERM {pid} failed: {status}");
    }
    Ok(())
}

/// The sandboxes of the daemon's records (every state) whose processes still run, killed;
/// their ids and what was found.
fn leftovers(home: &Path, engine: &Engine) -> anyhow::Result<Vec<String>> {
    let db = home.join("sandcell.db");
    let store = sandcell_store::Store::open(&db)
        .with_context(|| format!("open the daemon's store {}", db.display()))?;
    let mut left = Vec::new();
    let mut query = sandcell_store::SandboxQuery {
        limit: 1000,
        ..Default::default()
    };
    loop {
        let page = store
            .list_sandboxes(&query)
            .context("list the daemon's sandboxes")?;
        for r in &page.items {
            let Ok(spec) = serde_json::from_value::<SandboxSpec>(r.spec.clone()) else {
                continue;
            };
            let found = engine.kill_orphan(&spec, &r.runtime);
            if found.starts_with("killed") {
                left.push(format!("{} ({}: {found})", r.id, r.state));
            }
        }
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => break,
        }
    }
    Ok(left)
}
