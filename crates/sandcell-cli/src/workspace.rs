//! `sandcell run --workspace DIR`: a repository's tests in isolation. Its template is planned
//! from the folder's dependency files (`sandcell_template::workspace`) and built once, then
//! found by the digest of its inputs; the command runs with the folder mounted at
//! `/workspace` under an overlay (it reads the folder, its writes go to a scratch layer) and
//! the network off.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use sandcell_template::workspace::{self, Setup, TemplateName};

/// Folders never copied into a build: what tools make, not the project.
const SKIPPED: [&str; 9] = [
    ".git",
    ".hg",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".tox",
];

/// The template for `dir` prepared per `setup`: built now (its progress on stderr) unless a
/// build of the same inputs is in the home's store. Returns its name.
pub fn template_for(dir: &Path, setup: &Setup, home: &Path) -> anyhow::Result<String> {
    let mut deps = BTreeMap::new();
    collect(dir, dir, &mut |relative, path| {
        if workspace::is_dependency_file(relative) {
            let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
            deps.insert(relative.to_string(), bytes);
        }
        Ok(())
    })?;
    let plan = workspace::plan(&deps, setup)?;
    for line in &plan.found {
        eprintln!("workspace: {line}");
    }
    let scratch = home
        .join("builds")
        .join("contexts")
        .join(format!("workspace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let context = scratch.join("context");
    std::fs::create_dir_all(&context).with_context(|| format!("create {}", context.display()))?;
    let result = build(dir, &plan, &scratch, &context, home);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn build(
    dir: &Path,
    plan: &workspace::WorkspacePlan,
    scratch: &Path,
    context: &Path,
    home: &Path,
) -> anyhow::Result<String> {
    let mut name = TemplateName::default();
    let mut write = |relative: &str, bytes: &[u8]| -> anyhow::Result<()> {
        name.add(relative, bytes);
        let to = context.join(relative);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&to, bytes).with_context(|| format!("write {}", to.display()))
    };
    match &plan.context {
        Some(files) => {
            for (relative, bytes) in files {
                write(relative, bytes)?;
            }
        }
        None => collect(dir, dir, &mut |relative, path| {
            let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
            write(relative, &bytes)
        })?,
    }
    let name = name.finish(&plan.dockerfile);
    let store = sandcell_image::Store::open(home.join("images"))?;
    if store.lookup(&name)?.is_some() {
        eprintln!("workspace: template {name} (built before from the same files)");
        return Ok(name);
    }
    let dockerfile = scratch.join("Dockerfile");
    std::fs::write(&dockerfile, &plan.dockerfile)?;
    eprintln!("workspace: building template {name}");
    let exe = std::env::current_exe().context("find the sandcell binary")?;
    // The build's progress goes to stderr: stdout is the command's.
    let stderr = std::io::stderr().as_fd().try_clone_to_owned()?;
    let status = Command::new(exe)
        .args(["template", "build", "--local", "-t", &name, "-f"])
        .arg(&dockerfile)
        .arg(context)
        .env("SANDCELL_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::from(stderr))
        .status()
        .context("run the workspace's build")?;
    if !status.success() {
        bail!(
            "the workspace's template did not build (exit status {}); its log is above",
            status.code().unwrap_or(1)
        );
    }
    Ok(name)
}

/// Calls `each(relative path, path)` for every regular file under `dir` (links and the
/// [`SKIPPED`] folders left out).
fn collect(
    root: &Path,
    dir: &Path,
    each: &mut dyn FnMut(&str, &Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path: PathBuf = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if SKIPPED.iter().any(|s| entry.file_name() == *s) {
                continue;
            }
            collect(root, &path, each)?;
        } else if kind.is_file() {
            let relative = path
                .strip_prefix(root)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            each(&relative, &path)?;
        }
    }
    Ok(())
}
