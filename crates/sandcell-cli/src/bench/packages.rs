//! `sandcell bench packages`: what `packages` at create costs (issue 18), in one run, on
//! loopback. The test kit's `fake-registries` serves a Python simple index holding
//! `sandcell-fake`; a `sandcell serve` on a temporary home takes its packages from it, under
//! a registry name its test-only resolver pins to 127.0.0.1. Its two warm pools hold
//! `python` sandboxes only (with the package, and without), so the `default` creates below
//! start fresh. Timed, interleaved round by round so all see the same machine:
//! - a create with `packages: {"pip": ["sandcell-fake"]}` and an empty package cache (the
//!   daemon's `cache/packages/` emptied first): pip runs in the sandbox, through its egress
//!   proxy, against the fake index ("cold");
//! - the same create with that list in the cache: the archive is unpacked ("cached");
//! - a create without packages (the baseline: the issue asks that a cached create start
//!   about as fast);
//! - from the warm pools: a `python` create with the package, served by the pool that
//!   installed it ahead, against a `python` create without, served by the plain pool (the
//!   bench waits for both pools to refill, untimed, before going on);
//! - what a user would do instead: the host's own pip installing the same package from the
//!   same index into a fresh folder (`--target`, `--no-cache-dir`), no sandbox.
//!
//! Each is timed to the create's answer (to pip's exit, for the host's pip), and to the
//! package imported after it (`python3 -c 'import sandcell_fake'` in the sandbox, or with
//! `PYTHONPATH` on the host; `python3 -c pass` for the baseline). The create's report
//! (`packages.cached`) is checked on every sample, so a cold sample cannot come from the
//! cache nor a cached one from the index.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_api::exec::ExecInput;
use sandcell_api::sandboxes::{CreateSandbox, Packages};
use sandcell_engine::Engine;
use serde_json::{Value, json};

use super::daemon::server::{Daemon, terminate};
use super::host::{PYTHON, fake_registries_bin};
use super::stats::quantile;

/// The name the daemon reaches the fake index by (its certificate covers it).
const INDEX_NAME: &str = "pypi.test";
/// The package the fake index holds, and the module it installs.
const PACKAGE: &str = "sandcell-fake";
const MODULE: &str = "sandcell_fake";
/// How long `fake-registries` gets to stop on SIGTERM (it removes its files first).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The `fake-registries` process, stopped (SIGTERM, so it removes its CA file) when dropped.
struct FakeIndex {
    child: Child,
    /// Its HTTPS port on 127.0.0.1.
    port: u16,
    /// The CA that signed its certificate (PEM).
    ca: PathBuf,
}

impl FakeIndex {
    /// Starts it, covering [`INDEX_NAME`], and waits for its line saying it is up.
    fn start() -> anyhow::Result<Self> {
        let mut child = Command::new(fake_registries_bin()?)
            .args(["--name", INDEX_NAME])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start fake-registries")?;
        let stdout = child.stdout.take().context("fake-registries' stdout")?;
        let mut line = String::new();
        let read = std::io::BufReader::new(stdout).read_line(&mut line);
        let ready = read
            .context("read fake-registries' first line")
            .and_then(|_| ready_line(&line));
        match ready {
            Ok((port, ca)) => Ok(Self { child, port, ca }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}

/// The HTTPS port and the CA file of `fake-registries`' line saying it is up
/// (`{"https":"127.0.0.1:P","http":…,"ca":"…"}`).
fn ready_line(line: &str) -> anyhow::Result<(u16, PathBuf)> {
    let v: Value = serde_json::from_str(line.trim())
        .with_context(|| format!("fake-registries said {line:?}"))?;
    let port = v["https"]
        .as_str()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .with_context(|| format!("no HTTPS port in {line:?}"))?;
    let ca = v["ca"]
        .as_str()
        .with_context(|| format!("no CA in {line:?}"))?;
    Ok((port, PathBuf::from(ca)))
}

impl Drop for FakeIndex {
    fn drop(&mut self) {
        if terminate(self.child.id()).is_ok() {
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Create with the package, the cache empty.
    Cold,
    /// Create with the package, the cache holding it.
    Cached,
    /// Create without packages.
    Bare,
    /// The host's pip, no sandbox.
    HostPip,
    /// A `python` create with the package, from the pool that installed it.
    PooledPackages,
    /// A `python` create without packages, from the plain pool.
    PooledBare,
}

/// The pool with the package installed, and the plain one, as `/metrics` names them.
const POOLS: [&str; 2] = ["python/small+pip:sandcell-fake", "python/small"];

impl Case {
    const ALL: [Case; 6] = [
        Case::Cold,
        Case::Cached,
        Case::Bare,
        Case::HostPip,
        Case::PooledPackages,
        Case::PooledBare,
    ];

    fn key(self) -> &'static str {
        match self {
            Case::Cold => "cold",
            Case::Cached => "cached",
            Case::Bare => "no_packages",
            Case::HostPip => "host_pip",
            Case::PooledPackages => "pool_packages",
            Case::PooledBare => "pool_no_packages",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Case::Cold => "create, cold (empty cache)",
            Case::Cached => "create, cached",
            Case::Bare => "create, no packages",
            Case::HostPip => "host pip --target (no sandbox)",
            Case::PooledPackages => "warm pool, with the package",
            Case::PooledBare => "warm pool, no packages",
        }
    }
}

/// One sample: to the create's answer (pip's exit), to the import after it, and the
/// install's own time as the create reported it.
struct Sample {
    create: Duration,
    ready: Duration,
    install: Option<Duration>,
}

/// The samples of one case.
#[derive(Default)]
struct Times {
    create: Vec<Duration>,
    ready: Vec<Duration>,
    install: Vec<Duration>,
}

impl Times {
    fn push(&mut self, s: Sample) {
        self.create.push(s.create);
        self.ready.push(s.ready);
        self.install.extend(s.install);
    }
}

fn progress(what: &str) {
    eprintln!("bench packages: {what}");
}

/// Runs `sandcell bench packages`.
pub async fn packages(engine: Engine, samples: usize, json_out: bool) -> anyhow::Result<ExitCode> {
    let samples = samples.max(1);
    let scratch =
        std::env::temp_dir().join(format!("sandcell-bench-packages-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("create {}", scratch.display()))?;
    let result = run(engine, samples, json_out, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

async fn run(
    engine: Engine,
    samples: usize,
    json_out: bool,
    scratch: &Path,
) -> anyhow::Result<ExitCode> {
    progress("starting fake-registries");
    let index = FakeIndex::start()?;
    progress("starting `sandcell serve` on a temporary home (two python pools)");
    let mut daemon = Daemon::start_with_env(
        0,
        &[
            format!(
                "packages.pip_index_url=https://{INDEX_NAME}:{}/simple/",
                index.port
            ),
            format!("packages.ca_file={}", index.ca.display()),
            format!("pools.warm=python/small=1 pip:{PACKAGE},python/small=1"),
        ],
        &[
            ("SANDCELL_TEST".into(), "1".into()),
            (
                "SANDCELL_TEST_RESOLVE".into(),
                format!("{INDEX_NAME}=127.0.0.1"),
            ),
        ],
    )
    .await?;
    let measured = measure(&daemon, &index, samples, scratch).await;
    if measured.is_err() {
        eprintln!("{}", daemon.log_tail(30));
    }
    progress("stopping the daemon (SIGTERM)");
    let stopped = daemon.stop(&engine).await;
    drop(daemon);
    drop(index);
    let times = measured?;
    stopped?;
    report(&times, samples, json_out)?;
    Ok(ExitCode::SUCCESS)
}

/// Every case `samples` times, interleaved, after one unrecorded round.
async fn measure(
    daemon: &Daemon,
    index: &FakeIndex,
    samples: usize,
    scratch: &Path,
) -> anyhow::Result<[Times; 6]> {
    pools_full(daemon).await?;
    progress("one round of each to warm up (not recorded)");
    for case in Case::ALL {
        once(daemon, index, case, scratch)
            .await
            .with_context(|| format!("warm-up: {}", case.label()))?;
    }
    let mut times: [Times; 6] = Default::default();
    for round in 0..samples {
        progress(&format!("round {} of {samples}", round + 1));
        for (i, case) in Case::ALL.into_iter().enumerate() {
            let s = once(daemon, index, case, scratch)
                .await
                .with_context(|| format!("round {}: {}", round + 1, case.label()))?;
            times[i].push(s);
        }
    }
    Ok(times)
}

/// One sample of `case`. A cold one empties the cache first and leaves it holding the list,
/// which the cached one after it uses.
async fn once(
    daemon: &Daemon,
    index: &FakeIndex,
    case: Case,
    scratch: &Path,
) -> anyhow::Result<Sample> {
    match case {
        Case::Cold => {
            empty_cache(&daemon.home().join("cache").join("packages"))?;
            in_sandbox(daemon, Some(false), false).await
        }
        Case::Cached => in_sandbox(daemon, Some(true), false).await,
        Case::Bare => in_sandbox(daemon, None, false).await,
        Case::HostPip => host_pip(index, scratch),
        Case::PooledPackages | Case::PooledBare => {
            let with = case == Case::PooledPackages;
            let sample = in_sandbox(daemon, with.then_some(true), true).await?;
            pools_full(daemon).await?;
            Ok(sample)
        }
    }
}

/// The hits counted in `/metrics` so far.
async fn pool_hits(daemon: &Daemon) -> anyhow::Result<u64> {
    let text = daemon.api.metrics_text().await.context("read /metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix("sandcell_pool_requests_total{result=\"hit\"} "))
        .and_then(|n| n.trim().parse().ok())
        .context("no pool hit count in /metrics")
}

/// Waits (at most two minutes) until both [`POOLS`] hold a ready sandbox.
async fn pools_full(daemon: &Daemon) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = daemon.api.metrics_text().await.context("read /metrics")?;
        let full = POOLS
            .iter()
            .all(|p| text.contains(&format!("sandcell_pool_ready{{pool=\"{p}\"}} 1")));
        if full {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the warm pools did not fill in 2 minutes:\n{}",
                daemon.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Removes everything in the daemon's package cache `cache` (its archives, keyed by the
/// list, the registries and the backend), which need not exist.
fn empty_cache(cache: &Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(cache) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("read {}", cache.display())),
    };
    for entry in entries {
        let path = entry
            .with_context(|| format!("read {}", cache.display()))?
            .path();
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.with_context(|| format!("remove {}", path.display()))?;
    }
    Ok(())
}

/// A create (with the package when `cached` says how it must come: `Some(false)` from the
/// index, `Some(true)` from the cache; without packages on `None`), then the import (or
/// `pass`) in it; the sandbox is deleted after. `pooled`: a `python` create, which must be
/// served by a warm pool (else a `default` one, which must not be).
async fn in_sandbox(daemon: &Daemon, cached: Option<bool>, pooled: bool) -> anyhow::Result<Sample> {
    let hits_before = pool_hits(daemon).await?;
    let req = CreateSandbox {
        template: pooled.then(|| "python".to_string()),
        packages: cached.map(|_| Packages {
            pip: vec![PACKAGE.into()],
            ..Packages::default()
        }),
        ..CreateSandbox::default()
    };
    let code = if cached.is_some() {
        format!("import {MODULE}")
    } else {
        "pass".into()
    };
    let exec = ExecInput {
        argv: Some(vec!["python3".into(), "-c".into(), code.clone()]),
        ..ExecInput::default()
    };
    let started = Instant::now();
    let info = daemon
        .api
        .create_sandbox(&req)
        .await
        .context("create the sandbox")?;
    let create = started.elapsed();
    let checked = async {
        let install = match (cached, &info.packages) {
            (None, None) => None,
            (None, Some(_)) => bail!("a create without packages reported packages"),
            (Some(_), None) => bail!("the create reported no packages"),
            // A pool's sandbox reports its own install (the first one cold).
            (Some(want), Some(got)) if !pooled && got.cached != want => bail!(
                "the create's packages.cached is {} where {want} was expected",
                got.cached
            ),
            (Some(_), Some(got)) if got.from_pool != pooled => bail!(
                "the create's packages.from_pool is {} where {pooled} was expected",
                got.from_pool
            ),
            // A pool's install was done ahead, not on this create.
            (Some(_), Some(got)) => (!pooled).then(|| Duration::from_millis(got.duration_ms)),
        };
        let hits = pool_hits(daemon).await? - hits_before;
        if hits != u64::from(pooled) {
            bail!("the create took {hits} sandboxes from a pool where pooled is {pooled}");
        }
        let out = daemon
            .api
            .exec(&info.id, &exec)
            .await
            .context("exec in the sandbox")?;
        if !out.ok {
            bail!(
                "python3 -c '{code}' failed in the sandbox: {}",
                out.stderr.trim()
            );
        }
        Ok(install)
    }
    .await;
    let ready = started.elapsed();
    let deleted = daemon
        .api
        .delete_sandbox(&info.id)
        .await
        .context("delete the sandbox");
    let install = checked?;
    deleted?;
    Ok(Sample {
        create,
        ready,
        install,
    })
}

/// Runs `cmd`, which must succeed; fails with the end of its stderr.
fn run_host(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {what}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        bail!(
            "{what} failed ({}): {}",
            out.status,
            lines[lines.len().saturating_sub(8)..].join("\n")
        );
    }
    Ok(())
}

/// The host's pip installing the package from the fake index (straight to its port, no
/// proxy) into a fresh folder, without its cache; then the import from that folder.
fn host_pip(index: &FakeIndex, scratch: &Path) -> anyhow::Result<Sample> {
    let target = scratch.join("target");
    if target.exists() {
        std::fs::remove_dir_all(&target).with_context(|| format!("remove {}", target.display()))?;
    }
    let index_url = format!("https://127.0.0.1:{}/simple/", index.port);
    let mut pip = Command::new(PYTHON);
    // As the sandbox's pip runs: none of this environment's pip settings (such as extra
    // places to find packages in), every CA variable naming the index's CA (a
    // `REQUESTS_CA_BUNDLE` would otherwise win over `--cert`), no version check.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PIP_") {
            pip.env_remove(name);
        }
    }
    for var in sandcell_service::packages::CA_FILE_VARIABLES {
        pip.env(var, &index.ca);
    }
    let started = Instant::now();
    run_host(
        pip.args(["-m", "pip", "install", "--target"])
            .arg(&target)
            .args(["--index-url", &index_url, "--cert"])
            .arg(&index.ca)
            .args([
                "--no-cache-dir",
                "--no-input",
                "--progress-bar",
                "off",
                "--",
                PACKAGE,
            ])
            .env("PIP_CONFIG_FILE", "/dev/null")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        "the host's pip install",
    )?;
    let create = started.elapsed();
    run_host(
        Command::new(PYTHON)
            .args(["-c", &format!("import {MODULE}")])
            .env("PYTHONPATH", &target),
        "the host's import",
    )?;
    let ready = started.elapsed();
    std::fs::remove_dir_all(&target).with_context(|| format!("remove {}", target.display()))?;
    Ok(Sample {
        create,
        ready,
        install: None,
    })
}

/// Median, p90, min and max of `s`, in milliseconds.
fn summary(s: &[Duration]) -> Value {
    json!({
        "median_ms": quantile(s, 0.5),
        "p90_ms": quantile(s, 0.9),
        "min_ms": quantile(s, 0.0),
        "max_ms": quantile(s, 1.0),
    })
}

/// `a / b`, or 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

fn report(times: &[Times; 6], samples: usize, json_out: bool) -> anyhow::Result<()> {
    let median = |c: Case, ready: bool| {
        let t = &times[c as usize];
        quantile(if ready { &t.ready } else { &t.create }, 0.5)
    };
    let ratios = |ready: bool| {
        json!({
            "cached_over_no_packages": ratio(median(Case::Cached, ready), median(Case::Bare, ready)),
            "cold_over_cached": ratio(median(Case::Cold, ready), median(Case::Cached, ready)),
            "cold_over_host_pip": ratio(median(Case::Cold, ready), median(Case::HostPip, ready)),
            "cached_over_host_pip": ratio(median(Case::Cached, ready), median(Case::HostPip, ready)),
            "pool_packages_over_pool_no_packages": ratio(median(Case::PooledPackages, ready), median(Case::PooledBare, ready)),
            "pool_packages_over_no_packages": ratio(median(Case::PooledPackages, ready), median(Case::Bare, ready)),
        })
    };
    if json_out {
        let mut out = serde_json::Map::new();
        out.insert(
            "measured".into(),
            json!({
                "create": "until the create request returned (the host's pip: until it exited)",
                "ready": format!("create, then until python3 -c 'import {MODULE}' exited in it (no packages: python3 -c pass)"),
                "install": "the install (or unpacking) as the create's packages.duration_ms reported it",
                "warm_pools": POOLS,
            }),
        );
        out.insert("samples".into(), json!(samples));
        for c in Case::ALL {
            let t = &times[c as usize];
            let mut case = json!({
                "create": summary(&t.create),
                "ready": summary(&t.ready),
            });
            if !t.install.is_empty() {
                case["install"] = summary(&t.install);
            }
            out.insert(c.key().into(), case);
        }
        out.insert(
            "ratios".into(),
            json!({"create": ratios(false), "ready": ratios(true)}),
        );
        println!("{}", serde_json::to_string_pretty(&Value::Object(out))?);
        return Ok(());
    }
    println!(
        "packages at create: {{\"pip\": [\"{PACKAGE}\"]}} from a fake index on loopback, through the sandbox's egress proxy;"
    );
    println!(
        "  against a create without packages and the host's own pip (straight to the index, no sandbox)."
    );
    println!(
        "  {samples} samples each, interleaved, after one unrecorded round; each sandbox deleted after; warm pools only for python creates."
    );
    println!("  create: until POST /v1/sandboxes returned (host: until pip exited)");
    println!(
        "  ready:  create, then until `python3 -c 'import {MODULE}'` exited in it (no packages: `python3 -c pass`)"
    );
    for c in Case::ALL {
        let t = &times[c as usize];
        println!(
            "  {:<32} create median {:>8.1} ms  p90 {:>8.1}  min {:>8.1}  max {:>8.1}   ready median {:>8.1} ms  p90 {:>8.1}",
            c.label(),
            quantile(&t.create, 0.5),
            quantile(&t.create, 0.9),
            quantile(&t.create, 0.0),
            quantile(&t.create, 1.0),
            quantile(&t.ready, 0.5),
            quantile(&t.ready, 0.9),
        );
        if !t.install.is_empty() {
            println!(
                "  {:<32} of which the install (the create's packages.duration_ms): median {:>8.1} ms",
                "",
                quantile(&t.install, 0.5)
            );
        }
    }
    for (name, a, b) in [
        ("cached / no packages", Case::Cached, Case::Bare),
        ("cold / cached", Case::Cold, Case::Cached),
        ("cold / host pip", Case::Cold, Case::HostPip),
        ("cached / host pip", Case::Cached, Case::HostPip),
        (
            "pool: with / without",
            Case::PooledPackages,
            Case::PooledBare,
        ),
        ("pool with / no packages", Case::PooledPackages, Case::Bare),
    ] {
        println!(
            "  {name:<22} {:>6.2}x create  {:>6.2}x ready",
            ratio(median(a, false), median(b, false)),
            ratio(median(a, true), median(b, true)),
        );
    }
    println!("  target: a cached create about as fast as a create without packages (ratio near 1)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_gives_the_https_port_and_the_ca() {
        let (port, ca) = ready_line(
            "{\"https\":\"127.0.0.1:4431\",\"http\":\"127.0.0.1:8080\",\"ca\":\"/tmp/x/ca.pem\"}\n",
        )
        .unwrap();
        assert_eq!(port, 4431);
        assert_eq!(ca, PathBuf::from("/tmp/x/ca.pem"));
        assert!(ready_line("listening on 127.0.0.1:1").is_err());
        assert!(ready_line("{\"https\":\"127.0.0.1\",\"ca\":\"/c\"}").is_err());
        assert!(ready_line("{\"https\":\"127.0.0.1:1\"}").is_err());
    }

    #[test]
    fn emptying_the_cache_removes_every_archive_and_needs_no_folder() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache").join("packages");
        empty_cache(&cache).unwrap();
        std::fs::create_dir_all(cache.join("sub")).unwrap();
        std::fs::write(cache.join("0123abcd.tar"), b"tar").unwrap();
        std::fs::write(cache.join(".42.partial"), b"part").unwrap();
        std::fs::write(cache.join("sub").join("f"), b"f").unwrap();
        empty_cache(&cache).unwrap();
        assert!(cache.is_dir());
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
    }

    #[test]
    fn a_ratio_over_nothing_is_zero() {
        assert_eq!(ratio(3.0, 2.0), 1.5);
        assert_eq!(ratio(3.0, 0.0), 0.0);
    }
}
