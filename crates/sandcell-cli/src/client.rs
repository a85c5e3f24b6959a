//! The CLI as a client of a running daemon: `sandbox …`, `exec`, `code`, `files …`, `ps`.
//!
//! The daemon is found through `--url` or `$SANDCELL_API_URL`, else the `daemon.json` a running
//! `sandcell serve` leaves in its home; the key through `--api-key` or `$SANDCELL_API_KEY`,
//! else the admin key the first `serve` wrote there.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::render::table;

/// How to reach the daemon.
#[derive(Debug, Args, Clone, Default)]
pub struct ClientArgs {
    /// The daemon's URL (default: $SANDCELL_API_URL, else the running daemon's).
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    /// The API key (default: $SANDCELL_API_KEY, else <home>/admin.key).
    #[arg(long, global = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Sandcell's data directory, where a running daemon leaves its address.
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

/// A connection to the daemon.
pub struct Client {
    base: String,
    key: String,
    http: reqwest::Client,
    json: bool,
}

/// The daemon's answer to a request that failed.
#[derive(Debug)]
pub struct ApiFailure {
    /// HTTP status.
    pub status: u16,
    /// The error code.
    pub code: String,
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.status, self.message)
    }
}

impl std::error::Error for ApiFailure {}

impl Client {
    /// Finds the daemon and the key, and checks that the daemon answers.
    pub async fn connect(args: &ClientArgs) -> anyhow::Result<Self> {
        let home = args
            .home
            .clone()
            .unwrap_or_else(sandcell_server::config::default_home);
        let base = match args.url.clone().or_else(|| {
            std::env::var("SANDCELL_API_URL")
                .ok()
                .filter(|u| !u.is_empty())
        }) {
            Some(url) => url,
            None => running_daemon(&home)?,
        };
        let base = base.trim_end_matches('/').to_string();
        let key = match args.api_key.clone().or_else(|| {
            std::env::var("SANDCELL_API_KEY")
                .ok()
                .filter(|k| !k.is_empty())
        }) {
            Some(k) => k,
            None => {
                let path = sandcell_server::admin_key_path(&home);
                std::fs::read_to_string(&path)
                    .map(|k| k.trim().to_string())
                    .with_context(|| {
                        format!(
                            "no API key: pass --api-key, set SANDCELL_API_KEY, or run as the user who can read {}",
                            path.display()
                        )
                    })?
            }
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("build the HTTP client")?;
        let client = Self {
            base,
            key,
            http,
            json: args.json,
        };
        client.health().await?;
        Ok(client)
    }

    async fn health(&self) -> anyhow::Result<()> {
        let url = format!("{}/healthz", self.base);
        match self.http.get(&url).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => bail!(
                "the daemon at {} answered {} to a health check",
                self.base,
                r.status()
            ),
            Err(e) => bail!(
                "no Sandcell daemon answers at {} ({e}); start one with `sandcell serve`",
                self.base
            ),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("X-API-Key", &self.key)
    }

    /// Sends a request and returns its JSON answer (`Null` for an empty one).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.context("send the request")?;
        read_json(resp).await
    }

    /// Sends a request whose answer is a stream of server-sent events; calls `on_event`
    /// with each (name, data) until the stream ends or it returns false.
    pub async fn events(
        &self,
        path: &str,
        body: &Value,
        mut on_event: impl FnMut(&str, &Value) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let resp = self
            .request(reqwest::Method::POST, path)
            .json(body)
            .send()
            .await
            .context("send the request")?;
        if !resp.status().is_success() {
            read_json(resp).await?;
            bail!("the stream did not start");
        }
        let mut stream = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            buf.extend_from_slice(&chunk.context("read the event stream")?);
            while let Some(end) = find_blank_line(&buf) {
                let block: Vec<u8> = buf.drain(..end.1).collect();
                let text = String::from_utf8_lossy(&block[..end.0]);
                let (name, data) = parse_event(&text);
                if data.is_empty() {
                    continue;
                }
                let value: Value = serde_json::from_str(&data).unwrap_or(Value::String(data));
                if !on_event(&name, &value)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The URL of the daemon running with `home`, from its `daemon.json`.
fn running_daemon(home: &std::path::Path) -> anyhow::Result<String> {
    let path = sandcell_server::daemon_info_path(home);
    let text = std::fs::read_to_string(&path).map_err(|_| {
        anyhow!(
            "no Sandcell daemon is running (no {}): start one with `sandcell serve`, or point to one with --url or SANDCELL_API_URL",
            path.display()
        )
    })?;
    let info: sandcell_server::DaemonInfo =
        serde_json::from_str(&text).with_context(|| format!("read {}", path.display()))?;
    if !std::path::Path::new(&format!("/proc/{}", info.pid)).exists() {
        bail!(
            "the Sandcell daemon that wrote {} (pid {}) is not running: start one with `sandcell serve`",
            path.display(),
            info.pid
        );
    }
    Ok(info.url)
}

/// (end of the block, end of the separator) of the first event block in `buf`.
fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| (i, i + 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The event name (default `message`) and data of one SSE block.
fn parse_event(block: &str) -> (String, String) {
    let mut name = "message".to_string();
    let mut data: Vec<&str> = Vec::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    (name, data.join("\n"))
}

async fn read_json(resp: reqwest::Response) -> anyhow::Result<Value> {
    let status = resp.status();
    let bytes = resp.bytes().await.context("read the answer")?;
    let value: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    if status.is_success() {
        return Ok(value);
    }
    Err(ApiFailure {
        status: status.as_u16(),
        code: value["code"].as_str().unwrap_or("error").to_string(),
        message: value["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string()),
    }
    .into())
}

fn pairs(items: &[String], what: &str) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow!("{what} '{p}': expected KEY=VALUE"))
        })
        .collect()
}

fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn str_of(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `sandcell sandbox …`.
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox and print its id.
    Create(CreateArgs),
    /// List sandboxes.
    #[command(alias = "list")]
    Ls(ListArgs),
    /// Show one sandbox.
    Get {
        /// The sandbox id.
        id: String,
    },
    /// Stop sandboxes.
    #[command(alias = "delete")]
    Rm {
        /// The sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Give a sandbox a new lifetime, counted from now.
    Timeout {
        /// The sandbox id.
        id: String,
        /// Seconds from now.
        secs: u64,
    },
    /// Pause sandboxes: their processes freeze (no CPU, memory kept), their clocks stop.
    Pause {
        /// The sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Resume paused sandboxes where they stopped.
    Resume {
        /// The sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// `sandcell sandbox create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// default, python, node, bash or r.
    #[arg(long, short)]
    template: Option<String>,
    /// nano, small, medium or large.
    #[arg(long, short)]
    size: Option<String>,
    /// The isolation backend (default: process).
    #[arg(long)]
    backend: Option<String>,
    /// Make it checkpointable by CRIU (process backend): snapshots keep every process.
    #[arg(long)]
    checkpointable: bool,
    /// A label (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// A metadata entry (repeatable).
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
    /// An environment variable (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Lifetime in seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// Idle timeout in seconds.
    #[arg(long)]
    idle_timeout: Option<u64>,
    /// Forget its record when it stops.
    #[arg(long)]
    ephemeral: bool,
    /// loopback or off.
    #[arg(long)]
    network: Option<String>,
}

/// `sandcell sandbox ls`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only with this label (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Only in this state (repeatable; default: running, paused, creating).
    #[arg(long)]
    state: Vec<String>,
    /// Every state, stopped and lost included.
    #[arg(long, short)]
    all: bool,
}

fn sandbox_rows(items: &[Value]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let labels = s["labels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                str_of(&s["id"]),
                str_of(&s["state"]),
                str_of(&s["template"]),
                str_of(&s["created_at"]),
                labels,
            ]
        })
        .collect();
    table(&["ID", "STATE", "TEMPLATE", "CREATED", "LABELS"], &rows)
}

/// Runs a `sandbox` command.
pub async fn sandbox(args: &ClientArgs, cmd: SandboxCommand) -> anyhow::Result<ExitCode> {
    let c = Client::connect(args).await?;
    match cmd {
        SandboxCommand::Create(a) => {
            let mut body = json!({
                "labels": pairs(&a.labels, "--label")?,
                "metadata": pairs(&a.metadata, "--meta")?,
                "env": pairs(&a.env, "--env")?,
                "ephemeral": a.ephemeral,
            });
            for (k, v) in [
                ("template", a.template.map(Value::from)),
                ("size", a.size.map(Value::from)),
                ("backend", a.backend.map(Value::from)),
                (
                    "checkpointable",
                    a.checkpointable.then_some(Value::Bool(true)),
                ),
                ("timeout_secs", a.timeout.map(Value::from)),
                ("idle_timeout_secs", a.idle_timeout.map(Value::from)),
                ("network", a.network.map(Value::from)),
            ] {
                if let Some(v) = v {
                    body[k] = v;
                }
            }
            let v = c
                .call(reqwest::Method::POST, "/v1/sandboxes", Some(&body))
                .await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{}", str_of(&v["id"]));
            }
        }
        SandboxCommand::Ls(a) => {
            let mut query: Vec<(String, String)> = Vec::new();
            for l in &a.labels {
                let (k, v) = l
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--label '{l}': expected KEY=VALUE"))?;
                query.push(("label".into(), format!("{k}:{v}")));
            }
            if a.all {
                query.push(("state".into(), "all".into()));
            }
            for s in &a.state {
                query.push(("state".into(), s.clone()));
            }
            let mut items = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let mut q = query.clone();
                if let Some(c) = &cursor {
                    q.push(("cursor".into(), c.clone()));
                }
                let qs = serde_urlencoded::to_string(&q)?;
                let v = c
                    .call(reqwest::Method::GET, &format!("/v1/sandboxes?{qs}"), None)
                    .await?;
                items.extend(v["items"].as_array().cloned().unwrap_or_default());
                match v["next_cursor"].as_str() {
                    Some(next) => cursor = Some(next.to_string()),
                    None => break,
                }
            }
            if c.json {
                print_json(&Value::Array(items))?;
            } else {
                print!("{}", sandbox_rows(&items));
            }
        }
        SandboxCommand::Get { id } => {
            let v = c
                .call(reqwest::Method::GET, &format!("/v1/sandboxes/{id}"), None)
                .await?;
            if c.json {
                print_json(&v)?;
            } else {
                print!("{}", sandbox_rows(std::slice::from_ref(&v)));
                if let Some(r) = v["reason"].as_str() {
                    println!("reason: {r}");
                }
                if let Some(e) = v["expires_at"].as_str() {
                    println!("expires: {e}");
                }
            }
        }
        SandboxCommand::Rm { ids } => {
            let mut failed = false;
            for id in ids {
                match c
                    .call(
                        reqwest::Method::DELETE,
                        &format!("/v1/sandboxes/{id}"),
                        None,
                    )
                    .await
                {
                    Ok(_) => println!("{id}"),
                    Err(e) => {
                        eprintln!("sandcell: {id}: {e:#}");
                        failed = true;
                    }
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
        SandboxCommand::Timeout { id, secs } => {
            let v = c
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sandboxes/{id}/timeout"),
                    Some(&json!({ "timeout_secs": secs })),
                )
                .await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{id} now ends at {}", str_of(&v["expires_at"]));
            }
        }
        SandboxCommand::Pause { ids } => return pause_or_resume(&c, "pause", &ids).await,
        SandboxCommand::Resume { ids } => return pause_or_resume(&c, "resume", &ids).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// `sandcell sandbox pause|resume ID…`: each sandbox's new state, or why not.
async fn pause_or_resume(c: &Client, action: &str, ids: &[String]) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    let mut answers = Vec::new();
    for id in ids {
        match c
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{id}/{action}"),
                None,
            )
            .await
        {
            Ok(v) => {
                if !c.json {
                    println!("{id} {}", str_of(&v["state"]));
                }
                answers.push(v);
            }
            Err(e) => {
                failed = true;
                eprintln!("sandcell: {id}: {e:#}");
            }
        }
    }
    if c.json {
        print_json(&serde_json::Value::Array(answers))?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `sandcell exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The sandbox id.
    id: String,
    /// Working directory.
    #[arg(long, short = 'w')]
    cwd: Option<String>,
    /// An environment variable (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Seconds before it is killed.
    #[arg(long)]
    timeout: Option<u64>,
    /// The command and its arguments (one argument is run by the shell).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs a command in a sandbox, streaming its output; exits with its status.
pub async fn exec(args: &ClientArgs, a: ExecArgs) -> anyhow::Result<ExitCode> {
    let c = Client::connect(args).await?;
    let mut body = json!({ "env": pairs(&a.env, "--env")? });
    if a.command.len() == 1 {
        body["cmd"] = Value::from(a.command[0].clone());
    } else {
        body["argv"] = json!(a.command);
    }
    if let Some(cwd) = a.cwd {
        body["cwd"] = Value::from(cwd);
    }
    if let Some(t) = a.timeout {
        body["timeout_secs"] = Value::from(t);
    }
    if c.json {
        let v = c
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{}/exec", a.id),
                Some(&body),
            )
            .await?;
        print_json(&v)?;
        // The exec answer carries how it ended at its top level.
        return Ok(exit_code(v["exit_code"].as_i64(), &v));
    }
    let mut code = ExitCode::from(1);
    c.events(
        &format!("/v1/sandboxes/{}/exec/stream", a.id),
        &body,
        |name, v| {
            match name {
                "stdout" => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(v["data"].as_str().unwrap_or("").as_bytes())?;
                    out.flush()?;
                }
                "stderr" => {
                    let mut err = std::io::stderr().lock();
                    err.write_all(v["data"].as_str().unwrap_or("").as_bytes())?;
                    err.flush()?;
                }
                "exit" => {
                    code = exit_code(v["exit_code"].as_i64(), v);
                    return Ok(false);
                }
                "error" => {
                    eprintln!(
                        "sandcell: {}: {}",
                        str_of(&v["code"]),
                        str_of(&v["message"])
                    );
                    return Ok(false);
                }
                _ => {}
            }
            Ok(true)
        },
    )
    .await?;
    Ok(code)
}

/// The exit status of an exec: its code, or 128 + signal, or 124 for a timeout.
fn exit_code(code: Option<i64>, result: &Value) -> ExitCode {
    if let Some(c) = code {
        return ExitCode::from(u8::try_from(c.clamp(0, 255)).unwrap_or(1));
    }
    if result["timed_out"].as_bool() == Some(true) {
        return ExitCode::from(124);
    }
    match result["signal"].as_i64() {
        Some(s) => ExitCode::from(u8::try_from((128 + s).clamp(0, 255)).unwrap_or(1)),
        None => ExitCode::from(1),
    }
}

/// `sandcell code`.
#[derive(Debug, Args)]
pub struct CodeArgs {
    /// The sandbox id.
    id: String,
    /// python, node, bash or r.
    #[arg(long, short, default_value = "python")]
    lang: String,
    /// A context made with the API (default: the language's own).
    #[arg(long)]
    context: Option<String>,
    /// Seconds before the execution is interrupted.
    #[arg(long)]
    timeout: Option<f64>,
    /// The code ('-' reads it from stdin).
    code: String,
}

/// Runs code in a sandbox's kernel, streaming its output.
pub async fn code(args: &ClientArgs, a: CodeArgs) -> anyhow::Result<ExitCode> {
    let c = Client::connect(args).await?;
    let code = if a.code == "-" {
        std::io::read_to_string(std::io::stdin()).context("read the code from stdin")?
    } else {
        a.code
    };
    let mut body = json!({ "code": code, "language": a.lang });
    if let Some(ctx) = a.context {
        body["context"] = Value::from(ctx);
    }
    if let Some(t) = a.timeout {
        body["timeout_secs"] = Value::from(t);
    }
    if c.json {
        let v = c
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{}/code", a.id),
                Some(&body),
            )
            .await?;
        print_json(&v)?;
        let ok = v["done"]["status"].as_str() == Some("ok");
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let mut status = ExitCode::from(1);
    c.events(
        &format!("/v1/sandboxes/{}/code/stream", a.id),
        &body,
        |name, v| {
            match name {
                "stdout" => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(v["text"].as_str().unwrap_or("").as_bytes())?;
                    out.flush()?;
                }
                "stderr" => {
                    let mut err = std::io::stderr().lock();
                    err.write_all(v["text"].as_str().unwrap_or("").as_bytes())?;
                    err.flush()?;
                }
                "result" | "display" => {
                    if let Some(text) = v["data"]["text/plain"].as_str() {
                        println!("{text}");
                    } else if let Some(types) = v["data"].as_object() {
                        let kinds: Vec<&String> = types.keys().collect();
                        println!(
                            "[{}]",
                            kinds
                                .iter()
                                .map(|k| k.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                }
                "error" => {
                    if let Some(tb) = v["traceback"].as_array().filter(|t| !t.is_empty()) {
                        for line in tb {
                            eprintln!("{}", line.as_str().unwrap_or(""));
                        }
                    } else if v.get("ename").is_some() {
                        eprintln!("{}: {}", str_of(&v["ename"]), str_of(&v["evalue"]));
                    } else {
                        eprintln!(
                            "sandcell: {}: {}",
                            str_of(&v["code"]),
                            str_of(&v["message"])
                        );
                        return Ok(false);
                    }
                }
                "done" => {
                    if v["status"].as_str() == Some("ok") {
                        status = ExitCode::SUCCESS;
                    }
                    return Ok(false);
                }
                _ => {}
            }
            Ok(true)
        },
    )
    .await?;
    Ok(status)
}

/// `sandcell files …`.
#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// List a directory.
    Ls {
        /// The sandbox id.
        id: String,
        /// The directory (default /workspace).
        path: Option<String>,
    },
    /// Download a file ('-' or nothing: to stdout).
    Get {
        /// The sandbox id.
        id: String,
        /// The file in the sandbox.
        remote: String,
        /// Where to write it.
        local: Option<PathBuf>,
    },
    /// Upload a file ('-': from stdin).
    Put {
        /// The sandbox id.
        id: String,
        /// The local file.
        local: PathBuf,
        /// Where it goes in the sandbox.
        remote: String,
    },
}

/// Runs a `files` command.
pub async fn files(args: &ClientArgs, cmd: FilesCommand) -> anyhow::Result<ExitCode> {
    let c = Client::connect(args).await?;
    match cmd {
        FilesCommand::Ls { id, path } => {
            let q = serde_urlencoded::to_string([(
                "path",
                path.unwrap_or_else(|| "/workspace".into()),
            )])?;
            let v = c
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/sandboxes/{id}/files?{q}"),
                    None,
                )
                .await?;
            if c.json {
                print_json(&v)?;
            } else {
                let rows: Vec<Vec<String>> = v["entries"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|e| {
                        vec![
                            str_of(&e["kind"]),
                            format!("{:o}", e["mode"].as_u64().unwrap_or(0)),
                            str_of(&e["size"]),
                            str_of(&e["name"]),
                        ]
                    })
                    .collect();
                print!("{}", table(&["KIND", "MODE", "SIZE", "NAME"], &rows));
            }
        }
        FilesCommand::Get { id, remote, local } => {
            let q = serde_urlencoded::to_string([("path", remote.as_str())])?;
            let resp = c
                .request(
                    reqwest::Method::GET,
                    &format!("/v1/sandboxes/{id}/files/content?{q}"),
                )
                .send()
                .await
                .context("send the request")?;
            if !resp.status().is_success() {
                read_json(resp).await?;
                bail!("the download did not start");
            }
            let mut out: Box<dyn Write> = match local.as_ref().filter(|p| p.as_os_str() != "-") {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p).with_context(|| format!("create {}", p.display()))?,
                )),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut stream = resp.bytes_stream();
            while let Some(chunk) = stream.next().await {
                out.write_all(&chunk.context("read the download")?)?;
            }
            out.flush()?;
        }
        FilesCommand::Put { id, local, remote } => {
            let q = serde_urlencoded::to_string([("path", remote.as_str())])?;
            let body = if local.as_os_str() == "-" {
                let mut buf = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
                reqwest::Body::from(buf)
            } else {
                let file = tokio::fs::File::open(&local)
                    .await
                    .with_context(|| format!("open {}", local.display()))?;
                reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file))
            };
            let resp = c
                .request(
                    reqwest::Method::PUT,
                    &format!("/v1/sandboxes/{id}/files/content?{q}"),
                )
                .header("content-type", "application/octet-stream")
                .body(body)
                .send()
                .await
                .context("send the file")?;
            let v = read_json(resp).await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{} ({} bytes)", str_of(&v["path"]), str_of(&v["size"]));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The first line of `text`, cut to `max` characters (a kernel's command line holds its
/// whole program).
fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() > max || text.contains('\n') {
        let cut: String = line.chars().take(max).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

/// `sandcell ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// The sandbox id.
    id: String,
}

/// Lists a sandbox's processes.
pub async fn ps(args: &ClientArgs, a: PsArgs) -> anyhow::Result<ExitCode> {
    let c = Client::connect(args).await?;
    let v = c
        .call(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{}/processes", a.id),
            None,
        )
        .await?;
    if c.json {
        print_json(&v)?;
    } else {
        let rows: Vec<Vec<String>> = v["processes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|p| {
                vec![
                    str_of(&p["pid"]),
                    str_of(&p["ppid"]),
                    str_of(&p["state"]),
                    p["rss_bytes"]
                        .as_u64()
                        .map_or_else(|| "-".into(), |b| (b / 1024).to_string()),
                    first_line(&str_of(&p["cmdline"]), 100),
                ]
            })
            .collect();
        print!(
            "{}",
            table(&["PID", "PPID", "STATE", "RSS_KB", "COMMAND"], &rows)
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_blocks_parse() {
        let buf = b"event: stdout\ndata: {\"data\":\"hi\"}\n\nevent: exit\r\ndata: {}\r\n\r\n";
        let (end, sep) = find_blank_line(buf).unwrap();
        let (name, data) = parse_event(std::str::from_utf8(&buf[..end]).unwrap());
        assert_eq!(
            (name.as_str(), data.as_str()),
            ("stdout", "{\"data\":\"hi\"}")
        );
        let rest = &buf[sep..];
        let (end, _) = find_blank_line(rest).unwrap();
        let (name, _) = parse_event(std::str::from_utf8(&rest[..end]).unwrap());
        assert_eq!(name, "exit");
    }
}

/// `sandcell snapshot …`.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a sandbox (its /workspace, /home/sandbox and /tmp) and print the snapshot's id.
    Create {
        /// The sandbox id.
        id: String,
        /// A name.
        #[arg(long, short)]
        name: Option<String>,
        /// A description.
        #[arg(long, short)]
        description: Option<String>,
        /// A tag (repeatable).
        #[arg(long = "tag", short = 't', value_name = "KEY=VALUE")]
        tags: Vec<String>,
    },
    /// List snapshots.
    #[command(alias = "list")]
    Ls {
        /// Only this sandbox's.
        #[arg(long)]
        sandbox: Option<String>,
    },
    /// Show a snapshot with its lineage.
    Get {
        /// The snapshot id.
        id: String,
    },
    /// Delete snapshots.
    #[command(alias = "delete")]
    Rm {
        /// The snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Make new sandboxes from a snapshot and print their ids (`--json`: one sandbox's record
    /// with what came back, or with `-n` above 1 every sandbox's).
    Fork {
        /// The snapshot id.
        id: String,
        /// How many (1 to 16).
        #[arg(long, short = 'n', default_value_t = 1)]
        count: u32,
        /// A label of the new sandboxes (repeatable).
        #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
        labels: Vec<String>,
    },
}

/// `sandcell snapshot`.
pub async fn snapshot(args: &ClientArgs, cmd: SnapshotCommand) -> anyhow::Result<ExitCode> {
    let c = Client::connect(args).await?;
    match cmd {
        SnapshotCommand::Create {
            id,
            name,
            description,
            tags,
        } => {
            let mut body = json!({ "tags": pairs(&tags, "--tag")? });
            if let Some(n) = name {
                body["name"] = n.into();
            }
            if let Some(d) = description {
                body["description"] = d.into();
            }
            let v = c
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sandboxes/{id}/snapshots"),
                    Some(&body),
                )
                .await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{}", str_of(&v["id"]));
                eprintln!(
                    "{} fidelity, {} files, {} bytes",
                    str_of(&v["fidelity"]),
                    v["files"],
                    v["size"]
                );
            }
        }
        SnapshotCommand::Ls { sandbox } => {
            let path = match sandbox {
                Some(s) => format!("/v1/snapshots?sandbox={s}"),
                None => "/v1/snapshots".into(),
            };
            let v = c.call(reqwest::Method::GET, &path, None).await?;
            if c.json {
                print_json(&v)?;
            } else {
                let rows: Vec<Vec<String>> = v["snapshots"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|s| {
                                vec![
                                    str_of(&s["id"]),
                                    str_of(&s["sandbox_id"]),
                                    str_of(&s["name"]),
                                    str_of(&s["fidelity"]),
                                    s["size"].to_string(),
                                    str_of(&s["created_at"]),
                                    s["parent_id"].as_str().unwrap_or("-").to_string(),
                                ]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                print!(
                    "{}",
                    crate::render::table(
                        &[
                            "ID", "SANDBOX", "NAME", "FIDELITY", "BYTES", "CREATED", "PARENT"
                        ],
                        &rows
                    )
                );
            }
        }
        SnapshotCommand::Get { id } => {
            let v = c
                .call(reqwest::Method::GET, &format!("/v1/snapshots/{id}"), None)
                .await?;
            print_json(&v)?;
        }
        SnapshotCommand::Rm { ids } => {
            let mut failed = false;
            for id in ids {
                if let Err(e) = c
                    .call(
                        reqwest::Method::DELETE,
                        &format!("/v1/snapshots/{id}"),
                        None,
                    )
                    .await
                {
                    failed = true;
                    eprintln!("sandcell: {id}: {e:#}");
                }
            }
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
        SnapshotCommand::Fork {
            id,
            count: 1,
            labels,
        } => {
            // One sandbox: a restore, whose answer is the sandbox itself.
            let body = json!({ "snapshot_id": id, "labels": pairs(&labels, "--label")? });
            let v = c
                .call(reqwest::Method::POST, "/v1/sandboxes", Some(&body))
                .await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{}", str_of(&v["id"]));
            }
        }
        SnapshotCommand::Fork { id, count, labels } => {
            let body = json!({ "count": count, "labels": pairs(&labels, "--label")? });
            let v = c
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/snapshots/{id}/fork"),
                    Some(&body),
                )
                .await?;
            if c.json {
                print_json(&v)?;
            } else {
                for f in v["sandboxes"].as_array().into_iter().flatten() {
                    println!("{}", str_of(&f["sandbox"]["id"]));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
