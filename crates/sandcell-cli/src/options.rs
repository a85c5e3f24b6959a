//! Sandbox options shared by `run` and `repl`.

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use sandcell_api::volumes::MountInput;
use sandcell_engine::spec::parse_size;
use sandcell_engine::{NetworkPolicy, SandboxSpec};
use sandcell_protocol::Language;

/// Languages with a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Python 3 (the system /usr/bin/python3).
    Python,
    /// Node.js.
    Node,
    /// Bash.
    Bash,
    /// R.
    R,
}

impl Lang {
    /// The protocol's language.
    pub fn language(self) -> Language {
        match self {
            Lang::Python => Language::Python,
            Lang::Node => Language::Node,
            Lang::Bash => Language::Bash,
            Lang::R => Language::R,
        }
    }
}

/// Limits and environment of the sandbox.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Memory limit for the whole sandbox (e.g. 64m, 1g), no swap.
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Timeout in seconds (per command or cell); it is interrupted, then killed.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// CPU quota (e.g. 0.5).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Process limit for the whole sandbox.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Size of the writable /workspace (e.g. 100m).
    #[arg(long, value_parser = parse_size)]
    pub disk: Option<u64>,
    /// Network: `loopback` (the sandbox's own lo only), `off` (no inet sockets at all),
    /// `full` (any public host) or `allow:HOST[,HOST…]` (only these: `pypi.org`,
    /// `*.example.com`, `host:443`), through the host's egress proxy.
    #[arg(long, default_value = "loopback", value_name = "POLICY")]
    pub network: NetworkPolicy,
    /// Environment variable (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// An image of the home's store as the sandbox's system instead of the host's
    /// (`sandcell image ls`; the home is $SANDCELL_HOME or the default).
    #[arg(long, value_name = "IMAGE")]
    pub template: Option<String>,
    /// A host folder mounted inside: HOST:PATH[:ro|rw|overlay], read-only by default; PATH is
    /// /workspace or lies below /workspace, /home/sandbox or /tmp (repeatable).
    #[arg(long = "mount", value_name = "HOST:PATH[:MODE]")]
    pub mounts: Vec<String>,
    /// A named volume of the home mounted inside: NAME:PATH[:ro|rw|overlay], read-write by
    /// default, made on first use (repeatable; see `sandcell volume`).
    #[arg(long = "volume", value_name = "NAME:PATH[:MODE]")]
    pub volumes: Vec<String>,
}

impl SandboxArgs {
    /// The sandbox's spec (`--env` applies to every command and kernel).
    pub fn spec(&self) -> anyhow::Result<SandboxSpec> {
        self.spec_on(self.template.as_deref())
    }

    /// The sandbox's spec on image `template` (`None`: the host's system).
    pub fn spec_on(&self, template: Option<&str>) -> anyhow::Result<SandboxSpec> {
        let mut spec = SandboxSpec {
            env: self.env_pairs()?.into_iter().collect(),
            ..SandboxSpec::default()
        };
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
        spec.network = self.network.clone();
        if let Some(name) = template {
            let home = sandcell_service::config::default_home();
            let root = sandcell_service::images::image_root(&home, name)?;
            spec.template = Some(name.to_string());
            spec.system_root = Some(root.display().to_string());
            for (key, value) in sandcell_service::images::image_env(&home, name)? {
                spec.env.entry(key).or_insert(value);
            }
            spec.workdir = sandcell_service::images::image_workdir(&home, name)?;
            // The template's own network, unless --network chose one.
            if let Some(defaults) = sandcell_service::images::template_defaults(&home, name)? {
                for (key, value) in defaults.sandbox.env {
                    spec.env.entry(key).or_insert(value);
                }
                if self.network == NetworkPolicy::Loopback
                    && let Some(network) = defaults.sandbox.network
                {
                    spec.network = serde_json::from_value(network)
                        .context("the template's recorded network")?;
                }
            }
        }
        spec.mounts = self.mounts()?;
        Ok(spec)
    }

    /// `--mount` and `--volume`, resolved. The command line's user picks any folder they can
    /// read (the daemon's allow-list, `mounts.allowed_paths`, is for its API's callers);
    /// volumes are the home's, shared with the daemon's admin.
    pub fn mounts(&self) -> anyhow::Result<Vec<sandcell_engine::SandboxMount>> {
        let hosts = self.mounts.iter().map(|m| MountInput::parse_host(m));
        let volumes = self.volumes.iter().map(|v| MountInput::parse_volume(v));
        local_mounts(&hosts.chain(volumes).collect::<Result<Vec<_>, _>>()?)
    }

    /// `--env` pairs, checked.
    pub fn env_pairs(&self) -> anyhow::Result<Vec<(String, String)>> {
        self.env
            .iter()
            .map(|kv| {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--env '{kv}' is not KEY=VALUE"))?;
                Ok((k.to_string(), v.to_string()))
            })
            .collect()
    }

    /// `--timeout` in milliseconds, checked.
    pub fn timeout_ms(&self) -> anyhow::Result<Option<u64>> {
        match self.timeout {
            None => Ok(None),
            Some(t) if t.is_finite() && t > 0.0 => Ok(Some((t * 1000.0).ceil() as u64)),
            Some(_) => bail!("--timeout must be a positive number of seconds"),
        }
    }
}

/// `list` resolved for the command line's user: any host folder they can read (links
/// resolved), the home's volumes of the daemon's admin (made on first use).
pub fn local_mounts(list: &[MountInput]) -> anyhow::Result<Vec<sandcell_engine::SandboxMount>> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let home = sandcell_service::config::default_home();
    Ok(sandcell_service::volumes::resolve_mounts(
        &home,
        sandcell_server::ADMIN_OWNER,
        list,
        |host| {
            std::fs::canonicalize(host).map_err(|e| {
                sandcell_service::ServiceError::invalid(format!("the host folder '{host}': {e}"))
            })
        },
    )?)
}
