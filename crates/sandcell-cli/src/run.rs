//! `sandcell run`: one command in a fresh sandbox.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use sandcell_engine::spec::parse_size;
use sandcell_engine::{Engine, ExecEvent, ExecStream, NetworkPolicy, SandboxSpec};
use sandcell_protocol::ExecRequest;
use serde_json::json;

/// Languages `run` can take as CODE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Python 3 (the system /usr/bin/python3).
    Python,
    /// Node.js.
    Node,
    /// Bash.
    Bash,
}

/// Arguments of `sandcell run`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sandcell run 'print(6*7)'\n  sandcell run --lang node 'console.log(process.version)'\n  sandcell run --memory 64m --timeout 5 -- python3 -c 'print(1)'"
)]
pub struct RunArgs {
    /// Language of CODE.
    #[arg(long, value_enum, default_value = "python")]
    lang: Lang,
    /// Memory limit for the whole sandbox (e.g. 64m, 1g), no swap.
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Timeout in seconds; the whole process tree is killed when it passes.
    #[arg(long)]
    timeout: Option<f64>,
    /// CPU quota (e.g. 0.5).
    #[arg(long)]
    cpus: Option<f64>,
    /// Process limit for the whole sandbox.
    #[arg(long)]
    pids: Option<u64>,
    /// Size of the writable /workspace (e.g. 100m).
    #[arg(long, value_parser = parse_size)]
    disk: Option<u64>,
    /// Network: `loopback` (the sandbox's own lo only) or `off` (no inet sockets at all).
    #[arg(long, value_enum, default_value = "loopback")]
    network: Net,
    /// Environment variable for the command (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    cwd: Option<String>,
    /// Forward this process's standard input to the command.
    #[arg(short = 'i', long)]
    stdin: bool,
    /// Print one JSON object (output, result, timings, isolation) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Do not print the status line.
    #[arg(short, long)]
    quiet: bool,
    /// Code in --lang.
    #[arg(conflicts_with = "command")]
    code: Option<String>,
    /// A command and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

/// Network choices on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Net {
    /// The sandbox's own loopback only.
    Loopback,
    /// No network sockets at all.
    Off,
}

impl RunArgs {
    fn request(&self) -> anyhow::Result<ExecRequest> {
        let mut req = match (&self.code, self.command.is_empty()) {
            (Some(code), true) => match self.lang {
                Lang::Python => ExecRequest::argv(["/usr/bin/python3", "-c", code.as_str()]),
                Lang::Node => ExecRequest::argv(["node", "-e", code.as_str()]),
                Lang::Bash => ExecRequest::argv(["bash", "-c", code.as_str()]),
            },
            (None, false) => ExecRequest::argv(self.command.clone()),
            (None, true) => bail!("nothing to run: give CODE or `-- COMMAND [ARGS…]`"),
            (Some(_), false) => bail!("give either CODE or `-- COMMAND`, not both"),
        };
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--env '{kv}' is not KEY=VALUE"))?;
            req.env.insert(k.to_string(), v.to_string());
        }
        req.cwd = self.cwd.clone();
        req.stdin = self.stdin;
        if let Some(t) = self.timeout {
            if !(t.is_finite() && t > 0.0) {
                bail!("--timeout must be a positive number of seconds");
            }
            req.timeout_ms = Some((t * 1000.0).ceil() as u64);
        }
        Ok(req)
    }

    fn spec(&self) -> SandboxSpec {
        let mut spec = SandboxSpec::default();
        if let Some(m) = self.memory {
            spec.limits.memory_bytes = Some(m);
        }
        spec.limits.cpus = self.cpus;
        if let Some(p) = self.pids {
            spec.limits.pids = Some(p);
        }
        if let Some(d) = self.disk {
            spec.limits.disk_bytes = d;
        }
        spec.network = match self.network {
            Net::Loopback => NetworkPolicy::Loopback,
            Net::Off => NetworkPolicy::Off,
        };
        spec
    }
}

/// A validated `sandcell run`: what to run, in what.
pub struct Prepared {
    /// The sandbox's id, chosen before it exists.
    pub id: String,
    req: ExecRequest,
    /// The sandbox's spec.
    pub spec: SandboxSpec,
}

/// Validates the arguments before anything starts.
pub fn prepare(args: &RunArgs) -> anyhow::Result<Prepared> {
    let req = args.request()?;
    let spec = args.spec();
    spec.validate()?;
    Ok(Prepared {
        id: sandcell_engine::new_sandbox_id(),
        req,
        spec,
    })
}

/// Runs `sandcell run`.
pub async fn run(args: RunArgs, prepared: Prepared, engine: Engine) -> anyhow::Result<ExitCode> {
    let Prepared { id, req, spec } = prepared;
    let start = Instant::now();
    let (sandbox, stream) = engine
        .create_and_exec(id, spec, req)
        .await
        .context("create the sandbox and start the command")?;
    let created = start.elapsed();
    let outcome = execute(stream, &args).await;
    let exec_done = start.elapsed();
    // The kill is sent; the namespaces finish dying after we exit, as with any one-shot
    // runner.
    sandbox.kill();
    let total = start.elapsed();
    let (stdout, stderr, result) = outcome?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let timings = json!({
        "create_ms": ms(created),
        "exec_ms": ms(exec_done - created),
        "destroy_ms": ms(total - exec_done),
        "total_ms": ms(total),
    });
    if args.json {
        let out = json!({
            "sandbox_id": sandbox.id(),
            "stdout": String::from_utf8_lossy(&stdout),
            "stderr": String::from_utf8_lossy(&stderr),
            "result": result,
            "timings": timings,
            "isolation": sandbox.isolation(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if !args.quiet {
        let status = if result.success() {
            "ok".to_string()
        } else {
            result.message.clone()
        };
        eprintln!(
            "sandcell: {status} · exit status {} · create {:.1} ms · run {:.1} ms · total {:.1} ms",
            result.shell_status(),
            ms(created),
            ms(exec_done - created),
            ms(total)
        );
    }
    Ok(ExitCode::from(
        u8::try_from(result.shell_status()).unwrap_or(1),
    ))
}

type Outcome = (Vec<u8>, Vec<u8>, sandcell_protocol::ExecResult);

async fn execute(mut stream: ExecStream, args: &RunArgs) -> anyhow::Result<Outcome> {
    if args.stdin {
        // Forward stdin from a thread: reading a terminal or pipe blocks.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut input = std::io::stdin().lock();
            while let Ok(n) = std::io::Read::read(&mut input, &mut buf) {
                if n == 0 || tx.blocking_send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        // Send everything before reading output (fine for one-shot runs).
        while let Some(chunk) = rx.recv().await {
            stream.write_stdin(&chunk).await?;
        }
        stream.close_stdin().await?;
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    while let Some(event) = stream.next().await {
        match event? {
            ExecEvent::Stdout(b) if args.json => out.extend_from_slice(&b),
            ExecEvent::Stderr(b) if args.json => err.extend_from_slice(&b),
            ExecEvent::Stdout(b) => {
                let mut lock = stdout.lock();
                lock.write_all(&b)?;
                lock.flush()?;
            }
            ExecEvent::Stderr(b) => {
                let mut lock = stderr.lock();
                lock.write_all(&b)?;
                lock.flush()?;
            }
            ExecEvent::Exit(result) => return Ok((out, err, result)),
        }
    }
    bail!("the command ended without an exit status")
}
