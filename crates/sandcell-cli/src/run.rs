//! `sandcell run`: one command in a fresh sandbox.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use sandcell_engine::{CodeEvent, Engine, ExecEvent, ExecStream, SandboxSpec};
use sandcell_protocol::{ExecRequest, Language, RunCodeRequest};
use serde_json::json;

use crate::options::{Lang, SandboxArgs};
use crate::render::{self, Renderer};
use sandcell_api::volumes::MountInput;

/// Arguments of `sandcell run`.
#[derive(Debug, Args)]
#[command(
    after_help = "CODE runs in a language kernel (the same one `repl` and the API use); `-- COMMAND` runs a\nprocess directly.\n\nExamples:\n  sandcell run 'print(6*7)'\n  sandcell run --lang node 'console.log(process.version)'\n  sandcell run --json 'import matplotlib.pyplot as plt; plt.plot([1, 2, 3])'\n  sandcell run --memory 64m --timeout 5 -- python3 -c 'print(1)'"
)]
pub struct RunArgs {
    /// Language of CODE.
    #[arg(long, value_enum, default_value = "python")]
    lang: Lang,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Forward this process's standard input to the command (with `-- COMMAND`).
    #[arg(short = 'i', long)]
    stdin: bool,
    /// Print one JSON object (output, result, timings, isolation) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Do not print the status line.
    #[arg(short, long)]
    quiet: bool,
    /// Run in a repository folder: its template is built (once) from its dependency files,
    /// then the command runs with the folder at /workspace (read-only below an overlay: writes
    /// go to a scratch layer) and the network off.
    #[arg(long, value_name = "DIR", conflicts_with = "template")]
    workspace: Option<PathBuf>,
    /// With --workspace: `tests-only` (the test runner and declared test dependencies; the
    /// default), `dev` (the project's own install) or a command run in a copy of the folder.
    #[arg(long, value_name = "tests-only|dev|CMD", requires = "workspace")]
    setup: Option<String>,
    /// Where images from CODE are saved (default: a new folder under the temp dir).
    #[arg(long, value_name = "DIR")]
    image_dir: Option<PathBuf>,
    /// Code in --lang.
    #[arg(conflicts_with = "command")]
    code: Option<String>,
    /// A command and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

/// What `run` runs.
enum Job {
    /// A process, through exec.
    Command(ExecRequest),
    /// Code in a kernel.
    Code {
        language: Language,
        code: String,
        timeout_ms: Option<u64>,
        cwd: Option<String>,
    },
}

impl RunArgs {
    fn job(&self) -> anyhow::Result<Job> {
        let timeout_ms = self.sandbox.timeout_ms()?;
        match (&self.code, self.command.is_empty()) {
            (Some(code), true) => {
                if self.stdin {
                    bail!("-i forwards stdin to `-- COMMAND`; CODE runs in a kernel without it");
                }
                Ok(Job::Code {
                    language: self.lang.language(),
                    code: code.clone(),
                    timeout_ms,
                    cwd: self.sandbox.cwd.clone(),
                })
            }
            (None, false) => {
                let mut req = ExecRequest::argv(self.command.clone());
                req.cwd = self.sandbox.cwd.clone();
                req.stdin = self.stdin;
                req.timeout_ms = timeout_ms;
                Ok(Job::Command(req))
            }
            (None, true) => bail!("nothing to run: give CODE or `-- COMMAND [ARGS…]`"),
            (Some(_), false) => bail!("give either CODE or `-- COMMAND`, not both"),
        }
    }
}

/// A validated `sandcell run`: what to run, in what.
pub struct Prepared {
    /// The sandbox's id, chosen before it exists.
    pub id: String,
    job: Job,
    /// The sandbox's spec.
    pub spec: SandboxSpec,
}

/// Validates the arguments before anything starts.
pub fn prepare(args: &RunArgs) -> anyhow::Result<Prepared> {
    let job = args.job()?;
    let mut spec = match &args.workspace {
        Some(dir) => workspace_spec(args, dir)?,
        None => args.sandbox.spec()?,
    };
    if let Job::Code {
        language,
        cwd: None,
        ..
    } = &job
    {
        // Its kernel starts while the sandbox is being created.
        spec.warm_kernels = vec![*language];
    }
    spec.validate()?;
    Ok(Prepared {
        id: sandcell_engine::new_sandbox_id(),
        job,
        spec,
    })
}

/// The spec of a `--workspace` run: the folder's template, the folder under an overlay at
/// `/workspace`, the network off (unless --network chose another).
fn workspace_spec(args: &RunArgs, dir: &std::path::Path) -> anyhow::Result<SandboxSpec> {
    let dir =
        std::fs::canonicalize(dir).with_context(|| format!("--workspace '{}'", dir.display()))?;
    if !dir.is_dir() {
        bail!("--workspace '{}' is not a folder", dir.display());
    }
    let setup: sandcell_template::workspace::Setup =
        args.setup.as_deref().unwrap_or("tests-only").parse()?;
    let home = sandcell_service::config::default_home();
    let template = crate::workspace::template_for(&dir, &setup, &home)?;
    let mut spec = args.sandbox.spec_on(Some(&template))?;
    spec.mounts
        .extend(crate::options::local_mounts(&[MountInput {
            host_path: Some(dir.display().to_string()),
            volume: None,
            path: "/workspace".into(),
            mode: Some(sandcell_engine::MountMode::Overlay),
        }])?);
    if args.sandbox.network == sandcell_engine::NetworkPolicy::Loopback {
        spec.network = sandcell_engine::NetworkPolicy::Off;
    }
    Ok(spec)
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `sandcell run`.
pub async fn run(args: RunArgs, prepared: Prepared, engine: Engine) -> anyhow::Result<ExitCode> {
    let Prepared { id, job, spec } = prepared;
    let req = match job {
        Job::Command(req) => req,
        Job::Code {
            language,
            code,
            timeout_ms,
            cwd,
        } => {
            let code = CodeJob {
                language,
                code,
                timeout_ms,
                cwd,
            };
            return run_code(args, id, spec, code, engine).await;
        }
    };
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

struct CodeJob {
    language: Language,
    code: String,
    timeout_ms: Option<u64>,
    cwd: Option<String>,
}

/// `run CODE`: the code in a kernel of a fresh sandbox.
async fn run_code(
    args: RunArgs,
    id: String,
    spec: SandboxSpec,
    job: CodeJob,
    engine: Engine,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let sandbox = engine
        .create_with_id(id, spec)
        .await
        .context("create the sandbox")?;
    let outcome = code_in(&sandbox, &args, job, start).await;
    sandbox.kill();
    outcome
}

async fn code_in(
    sandbox: &sandcell_engine::Sandbox,
    args: &RunArgs,
    job: CodeJob,
    start: Instant,
) -> anyhow::Result<ExitCode> {
    // --cwd needs a context of its own (the default one starts in /workspace).
    let context = match job.cwd {
        None => None,
        Some(cwd) => {
            let ctx = sandbox
                .create_context(job.language, Some(cwd), Default::default())
                .await
                .context("start the kernel")?;
            Some(ctx.id)
        }
    };
    let req = RunCodeRequest {
        context,
        language: Some(job.language),
        code: job.code,
        timeout_ms: job.timeout_ms,
    };
    let created = start.elapsed();
    let stream = sandbox.run_code_stream(req).await.context("run the code")?;
    if args.json {
        let run = stream.collect().await.context("run the code")?;
        let total = start.elapsed();
        let out = json!({
            "sandbox_id": sandbox.id(),
            "language": job.language,
            "stdout": run.stdout,
            "stderr": run.stderr,
            "outputs": run.outputs,
            "result": run.result(),
            "error": run.error,
            "done": run.done,
            "timings": {"create_ms": ms(created), "run_ms": ms(total - created), "total_ms": ms(total)},
            "isolation": sandbox.isolation(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::from(render::exit_status(&run.done)));
    }
    let dir = args
        .image_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("sandcell-{}", sandbox.id())));
    let mut renderer = Renderer::new(dir);
    let mut stream = stream;
    let mut done = None;
    while let Some(event) = stream.next().await {
        let event = event.context("run the code")?;
        renderer.event(&event)?;
        if let CodeEvent::Done(d) = event {
            done = Some(d);
        }
    }
    let done = done.context("the execution ended without a done event")?;
    let total = start.elapsed();
    if !args.quiet {
        let status = match (&done.crash, done.status) {
            (Some(why), _) => format!("kernel died: {why}"),
            (None, s) => s.as_str().to_string(),
        };
        eprintln!(
            "sandcell: {status} · {} · create {:.1} ms · run {:.1} ms · total {:.1} ms",
            job.language,
            ms(created),
            ms(total - created),
            ms(total)
        );
    }
    Ok(ExitCode::from(render::exit_status(&done)))
}
