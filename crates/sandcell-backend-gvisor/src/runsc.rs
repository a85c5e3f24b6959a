//! Running `runsc`: one command per operation, always with the same global flags, stdin
//! from `/dev/null` unless it carries the agent's connection (a `runsc` that inherits a
//! terminal or pipe as stdin can hand it to the sandbox).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

/// How to invoke `runsc`.
#[derive(Debug, Clone)]
pub struct Runsc {
    /// The `runsc` executable.
    pub program: PathBuf,
    /// Its state folder (`--root`).
    pub root: PathBuf,
    /// `--platform` (ptrace works on these hosts; kvm needs usable hardware virtualization).
    pub platform: String,
    /// Write runsc's debug logs into this folder.
    pub debug_log: Option<PathBuf>,
    /// Let the sandbox connect to host Unix sockets bound into it (its egress proxy's): only
    /// for sandboxes with egress, the others keep gVisor's default.
    pub host_uds: bool,
}

/// What `runsc state` says about a container.
#[derive(Debug, Clone, Deserialize)]
pub struct State {
    /// `created`, `running`, `paused` or `stopped`.
    pub status: String,
    /// The sandbox's process on the host (gVisor's kernel).
    pub pid: i32,
}

impl Runsc {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.arg("--root")
            .arg(&self.root)
            .arg("--network=none")
            .arg(format!("--platform={}", self.platform));
        if self.host_uds {
            c.arg("--host-uds=open");
        }
        if let Some(dir) = &self.debug_log {
            c.arg("--debug")
                .arg(format!("--debug-log={}/", dir.display()));
        }
        c.stdin(Stdio::null());
        c
    }

    /// Runs `runsc <args>`; its stderr's last lines on failure.
    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("run {}: {e}", self.program.display()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(last_lines(&String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// Starts (or, with `image`, restores) container `id` from `bundle`, detached, with
    /// `agent` as its stdin, `control` as its stdout (the agent's control channel) and `log`
    /// as its stderr; returns once it runs.
    pub fn start(
        &self,
        id: &str,
        bundle: &Path,
        image: Option<&Path>,
        agent: UnixStream,
        control: UnixStream,
        log: &Path,
    ) -> Result<(), String> {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("open {}: {e}", log.display()))?;
        let mut c = self.command();
        match image {
            Some(image) => c.arg("restore").arg("--image-path").arg(image),
            None => c.arg("run"),
        };
        let status = c
            .arg("-detach")
            .arg("-bundle")
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(agent)))
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(control)))
            .stderr(Stdio::from(err))
            .status()
            .map_err(|e| format!("run {}: {e}", self.program.display()))?;
        if status.success() {
            Ok(())
        } else {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            Err(last_lines(&text))
        }
    }

    /// `runsc state <id>`.
    pub fn state(&self, id: &str) -> Result<State, String> {
        let out = self.run(&["state", id])?;
        serde_json::from_str(&out).map_err(|e| format!("unreadable runsc state: {e}"))
    }

    /// Ends container `id` and removes what runsc keeps of it (quietly, if it is gone).
    pub fn delete(&self, id: &str) -> Result<(), String> {
        match self.run(&["delete", "-force", id]) {
            Ok(_) => Ok(()),
            Err(e) if e.contains("does not exist") || e.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The last few non-empty lines of a command's output (what explains a failure).
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("gvisor.dev/") && !l.starts_with("github.com/"))
        .collect();
    let start = lines.len().saturating_sub(3);
    let tail = lines[start..].join(" | ");
    if tail.is_empty() {
        "runsc failed without saying why".into()
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_explained_by_their_last_lines() {
        let text = "W1124 boot\nrestoring: bad image\n\tgvisor.dev/gvisor/pkg/x.go:1\n";
        assert_eq!(last_lines(text), "W1124 boot | restoring: bad image");
        assert_eq!(last_lines(""), "runsc failed without saying why");
    }
}
