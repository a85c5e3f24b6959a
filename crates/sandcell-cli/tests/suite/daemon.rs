//! The real daemon (`sandcell serve`) over real HTTP on loopback: a helper that starts, kills
//! and restarts it on its own home, and the tests of sandboxes, exec and code. Files, the API
//! around them, lifecycle and the CLI as a client are in the `daemon_*` modules.

use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::blocking::{Client, RequestBuilder};
use sandcell_api::code::{CodeInput, CodeResult};
use sandcell_api::exec::{ExecInput, ExecOutput};
use sandcell_api::keys::CreateKey;
use sandcell_api::network::NetworkPolicy as Network;
use sandcell_api::sandboxes::{CreateSandbox, SandboxInfo};
use sandcell_client::SseParser;
use serde_json::{Value, json};

use super::common::BIN;

/// How long a daemon gets to write `daemon.json` and answer `/healthz`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A `sandcell serve` on its own temporary home, listening on a free loopback port.
///
/// It starts with `shutdown.sandboxes=stop` unless told otherwise; on drop it gets SIGTERM
/// (and is waited for), then whatever sandbox of its home is still alive is killed, so no
/// sandbox process outlives a test.
///
/// Two ways to talk to it: the helpers about behaviour (`create`, `exec`, `code`, `sandbox`,
/// `key_for`) go through the typed client (`sandcell-client`, as the CLI does); the raw
/// `call`/`get`/`post`/`delete`/`req` are for the tests of the HTTP wire itself (statuses,
/// headers, error bodies, malformed input), which the typed client cannot send.
pub struct Daemon {
    child: Option<Child>,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// The admin key the first start wrote.
    pub key: String,
    http: Client,
    /// The typed client with the admin key (rebuilt on each start: the port changes).
    api: Option<sandcell_client::Client>,
    /// Drives the typed client's calls for the blocking tests.
    rt: tokio::runtime::Runtime,
    home: tempfile::TempDir,
    /// Environment variables every start of it gets.
    env: Vec<(String, String)>,
}

/// An HTTP answer: status, JSON body (a string for a body that is not JSON), headers.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl Resp {
    /// The error code of a `{code, message}` body, checking that shape.
    pub fn error_code(&self) -> &str {
        assert!(
            self.body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "not a structured error (status {}): {}",
            self.status,
            self.body
        );
        self.body["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no code in {}", self.body))
    }

    /// Asserts the status and the error code.
    pub fn expect_error(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.error_code()),
            (status, code),
            "{}",
            self.body
        );
    }
}

/// One server-sent event: its name, its data (as JSON) and when it arrived.
#[derive(Debug, Clone)]
pub struct Sse {
    pub name: String,
    pub data: Value,
    pub at: Duration,
}

fn http_client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

impl Daemon {
    /// Starts a daemon with these `--set KEY=VALUE` settings.
    pub fn start(sets: &[&str]) -> Self {
        Self::start_with_env(sets, &[])
    }

    /// As [`Self::start`], with these environment variables (on every start).
    pub fn start_with_env(sets: &[&str], env: &[(&str, &str)]) -> Self {
        let home = tempfile::Builder::new()
            .prefix("sandcell-daemon-")
            .tempdir()
            .unwrap();
        let mut d = Self {
            child: None,
            url: String::new(),
            key: String::new(),
            http: http_client(),
            api: None,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            home,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        d.spawn(sets);
        d
    }

    /// The typed client, with the admin key.
    pub fn client(&self) -> sandcell_client::Client {
        self.api.clone().expect("the daemon is not running")
    }

    /// The typed client with `key`.
    pub fn client_as(&self, key: &str) -> sandcell_client::Client {
        self.client().with_api_key(key)
    }

    /// Runs a typed call (or any future) to its end on this daemon's runtime.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        self.rt.block_on(fut)
    }

    /// Its home.
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home().join("daemon.log")).unwrap_or_default()
    }

    fn spawn(&mut self, sets: &[&str]) {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--home".into(),
            self.home().display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        let mut sets: Vec<&str> = sets.to_vec();
        if !sets.iter().any(|s| s.starts_with("shutdown.sandboxes=")) {
            sets.push("shutdown.sandboxes=stop");
        }
        for s in sets {
            args.push("--set".into());
            args.push(s.into());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.home().join("daemon.log"))
            .unwrap();
        let mut cmd = Command::new(BIN);
        // The CRIU scripts/tools.sh builds, for checkpointable sandboxes.
        let criu = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/criu/criu");
        if criu.exists() {
            cmd.env("SANDCELL_CRIU", criu);
        }
        let mut child = cmd
            .args(&args)
            .env_remove("SANDCELL_API_URL")
            .env_remove("SANDCELL_API_KEY")
            .env_remove("SANDCELL_HOME")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = child.id();
        let info_path = self.home().join("daemon.json");
        let deadline = Instant::now() + START_TIMEOUT;
        let url = loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the daemon exited with {status}:\n{}", self.log());
            }
            let info: Option<Value> = std::fs::read_to_string(&info_path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok());
            // A daemon killed with -9 leaves its daemon.json: wait for this one's.
            if let Some(info) = info.filter(|i| i["pid"].as_u64() == Some(u64::from(pid))) {
                break info["url"].as_str().unwrap().to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no daemon.json after {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // Health needs no key.
        let api = sandcell_client::Client::builder(&url)
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap();
        loop {
            let ok = self
                .rt
                .block_on(api.health())
                .is_ok_and(|status| status == 200);
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "/healthz never answered 200");
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.key.is_empty() {
            // The first start wrote it.
            self.key = std::fs::read_to_string(self.home().join("admin.key"))
                .unwrap()
                .trim()
                .to_string();
            assert!(self.key.starts_with("sc_"), "admin key {:?}", self.key);
        }
        let api = api.with_api_key(&self.key);
        self.url = url;
        self.api = Some(api);
        self.child = Some(child);
    }

    /// `kill -9`: no cleanup of any kind (daemon.json stays, sandboxes keep running).
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("the daemon is not running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, and waits for a clean exit.
    pub fn terminate(&mut self) {
        let mut child = self.child.take().expect("the daemon is not running");
        signal(child.id(), libc::SIGTERM);
        let status = wait_child(&mut child, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("the daemon did not stop on SIGTERM:\n{}", self.log()));
        assert!(status.success(), "{status}:\n{}", self.log());
    }

    /// Starts it again on the same home, with these settings.
    pub fn restart(&mut self, sets: &[&str]) {
        assert!(self.child.is_none(), "stop it first");
        self.spawn(sets);
    }

    /// The running daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the daemon is not running").id()
    }

    /// A request with the admin key.
    pub fn req(&self, method: Method, path: &str) -> RequestBuilder {
        self.req_as(Some(&self.key), method, path)
    }

    /// A request with `key` (or none).
    pub fn req_as(&self, key: Option<&str>, method: Method, path: &str) -> RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.url));
        match key {
            Some(k) => r.header("X-API-Key", k),
            None => r,
        }
    }

    /// Sends a request with the admin key and a JSON body (if any).
    pub fn call(&self, method: Method, path: &str, body: Option<Value>) -> Resp {
        self.call_as(Some(&self.key), method, path, body)
    }

    /// Sends a request with `key` and a JSON body (if any).
    pub fn call_as(
        &self,
        key: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Resp {
        let mut r = self.req_as(key, method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        send(r)
    }

    pub fn get(&self, path: &str) -> Resp {
        self.call(Method::GET, path, None)
    }

    pub fn post(&self, path: &str, body: Value) -> Resp {
        self.call(Method::POST, path, Some(body))
    }

    pub fn delete(&self, path: &str) -> Resp {
        self.call(Method::DELETE, path, None)
    }

    /// Creates a sandbox (admin's) and returns its record; `body` is read as the typed
    /// request, so a field the API does not have fails here.
    pub fn create(&self, body: Value) -> SandboxInfo {
        self.create_with(&self.client(), body)
    }

    /// Creates a sandbox with `key` (its owner's) and returns its record.
    pub fn create_as(&self, key: &str, body: Value) -> SandboxInfo {
        self.create_with(&self.client_as(key), body)
    }

    fn create_with(&self, client: &sandcell_client::Client, body: Value) -> SandboxInfo {
        let req: CreateSandbox = serde_json::from_value(body.clone())
            .unwrap_or_else(|e| panic!("not a sandbox request: {e}: {body}"));
        self.block_on(client.create_sandbox(&req))
            .unwrap_or_else(|e| panic!("create {body}: {e}\n{}", self.log()))
    }

    /// Creates a sandbox and returns its id.
    pub fn create_id(&self, body: Value) -> String {
        self.create(body).id
    }

    /// Runs `sh -c cmd` and returns the collected output.
    pub fn exec(&self, id: &str, cmd: &str) -> ExecOutput {
        let req = ExecInput {
            cmd: Some(cmd.to_string()),
            ..ExecInput::default()
        };
        self.block_on(self.client().exec(id, &req))
            .unwrap_or_else(|e| panic!("exec {cmd:?} in {id}: {e}"))
    }

    /// Runs Python code in the default context and returns the collected result.
    pub fn code(&self, id: &str, code: &str) -> CodeResult {
        let req = CodeInput {
            code: sandcell_api::Code::new(code).expect("a small snippet"),
            ..CodeInput::default()
        };
        self.block_on(self.client().run_code(id, &req))
            .unwrap_or_else(|e| panic!("code {code:?} in {id}: {e}"))
    }

    /// The sandbox's record.
    pub fn sandbox(&self, id: &str) -> SandboxInfo {
        self.block_on(self.client().sandbox(id))
            .unwrap_or_else(|e| panic!("get {id}: {e}"))
    }

    /// Posts `body` to a streaming route and collects its events.
    pub fn sse(&self, path: &str, body: Value) -> Vec<Sse> {
        let start = Instant::now();
        let resp = self.req(Method::POST, path).json(&body).send().unwrap();
        assert_eq!(resp.status(), 200);
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ctype.starts_with("text/event-stream"), "{ctype}");
        read_sse(resp, start)
    }

    /// A key for `owner` (not an admin key), made by the admin over the API.
    pub fn key_for(&self, owner: &str) -> (String, String) {
        let req = CreateKey {
            name: "t".into(),
            owner: Some(owner.into()),
            admin: false,
        };
        let new = self
            .block_on(self.client().create_key(&req))
            .unwrap_or_else(|e| panic!("create a key for {owner}: {e}"));
        assert_eq!(new.info.owner, owner);
        assert!(!new.info.admin);
        (new.key, new.info.id)
    }

    /// What the store says about sandbox `id`'s processes (read from the SQLite file the
    /// way the next start reads it).
    pub fn runtime_of(&self, id: &str) -> Runtime {
        let store = sandcell_store::Store::open(&self.home().join("sandcell.db")).unwrap();
        let rec = store.get_sandbox(id).unwrap().expect("no such record");
        Runtime::from_json(&rec.runtime).expect("no runtime record")
    }

    /// Kills what is left of every sandbox of this home (a safety net: a daemon stopped with
    /// `shutdown.sandboxes=stop` leaves nothing). Returns the ids it found alive.
    pub fn kill_leftovers(&self) -> Vec<String> {
        let Ok(store) = sandcell_store::Store::open(&self.home().join("sandcell.db")) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut cursor = None;
        loop {
            let Ok(page) = store.list_sandboxes(&sandcell_store::SandboxQuery {
                limit: 500,
                cursor: cursor.clone(),
                ..Default::default()
            }) else {
                break;
            };
            for rec in &page.items {
                if let Some(rt) = Runtime::from_json(&rec.runtime)
                    && rt.alive()
                {
                    rt.kill();
                    found.push(rec.id.clone());
                }
                // A gVisor sandbox: its container, by name.
                if let Some(container) = rec.runtime["container"].as_str() {
                    let gone = std::process::Command::new("runsc")
                        .args(["--root", "/run/sandcell/gvisor/state", "delete", "-force"])
                        .arg(container)
                        .stdin(std::process::Stdio::null())
                        .output()
                        .is_ok_and(|o| o.status.success());
                    if gone && matches!(rec.state.as_str(), "running" | "paused" | "creating") {
                        found.push(rec.id.clone());
                    }
                }
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        found
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGTERM);
            if wait_child(&mut child, Duration::from_secs(30)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let left = self.kill_leftovers();
        if !left.is_empty() {
            eprintln!("sandboxes left running by the daemon, killed: {left:?}");
        }
    }
}

/// What the tests read of a code result.
pub trait CodeResultExt {
    /// The `text/plain` form of the last expression's value ("" without one).
    fn plain(&self) -> &str;
    /// The name of the exception it raised ("" without one).
    fn raised(&self) -> &str;
}

impl CodeResultExt for CodeResult {
    fn plain(&self) -> &str {
        self.result
            .as_ref()
            .and_then(|r| r["text/plain"].as_str())
            .unwrap_or_default()
    }

    fn raised(&self) -> &str {
        self.error.as_ref().map_or("", |e| e.name.as_str())
    }
}

/// Where a sandbox runs on the host, from its runtime record.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Its PID 1.
    pub host_pid: i32,
    /// PID 1's start time (tells it from a later process with the same pid).
    pub start_time: Option<u64>,
    /// Where its agent listens.
    pub agent_socket: Option<PathBuf>,
    /// Its cgroup directories.
    pub cgroups: Vec<PathBuf>,
}

impl Runtime {
    fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            host_pid: i32::try_from(v["host_pid"].as_i64()?).ok()?,
            start_time: v["start_time"].as_u64(),
            agent_socket: v["agent_socket"].as_str().map(PathBuf::from),
            cgroups: v["cgroup"]["paths"]
                .as_array()
                .map(|a| a.iter().filter_map(|p| p.as_str()).map(PathBuf::from))
                .into_iter()
                .flatten()
                .collect(),
        })
    }

    /// Whether its PID 1 still runs.
    pub fn alive(&self) -> bool {
        let now = start_time(self.host_pid);
        now.is_some() && (self.start_time.is_none() || now == self.start_time)
    }

    /// Kills it (PID 1 of its pid namespace: the kernel kills the rest) and removes its
    /// cgroups and socket.
    pub fn kill(&self) {
        signal(u32::try_from(self.host_pid).unwrap(), libc::SIGKILL);
        let _ = wait_for(Duration::from_secs(10), || (!self.alive()).then_some(()));
        for cg in &self.cgroups {
            for _ in 0..50 {
                if std::fs::remove_dir(cg).is_ok() || !cg.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(s) = &self.agent_socket {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// Field 22 of /proc/<pid>/stat: the process's start time, if it exists (and is no zombie).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// The parent pid of `pid`.
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// Pids of the processes whose cgroup is sandbox `id`'s (`…/sandcell/<id>`), with their
/// command lines.
pub fn processes_in_cgroup_of(id: &str) -> Vec<(i32, String)> {
    let needle = format!("/sandcell/{id}");
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cg.lines().any(|l| l.ends_with(&needle)) && start_time(pid).is_some() {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            out.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    out
}

fn signal(pid: u32, sig: i32) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    let sig = rustix::process::Signal::from_named_raw(sig).unwrap();
    let _ = rustix::process::kill_process(pid, sig);
}

fn wait_child(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    wait_for(timeout, || child.try_wait().unwrap())
}

/// Polls `f` every 20 ms until it gives a value or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a request and reads the answer.
pub fn send(r: RequestBuilder) -> Resp {
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Resp {
        status,
        body,
        headers,
    }
}

/// Reads server-sent events through the client's parser until the stream ends, each
/// stamped with when its last chunk arrived.
pub fn read_sse(mut resp: impl Read, start: Instant) -> Vec<Sse> {
    let mut parser = SseParser::new();
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = resp.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        let at = start.elapsed();
        raw.extend(parser.push(&buf[..n]).into_iter().map(|e| (e, at)));
    }
    let at = start.elapsed();
    raw.extend(parser.finish().map(|e| (e, at)));
    raw.into_iter()
        .map(|(e, at)| Sse {
            data: serde_json::from_str(&e.data).unwrap_or(Value::String(e.data)),
            name: e.event,
            at,
        })
        .collect()
}

/// Milliseconds since the epoch of an RFC 3339 UTC time as the API writes it
/// (`2026-11-24T01:30:00.000Z`).
pub fn epoch_ms(t: &str) -> i64 {
    let num = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
    assert!(t.len() == 24 && t.ends_with('Z'), "{t}");
    let (y, m, d) = (num(0..4), num(5..7), num(8..10));
    let (hh, mm, ss, ms) = (num(11..13), num(14..16), num(17..19), num(20..23));
    // Days from civil (Howard Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000) + ms
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Ids of the items of a list answer.
pub fn ids(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items in {list}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn daemon_sandboxes_create_get_list_filter_paginate_delete_timeout() {
    let d = Daemon::start(&[]);
    assert_eq!(epoch_ms("2026-11-24T01:30:00.000Z"), 1_795_483_800_000);

    // Create with every field, and see each one in the record and in effect.
    let before = now_ms();
    let sb = d.create(json!({
        "template": "python",
        "size": "nano",
        "limits": {"memory_mb": 200, "exec_timeout_secs": 30},
        "env": {"GREETING": "hello from env"},
        "labels": {"team": "ml", "tier": "a"},
        "metadata": {"run": "1"},
        "timeout_secs": 600,
        "idle_timeout_secs": 300,
        "network": "off",
    }));
    let a = sb.id.as_str().to_string();
    assert!(a.starts_with("sb-"), "{sb:?}");
    assert_eq!(sb.state, "running");
    assert_eq!(sb.template, "python");
    assert_eq!(sb.backend, "process");
    assert_eq!(sb.network, Network::Off);
    assert!(!sb.ephemeral);
    assert_eq!(json!(sb.labels), json!({"team": "ml", "tier": "a"}));
    assert_eq!(json!(sb.metadata), json!({"run": "1"}));
    assert_eq!(sb.idle_timeout_secs, Some(300));
    // nano's pids and disk, the explicit memory and exec timeout.
    assert_eq!(sb.limits.memory_mb, Some(200));
    assert_eq!(sb.limits.pids, Some(64));
    assert_eq!(sb.limits.disk_mb, 256);
    assert_eq!(sb.limits.cpus, Some(0.5));
    assert_eq!(sb.limits.exec_timeout_secs, Some(30));
    let created = epoch_ms(sb.created_at.as_str());
    assert!(
        (before - 1000..=now_ms() + 1000).contains(&created),
        "{sb:?}"
    );
    let expires = epoch_ms(sb.expires_at.as_deref().unwrap());
    assert_eq!(expires - created, 600_000, "{sb:?}");
    // The env reaches commands; the python template started its kernel during creation.
    let out = d.exec(&a, "echo \"$GREETING\"");
    assert_eq!(out.stdout, "hello from env\n");
    // The python template starts its kernel with the sandbox (in the background: the
    // create answers first), with no code run.
    let warm =
        wait_for(Duration::from_secs(10), || {
            let ctx = d.get(&format!("/v1/sandboxes/{a}/contexts"));
            assert_eq!(ctx.status, 200, "{}", ctx.body);
            ctx.body.as_array().unwrap().iter().find_map(|c| {
                (c["id"] == "python" && c["pid"].as_i64().is_some()).then(|| c.clone())
            })
        })
        .expect("the python template's kernel never started");
    assert_eq!(warm["execution_count"], 0, "{warm}");
    let plain = d.create_id(json!({"ephemeral": true}));
    let ctx = d.get(&format!("/v1/sandboxes/{plain}/contexts"));
    assert!(
        ctx.body
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["pid"].is_null()),
        "a default sandbox runs a kernel before any code: {}",
        ctx.body
    );
    assert_eq!(d.delete(&format!("/v1/sandboxes/{plain}")).status, 204);
    // Memory and pids limits are the kernel's: the cgroup holds what the record says.
    let rt = d.runtime_of(&a);
    if let Some(mem) = rt
        .cgroups
        .iter()
        .find(|p| p.to_string_lossy().contains("memory"))
    {
        let limit = std::fs::read_to_string(mem.join("memory.limit_in_bytes"))
            .or_else(|_| std::fs::read_to_string(mem.join("memory.max")))
            .unwrap();
        assert_eq!(limit.trim(), (200u64 << 20).to_string());
    }

    // GET shows the same record.
    let got = d.sandbox(&a);
    assert_eq!(got.id, a.as_str());
    assert_eq!(got.labels, sb.labels);
    assert_eq!(got.expires_at, sb.expires_at);

    // Three more, for the filters and pages.
    let b = d.create_id(json!({"labels": {"team": "ml"}, "metadata": {"run": "2"}}));
    let c = d.create_id(json!({"labels": {"team": "ml"}, "metadata": {"run": "3"}}));
    let w = d.create_id(json!({"labels": {"team": "web"}, "metadata": {"run": "2"}}));
    let defaults = d.sandbox(&b);
    assert_eq!(defaults.template, "default");
    assert_eq!(defaults.limits.memory_mb, Some(512));
    assert_eq!(defaults.network, Network::Loopback);

    let list = |q: &str| {
        let r = d.get(&format!("/v1/sandboxes{q}"));
        assert_eq!(r.status, 200, "{q}: {}", r.body);
        r.body
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let all4 = sorted(vec![a.clone(), b.clone(), c.clone(), w.clone()]);
    assert_eq!(sorted(ids(&list(""))), all4);
    assert_eq!(
        sorted(ids(&list("?label=team:ml"))),
        sorted(vec![a.clone(), b.clone(), c.clone()])
    );
    assert_eq!(ids(&list("?label=team:ml&label=tier:a")), [a.as_str()]);
    assert_eq!(
        sorted(ids(&list("?metadata=run:2"))),
        sorted(vec![b.clone(), w.clone()])
    );
    assert_eq!(ids(&list("?metadata=run:2&label=team:web")), [w.as_str()]);
    assert!(ids(&list("?label=team:nobody")).is_empty());
    // A filter value with SQL in it is only a value.
    assert!(ids(&list("?label=team:ml'%20OR%20'1'='1")).is_empty());

    // Pages of one, following the cursor, give each sandbox exactly once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let q = match &cursor {
            Some(c) => format!("?limit=1&cursor={c}"),
            None => "?limit=1".into(),
        };
        let page = list(&q);
        let items = ids(&page);
        assert!(items.len() <= 1, "{page}");
        seen.extend(items);
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(sorted(seen.clone()), all4, "pages: {seen:?}");
    // Two at a time, with a filter.
    let page = list("?limit=2&label=team:ml");
    assert_eq!(ids(&page).len(), 2);
    let next = page["next_cursor"].as_str().unwrap();
    let rest = list(&format!("?limit=2&label=team:ml&cursor={next}"));
    assert_eq!(ids(&rest).len(), 1, "{rest}");
    assert!(rest["next_cursor"].is_null(), "{rest}");

    // Set the timeout: the lifetime now ends 120 s from now.
    let t0 = now_ms();
    let r = d.post(
        &format!("/v1/sandboxes/{a}/timeout"),
        json!({"timeout_secs": 120}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let exp = epoch_ms(r.body["expires_at"].as_str().unwrap());
    assert!(
        (t0 + 119_000..=now_ms() + 121_000).contains(&exp),
        "{}",
        r.body
    );
    assert_eq!(
        d.sandbox(&a).expires_at.as_deref(),
        r.body["expires_at"].as_str()
    );

    // Delete: the record stays, stopped, with a reason; it leaves the default list.
    let r = d.delete(&format!("/v1/sandboxes/{b}"));
    assert_eq!(r.status, 204, "{}", r.body);
    let gone = d.sandbox(&b);
    assert_eq!(gone.state, "stopped");
    assert!(
        gone.reason.as_deref().is_some_and(|r| !r.is_empty()),
        "{gone:?}"
    );
    assert!(!ids(&list("")).contains(&b));
    assert_eq!(ids(&list("?state=stopped")), [b.as_str()]);
    assert_eq!(sorted(ids(&list("?state=all"))), all4);
    assert_eq!(
        sorted(ids(&list("?state=running,stopped&label=team:ml"))),
        sorted(vec![a.clone(), b.clone(), c.clone()])
    );
    // A stopped sandbox runs nothing and takes no new timeout.
    d.post(&format!("/v1/sandboxes/{b}/exec"), json!({"cmd": "true"}))
        .expect_error(409, "sandbox_gone");
    d.post(
        &format!("/v1/sandboxes/{b}/timeout"),
        json!({"timeout_secs": 5}),
    )
    .expect_error(409, "sandbox_gone");
    // Its processes are gone.
    let rt_b = d.runtime_of(&b);
    assert!(
        wait_for(Duration::from_secs(10), || (!rt_b.alive()).then_some(())).is_some(),
        "{b}'s PID 1 still runs after delete"
    );

    // An ephemeral sandbox leaves no record.
    let e = d.create(json!({"ephemeral": true}));
    assert!(e.ephemeral);
    let e = e.id.as_str().to_string();
    assert_eq!(d.delete(&format!("/v1/sandboxes/{e}")).status, 204);
    d.get(&format!("/v1/sandboxes/{e}"))
        .expect_error(404, "not_found");
    assert!(!ids(&list("?state=all")).contains(&e));
    d.delete(&format!("/v1/sandboxes/{e}"))
        .expect_error(404, "not_found");
    d.get("/v1/sandboxes/sb-000000000000")
        .expect_error(404, "not_found");
}

#[test]
fn daemon_exec_collected_with_stdin_and_streamed() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    let path = format!("/v1/sandboxes/{id}/exec");

    // Collected: both streams, the exit code and how it ended.
    let r = d.post(
        &path,
        json!({"cmd": "echo out; echo err >&2; exit 3", "env": {"X": "1"}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["stdout"], "out\n");
    assert_eq!(r.body["stderr"], "err\n");
    assert_eq!(r.body["exit_code"], 3);
    assert_eq!(r.body["ok"], false);
    assert_eq!(r.body["cause"], "exited");
    assert!(r.body["duration_ms"].as_f64().is_some(), "{}", r.body);

    // argv, env, cwd.
    let r = d.post(
        &path,
        json!({"argv": ["sh", "-c", "echo $X $(pwd)"], "env": {"X": "42"}, "cwd": "/tmp"}),
    );
    assert_eq!(r.body["stdout"], "42 /tmp\n", "{}", r.body);
    assert_eq!(
        (r.body["exit_code"].clone(), r.body["ok"].clone()),
        (json!(0), json!(true))
    );

    // A signal and a timeout are told apart from an exit.
    let r = d.post(&path, json!({"cmd": "kill -9 $$"}));
    assert_eq!(r.body["cause"], "signaled", "{}", r.body);
    assert_eq!(r.body["signal"], 9);
    assert!(r.body["exit_code"].is_null());
    let r = d.post(&path, json!({"cmd": "sleep 30", "timeout_secs": 0.5}));
    assert_eq!(r.body["cause"], "timeout", "{}", r.body);
    assert_eq!(r.body["timed_out"], true);
    assert!(r.body["duration_ms"].as_f64().unwrap() < 10_000.0);

    // Stdin reaches the command, and is closed after.
    let r = d.post(
        &path,
        json!({"cmd": "tr a-z A-Z; echo; wc -c < /dev/stdin", "stdin": "hello stdin"}),
    );
    assert_eq!(r.body["stdout"], "HELLO STDIN\n0\n", "{}", r.body);
    let r = d.post(&path, json!({"argv": ["cat"], "stdin": "line1\nline2\n"}));
    assert_eq!(r.body["stdout"], "line1\nline2\n", "{}", r.body);

    // Streamed: stdout and stderr as they come, in order, then exit.
    let events = d.sse(
        &format!("{path}/stream"),
        json!({"cmd": "echo a; sleep 0.3; echo b >&2; sleep 0.3; echo c; sleep 0.6; exit 4"}),
    );
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["stdout", "stderr", "stdout", "exit"], "{events:?}");
    assert_eq!(events[0].data["data"], "a\n");
    assert_eq!(events[1].data["data"], "b\n");
    assert_eq!(events[2].data["data"], "c\n");
    let exit = &events[3].data;
    assert_eq!(exit["exit_code"], 4, "{exit}");
    assert_eq!(exit["ok"], false);
    assert_eq!(exit["cause"], "exited");
    // Really streamed: "a" arrived long before the end.
    assert!(
        events[3].at - events[0].at >= Duration::from_millis(900),
        "{events:?}"
    );
    // With stdin, streamed too.
    let events = d.sse(
        &format!("{path}/stream"),
        json!({"cmd": "cat; echo done >&2", "stdin": "piped"}),
    );
    let out: String = events
        .iter()
        .filter(|e| e.name == "stdout")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();
    assert_eq!(out, "piped");
    assert_eq!(events.last().unwrap().name, "exit");
    assert_eq!(events.last().unwrap().data["exit_code"], 0);
    // A program that cannot start is an error before the stream starts.
    let r = d.post(&path, json!({"argv": ["/no/such/program"]}));
    assert!((400..500).contains(&r.status), "{}", r.body);
    r.error_code();
}

#[test]
fn daemon_code_state_streams_contexts_variables_interrupt_restart() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"template": "python"}));
    let code_path = format!("/v1/sandboxes/{id}/code");

    // Collected: stdout, the last expression's value; state persists between calls.
    let r = d.code(&id, "x = 41\nprint('hi')\nx + 1");
    assert_eq!(r.stdout, "hi\n", "{r:?}");
    assert_eq!(r.plain(), "42");
    assert_eq!(r.done.status, "ok");
    assert_eq!(r.done.context, "python");
    assert!(r.error.is_none());
    let r = d.code(&id, "x += 1\nx");
    assert_eq!(r.plain(), "42", "{r:?}");
    let r = d.code(&id, "1/0");
    assert_eq!(r.done.status, "error");
    assert_eq!(r.raised(), "ZeroDivisionError", "{r:?}");
    assert!(
        r.error.as_ref().is_some_and(|e| !e.traceback.is_empty()),
        "{r:?}"
    );

    // Streamed: stdout, result, done in order; an error event for an exception.
    let events = d.sse(
        &format!("{code_path}/stream"),
        json!({"code": "import time\nprint('one', flush=True)\ntime.sleep(0.5)\nprint('two')\nx * 10"}),
    );
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["stdout", "stdout", "result", "done"], "{events:?}");
    assert_eq!(events[0].data["text"], "one\n");
    assert_eq!(events[1].data["text"], "two\n");
    assert_eq!(events[2].data["data"]["text/plain"], "420");
    assert_eq!(events[3].data["status"], "ok");
    assert!(
        events[1].at - events[0].at >= Duration::from_millis(300),
        "{events:?}"
    );
    let events = d.sse(
        &format!("{code_path}/stream"),
        json!({"code": "print('before')\nraise ValueError('bad value')"}),
    );
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["stdout", "error", "done"], "{events:?}");
    assert_eq!(events[1].data["name"], "ValueError");
    assert_eq!(events[1].data["value"], "bad value");
    assert_eq!(events[2].data["status"], "error");

    // Contexts: a new one has its own state.
    let r = d.post(
        &format!("/v1/sandboxes/{id}/contexts"),
        json!({"language": "python"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let ctx = r.body["id"].as_str().unwrap().to_string();
    assert_ne!(ctx, "python");
    let r = d.post(&code_path, json!({"code": "x", "context": ctx}));
    assert_eq!(r.body["error"]["name"], "NameError", "{}", r.body);
    let r = d.post(&code_path, json!({"code": "y = 'mine'", "context": ctx}));
    assert_eq!(r.body["done"]["status"], "ok");
    assert_eq!(r.body["done"]["context"], ctx.as_str());
    assert_eq!(d.code(&id, "x").plain(), "42");
    let list = d.get(&format!("/v1/sandboxes/{id}/contexts"));
    let listed: Vec<&str> = list
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(
        listed.contains(&"python") && listed.contains(&ctx.as_str()),
        "{listed:?}"
    );
    assert_eq!(
        d.delete(&format!("/v1/sandboxes/{id}/contexts/{ctx}"))
            .status,
        204
    );
    let list = d.get(&format!("/v1/sandboxes/{id}/contexts"));
    assert!(
        !list
            .body
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == ctx.as_str()),
        "{}",
        list.body
    );
    let r = d.post(&code_path, json!({"code": "y", "context": ctx}));
    assert!((400..500).contains(&r.status), "{}", r.body);
    r.error_code();

    // Variables: set from JSON, read back (selected or all), used by code, cleared.
    let vars = format!("/v1/sandboxes/{id}/contexts/python/variables");
    let r = d.call(
        Method::PUT,
        &vars,
        Some(json!({"values": {"a": [1, 2], "b": {"k": "v"}, "c": 1.5}})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let mut names: Vec<String> = serde_json::from_value(r.body["names"].clone()).unwrap();
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
    let r = d.get(&format!("{vars}?names=a,b,nope"));
    assert_eq!(
        r.body["values"],
        json!({"a": [1, 2], "b": {"k": "v"}}),
        "{}",
        r.body
    );
    assert_eq!(r.body["missing"], json!(["nope"]));
    assert_eq!(d.code(&id, "a + [len(b)]").plain(), "[1, 2, 1]");
    d.code(&id, "t = (1, 2)");
    let r = d.get(&vars);
    assert_eq!(r.body["values"]["x"], 42, "{}", r.body);
    assert_eq!(r.body["values"]["c"], 1.5);
    assert_eq!(
        r.body["unrepresentable"]["t"]["type"], "tuple",
        "{}",
        r.body
    );
    let r = d.delete(&format!("{vars}?names=a"));
    assert_eq!(r.body["names"], json!(["a"]), "{}", r.body);
    let r = d.get(&format!("{vars}?names=a,b"));
    assert_eq!(r.body["missing"], json!(["a"]));
    let r = d.delete(&vars);
    assert_eq!(r.status, 200);
    let r = d.get(&vars);
    assert_eq!(r.body["values"], json!({}), "{}", r.body);
    d.code(&id, "x = 41");

    // Interrupt a busy loop from another request: the state stays.
    let started = Instant::now();
    let runner = {
        let (url, key, path) = (d.url.clone(), d.key.clone(), code_path.clone());
        std::thread::spawn(move || {
            send(
                http_client()
                    .post(format!("{url}{path}"))
                    .header("X-API-Key", key)
                    .json(&json!({"code": "n = 0\nwhile True:\n    n += 1"})),
            )
        })
    };
    let busy = wait_for(Duration::from_secs(20), || {
        let r = d.get(&format!("/v1/sandboxes/{id}/contexts"));
        r.body
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == "python" && c["busy"] == true)
            .then_some(())
    });
    assert!(busy.is_some(), "the loop never showed as busy");
    std::thread::sleep(Duration::from_millis(200));
    let r = d.call(
        Method::POST,
        &format!("/v1/sandboxes/{id}/contexts/python/interrupt"),
        None,
    );
    assert_eq!(r.status, 204, "{}", r.body);
    let r = runner.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["done"]["status"], "interrupted", "{}", r.body);
    assert_eq!(r.body["error"]["name"], "KeyboardInterrupt");
    assert!(started.elapsed() < Duration::from_secs(30));
    let r = d.code(&id, "(x, n > 0)");
    assert_eq!(r.plain(), "(41, True)", "{r:?}");

    // Restart: a fresh kernel, no state.
    let r = d.call(
        Method::POST,
        &format!("/v1/sandboxes/{id}/contexts/python/restart"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["id"], "python");
    let r = d.code(&id, "x");
    assert_eq!(r.raised(), "NameError", "{r:?}");
    assert_eq!(d.code(&id, "6 * 7").plain(), "42");

    // The store keeps each context's history: while it runs, when each began; after the
    // sandbox is gone, what it ran and how each ended.
    let list = d.get(&format!("/v1/sandboxes/{id}/contexts"));
    let python = list
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "python");
    assert!(python.unwrap()["created_at"].is_string(), "{}", list.body);
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    let list = d.get(&format!("/v1/sandboxes/{id}/contexts"));
    assert_eq!(list.status, 200, "{}", list.body);
    let ended: Vec<(String, String, bool)> = list
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["end_reason"].as_str().unwrap_or("open").to_string(),
                c["created_at"].is_string() && c["ended_at"].is_string(),
            )
        })
        .collect();
    assert_eq!(
        ended,
        [
            ("python".into(), "the sandbox is stopped".into(), true),
            (ctx.clone(), "deleted".into(), true),
        ],
        "{}",
        list.body
    );
    // Another owner sees none of it.
    let (bob, _) = d.key_for("bob");
    d.call_as(
        Some(&bob),
        Method::GET,
        &format!("/v1/sandboxes/{id}/contexts"),
        None,
    )
    .expect_error(404, "not_found");
}
