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
use sandcell_api::code::{CodeInput, CodeStreamEvent};
use sandcell_api::exec::{ExecInput, ExecStreamEvent, ExitInfo};
use sandcell_api::git::GitClone;
use sandcell_api::network::NetworkPolicy;
use sandcell_api::sandboxes::{CreateSandbox, Lang, SandboxInfo, Size};
use sandcell_api::snapshots::{CreateSnapshot, ForkSnapshot, VolumeCarry};
use sandcell_api::volumes::MountInput;
use sandcell_api::{Code, Seconds, Tags, Timeout};
use sandcell_client::{ClientError, Discover, ListSandboxes};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

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

/// A connection to the daemon, and how to print.
pub struct Client {
    api: sandcell_client::Client,
    json: bool,
}

impl Client {
    /// Finds the daemon and the key, and checks that the daemon answers.
    pub async fn connect(args: &ClientArgs) -> anyhow::Result<Self> {
        let found = Discover {
            url: args.url.clone(),
            api_key: args.api_key.clone(),
            home: args.home.clone(),
        };
        let base = found.url()?;
        let key = found.api_key()?;
        let api = sandcell_client::Client::builder(base)
            .api_key(key)
            .build()?;
        match api.health().await {
            Ok(status) if status.is_success() => {}
            Ok(status) => bail!(
                "the daemon at {} answered {status} to a health check",
                api.base_url()
            ),
            Err(ClientError::Transport { source, .. }) => bail!(
                "no Sandcell daemon answers at {} ({source}); start one with `sandcell serve`",
                api.base_url()
            ),
            Err(e) => return Err(e.into()),
        }
        Ok(Self {
            api,
            json: args.json,
        })
    }
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

/// Prints an answer as JSON, as the daemon's own JSON read back would print (keys in the
/// order a JSON object keeps them).
fn print_json(v: &impl Serialize) -> anyhow::Result<()> {
    let v = serde_json::to_value(v)?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// A flag's value as the API type it names (`--size`, `--network`, `--lang`).
fn choice<T: DeserializeOwned>(flag: &str, value: String, choices: &str) -> anyhow::Result<T> {
    serde_json::from_value(Value::String(value.clone()))
        .map_err(|_| anyhow!("{flag} '{value}' is not one of {choices}"))
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
    /// Clone a git repository into a sandbox (on the host, through a proxy that allows only
    /// its host; credentials never enter the sandbox).
    GitClone {
        /// The sandbox id.
        id: String,
        /// The repository's https:// or http:// URL.
        #[arg(id = "repository", value_name = "URL")]
        url: String,
        /// Where in the sandbox (default /workspace/<repository name>).
        #[arg(id = "target", value_name = "PATH")]
        path: Option<String>,
        /// The branch or tag to check out.
        #[arg(long, short)]
        branch: Option<String>,
        /// Only this many commits of history.
        #[arg(long)]
        depth: Option<u32>,
        /// The user name for HTTP authentication.
        #[arg(long)]
        username: Option<String>,
        /// The environment variable holding the password or token (never given on the
        /// command line, where other users could see it).
        #[arg(long, value_name = "VAR")]
        password_env: Option<String>,
    },
    /// Show what a sandbox's network reaches, change it live, or list its egress events.
    Network {
        /// The sandbox id.
        id: String,
        /// The new policy: loopback, full or allow:HOST[,HOST…] (`off` is set at create).
        #[arg(value_name = "POLICY", conflicts_with = "events")]
        policy: Option<NetworkPolicy>,
        /// List its egress events (newest first) instead.
        #[arg(long)]
        events: bool,
        /// With --events: at most this many.
        #[arg(long, requires = "events")]
        limit: Option<u32>,
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
    /// off, loopback, full or allow:HOST[,HOST…] (through the host's egress proxy).
    #[arg(long, value_name = "POLICY")]
    network: Option<NetworkPolicy>,
    /// A Python package to install while it is made, as pip takes it (repeatable).
    #[arg(long = "pip", value_name = "SPEC")]
    pip: Vec<String>,
    /// An npm package to install while it is made (repeatable).
    #[arg(long = "npm", value_name = "SPEC")]
    npm: Vec<String>,
    /// An R package to install while it is made (repeatable).
    #[arg(long = "r", value_name = "NAME")]
    r: Vec<String>,
    /// A host folder mounted inside: HOST:PATH[:ro|rw|overlay], read-only by default, inside
    /// the daemon's `mounts.allowed_paths` (repeatable).
    #[arg(long = "mount", value_name = "HOST:PATH[:MODE]")]
    mounts: Vec<String>,
    /// A named volume mounted inside: NAME:PATH[:ro|rw|overlay], read-write by default,
    /// made on first use (repeatable).
    #[arg(long = "volume", value_name = "NAME:PATH[:MODE]")]
    volumes: Vec<String>,
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

fn sandbox_rows(items: &[SandboxInfo]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            vec![
                s.id.clone(),
                s.state.clone(),
                s.template.clone(),
                s.created_at.clone(),
                labels,
            ]
        })
        .collect();
    table(&["ID", "STATE", "TEMPLATE", "CREATED", "LABELS"], &rows)
}

/// `sandcell sandbox network`.
async fn network(
    c: &Client,
    id: &str,
    policy: Option<NetworkPolicy>,
    events: bool,
    limit: Option<u32>,
) -> anyhow::Result<()> {
    if events {
        let list = c.api.egress_events(id, None, limit).await?;
        if c.json {
            return print_json(&list);
        }
        let rows: Vec<Vec<String>> = list
            .events
            .iter()
            .map(|e| {
                vec![
                    e.at.clone(),
                    e.decision.clone(),
                    e.protocol.clone(),
                    format!("{}:{}", e.host, e.port),
                    format!("{}/{}", e.bytes_up, e.bytes_down),
                    e.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &["AT", "DECISION", "VIA", "HOST", "UP/DOWN", "REASON"],
                &rows
            )
        );
        return Ok(());
    }
    let info = match policy {
        Some(p) => c.api.set_sandbox_network(id, &p).await?,
        None => c.api.sandbox_network(id).await?,
    };
    if c.json {
        return print_json(&info);
    }
    println!("network: {}", info.network);
    if let Some(p) = &info.http_proxy {
        println!("http proxy inside: {p}");
    }
    if let Some(p) = &info.socks_proxy {
        println!("socks proxy inside: {p}");
    }
    println!(
        "egress: {} bytes, {} connections open",
        info.bytes, info.open_connections
    );
    Ok(())
}

/// Runs a `sandbox` command.
pub async fn sandbox(args: &ClientArgs, cmd: SandboxCommand) -> anyhow::Result<ExitCode> {
    let c = Client::connect(args).await?;
    match cmd {
        SandboxCommand::Create(a) => {
            let req = CreateSandbox {
                template: a.template,
                size: a
                    .size
                    .map(|s| choice::<Size>("--size", s, "nano, small, medium, large"))
                    .transpose()?,
                labels: Tags::new(pairs(&a.labels, "--label")?)?,
                metadata: Tags::new(pairs(&a.metadata, "--meta")?)?,
                env: pairs(&a.env, "--env")?,
                timeout_secs: a.timeout.map(Seconds::new).transpose()?,
                idle_timeout_secs: a.idle_timeout.map(Seconds::new).transpose()?,
                ephemeral: a.ephemeral,
                network: a.network,
                packages: {
                    let p = sandcell_api::sandboxes::Packages {
                        pip: a.pip,
                        npm: a.npm,
                        r: a.r,
                    };
                    (!p.is_empty()).then_some(p)
                },
                backend: a.backend,
                checkpointable: a.checkpointable,
                mounts: a
                    .mounts
                    .iter()
                    .map(|m| MountInput::parse_host(m))
                    .chain(a.volumes.iter().map(|v| MountInput::parse_volume(v)))
                    .collect::<Result<_, _>>()?,
                ..CreateSandbox::default()
            };
            let v = c.api.create_sandbox(&req).await?;
            if c.json {
                print_json(&v)?;
            } else {
                if let Some(p) = &v.packages {
                    eprintln!(
                        "packages: {} files, {} bytes in {} ms{}",
                        p.files,
                        p.bytes,
                        p.duration_ms,
                        if p.cached { " (from the cache)" } else { "" }
                    );
                }
                println!("{}", v.id);
            }
        }
        SandboxCommand::Ls(a) => {
            let mut req = ListSandboxes::default();
            for l in &a.labels {
                let (k, v) = l
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--label '{l}': expected KEY=VALUE"))?;
                req.labels.push((k.to_string(), v.to_string()));
            }
            if a.all {
                req.states.push("all".into());
            }
            req.states.extend(a.state.iter().cloned());
            let items = c.api.all_sandboxes(&req).await?;
            if c.json {
                print_json(&items)?;
            } else {
                print!("{}", sandbox_rows(&items));
            }
        }
        SandboxCommand::Get { id } => {
            let v = c.api.sandbox(&id).await?;
            if c.json {
                print_json(&v)?;
            } else {
                print!("{}", sandbox_rows(std::slice::from_ref(&v)));
                if let Some(r) = &v.reason {
                    println!("reason: {r}");
                }
                if let Some(e) = &v.expires_at {
                    println!("expires: {e}");
                }
            }
        }
        SandboxCommand::Rm { ids } => {
            let mut failed = false;
            for id in ids {
                match c.api.delete_sandbox(&id).await {
                    Ok(()) => println!("{id}"),
                    Err(e) => {
                        eprintln!("sandcell: {id}: {:#}", anyhow::Error::from(e));
                        failed = true;
                    }
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
        SandboxCommand::Timeout { id, secs } => {
            let v = c.api.set_sandbox_timeout(&id, Seconds::new(secs)?).await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!(
                    "{id} now ends at {}",
                    v.expires_at.as_deref().unwrap_or("-")
                );
            }
        }
        SandboxCommand::GitClone {
            id,
            url,
            path,
            branch,
            depth,
            username,
            password_env,
        } => {
            let password = match password_env {
                Some(var) => Some(
                    std::env::var(&var)
                        .map_err(|_| anyhow!("--password-env {var}: the variable is not set"))?,
                ),
                None => None,
            };
            let req = GitClone {
                url,
                path,
                branch,
                depth,
                username,
                password,
            };
            let r = c.api.git_clone(&id, &req).await?;
            if c.json {
                print_json(&r)?;
            } else {
                println!(
                    "cloned {} at {} ({}{} files, {} bytes, {} ms)",
                    r.path,
                    &r.commit[..r.commit.len().min(12)],
                    r.branch
                        .as_deref()
                        .map(|b| format!("{b}, "))
                        .unwrap_or_default(),
                    r.files,
                    r.bytes,
                    r.duration_ms
                );
            }
        }
        SandboxCommand::Network {
            id,
            policy,
            events,
            limit,
        } => network(&c, &id, policy, events, limit).await?,
        SandboxCommand::Pause { ids } => return pause_or_resume(&c, true, &ids).await,
        SandboxCommand::Resume { ids } => return pause_or_resume(&c, false, &ids).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// `sandcell sandbox pause|resume ID…`: each sandbox's new state, or why not.
async fn pause_or_resume(c: &Client, pause: bool, ids: &[String]) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    let mut answers = Vec::new();
    for id in ids {
        let answer = if pause {
            c.api.pause_sandbox(id).await
        } else {
            c.api.resume_sandbox(id).await
        };
        match answer {
            Ok(v) => {
                if !c.json {
                    println!("{id} {}", v.state);
                }
                answers.push(v);
            }
            Err(e) => {
                failed = true;
                eprintln!("sandcell: {id}: {:#}", anyhow::Error::from(e));
            }
        }
    }
    if c.json {
        print_json(&answers)?;
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
    let mut req = ExecInput {
        env: pairs(&a.env, "--env")?,
        cwd: a.cwd,
        timeout_secs: a
            .timeout
            .map(|t| Timeout::from_secs(t as f64))
            .transpose()?,
        ..ExecInput::default()
    };
    if a.command.len() == 1 {
        req.cmd = Some(a.command[0].clone());
    } else {
        req.argv = Some(a.command);
    }
    if c.json {
        let v = c.api.exec(&a.id, &req).await?;
        print_json(&v)?;
        return Ok(exit_code(v.exit_code, &v.result));
    }
    let mut code = ExitCode::from(1);
    let mut events = c.api.exec_stream(&a.id, &req).await?;
    while let Some(event) = events.next().await {
        match event? {
            ExecStreamEvent::Stdout(chunk) => {
                let mut out = std::io::stdout().lock();
                out.write_all(chunk.data.as_bytes())?;
                out.flush()?;
            }
            ExecStreamEvent::Stderr(chunk) => {
                let mut err = std::io::stderr().lock();
                err.write_all(chunk.data.as_bytes())?;
                err.flush()?;
            }
            ExecStreamEvent::Exit(exit) => {
                code = exit_code(exit.exit_code, &exit.result);
                break;
            }
            ExecStreamEvent::Error(e) => {
                eprintln!("sandcell: {}: {}", e.code, e.message);
                break;
            }
        }
    }
    Ok(code)
}

/// The exit status of an exec: its code, or 128 + signal, or 124 for a timeout.
fn exit_code(code: Option<i32>, result: &ExitInfo) -> ExitCode {
    if let Some(c) = code {
        return ExitCode::from(u8::try_from(c.clamp(0, 255)).unwrap_or(1));
    }
    if result.timed_out {
        return ExitCode::from(124);
    }
    match result.signal {
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
    let req = CodeInput {
        code: Code::new(code)?,
        language: Some(choice::<Lang>("--lang", a.lang, "python, node, bash, r")?),
        context: a.context,
        timeout_secs: a.timeout.map(Timeout::from_secs).transpose()?,
    };
    if c.json {
        let v = c.api.run_code(&a.id, &req).await?;
        print_json(&v)?;
        return Ok(if v.done.status == "ok" {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let mut status = ExitCode::from(1);
    let mut events = c.api.run_code_stream(&a.id, &req).await?;
    while let Some(event) = events.next().await {
        match event? {
            CodeStreamEvent::Stdout(t) => {
                let mut out = std::io::stdout().lock();
                out.write_all(t.text.as_bytes())?;
                out.flush()?;
            }
            CodeStreamEvent::Stderr(t) => {
                let mut err = std::io::stderr().lock();
                err.write_all(t.text.as_bytes())?;
                err.flush()?;
            }
            CodeStreamEvent::Result(r) | CodeStreamEvent::Display(r) => {
                if let Some(text) = r.data["text/plain"].as_str() {
                    println!("{text}");
                } else if let Some(types) = r.data.as_object() {
                    let kinds: Vec<&str> = types.keys().map(String::as_str).collect();
                    println!("[{}]", kinds.join(", "));
                }
            }
            // The code's own error (a raised exception, an interrupt, a kernel that died):
            // the run goes on to `done`.
            CodeStreamEvent::Error(e) => {
                if e.traceback.is_empty() {
                    eprintln!("{}: {}", e.name, e.value);
                } else {
                    for line in &e.traceback {
                        eprintln!("{line}");
                    }
                }
            }
            // The service's error: the stream ends here.
            CodeStreamEvent::Failed(e) => {
                eprintln!("sandcell: {}: {}", e.code, e.message);
                break;
            }
            CodeStreamEvent::Done(done) => {
                if done.status == "ok" {
                    status = ExitCode::SUCCESS;
                }
                break;
            }
        }
    }
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
            let path = path.unwrap_or_else(|| "/workspace".into());
            let v = c.api.list_files(&id, &path).await?;
            if c.json {
                print_json(&v)?;
            } else {
                let rows: Vec<Vec<String>> = v
                    .entries
                    .iter()
                    .map(|e| {
                        vec![
                            e.kind.clone(),
                            format!("{:o}", e.mode),
                            e.size.to_string(),
                            e.name.clone(),
                        ]
                    })
                    .collect();
                print!("{}", table(&["KIND", "MODE", "SIZE", "NAME"], &rows));
            }
        }
        FilesCommand::Get { id, remote, local } => {
            let mut out: Box<dyn Write> = match local.as_ref().filter(|p| p.as_os_str() != "-") {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p).with_context(|| format!("create {}", p.display()))?,
                )),
                None => Box::new(std::io::stdout().lock()),
            };
            c.api
                .read_file(&id, &remote, |chunk| out.write_all(chunk))
                .await?;
            out.flush()?;
        }
        FilesCommand::Put { id, local, remote } => {
            let body = if local.as_os_str() == "-" {
                let mut buf = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
                sandcell_client::Body::from(buf)
            } else {
                sandcell_client::Client::file_body(&local).await?
            };
            let v = c.api.write_file(&id, &remote, body).await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{} ({} bytes)", v.path, v.size);
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
    let v = c.api.processes(&a.id).await?;
    if c.json {
        print_json(&v)?;
    } else {
        let rows: Vec<Vec<String>> = v
            .processes
            .iter()
            .map(|p| {
                vec![
                    p.pid.to_string(),
                    p.ppid.to_string(),
                    p.state.clone(),
                    (p.rss_bytes / 1024).to_string(),
                    first_line(&p.cmdline, 100),
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
        /// Keep a copy of each named volume it mounts (a sandbox made from the snapshot gets
        /// new volumes filled from them; without it, the volumes are mounted again as they are).
        #[arg(long)]
        copy_volumes: bool,
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
            copy_volumes,
        } => {
            let req = CreateSnapshot {
                name,
                description: description.unwrap_or_default(),
                tags: Tags::new(pairs(&tags, "--tag")?)?,
                volumes: if copy_volumes {
                    VolumeCarry::Copy
                } else {
                    VolumeCarry::Mount
                },
            };
            let v = c.api.create_snapshot(&id, &req).await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{}", v.id);
                eprintln!(
                    "{} fidelity, {} files, {} bytes",
                    v.fidelity, v.files, v.size
                );
            }
        }
        SnapshotCommand::Ls { sandbox } => {
            let v = c.api.snapshots(sandbox.as_deref()).await?;
            if c.json {
                print_json(&v)?;
            } else {
                let rows: Vec<Vec<String>> = v
                    .snapshots
                    .iter()
                    .map(|s| {
                        vec![
                            s.id.clone(),
                            s.sandbox_id.clone(),
                            s.name.clone(),
                            s.fidelity.clone(),
                            s.size.to_string(),
                            s.created_at.clone(),
                            s.parent_id.clone().unwrap_or_else(|| "-".into()),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(
                        &[
                            "ID", "SANDBOX", "NAME", "FIDELITY", "BYTES", "CREATED", "PARENT"
                        ],
                        &rows
                    )
                );
            }
        }
        SnapshotCommand::Get { id } => {
            let v = c.api.snapshot(&id).await?;
            print_json(&v)?;
        }
        SnapshotCommand::Rm { ids } => {
            let mut failed = false;
            for id in ids {
                if let Err(e) = c.api.delete_snapshot(&id).await {
                    failed = true;
                    eprintln!("sandcell: {id}: {:#}", anyhow::Error::from(e));
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
            let req = CreateSandbox {
                snapshot_id: Some(id),
                labels: Tags::new(pairs(&labels, "--label")?)?,
                ..CreateSandbox::default()
            };
            let v = c.api.create_sandbox(&req).await?;
            if c.json {
                print_json(&v)?;
            } else {
                println!("{}", v.id);
            }
        }
        SnapshotCommand::Fork { id, count, labels } => {
            let req = ForkSnapshot {
                count: Some(count),
                labels: Tags::new(pairs(&labels, "--label")?)?,
                ..ForkSnapshot::default()
            };
            let v = c.api.fork_snapshot(&id, &req).await?;
            if c.json {
                print_json(&v)?;
            } else {
                for f in &v.sandboxes {
                    println!("{}", f.sandbox.id);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
