//! The `sandcell serve` under test: started on a temporary home with an admin key and a warm
//! pool, typed calls to it, stopped with SIGTERM, and the check that it left no sandbox
//! running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sandcell_api::code::{CodeInput, CodeResult};
use sandcell_api::exec::ExecInput;
use sandcell_api::sandboxes::CreateSandbox;
use sandcell_engine::{Engine, SandboxSpec};
use sandcell_protocol::FeatureState;
use serde_json::{Value, json};

use super::requests::python;

/// The warm pool the daemon keeps (`pools.warm`), as `/metrics` names it.
const POOL: &str = "python/small";
/// How long the daemon gets to write `daemon.json`, answer `/healthz` and fill its pool.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the daemon gets to stop on SIGTERM (it stops every sandbox first).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The daemon's default backend: its rows keep their keys without a suffix.
pub(super) const DEFAULT_BACKEND: &str = "process";

/// A backend the daemon can run here (`GET /v1/system`).
pub(super) struct Backend {
    pub(super) kind: String,
    pub(super) supports_pause: bool,
    /// Its snapshots carry more than nothing (`checkpoint_fidelity` is not `none`).
    pub(super) snapshots: bool,
    /// It has a working CRIU (checkpointable sandboxes: process-fidelity snapshots).
    pub(super) criu: bool,
}

/// A `sandcell serve` of this benchmark, on its own temporary home. Dropping it stops it
/// (SIGTERM, then SIGKILL) if [`Daemon::stop`] did not, and removes the home.
pub(in crate::bench) struct Daemon {
    child: Option<Child>,
    pid: u32,
    home: PathBuf,
    url: String,
    /// The admin key, once the daemon wrote it (kept for the clients of a restart).
    key: Option<String>,
    /// `--set` settings given on top of the benchmark's own, again at each restart.
    extra: Vec<String>,
    /// Environment variables the daemon gets on top of this process's, again at each
    /// restart.
    env: Vec<(String, String)>,
    /// The warm pool's size.
    pool: usize,
    /// The daemon's typed client (with the admin key once the daemon wrote it).
    pub(in crate::bench) api: sandcell_client::Client,
}

/// When a restarted daemon came back (see [`Daemon::restart`]).
pub(in crate::bench) struct Restarted {
    /// Just before its process was spawned.
    pub(in crate::bench) spawned: Instant,
    /// When `GET /healthz` first answered 200 (polled every millisecond).
    pub(in crate::bench) up: Instant,
}

impl Daemon {
    /// Starts it with a warm pool of `pool` python sandboxes and waits until it answers and
    /// the pool is full.
    pub(super) async fn start(pool: usize) -> anyhow::Result<Self> {
        Self::start_with(pool, &[]).await
    }

    /// [`Daemon::start`] with `extra` settings (`key=value`, as `--set` takes them) after
    /// the benchmark's own, e.g. the model server agent runs use.
    pub(in crate::bench) async fn start_with(
        pool: usize,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        Self::start_with_env(pool, extra, &[]).await
    }

    /// [`Daemon::start_with`] with `env` added to the daemon's environment, e.g. the
    /// test-only resolver (`SANDCELL_TEST_RESOLVE`) that points a registry's name at a fake
    /// one on loopback.
    pub(in crate::bench) async fn start_with_env(
        pool: usize,
        extra: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        Self::start_in(temp_home()?, pool, extra, env).await
    }

    /// [`Daemon::start_with_env`] on `home`, a folder from [`temp_home`] the caller filled
    /// first (an image store, say); it is removed with the daemon.
    pub(in crate::bench) async fn start_in(
        home: PathBuf,
        pool: usize,
        extra: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let mut d = Self {
            child: None,
            pid: 0,
            home,
            url: String::new(),
            key: None,
            extra: extra.to_vec(),
            env: env.to_vec(),
            pool,
            api: sandcell_client::Client::builder("http://127.0.0.1:1").build()?,
        };
        d.spawn()?;
        d.wait_up(Duration::from_millis(20)).await?;
        let key_path = sandcell_api::discovery::admin_key_path(&d.home);
        let key = std::fs::read_to_string(&key_path)
            .with_context(|| format!("read {}", key_path.display()))?;
        d.api = d.api.with_api_key(key.trim());
        d.key = Some(key.trim().to_string());
        d.wait_pool_full(pool).await?;
        Ok(d)
    }

    /// Spawns `sandcell serve` on the home (its log appended to `daemon.log`).
    fn spawn(&mut self) -> anyhow::Result<()> {
        let log_path = self.home.join("daemon.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let exe = std::env::current_exe().context("find the sandcell binary")?;
        let pools = if self.pool > 0 {
            format!("pools.warm={POOL}={}", self.pool)
        } else {
            "pools.warm=".into()
        };
        let database = format!("database={}", self.home.join("sandcell.db").display());
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
            .arg(&self.home)
            .args(["--listen", "127.0.0.1:0"]);
        for s in sets
            .iter()
            .copied()
            .chain(self.extra.iter().map(String::as_str))
        {
            cmd.args(["--set", s]);
        }
        let child = cmd
            .env_remove("SANDCELL_API_URL")
            .env_remove("SANDCELL_API_KEY")
            .env_remove("SANDCELL_HOME")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start sandcell serve")?;
        self.pid = child.id();
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the spawned daemon has written its `daemon.json` and answers
    /// `/healthz`, checking every `every`; points the client at it and returns when
    /// `/healthz` first answered.
    async fn wait_up(&mut self, every: Duration) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + START_TIMEOUT;
        let info_path = sandcell_api::discovery::daemon_info_path(&self.home);
        self.url = loop {
            self.check_running()?;
            let info: Option<sandcell_api::discovery::DaemonInfo> =
                std::fs::read_to_string(&info_path)
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok());
            if let Some(info) = info.filter(|i| i.pid == self.pid) {
                break info.url;
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon wrote no {} in {START_TIMEOUT:?}\n{}",
                    info_path.display(),
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(every).await;
        };
        let api = sandcell_client::Client::builder(self.url.clone())
            .timeout(Duration::from_secs(300))
            .build()?;
        self.api = match &self.key {
            Some(key) => api.with_api_key(key.as_str()),
            None => api,
        };
        loop {
            self.check_running()?;
            if self.healthz().await.is_ok() {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("the daemon at {} never answered /healthz", self.url);
            }
            tokio::time::sleep(every).await;
        }
    }

    /// A client of the daemon with the admin key that shares no connection with
    /// [`Daemon::api`]: its first request opens a new one.
    pub(in crate::bench) fn new_client(&self) -> anyhow::Result<sandcell_client::Client> {
        let api = sandcell_client::Client::builder(self.url.clone())
            .timeout(Duration::from_secs(300))
            .build()?;
        Ok(match &self.key {
            Some(key) => api.with_api_key(key.as_str()),
            None => api,
        })
    }

    /// SIGKILL, as a crash would: the daemon stops at once, leaving its records as they
    /// were and its sandboxes running.
    pub(in crate::bench) fn kill9(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("the daemon is not running");
        };
        child.kill().context("kill -9 the daemon")?;
        child.wait().context("wait for the killed daemon")?;
        Ok(())
    }

    /// Starts it again on the same home with the same settings, after [`Daemon::kill9`],
    /// and waits until it answers (its pool is not waited for).
    pub(in crate::bench) async fn restart(&mut self) -> anyhow::Result<Restarted> {
        if self.child.is_some() {
            bail!("the daemon is still running: kill it first");
        }
        let spawned = Instant::now();
        self.spawn()?;
        let up = self.wait_up(Duration::from_millis(1)).await?;
        Ok(Restarted { spawned, up })
    }

    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// Its home (what it keeps, e.g. `cache/`, is under it).
    pub(in crate::bench) fn home(&self) -> &Path {
        &self.home
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
    pub(in crate::bench) fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(self.home.join("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(n)..].join("\n");
        format!("the daemon's log ends with:\n{tail}")
    }

    /// `GET /healthz`, which must answer 200.
    pub(super) async fn healthz(&self) -> anyhow::Result<()> {
        let status = self.api.health().await.context("GET /healthz")?;
        if !status.is_success() {
            bail!("GET /healthz answered {status}");
        }
        Ok(())
    }

    /// Creates a sandbox; its id.
    pub(in crate::bench) async fn create(&self, req: &CreateSandbox) -> anyhow::Result<String> {
        Ok(self.api.create_sandbox(req).await?.id)
    }

    /// The backends `GET /v1/system` reports available: the default first, then the
    /// others in its order.
    pub(super) async fn backends(&self) -> anyhow::Result<Vec<Backend>> {
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

    pub(in crate::bench) async fn delete(&self, id: &str) -> anyhow::Result<()> {
        Ok(self.api.delete_sandbox(id).await?)
    }

    /// An exec in sandbox `id` that must succeed with `ok`.
    pub(super) async fn exec_ok(&self, id: &str, req: &ExecInput) -> anyhow::Result<()> {
        let v = self.api.exec(id, req).await?;
        if !v.ok {
            bail!("exec in {id}: the command failed: {}", v.result.message);
        }
        Ok(())
    }

    /// Code in sandbox `id` that must end with status `ok`; the answer.
    pub(in crate::bench) async fn code_ok(
        &self,
        id: &str,
        req: &CodeInput,
    ) -> anyhow::Result<CodeResult> {
        let v = self.api.run_code(id, req).await?;
        if v.done.status != "ok" {
            bail!("code in {id}: the code did not run: {}", json!(v.done));
        }
        Ok(v)
    }

    /// Runs `1+1` in sandbox `id` and checks the result.
    pub(in crate::bench) async fn first_result(&self, id: &str) -> anyhow::Result<()> {
        let v = self.code_ok(id, &python("1+1")).await?;
        let result = v.result.unwrap_or(Value::Null);
        if result["text/plain"] != "2" {
            bail!("1+1 gave {result}");
        }
        Ok(())
    }

    /// One sample of `/metrics` (0 when the series is absent).
    pub(in crate::bench) async fn metric(&self, series: &str) -> anyhow::Result<f64> {
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
    pub(super) async fn cpu_seconds(&self, ids: &[String]) -> anyhow::Result<Option<f64>> {
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
    pub(super) async fn wait_pool_full(&self, pool: usize) -> anyhow::Result<()> {
        self.wait_named_pool_full(POOL, pool).await
    }

    /// Waits until warm pool `name` holds `size` ready sandboxes.
    pub(in crate::bench) async fn wait_named_pool_full(
        &self,
        name: &str,
        size: usize,
    ) -> anyhow::Result<()> {
        let pool = size;
        if pool == 0 {
            return Ok(());
        }
        let series = format!("sandcell_pool_ready{{pool=\"{name}\"}}");
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
    pub(in crate::bench) async fn stop(&mut self, engine: &Engine) -> anyhow::Result<()> {
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
pub(in crate::bench) fn temp_home() -> anyhow::Result<PathBuf> {
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
pub(in crate::bench) fn terminate(pid: u32) -> anyhow::Result<()> {
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
