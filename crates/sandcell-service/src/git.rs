//! `git clone` into a sandbox, done on the host: git runs unprivileged, with no hooks, no
//! submodules and only the http(s) transports, through an egress proxy that allows only the
//! repository's host (its connections are the sandbox's egress events); the credentials go
//! to git in its environment and never into the sandbox; the working tree (with `.git`) is
//! copied in as one archive and unpacked there by the sandbox's user.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use sandcell_api::SandboxId;
use sandcell_api::git::{CloneUrl, GitClone, GitCloneResult};
use sandcell_api::network::{HostPattern, HostRule, NetworkPolicy};
use sandcell_egress::Limits;
use sandcell_engine::Sandbox;
use sandcell_protocol::ExecRequest;

use crate::{Caller, Service, ServiceError, ServiceResult};

/// Longest a clone may take.
const CLONE_TIMEOUT: Duration = Duration::from_secs(600);
/// Most bytes a clone may download.
const CLONE_MAX_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// The unprivileged ids git runs as when the service is root (`nobody`).
const NOBODY: u32 = 65534;
/// Where the archive waits in the sandbox while it is unpacked.
const ARCHIVE_IN_SANDBOX: &str = "/tmp/.sandcell-clone.tar";

/// The environment git runs in: nothing of the service's but `PATH` and the TLS trust the
/// operator set (`GIT_SSL_CAINFO`, `SSL_CERT_FILE`, `SSL_CERT_DIR`).
fn git_env(
    home: &Path,
    proxy: &str,
    credentials: Option<&(String, String)>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), home.display().to_string()),
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
        ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
        ("GIT_ASKPASS".into(), "/bin/false".into()),
        ("http_proxy".into(), proxy.into()),
        ("https_proxy".into(), proxy.into()),
        ("HTTPS_PROXY".into(), proxy.into()),
        ("no_proxy".into(), String::new()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    for var in ["GIT_SSL_CAINFO", "SSL_CERT_FILE", "SSL_CERT_DIR"] {
        if let Ok(v) = std::env::var(var) {
            env.push((var.into(), v));
        }
    }
    if let Some((user, pass)) = credentials {
        // Passed as configuration in the environment: not in git's arguments (visible in
        // the process list) nor in the clone's .git/config.
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        env.push(("GIT_CONFIG_COUNT".into(), "1".into()));
        env.push(("GIT_CONFIG_KEY_0".into(), "http.extraHeader".into()));
        env.push((
            "GIT_CONFIG_VALUE_0".into(),
            format!("Authorization: Basic {basic}"),
        ));
    }
    env
}

/// git's arguments for `req` into `dest`: only http(s), no hooks, no submodules, objects
/// checked.
fn git_args(url: &CloneUrl, req: &GitClone, dest: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "-c",
        "protocol.allow=never",
        "-c",
        "protocol.https.allow=always",
        "-c",
        "protocol.http.allow=always",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "transfer.fsckObjects=true",
        "-c",
        "http.followRedirects=false",
        "clone",
        "--no-recurse-submodules",
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(b) = &req.branch {
        args.push("--branch".into());
        args.push(b.clone());
    }
    if let Some(d) = req.depth {
        args.push("--depth".into());
        args.push(d.to_string());
    }
    args.push("--".into());
    args.push(url.url.clone());
    args.push(dest.display().to_string());
    args
}

/// The last lines of git's error output, with the credentials blanked.
fn git_error(stderr: &[u8], credentials: Option<&(String, String)>) -> String {
    let mut text = String::from_utf8_lossy(stderr).trim().to_string();
    if let Some((_, pass)) = credentials
        && !pass.is_empty()
    {
        text = text.replace(pass.as_str(), "***");
    }
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(6)..].join("\n");
    if tail.is_empty() {
        "git said nothing".into()
    } else {
        tail
    }
}

/// Runs git with `args` in `env`, unprivileged when the service is root; its stdout.
async fn run_git(
    args: &[String],
    env: &[(String, String)],
    credentials: Option<&(String, String)>,
    timeout: Duration,
) -> ServiceResult<String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if crate::is_root() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    let child = cmd.spawn().map_err(|e| {
        ServiceError::new(
            crate::ErrorKind::Unsupported,
            format!("git cannot run on this host: {e}"),
        )
    })?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| {
            ServiceError::invalid(format!(
                "the clone took longer than {} s and was stopped",
                timeout.as_secs()
            ))
        })?
        .map_err(|e| ServiceError::internal(format!("wait for git: {e}")))?;
    if !out.status.success() {
        return Err(ServiceError::invalid(format!(
            "the repository could not be cloned: {}",
            git_error(&out.stderr, credentials)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Writes `dir` (the clone) as a tar archive; its file count and bytes.
fn archive(dir: &Path, out: &Path) -> std::io::Result<(u64, u64)> {
    let file = std::fs::File::create(out)?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(file));
    builder.follow_symlinks(false);
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            let meta = entry.path().symlink_metadata()?;
            if meta.is_dir() {
                builder.append_dir(&rel, entry.path())?;
                stack.push(rel);
            } else {
                if meta.is_file() {
                    files += 1;
                    bytes += meta.len();
                }
                builder.append_path_with_name(entry.path(), &rel)?;
            }
        }
    }
    builder
        .into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    Ok((files, bytes))
}

/// Unpacks the archive at `host_archive` into `target` in the sandbox, as its user.
async fn unpack(sandbox: &Sandbox, host_archive: &Path, target: &str) -> ServiceResult<()> {
    let mut budget = u64::MAX;
    crate::transfer::import::upload_host_file(
        sandbox,
        host_archive,
        ARCHIVE_IN_SANDBOX,
        Some(0o600),
        &mut budget,
        u64::MAX,
    )
    .await?;
    let out = sandbox
        .exec(ExecRequest::argv([
            "/bin/sh",
            "-c",
            "mkdir -p -- \"$1\" && tar -xf \"$2\" -C \"$1\" --no-same-owner; s=$?; rm -f \"$2\"; exit $s",
            "sh",
            target,
            ARCHIVE_IN_SANDBOX,
        ]))
        .await?;
    if !out.result.success() {
        return Err(ServiceError::invalid(format!(
            "the clone could not be unpacked at {target}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

impl Service {
    /// Clones a repository into the caller's sandbox `id` (see the module's description).
    pub async fn git_clone(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: GitClone,
    ) -> ServiceResult<GitCloneResult> {
        let started = Instant::now();
        let url = req.checked()?;
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        let target = req
            .path
            .clone()
            .unwrap_or_else(|| format!("/workspace/{}", url.name));
        // git refuses a folder with files in it; said before anything is downloaded.
        if let Ok(entries) = sandbox.list_dir(&target).await
            && !entries.is_empty()
        {
            return Err(ServiceError::new(
                crate::ErrorKind::AlreadyExists,
                format!("{target} exists and is not empty"),
            ));
        }
        // The host by name, even an address: a rule naming an address would let a clone
        // reach the host's loopback, its LAN or a metadata service; by name, those are refused
        // after resolution as for any sandbox.
        let policy = NetworkPolicy::Allow(vec![HostRule {
            host: HostPattern::Exact(url.host.clone()),
            port: Some(url.port),
        }]);
        let limits = Limits {
            max_bytes: Some(CLONE_MAX_BYTES),
            ..Limits::default()
        };
        let (addr, proxy) = self
            .fleet
            .engine()
            .egress()
            .open_tcp(id, policy, limits)
            .await?;
        let work = tempfile::Builder::new()
            .prefix("sandcell-clone-")
            .tempdir()
            .map_err(|e| ServiceError::internal(format!("make the clone's folder: {e}")))?;
        if crate::is_root() {
            std::os::unix::fs::chown(work.path(), Some(NOBODY), Some(NOBODY)).map_err(|e| {
                ServiceError::internal(format!("hand the clone's folder to git: {e}"))
            })?;
        }
        let dest = work.path().join("repo");
        let env = git_env(
            work.path(),
            &format!("http://{addr}"),
            url.credentials.as_ref(),
        );
        let cloned = run_git(
            &git_args(&url, &req, &dest),
            &env,
            url.credentials.as_ref(),
            CLONE_TIMEOUT,
        )
        .await;
        drop(proxy);
        cloned?;
        let rev = |args: &[&str]| {
            let mut a = vec!["-C".to_string(), dest.display().to_string()];
            a.extend(args.iter().map(|s| s.to_string()));
            a
        };
        let commit = run_git(
            &rev(&["rev-parse", "HEAD"]),
            &env,
            None,
            Duration::from_secs(30),
        )
        .await?;
        let branch = run_git(
            &rev(&["symbolic-ref", "--quiet", "--short", "HEAD"]),
            &env,
            None,
            Duration::from_secs(30),
        )
        .await
        .ok()
        .filter(|b| !b.is_empty());
        let tar_path = work.path().join("clone.tar");
        let (files, bytes) = {
            let (dest, tar_path) = (dest.clone(), tar_path.clone());
            tokio::task::spawn_blocking(move || archive(&dest, &tar_path))
                .await
                .map_err(|e| ServiceError::internal(format!("archive the clone: {e}")))?
                .map_err(|e| ServiceError::internal(format!("archive the clone: {e}")))?
        };
        unpack(&sandbox, &tar_path, &target).await?;
        let path = sandbox.stat(&target).await?.path;
        self.audit(
            caller,
            "sandbox.git_clone",
            Some(id),
            serde_json::json!({
                "url": url.url, "path": path, "commit": commit, "files": files, "bytes": bytes,
                "authenticated": url.credentials.is_some(),
            }),
        );
        Ok(GitCloneResult {
            path,
            commit,
            branch,
            files,
            bytes,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_stay_out_of_arguments_and_errors() {
        let req = GitClone {
            url: "https://me:tok3n@git.example/team/repo.git".into(),
            branch: Some("dev".into()),
            depth: Some(1),
            ..GitClone::default()
        };
        let url = req.checked().unwrap();
        let args = git_args(&url, &req, Path::new("/tmp/x/repo"));
        let joined = args.join(" ");
        assert!(!joined.contains("tok3n"), "{joined}");
        assert!(
            joined.contains(
                "--branch dev --depth 1 -- https://git.example/team/repo.git /tmp/x/repo"
            ),
            "{joined}"
        );
        assert!(joined.contains("protocol.allow=never"));
        let env = git_env(
            Path::new("/tmp/x"),
            "http://127.0.0.1:9",
            url.credentials.as_ref(),
        );
        let header = env
            .iter()
            .find(|(k, _)| k == "GIT_CONFIG_VALUE_0")
            .map(|(_, v)| v.clone())
            .unwrap();
        let expected = base64::engine::general_purpose::STANDARD.encode("me:tok3n");
        assert_eq!(header, format!("Authorization: Basic {expected}"));
        let msg = git_error(b"fatal: auth failed for tok3n\n", url.credentials.as_ref());
        assert!(!msg.contains("tok3n") && msg.contains("***"), "{msg}");
    }
}
