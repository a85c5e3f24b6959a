//! The fake git repository: a bare repository made with the `git` CLI and served as static
//! files (git's "dumb" HTTP protocol), so no git server code is needed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The text of `README.md` on `main` (and `dev`).
pub const README_TEXT: &str = "fake repository\n";
/// The file only `dev` has, and its text.
pub const DEV_FILE: (&str, &str) = ("DEV.md", "dev branch\n");

/// Why the repository could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// `git` could not be started (other than its absence, which is not an error).
    #[error("cannot run git {step}: {source}")]
    Spawn {
        /// The git subcommand.
        step: String,
        /// The reason.
        source: std::io::Error,
    },
    /// `git` ran and failed.
    #[error("git {step} failed ({status}): {stderr}")]
    Failed {
        /// The git subcommand.
        step: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// Makes `<parent>/repo.git`: `main` with one commit (`README.md`), `dev` with one more
/// (`DEV.md`), HEAD on `main`, and the info files dumb HTTP clients read. `None` when `git`
/// is not installed: the rest of the fake registries still work.
pub(crate) fn make_repository(parent: &Path) -> Result<Option<PathBuf>, GitError> {
    let repo = parent.join("repo.git");
    let git = Git {
        repo: repo.clone(),
        home: parent.to_path_buf(),
    };
    match git.run_init() {
        Ok(()) => {}
        Err(GitError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    }
    let readme = git.run("hash-object", &["-w", "--stdin"], Some(README_TEXT))?;
    let tree_main = git.run(
        "mktree",
        &[],
        Some(&format!("100644 blob {readme}\tREADME.md\n")),
    )?;
    let main = git.run(
        "commit-tree",
        &[&tree_main, "-m", "A fake repository"],
        None,
    )?;
    let dev_blob = git.run("hash-object", &["-w", "--stdin"], Some(DEV_FILE.1))?;
    // mktree wants its entries sorted by name: DEV.md before README.md.
    let tree_dev = git.run(
        "mktree",
        &[],
        Some(&format!(
            "100644 blob {dev_blob}\t{}\n100644 blob {readme}\tREADME.md\n",
            DEV_FILE.0
        )),
    )?;
    let dev = git.run(
        "commit-tree",
        &[&tree_dev, "-p", &main, "-m", "The dev branch"],
        None,
    )?;
    git.run("update-ref", &["refs/heads/main", &main], None)?;
    git.run("update-ref", &["refs/heads/dev", &dev], None)?;
    git.run("symbolic-ref", &["HEAD", "refs/heads/main"], None)?;
    git.run("update-server-info", &[], None)?;
    Ok(Some(repo))
}

/// `git` pinned to one repository, with none of the host's configuration or identity.
struct Git {
    repo: PathBuf,
    home: PathBuf,
}

impl Git {
    fn command(&self) -> Command {
        let mut cmd = Command::new("git");
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            // No system or user configuration (hooks, signing, templates) can change the
            // result; a fixed identity and date make the same commits every run.
            .env("HOME", &self.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "Sandcell tests")
            .env("GIT_AUTHOR_EMAIL", "tests@sandcell.invalid")
            .env("GIT_COMMITTER_NAME", "Sandcell tests")
            .env("GIT_COMMITTER_EMAIL", "tests@sandcell.invalid")
            .env("GIT_AUTHOR_DATE", "2001-09-09T01:46:40Z")
            .env("GIT_COMMITTER_DATE", "2001-09-09T01:46:40Z")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn run_init(&self) -> Result<(), GitError> {
        let mut cmd = self.command();
        cmd.arg("init").arg("--quiet").arg("--bare").arg(&self.repo);
        output("init", cmd, None).map(|_| ())
    }

    /// Runs `git --git-dir=<repo> <step> <args>` and returns its stdout, trimmed.
    fn run(&self, step: &str, args: &[&str], stdin: Option<&str>) -> Result<String, GitError> {
        let mut cmd = self.command();
        cmd.arg("--git-dir").arg(&self.repo).arg(step).args(args);
        output(step, cmd, stdin)
    }
}

fn output(step: &str, mut cmd: Command, stdin: Option<&str>) -> Result<String, GitError> {
    let spawn_error = |source| GitError::Spawn {
        step: step.to_string(),
        source,
    };
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().map_err(spawn_error)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Tiny inputs: the write cannot fill the pipe while git waits to write its output.
        pipe.write_all(text.as_bytes()).map_err(spawn_error)?;
    }
    let out = child.wait_with_output().map_err(spawn_error)?;
    if !out.status.success() {
        return Err(GitError::Failed {
            step: step.to_string(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Every file under `repo`, by its path inside it with `/` separators: what the server
/// answers `/repo.git/<path>` with. Read once, so serving touches no file system and no
/// request path can reach outside the repository.
pub(crate) fn read_files(repo: &Path) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![repo.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                let Ok(relative) = path.strip_prefix(repo) else {
                    continue;
                };
                let key = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                files.insert(key, std::fs::read(&path)?);
            }
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_has_both_branches_and_the_dumb_http_files() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let Some(repo) = make_repository(dir.path()).expect("the repository") else {
            crate::skip!("git not installed");
        };
        let refs = std::fs::read_to_string(repo.join("info/refs")).expect("info/refs");
        assert!(refs.contains("refs/heads/main"), "{refs}");
        assert!(refs.contains("refs/heads/dev"), "{refs}");
        let head = std::fs::read_to_string(repo.join("HEAD")).expect("HEAD");
        assert_eq!(head.trim(), "ref: refs/heads/main");
        let git = Git {
            repo: repo.clone(),
            home: dir.path().to_path_buf(),
        };
        let files = read_files(&repo).expect("the files");
        assert!(files.contains_key("info/refs"));
        assert!(files.contains_key("objects/info/packs"));
        assert!(
            files
                .keys()
                .any(|k| k.starts_with("objects/") && k.len() == 8 + 2 + 1 + 38)
        );
        let readme = git.run("show", &["main:README.md"], None).expect("show");
        assert_eq!(format!("{readme}\n"), README_TEXT);
        let dev = git.run("show", &["dev:DEV.md"], None).expect("show");
        assert_eq!(format!("{dev}\n"), DEV_FILE.1);
    }
}
