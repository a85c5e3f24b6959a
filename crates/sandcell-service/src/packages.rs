//! Packages installed while a sandbox is made (`packages: {pip, npm, r}` on create).
//!
//! The installers run inside the new sandbox, as its user, through its egress proxy, which
//! allows only the package registries for the install (the operator's `packages.*` settings,
//! else what the host's own pip, npm and R are configured with) and then goes back to the
//! sandbox's policy. What they installed (`~/.local`, `~/.npm-global`, `~/R`) is kept as an
//! archive keyed by the list and the registries: the next sandbox with the same list gets it
//! unpacked instead (no registry reached). A warm pool may hold sandboxes with a list
//! installed already ([`Service::pool_prepare`]): a create naming that list takes one.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sandcell_api::network::{HostPattern, HostRule, NetworkPolicy};
use sandcell_api::sandboxes::{Packages, PackagesReport};
use sandcell_engine::{Sandbox, SandboxSpec};
use sandcell_protocol::ExecRequest;
use sha2::{Digest, Sha256};

use crate::{Service, ServiceError, ServiceResult};

const HOME: &str = "/home/sandbox";
/// Where npm packages go (global, under the sandbox's home).
const NPM_PREFIX: &str = "/home/sandbox/.npm-global";
/// Where R packages go.
const R_LIBRARY: &str = "/home/sandbox/R/library";
/// What an install leaves, relative to the home (the archive's contents).
const INSTALLED: &[&str] = &[".local", ".npm-global", "R"];
/// The CA file in the sandbox while installers run.
const CA_IN_SANDBOX: &str = "/tmp/.sandcell-packages-ca.pem";
/// The archive in the sandbox while it is made or unpacked.
const ARCHIVE_IN_SANDBOX: &str = "/tmp/.sandcell-packages.tar";
/// Every variable clients read a CA bundle from (npm reads `npm_config_*` in any case).
pub const CA_FILE_VARIABLES: [&str; 7] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "NPM_CONFIG_CAFILE",
];
/// The home's size when packages are asked for and no size is: an upper bound (a tmpfs
/// takes only what it holds, counted in the sandbox's memory).
const HOME_FOR_PACKAGES: u64 = 2048 * 1024 * 1024;

/// What every process of a sandbox with packages needs to find them.
pub fn apply_to_spec(spec: &mut SandboxSpec, packages: &Packages, home_given: bool) {
    if packages.is_empty() {
        return;
    }
    let path = format!("{HOME}/.local/bin:{NPM_PREFIX}/bin:/usr/local/bin:/usr/bin:/bin");
    spec.env.entry("PATH".into()).or_insert(path);
    if !packages.npm.is_empty() {
        spec.env
            .entry("NODE_PATH".into())
            .or_insert_with(|| format!("{NPM_PREFIX}/lib/node_modules"));
    }
    if !packages.r.is_empty() {
        spec.env
            .entry("R_LIBS_USER".into())
            .or_insert_with(|| R_LIBRARY.to_string());
    }
    if !home_given {
        spec.limits.home_bytes = spec.limits.home_bytes.max(HOME_FOR_PACKAGES);
    }
}

/// The registries installs reach (found once).
#[derive(Debug, Default)]
pub struct PackagesState {
    registries: OnceLock<Result<Found, String>>,
}

/// What names a package list in warm pools (`CreateOptions::pool_key`): the sorted lists,
/// so that the order a request gives them in does not matter.
pub fn pool_key(packages: &Packages) -> String {
    let sorted = |l: &[String]| {
        let mut v = l.to_vec();
        v.sort();
        v.dedup();
        v
    };
    serde_json::json!({
        "packages": {"pip": sorted(&packages.pip), "npm": sorted(&packages.npm), "r": sorted(&packages.r)}
    })
    .to_string()
}

/// Where each installer installs from, and every host that takes.
#[derive(Debug, Clone)]
struct Found {
    pip_index: Option<String>,
    npm_registry: Option<String>,
    r_repo: Option<String>,
    hosts: Vec<HostRule>,
}

/// A command's trimmed stdout, when it ran and succeeded.
fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A URL's host as a rule (its port when it names one).
fn rule_of(url: &str) -> Option<HostRule> {
    sandcell_api::git::check_registry_url(url).ok()
}

impl Found {
    fn discover(config: &crate::config::PackagesConfig) -> Result<Self, String> {
        let mut hosts = Vec::new();
        for rule in &config.allow {
            hosts.push(rule.parse::<HostRule>()?);
        }
        let given = |v: &str| (!v.is_empty()).then(|| v.to_string());
        let pip_index = given(&config.pip_index_url);
        match &pip_index {
            Some(url) => hosts.extend(rule_of(url)),
            // pip's own defaults: its index and where it keeps the files.
            None => {
                let names = output_of(
                    "python3",
                    &[
                        "-c",
                        "from pip._internal.models.index import PyPI as p; print(p.netloc); print(p.file_storage_domain)",
                    ],
                )
                .unwrap_or_default();
                for name in names.lines().filter(|l| !l.is_empty()) {
                    hosts.push(HostRule {
                        host: HostPattern::Exact(name.to_ascii_lowercase()),
                        port: Some(443),
                    });
                }
            }
        }
        let npm_registry = given(&config.npm_registry).or_else(|| {
            output_of("npm", &["config", "get", "registry"]).filter(|r| r.contains("://"))
        });
        if let Some(url) = &npm_registry {
            hosts.extend(rule_of(url));
        }
        let r_repo = given(&config.r_repo).or_else(|| {
            output_of("Rscript", &["-e", "cat(getOption('repos')[[1]])"])
                .filter(|r| r.contains("://"))
        });
        if let Some(url) = &r_repo {
            hosts.extend(rule_of(url));
        }
        Ok(Self {
            pip_index,
            npm_registry,
            r_repo,
            hosts,
        })
    }
}

/// The cache key of `packages` from these registries: the sorted lists and where from.
fn cache_key(packages: &Packages, found: &Found, backend: &str) -> String {
    let sorted = |l: &[String]| {
        let mut v = l.to_vec();
        v.sort();
        v.dedup();
        v
    };
    let key = serde_json::json!({
        "v": 1,
        "backend": backend,
        "pip": sorted(&packages.pip),
        "npm": sorted(&packages.npm),
        "r": sorted(&packages.r),
        "pip_index": found.pip_index,
        "npm_registry": found.npm_registry,
        "r_repo": found.r_repo,
    });
    let mut h = Sha256::new();
    h.update(key.to_string().as_bytes());
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn elapsed_ms(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Runs `argv` in `sandbox` with `env`, within `timeout`; fails naming `what` with the last
/// lines of its output.
async fn run(
    sandbox: &Sandbox,
    argv: Vec<String>,
    env: &[(String, String)],
    timeout: Duration,
    what: &str,
) -> ServiceResult<()> {
    let mut req = ExecRequest::argv(argv);
    req.env = env.iter().cloned().collect();
    req.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
    req.cwd = Some(HOME.into());
    let out = sandbox.exec(req).await?;
    if out.result.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if text.is_empty() {
        text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(8)..].join("\n");
    Err(ServiceError::invalid(format!("{what} failed: {tail}")))
}

/// Which of `names` an installer's failure message mentions (all of them when none is).
fn named_in<'a>(message: &str, names: &'a [String]) -> Vec<&'a str> {
    let lower = message.to_ascii_lowercase();
    let hit: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| {
            let bare = n
                .split(['=', '<', '>', '!', '~', '[', ',', ' '])
                .next()
                .unwrap_or(n)
                .to_ascii_lowercase();
            !bare.is_empty() && lower.contains(&bare)
        })
        .collect();
    if hit.is_empty() {
        names.iter().map(String::as_str).collect()
    } else {
        hit
    }
}

impl Service {
    fn registries(&self) -> ServiceResult<Found> {
        self.packages
            .registries
            .get_or_init(|| Found::discover(&self.config.packages))
            .clone()
            .map_err(|e| ServiceError::internal(format!("packages.allow: {e}")))
    }

    /// The preparation of a warm pool whose sandboxes have `packages` installed: creates
    /// naming the same list ([`pool_key`]) take them ready. Holds the service weakly (the
    /// fleet holds the preparation, and the service the fleet).
    pub fn pool_prepare(
        service: &std::sync::Arc<Self>,
        packages: Packages,
    ) -> sandcell_engine::fleet::PoolPrepare {
        let weak = std::sync::Arc::downgrade(service);
        let key = pool_key(&packages);
        let run = move |sandbox: Sandbox| {
            let weak = weak.clone();
            let packages = packages.clone();
            Box::pin(async move {
                let service = weak.upgrade().ok_or("the service is gone")?;
                let report = service
                    .install_packages(&sandbox, &packages)
                    .await
                    .map_err(|e| e.to_string())?;
                // Kept with the sandbox in its pool: the create that takes it reports it.
                serde_json::to_value(report)
                    .map_err(|e| format!("the install report does not serialize: {e}"))
            })
                as std::pin::Pin<
                    Box<dyn std::future::Future<Output = Result<serde_json::Value, String>> + Send>,
                >
        };
        sandcell_engine::fleet::PoolPrepare {
            key,
            run: std::sync::Arc::new(run),
        }
    }

    /// Installs `packages` into the freshly made `sandbox` (see the module's description).
    pub(crate) async fn install_packages(
        &self,
        sandbox: &Sandbox,
        packages: &Packages,
    ) -> ServiceResult<PackagesReport> {
        let start = Instant::now();
        let found = self.registries()?;
        let key = cache_key(packages, &found, sandbox.spec().backend.as_str());
        let cache = self.config.home.join("cache").join("packages");
        let cached = cache.join(format!("{key}.tar"));
        if cached.is_file() {
            let (files, bytes) = unpack_packages(sandbox, &cached).await?;
            return Ok(PackagesReport {
                cached: true,
                duration_ms: elapsed_ms(start),
                files,
                bytes,
                from_pool: false,
            });
        }
        if packages.r.is_empty() && packages.npm.is_empty() && packages.pip.is_empty() {
            return Err(ServiceError::invalid("packages names no package"));
        }
        let missing = |installer: &str, setting: &str| {
            ServiceError::new(
                crate::ErrorKind::Unsupported,
                format!(
                    "{installer} packages need a registry: set {setting} (the host's {installer} names none)"
                ),
            )
        };
        if !packages.npm.is_empty() && found.npm_registry.is_none() {
            return Err(missing("npm", "packages.npm_registry"));
        }
        if !packages.r.is_empty() && found.r_repo.is_none() {
            return Err(missing("R", "packages.r_repo"));
        }
        // Only the registries while the installers run; the sandbox's own policy after.
        let before = sandbox.network();
        sandbox.set_network(NetworkPolicy::Allow(found.hosts.clone()))?;
        let installed = self.run_installers(sandbox, packages, &found).await;
        let restored = sandbox.set_network(before);
        installed?;
        restored?;
        let (files, bytes) = self.keep_packages(sandbox, &cache, &cached).await?;
        Ok(PackagesReport {
            cached: false,
            duration_ms: elapsed_ms(start),
            files,
            bytes,
            from_pool: false,
        })
    }

    async fn run_installers(
        &self,
        sandbox: &Sandbox,
        packages: &Packages,
        found: &Found,
    ) -> ServiceResult<()> {
        let timeout = Duration::from_secs(self.config.packages.timeout_secs.max(1));
        let mut env: Vec<(String, String)> = vec![
            ("PIP_CONFIG_FILE".into(), "/dev/null".into()),
            ("PIP_DISABLE_PIP_VERSION_CHECK".into(), "1".into()),
            // Debian marks its Python externally managed; `--user` writes only the
            // sandbox's home, which is what the marker protects the system from.
            ("PIP_BREAK_SYSTEM_PACKAGES".into(), "1".into()),
            ("npm_config_update_notifier".into(), "false".into()),
        ];
        if !self.config.packages.ca_file.is_empty() {
            let pem = tokio::fs::read(&self.config.packages.ca_file)
                .await
                .map_err(|e| {
                    ServiceError::internal(format!(
                        "read packages.ca_file {}: {e}",
                        self.config.packages.ca_file
                    ))
                })?;
            sandbox.write_file(CA_IN_SANDBOX, &pem, Some(0o644)).await?;
            for var in CA_FILE_VARIABLES {
                env.push((var.to_string(), CA_IN_SANDBOX.into()));
            }
        }
        let s = |v: &str| v.to_string();
        if !packages.pip.is_empty() {
            let mut argv = vec![
                s("python3"),
                s("-m"),
                s("pip"),
                s("install"),
                s("--user"),
                s("--no-cache-dir"),
                s("--no-input"),
                s("--no-warn-script-location"),
                s("--progress-bar"),
                s("off"),
            ];
            if let Some(index) = &found.pip_index {
                argv.extend([s("--index-url"), index.clone()]);
            }
            argv.push(s("--"));
            argv.extend(packages.pip.iter().cloned());
            if let Err(e) = run(sandbox, argv, &env, timeout, "pip install").await {
                let which = named_in(&e.message, &packages.pip).join(", ");
                return Err(ServiceError::invalid(format!(
                    "packages.pip ({which}): {}",
                    e.message
                )));
            }
        }
        if !packages.npm.is_empty() {
            let mut argv = vec![
                s("npm"),
                s("install"),
                s("--global"),
                s("--prefix"),
                s(NPM_PREFIX),
                s("--no-audit"),
                s("--no-fund"),
                s("--loglevel=error"),
            ];
            if let Some(registry) = &found.npm_registry {
                argv.push(format!("--registry={registry}"));
            }
            argv.push(s("--"));
            argv.extend(packages.npm.iter().cloned());
            if let Err(e) = run(sandbox, argv, &env, timeout, "npm install").await {
                let which = named_in(&e.message, &packages.npm).join(", ");
                return Err(ServiceError::invalid(format!(
                    "packages.npm ({which}): {}",
                    e.message
                )));
            }
        }
        if !packages.r.is_empty() {
            let script = "lib <- Sys.getenv('R_LIBS_USER'); dir.create(lib, recursive = TRUE, \
                          showWarnings = FALSE); p <- commandArgs(TRUE); install.packages(p, lib = lib, \
                          repos = Sys.getenv('SANDCELL_R_REPO'), quiet = TRUE); ok <- vapply(p, \
                          function(x) requireNamespace(x, lib.loc = lib, quietly = TRUE), TRUE); \
                          if (!all(ok)) { message('not installed: ', paste(p[!ok], collapse = ', ')); \
                          quit(status = 1) }";
            let mut argv = vec![s("Rscript"), s("-e"), s(script)];
            argv.extend(packages.r.iter().cloned());
            let mut r_env = env.clone();
            r_env.push(("R_LIBS_USER".into(), R_LIBRARY.into()));
            r_env.push((
                "SANDCELL_R_REPO".into(),
                found.r_repo.clone().unwrap_or_default(),
            ));
            if let Err(e) = run(sandbox, argv, &r_env, timeout, "R install.packages").await {
                let which = named_in(&e.message, &packages.r).join(", ");
                return Err(ServiceError::invalid(format!(
                    "packages.r ({which}): {}",
                    e.message
                )));
            }
        }
        // Installers' caches and the CA are not part of the sandbox.
        let _ = sandbox
            .exec(ExecRequest::argv([
                "/bin/rm",
                "-rf",
                "/home/sandbox/.npm",
                "/home/sandbox/.cache",
                CA_IN_SANDBOX,
            ]))
            .await;
        Ok(())
    }

    /// Archives what the installers left into `cached` (atomically: a concurrent install of
    /// the same list writes the same archive); its file count and bytes.
    async fn keep_packages(
        &self,
        sandbox: &Sandbox,
        cache: &Path,
        cached: &Path,
    ) -> ServiceResult<(u64, u64)> {
        let script = "a=$1; shift; cd /home/sandbox || exit 1; keep=; \
                      for d in \"$@\"; do [ -e \"$d\" ] && keep=\"$keep $d\"; done; \
                      [ -n \"$keep\" ] || keep=.; tar -cf \"$a\" $keep && find $keep -type f | wc -l \
                      && du -sb $keep | awk '{s+=$1} END {print s+0}'";
        let mut argv = vec!["/bin/sh", "-c", script, "sh", ARCHIVE_IN_SANDBOX];
        argv.extend(INSTALLED);
        let out = sandbox.exec(ExecRequest::argv(argv)).await?;
        if !out.result.success() {
            return Err(ServiceError::internal(format!(
                "archive the installed packages: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut nums = text.lines().filter_map(|l| l.trim().parse::<u64>().ok());
        let (files, bytes) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
        std::fs::create_dir_all(cache)
            .map_err(|e| ServiceError::internal(format!("create {}: {e}", cache.display())))?;
        let partial = cache.join(format!(".{}.partial", std::process::id()));
        let mut budget = u64::MAX;
        let written = crate::transfer::exports::copy_out(
            sandbox,
            ARCHIVE_IN_SANDBOX,
            &partial,
            &mut budget,
            u64::MAX,
        )
        .await;
        let _ = sandbox
            .exec(ExecRequest::argv(["/bin/rm", "-f", ARCHIVE_IN_SANDBOX]))
            .await;
        written?;
        // The counts first: an archive is never found without them.
        let _ = std::fs::write(counts_path(cached), format!("{files} {bytes}\n"));
        std::fs::rename(&partial, cached)
            .map_err(|e| ServiceError::internal(format!("keep the packages' archive: {e}")))?;
        Ok((files, bytes))
    }
}

/// The file count and bytes of a kept install, written beside its archive.
fn counts_path(archive: &Path) -> std::path::PathBuf {
    archive.with_extension("counts")
}

/// Unpacks a cached install into `sandbox`'s home, streamed into one `tar` (no copy of the
/// archive in the sandbox, no second process); its file count and bytes.
async fn unpack_packages(sandbox: &Sandbox, cached: &Path) -> ServiceResult<(u64, u64)> {
    use tokio::io::AsyncReadExt;
    let mut req = ExecRequest::argv(["/bin/tar", "-xf", "-", "-C", HOME]);
    req.stdin = true;
    let mut stream = sandbox.exec_stream(req).await?;
    let mut file = tokio::fs::File::open(cached)
        .await
        .map_err(|e| ServiceError::internal(format!("read {}: {e}", cached.display())))?;
    let mut buf = vec![0u8; 1024 * 1024];
    let mut sent = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| ServiceError::internal(format!("read {}: {e}", cached.display())))?;
        if n == 0 {
            break;
        }
        // A tar that ended early (a full home) says why in its output: collected below.
        if stream.write_stdin(&buf[..n]).await.is_err() {
            break;
        }
        sent += n as u64;
    }
    let _ = stream.close_stdin().await;
    let out = stream.collect().await?;
    if !out.result.success() {
        return Err(ServiceError::internal(format!(
            "unpack the cached packages: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let counts = std::fs::read_to_string(counts_path(cached)).unwrap_or_default();
    let mut nums = counts.split_whitespace().filter_map(|n| n.parse().ok());
    match (nums.next(), nums.next()) {
        (Some(files), Some(bytes)) => Ok((files, bytes)),
        // An archive kept before counts were: its size stands for the bytes.
        _ => Ok((0, sent)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found() -> Found {
        Found {
            pip_index: Some("https://pypi.test/simple/".into()),
            npm_registry: None,
            r_repo: None,
            hosts: Vec::new(),
        }
    }

    #[test]
    fn the_cache_key_is_the_sorted_list_and_where_from() {
        let p = |pip: &[&str]| Packages {
            pip: pip.iter().map(|s| s.to_string()).collect(),
            ..Packages::default()
        };
        let a = cache_key(&p(&["six", "attrs"]), &found(), "process");
        assert_eq!(
            a,
            cache_key(&p(&["attrs", "six", "six"]), &found(), "process")
        );
        assert_ne!(a, cache_key(&p(&["six"]), &found(), "process"));
        assert_ne!(a, cache_key(&p(&["six", "attrs"]), &found(), "gvisor"));
        let mut other = found();
        other.pip_index = None;
        assert_ne!(a, cache_key(&p(&["six", "attrs"]), &other, "process"));
    }

    #[test]
    fn a_failure_names_the_packages_it_mentions() {
        let names = vec!["numpy==1.0".to_string(), "six".to_string()];
        assert_eq!(
            named_in(
                "ERROR: No matching distribution found for numpy==1.0",
                &names
            ),
            ["numpy==1.0"]
        );
        assert_eq!(named_in("network down", &names), ["numpy==1.0", "six"]);
    }

    #[test]
    fn a_spec_with_packages_finds_them() {
        let mut spec = SandboxSpec::default();
        let p = Packages {
            npm: vec!["left-pad".into()],
            ..Packages::default()
        };
        apply_to_spec(&mut spec, &p, false);
        assert!(spec.env["PATH"].starts_with("/home/sandbox/.local/bin:"));
        assert_eq!(
            spec.env["NODE_PATH"],
            "/home/sandbox/.npm-global/lib/node_modules"
        );
        assert!(spec.limits.home_bytes >= HOME_FOR_PACKAGES);
        let mut plain = SandboxSpec::default();
        apply_to_spec(&mut plain, &Packages::default(), false);
        assert_eq!(plain, SandboxSpec::default());
    }
}
