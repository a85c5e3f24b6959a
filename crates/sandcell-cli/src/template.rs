//! `sandcell template`: build templates from a Dockerfile and a context folder, list, show
//! and remove them. Through the daemon when one runs on the home (or `--url` names one),
//! else in this process on the home's image store: the same builder either way.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use sandcell_api::templates::{BuildEvent, BuildState, StartBuild, TemplateInfo};
use sandcell_build::BuildError;
use sandcell_build::builder::{BuildRequest, Builder, BuilderConfig, Cancel};

use crate::agent::{DaemonArgs, daemon_client};
use crate::image::{ImageArgs, human};

/// `sandcell template`.
#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Build a template from a Dockerfile: each step in a build sandbox, its changes a cached
    /// layer; progress and the steps' output are shown live. Exits with the failing step's
    /// exit code.
    Build(BuildArgs),
    /// List the templates (the images of the store, built or imported).
    Ls {
        #[command(flatten)]
        daemon: DaemonArgs,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Show a template: digest, layers, size, kernels, environment, sandboxes on it.
    Inspect {
        /// Its name.
        name: String,
        #[command(flatten)]
        daemon: DaemonArgs,
        #[command(flatten)]
        args: ImageArgs,
    },
    /// Remove a template (refused while sandboxes run on it); its layers go at the next
    /// `sandcell image prune`.
    Rm {
        /// Its name.
        name: String,
        #[command(flatten)]
        daemon: DaemonArgs,
        #[command(flatten)]
        args: ImageArgs,
    },
}

/// `sandcell template build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The build context: the folder `COPY` and `ADD` read (none with --builtin).
    pub context: Option<PathBuf>,
    /// The Dockerfile (default: `CONTEXT/Dockerfile`).
    /// A template file (`*.toml`: its Dockerfile inline or in the context, the defaults of
    /// its sandboxes, its warm strategy) is read as one.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Build a built-in template: python-data-analysis, cpp-algorithm, go-algorithm, node,
    /// web-tools.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["context", "file"])]
    pub builtin: Option<String>,
    /// The network of the template's sandboxes (over the template file's): `off`,
    /// `loopback`, `full` or `allow:HOST[,HOST…]` (web-tools needs it).
    #[arg(long, value_name = "POLICY")]
    pub sandbox_network: Option<sandcell_api::network::NetworkPolicy>,
    /// The template's name (`name[:tag]`; default: the template file's or built-in's name).
    #[arg(short = 't', long)]
    pub name: Option<String>,
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
    /// Build in this process even when a daemon runs.
    #[arg(long)]
    pub local: bool,
    #[command(flatten)]
    pub daemon: DaemonArgs,
    #[command(flatten)]
    pub args: ImageArgs,
}

/// Runs a `template` command.
pub fn template(command: TemplateCommand) -> anyhow::Result<ExitCode> {
    match command {
        TemplateCommand::Build(build) => {
            let daemon = if build.local {
                None
            } else {
                daemon_client(&build.daemon, &build.args.config)?
            };
            match daemon {
                Some(client) => build_through(client, build),
                None => build_template(build),
            }
        }
        TemplateCommand::Ls { daemon, args } => {
            let list = match daemon_client(&daemon, &args.config)? {
                Some(client) => runtime()?.block_on(client.templates())?.templates,
                None => local_templates(&args)?,
            };
            if args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|t| {
                        vec![
                            t.name.clone(),
                            short(&t.digest),
                            t.layers.to_string(),
                            human(t.size),
                            if t.kernels.is_empty() {
                                "-".into()
                            } else {
                                t.kernels.join(",")
                            },
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    crate::render::table(&["NAME", "DIGEST", "LAYERS", "SIZE", "KERNELS"], &rows)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        TemplateCommand::Inspect { name, daemon, args } => {
            let info = match daemon_client(&daemon, &args.config)? {
                Some(client) => runtime()?.block_on(client.template(&name))?,
                None => local_templates(&args)?
                    .into_iter()
                    .find(|t| t.name == name || t.name == format!("{name}:latest"))
                    .with_context(|| format!("no template '{name}' (sandcell template ls)"))?,
            };
            println!("{}", serde_json::to_string_pretty(&info)?);
            Ok(ExitCode::SUCCESS)
        }
        TemplateCommand::Rm { name, daemon, args } => {
            match daemon_client(&daemon, &args.config)? {
                Some(client) => runtime()?.block_on(client.delete_template(&name))?,
                None => {
                    let store = sandcell_image::Store::open(args.config.home().join("images"))?;
                    let image = store
                        .lookup(&name)?
                        .with_context(|| format!("no template '{name}' (sandcell template ls)"))?;
                    store.untag(&image.reference)?;
                }
            }
            if !args.json {
                println!("removed {name}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")
}

/// The templates of the home's store, read in this process (no daemon: none runs on them).
fn local_templates(args: &ImageArgs) -> anyhow::Result<Vec<TemplateInfo>> {
    let store = sandcell_image::Store::open(args.config.home().join("images"))?;
    let mut out = Vec::new();
    for name in store.references()? {
        let Some(image) = store.image(&name)? else {
            continue;
        };
        out.push(sandcell_service::templates::template_info(&image, 0));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A build through the daemon: the context packed and sent, the log followed live.
fn build_through(client: sandcell_client::Client, b: BuildArgs) -> anyhow::Result<ExitCode> {
    let what = what_to_build(&b)?;
    let mut req = StartBuild {
        name: what.name.clone(),
        build_args: parse_build_args(&b.build_args)?,
        no_cache: b.no_cache,
        allow_hosts: b.allow.clone(),
        offline: b.offline,
        sandbox_network: b.sandbox_network.clone(),
        ..StartBuild::default()
    };
    match &what.form {
        Form::Builtin(name) => req.builtin = Some(name.clone()),
        Form::TemplateFile(text) => req.spec = Some(text.clone()),
        Form::Dockerfile(text) => req.dockerfile = text.clone(),
    }
    if let Some(dir) = &b.context {
        req.context = Some(pack_context(dir)?);
    }
    let json = b.args.json;
    let info = runtime()?.block_on(async move {
        let started = client.start_build(&req).await?;
        let mut events = client.follow_build(&started.id, 0).await?;
        let mut view = Progress::default();
        while let Some(event) = events.next().await {
            let event = event?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&event.event).unwrap_or_default()
                );
            } else {
                view.show(&event.event);
            }
        }
        anyhow::Ok(client.build(&started.id).await?)
    })?;
    match info.state {
        BuildState::Succeeded => {
            if let (Some(image), false) = (&info.image, json) {
                print_built(image);
            }
            Ok(ExitCode::SUCCESS)
        }
        BuildState::Cancelled => {
            eprintln!("sandcell: the build was cancelled");
            Ok(ExitCode::from(130))
        }
        _ => {
            eprintln!(
                "sandcell: {}",
                info.error
                    .clone()
                    .unwrap_or_else(|| "the build failed".into())
            );
            let code = info.exit_code.unwrap_or(1);
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1).max(1)))
        }
    }
}

/// A folder removed when dropped.
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What `sandcell template build` was asked to build.
struct WhatToBuild {
    name: String,
    form: Form,
}

enum Form {
    Builtin(String),
    /// A template file's text.
    TemplateFile(String),
    /// A Dockerfile's text.
    Dockerfile(String),
}

fn what_to_build(b: &BuildArgs) -> anyhow::Result<WhatToBuild> {
    let (form, file_name) = if let Some(name) = &b.builtin {
        let builtin = sandcell_template::builtin::builtin(name)?;
        (Form::Builtin(name.clone()), Some(builtin.name.to_string()))
    } else {
        let context = b
            .context
            .as_ref()
            .context("give the build context folder (or --builtin NAME)")?;
        let file = b.file.clone().unwrap_or_else(|| context.join("Dockerfile"));
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        if file.extension().is_some_and(|e| e == "toml") {
            let parsed = sandcell_template::TemplateFile::parse(&text)?;
            (Form::TemplateFile(text), parsed.name)
        } else {
            (Form::Dockerfile(text), None)
        }
    };
    let name = b
        .name
        .clone()
        .or(file_name)
        .context("give the template's name: -t NAME[:TAG]")?;
    Ok(WhatToBuild { name, form })
}

/// The context folder as a gzip tar, base64-encoded, without what its `.dockerignore` leaves
/// out (the file itself is sent: the daemon applies it to every copy too).
fn pack_context(dir: &std::path::Path) -> anyhow::Result<String> {
    use base64::Engine as _;
    let ignore = sandcell_build::ignore::ContextIgnore::read(dir)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    {
        let mut tar = tar::Builder::new(&mut gz);
        tar.follow_symlinks(false);
        add_kept(&mut tar, dir, std::path::Path::new(""), &ignore)
            .with_context(|| format!("pack the build context {}", dir.display()))?;
        tar.finish().context("pack the build context")?;
    }
    let bytes = gz.finish().context("pack the build context")?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Adds the entries of `root/rel` that `ignore` keeps, folders before their contents.
fn add_kept<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    root: &std::path::Path,
    rel: &std::path::Path,
    ignore: &sandcell_build::ignore::ContextIgnore,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(rel))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = rel.join(entry.file_name());
        let folder = entry.file_type()?.is_dir();
        let name = path.to_string_lossy();
        if name != sandcell_build::ignore::FILE_NAME && !ignore.keeps(&name, folder) {
            continue;
        }
        tar.append_path_with_name(entry.path(), &path)?;
        if folder {
            add_kept(tar, root, &path, ignore)?;
        }
    }
    Ok(())
}

fn parse_build_args(args: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for a in args {
        let (k, v) = a
            .split_once('=')
            .with_context(|| format!("--build-arg {a}: expected NAME=VALUE"))?;
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

fn print_built(image: &sandcell_api::templates::BuiltImage) {
    println!(
        "built {} ({}, {} layers, kernels: {})",
        image.reference,
        short(&image.digest),
        image.layers,
        if image.kernels.is_empty() {
            "none".to_string()
        } else {
            image.kernels.join(", ")
        }
    );
}

fn build_template(b: BuildArgs) -> anyhow::Result<ExitCode> {
    let what = what_to_build(&b)?;
    let helper = std::env::current_exe().context("find the sandcell binary")?;
    let builder = Builder::new(BuilderConfig::for_home(&b.args.config.home(), helper));
    // A built-in's context is written into a folder of its own, removed after.
    let scratch = ScratchDir(
        b.args
            .config
            .home()
            .join("builds")
            .join("contexts")
            .join(format!("cli-{}", std::process::id())),
    );
    let context = match &b.context {
        Some(dir) => dir.clone(),
        None => {
            let _ = std::fs::remove_dir_all(&scratch.0);
            std::fs::create_dir_all(&scratch.0)
                .with_context(|| format!("create {}", scratch.0.display()))?;
            scratch.0.clone()
        }
    };
    let network = match &b.sandbox_network {
        Some(n) => Some(serde_json::to_value(n)?),
        None => None,
    };
    let source = match &what.form {
        Form::Builtin(name) => sandcell_build::source::from_builtin(name, &context, network)?,
        Form::TemplateFile(text) => {
            sandcell_build::source::from_template_file(text, &context, network)?
        }
        Form::Dockerfile(text) => sandcell_build::source::Source {
            dockerfile: text.clone(),
            ..Default::default()
        },
    };
    let mut build_args = source.build_args;
    build_args.extend(parse_build_args(&b.build_args)?);
    let request = BuildRequest {
        name: what.name.clone(),
        dockerfile: source.dockerfile,
        context,
        build_args,
        no_cache: b.no_cache,
        allow_hosts: b.allow.clone(),
        offline: b.offline,
        defaults: source.defaults,
    };
    let rt = runtime()?;
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
                print_built(&image);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_sent_leaves_out_what_dockerignore_says() {
        use base64::Engine as _;
        use std::io::Read;
        let ctx = tempfile::tempdir().unwrap();
        let c = ctx.path();
        std::fs::create_dir_all(c.join("node_modules/pkg")).unwrap();
        std::fs::create_dir_all(c.join("src")).unwrap();
        std::fs::write(c.join("node_modules/pkg/big.js"), "x").unwrap();
        std::fs::write(c.join("src/app.py"), "a").unwrap();
        std::fs::write(c.join("src/app.pyc"), "c").unwrap();
        std::fs::write(
            c.join(".dockerignore"),
            "node_modules\n**/*.pyc\n.dockerignore\n",
        )
        .unwrap();
        let packed = base64::engine::general_purpose::STANDARD
            .decode(pack_context(c).unwrap())
            .unwrap();
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&packed[..]));
        let mut names: Vec<String> = tar
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut body = Vec::new();
                e.read_to_end(&mut body).unwrap();
                e.path()
                    .unwrap()
                    .to_string_lossy()
                    .trim_end_matches('/')
                    .to_string()
            })
            .collect();
        names.sort();
        assert_eq!(names, [".dockerignore", "src", "src/app.py"]);
    }
}
