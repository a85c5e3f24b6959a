//! `sandcell template`: build templates from a Dockerfile and a context folder into the
//! home's image store, in this process (builds through a running daemon come with its REST
//! API for them).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use sandcell_api::templates::{BuildEvent, BuildState};
use sandcell_build::BuildError;
use sandcell_build::builder::{BuildRequest, Builder, BuilderConfig, Cancel};

use crate::image::ImageArgs;

/// `sandcell template`.
#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Build a template from a Dockerfile: each step in a build sandbox, its changes a cached
    /// layer; progress and the steps' output are shown live. Exits with the failing step's
    /// exit code.
    Build(BuildArgs),
}

/// `sandcell template build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The build context: the folder `COPY` and `ADD` read.
    pub context: PathBuf,
    /// The Dockerfile (default: `CONTEXT/Dockerfile`).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The template's name (`name[:tag]`).
    #[arg(short = 't', long)]
    pub name: String,
    /// Run every step, even those whose layer is cached.
    #[arg(long)]
    pub no_cache: bool,
    /// A build argument, `NAME=VALUE` (repeatable).
    #[arg(long = "build-arg", value_name = "NAME=VALUE")]
    pub build_args: Vec<String>,
    /// A host `RUN` steps may reach besides the machine's package registries (repeatable).
    #[arg(long = "allow", value_name = "HOST")]
    pub allow: Vec<String>,
    /// No network for `RUN` steps, not even the registries.
    #[arg(long)]
    pub offline: bool,
    #[command(flatten)]
    pub args: ImageArgs,
}

/// Runs a `template` command.
pub fn template(command: TemplateCommand) -> anyhow::Result<ExitCode> {
    match command {
        TemplateCommand::Build(build) => build_template(build),
    }
}

fn build_template(b: BuildArgs) -> anyhow::Result<ExitCode> {
    let file = b
        .file
        .clone()
        .unwrap_or_else(|| b.context.join("Dockerfile"));
    let dockerfile = std::fs::read_to_string(&file)
        .with_context(|| format!("read the Dockerfile {}", file.display()))?;
    let mut build_args = BTreeMap::new();
    for a in &b.build_args {
        let (k, v) = a
            .split_once('=')
            .with_context(|| format!("--build-arg {a}: expected NAME=VALUE"))?;
        build_args.insert(k.to_string(), v.to_string());
    }
    let helper = std::env::current_exe().context("find the sandcell binary")?;
    let builder = Builder::new(BuilderConfig::for_home(&b.args.config.home(), helper));
    let request = BuildRequest {
        name: b.name.clone(),
        dockerfile,
        context: b.context.clone(),
        build_args,
        no_cache: b.no_cache,
        allow_hosts: b.allow.clone(),
        offline: b.offline,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let json = b.args.json;
    let result = rt.block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = Cancel::default();
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_signal.cancel();
            }
        });
        let build = tokio::spawn(async move { builder.build(request, tx, cancel).await });
        let mut view = Progress::default();
        while let Some(event) = rx.recv().await {
            if json {
                println!("{}", serde_json::to_string(&event).unwrap_or_default());
            } else {
                view.show(&event);
            }
        }
        build
            .await
            .context("the build task")?
            .map_err(anyhow::Error::from)
    });
    match result {
        Ok(image) => {
            if !json {
                println!(
                    "built {} ({}, {} layers, kernels: {})",
                    image.reference,
                    &image.digest[..19.min(image.digest.len())],
                    image.layers,
                    if image.kernels.is_empty() {
                        "none".to_string()
                    } else {
                        image.kernels.join(", ")
                    }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => match e.downcast_ref::<BuildError>() {
            Some(BuildError::StepFailed { exit_code, .. }) => {
                eprintln!("sandcell: {e}");
                Ok(ExitCode::from(u8::try_from(*exit_code).unwrap_or(1).max(1)))
            }
            Some(BuildError::Cancelled) => {
                eprintln!("sandcell: {e}");
                Ok(ExitCode::from(130))
            }
            _ => Err(e),
        },
    }
}

/// The human view of a build's events.
#[derive(Default)]
struct Progress {
    at_line_start: bool,
}

impl Progress {
    fn show(&mut self, event: &BuildEvent) {
        let mut out = std::io::stdout().lock();
        match event {
            BuildEvent::Warning { line, message } => {
                let _ = writeln!(out, "warning: line {line}: {message}");
            }
            BuildEvent::Base {
                name,
                digest,
                made_ms,
            } => {
                let made = made_ms
                    .map(|ms| format!(", made now in {:.1} s", ms as f64 / 1000.0))
                    .unwrap_or_default();
                let _ = writeln!(out, "FROM {name} ({}{made})", short(digest));
            }
            BuildEvent::StepStarted {
                index, total, text, ..
            } => {
                let _ = writeln!(out, "[{index}/{total}] {text}");
                self.at_line_start = true;
            }
            BuildEvent::Output { text, .. } => {
                for piece in text.split_inclusive('\n') {
                    if self.at_line_start {
                        let _ = write!(out, "    ");
                    }
                    let _ = write!(out, "{piece}");
                    self.at_line_start = piece.ends_with('\n');
                }
            }
            BuildEvent::Network {
                host,
                port,
                outcome,
                reason,
                ..
            } => {
                if outcome == "denied" {
                    self.newline(&mut out);
                    let _ = writeln!(
                        out,
                        "    network: {host}:{port} denied{}",
                        reason
                            .as_ref()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    );
                }
            }
            BuildEvent::StepFinished { step } => {
                self.newline(&mut out);
                let what = match (&step.layer, step.cached, step.exit_code) {
                    (_, true, _) => format!("cached {}", human(step.size)),
                    (Some(_), false, _) => format!("layer {}", human(step.size)),
                    (None, _, Some(code)) => format!("failed with exit code {code}"),
                    (None, _, None) => "failed".to_string(),
                };
                let _ = writeln!(
                    out,
                    "    {what} · {:.2} s",
                    step.duration_ms as f64 / 1000.0
                );
            }
            BuildEvent::Smoke { kernel, ok, detail } => {
                let mark = if *ok { "starts" } else { "missing" };
                let _ = writeln!(out, "kernel {kernel}: {mark} ({detail})");
            }
            BuildEvent::Finished { state, error } => {
                self.newline(&mut out);
                if *state == BuildState::Failed
                    && let Some(e) = error
                {
                    let _ = writeln!(out, "build failed: {e}");
                }
            }
        }
        let _ = out.flush();
    }

    fn newline(&mut self, out: &mut impl std::io::Write) {
        if !self.at_line_start {
            let _ = writeln!(out);
            self.at_line_start = true;
        }
    }
}

fn short(digest: &str) -> String {
    digest
        .strip_prefix("sha256:")
        .unwrap_or(digest)
        .chars()
        .take(12)
        .collect()
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
