//! `/v1/sandboxes`: create, get, list, set the timeout, and the settings a sandbox is made
//! with (size, limits, network, kernels, templates).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::network::NetworkPolicy;
use crate::snapshots::AutoSnapshot;
use crate::values::{Seconds, Tags};

/// A named set of limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Size {
    /// 256 MiB, 0.5 CPU, 64 processes, 256 MiB of workspace.
    Nano,
    /// 512 MiB, no CPU quota, 256 processes, 1 GiB of workspace (the default).
    Small,
    /// 2 GiB, 2 CPUs, 512 processes, 4 GiB of workspace.
    Medium,
    /// 8 GiB, 4 CPUs, 1024 processes, 16 GiB of workspace.
    Large,
}

/// Limits that override the size's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitsInput {
    /// Memory for the whole sandbox in MiB (swap excluded).
    pub memory_mb: Option<u64>,
    /// CPUs (fractions allowed).
    pub cpus: Option<f64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// Size of `/workspace` in MiB.
    pub disk_mb: Option<u64>,
    /// Size of `/tmp` in MiB.
    pub tmp_mb: Option<u64>,
    /// Size of `/home/sandbox` in MiB.
    pub home_mb: Option<u64>,
    /// Open files per process.
    pub open_files: Option<u64>,
    /// Default timeout of an exec that sets none, in seconds.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub exec_timeout_secs: Option<Seconds>,
}

/// A language with a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Lang {
    /// Python 3.
    Python,
    /// Node.js.
    Node,
    /// Bash.
    Bash,
    /// R.
    R,
}

impl From<Lang> for sandcell_protocol::Language {
    fn from(l: Lang) -> Self {
        match l {
            Lang::Python => Self::Python,
            Lang::Node => Self::Node,
            Lang::Bash => Self::Bash,
            Lang::R => Self::R,
        }
    }
}

impl From<sandcell_protocol::Language> for Lang {
    fn from(l: sandcell_protocol::Language) -> Self {
        match l {
            sandcell_protocol::Language::Python => Self::Python,
            sandcell_protocol::Language::Node => Self::Node,
            sandcell_protocol::Language::Bash => Self::Bash,
            sandcell_protocol::Language::R => Self::R,
        }
    }
}

/// The template a create request without one gets.
pub const DEFAULT_TEMPLATE: &str = "default";

/// The built-in templates: each is the host's system with some kernels started at creation.
pub const TEMPLATES: &[(&str, &[Lang], &str)] = &[
    (
        "default",
        &[],
        "the host's system; kernels start on first use",
    ),
    (
        "python",
        &[Lang::Python],
        "a Python kernel ready at creation",
    ),
    ("node", &[Lang::Node], "a Node.js kernel ready at creation"),
    ("bash", &[Lang::Bash], "a Bash kernel ready at creation"),
    ("r", &[Lang::R], "an R kernel ready at creation"),
];

/// The kernels a template starts, or `None` for an unknown template.
pub fn template_kernels(name: &str) -> Option<&'static [Lang]> {
    TEMPLATES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, kernels, _)| *kernels)
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// The template: `default` (the host's system), or `python`, `node`, `bash`, `r` (the
    /// same with that kernel started during creation), or an image of the daemon's store
    /// (`name[:tag]`, see `sandcell image`): its root filesystem is the sandbox's system
    /// (process backend).
    pub template: Option<String>,
    /// A named size (default `small`).
    pub size: Option<Size>,
    /// Limits overriding the size's.
    pub limits: Option<LimitsInput>,
    /// Environment variables of every command and kernel.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels (filterable, e.g. `?label=team:ml`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub labels: Tags,
    /// Metadata (filterable, e.g. `?metadata=run:42`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub metadata: Tags,
    /// Lifetime in seconds from now (default: the service's).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub timeout_secs: Option<Seconds>,
    /// Stopped after this many seconds without a request (default: the service's).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub idle_timeout_secs: Option<Seconds>,
    /// Forget the sandbox's record when it stops.
    #[serde(default)]
    pub ephemeral: bool,
    /// What its network reaches (default `loopback`): `off`, `loopback`, `full` or
    /// `{"allow": ["host", "*.suffix", "host:port"]}`.
    pub network: Option<NetworkPolicy>,
    /// Kernels to start during creation, so the first code in them runs at once.
    #[serde(default)]
    pub kernels: Vec<Lang>,
    /// Packages installed while the sandbox is made, through the egress proxy allowed only
    /// to the package registries the operator configured; installs are cached by the list,
    /// so the next sandbox with the same list gets them from the cache. Not with network
    /// `off`.
    pub packages: Option<Packages>,
    /// Secrets that never enter the sandbox: each becomes an environment variable holding a
    /// placeholder, which the egress proxy replaces with the value in the headers and query
    /// of requests to the secret's hosts only (over TLS it terminates with a CA the sandbox
    /// trusts, `/run/sandcell/ca.pem`); a request carrying it to another host is refused.
    /// Values are kept in the daemon's memory only. Not with network `off`. With
    /// `snapshot_id`: values for the snapshot's secrets (by name), needed when the daemon
    /// restarted since the snapshot was taken.
    #[serde(default)]
    pub secrets: Vec<SecretInput>,
    /// The isolation backend (default `process`; `GET /v1/system` lists those available).
    pub backend: Option<String>,
    /// On the `process` backend: make the sandbox so that CRIU can checkpoint every process
    /// (snapshots of `process` fidelity; needs a working `criu`, see `GET /v1/system`). Such a
    /// sandbox runs without Landlock.
    #[serde(default)]
    pub checkpointable: bool,
    /// Automatic snapshots: on an interval, and/or just before it is reclaimed.
    pub auto_snapshot: Option<AutoSnapshot>,
    /// Restore a snapshot: the new sandbox gets the snapshot's settings and files (then
    /// `template`, `size`, `limits`, `env`, `network` and `kernels` must not be given).
    pub snapshot_id: Option<String>,
    /// Host folders (inside the service's `mounts.allowed_paths`) and named volumes mounted
    /// into it, on either backend. Not with `checkpointable`.
    #[serde(default)]
    pub mounts: Vec<crate::volumes::MountInput>,
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxInfo {
    /// The id.
    pub id: String,
    /// `creating`, `running`, `paused`, `stopped`, `failed` or `lost`.
    pub state: String,
    /// Why it stopped, failed or was lost.
    pub reason: Option<String>,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it was last used (RFC 3339).
    pub last_active_at: String,
    /// When its lifetime ends (RFC 3339), if it has an end.
    pub expires_at: Option<String>,
    /// Idle timeout in seconds, if any.
    pub idle_timeout_secs: Option<u64>,
    /// Its record goes when it stops.
    pub ephemeral: bool,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Its limits.
    pub limits: LimitsInfo,
    /// What its network reaches now.
    pub network: NetworkPolicy,
    /// The isolation backend.
    pub backend: String,
    /// The template it was made from.
    pub template: String,
    /// Where a server inside on port P is reached (previews): this host name with `{port}`
    /// replaced by P (`{port}-<id>.localhost`), on the daemon's port.
    pub preview_host: String,
    /// The same, as a path on the daemon (`/v1/sandboxes/<id>/ports/{port}/`).
    pub preview_path: String,
    /// Only when it was just made with `packages`: how they were installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<PackagesReport>,
    /// Only when it was just restored from a snapshot: what came back (fidelity, files,
    /// what was not carried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<serde_json::Value>,
}

/// Most secrets a sandbox may have.
pub const MAX_SECRETS: usize = 32;

/// One secret at create.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SecretInput {
    /// The environment variable that holds its placeholder (`A-Z`, `0-9`, `_`, not starting
    /// with a digit).
    pub name: String,
    /// The value (1 to 8192 bytes, no control characters); never shown again.
    pub value: String,
    /// The hosts it may be sent to, as network allow rules (`api.example.com`,
    /// `*.example.com`, `host:443`).
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for SecretInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretInput")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl SecretInput {
    /// Checks a list of secrets (names, values, hosts; names unique).
    pub fn check_all(list: &[SecretInput]) -> Result<(), crate::ValidationError> {
        let bad = |m: String| Err(crate::ValidationError(m));
        if list.len() > MAX_SECRETS {
            return bad(format!("at most {MAX_SECRETS} secrets, got {}", list.len()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for s in list {
            let name_ok = !s.name.is_empty()
                && s.name.len() <= 128
                && !s.name.starts_with(|c: char| c.is_ascii_digit())
                && s.name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if !name_ok {
                return bad(format!(
                    "secret name '{}' must be an environment variable name (A-Z, 0-9, _)",
                    s.name
                ));
            }
            if !seen.insert(s.name.as_str()) {
                return bad(format!("secret '{}' is given twice", s.name));
            }
            if s.value.is_empty() || s.value.len() > 8192 || s.value.chars().any(char::is_control) {
                return bad(format!(
                    "secret '{}': its value must be 1 to 8192 bytes without control characters",
                    s.name
                ));
            }
            if s.hosts.is_empty() {
                return bad(format!(
                    "secret '{}' names no host it may be sent to",
                    s.name
                ));
            }
            for h in &s.hosts {
                h.parse::<crate::network::HostRule>()
                    .map_err(|e| crate::ValidationError(format!("secret '{}': {e}", s.name)))?;
            }
        }
        Ok(())
    }
}

/// A secret as a sandbox's record keeps it: its name, its placeholder and its hosts, never
/// its value (which only the daemon's memory holds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretRef {
    /// The environment variable that holds its placeholder.
    pub name: String,
    /// What the sandbox holds instead of the value (`SANDCELL_SECRET_` and 32 hex digits).
    pub placeholder: String,
    /// The hosts it may be sent to, as network allow rules.
    pub hosts: Vec<String>,
}

/// A sandbox's secrets, replacing those it has (`PUT /v1/sandboxes/{id}/secrets`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetSecrets {
    /// Every secret the sandbox is to have: one it has keeps its placeholder and gets this
    /// value and these hosts; a new one gets a new placeholder (not in the environment of
    /// processes already running: pass it on yourself); one left out is forgotten, and its
    /// placeholder then passes unreplaced.
    pub secrets: Vec<SecretInput>,
}

/// A sandbox's secrets, without their values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretList {
    /// Each secret.
    pub secrets: Vec<SecretState>,
}

/// One secret of a sandbox, without its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretState {
    /// Its name (the environment variable holding the placeholder).
    pub name: String,
    /// Its placeholder.
    pub placeholder: String,
    /// The hosts it may be sent to.
    pub hosts: Vec<String>,
    /// Whether the daemon holds its value: `false` after a restart of the daemon until it is
    /// given again, and meanwhile a request carrying the placeholder is refused.
    pub held: bool,
}

/// Most packages one installer may be given.
pub const MAX_PACKAGES: usize = 64;
/// Longest package specifier.
pub const MAX_PACKAGE_CHARS: usize = 200;

/// Packages to install while a sandbox is made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Packages {
    /// Python packages, as pip takes them (`numpy`, `pandas==2.2.2`, `requests[socks]>=2`),
    /// installed for the sandbox's user (`~/.local`).
    #[serde(default)]
    pub pip: Vec<String>,
    /// npm packages (`left-pad`, `@scope/name@1.2.3`), installed globally under
    /// `~/.npm-global` (on `PATH` and `NODE_PATH`).
    #[serde(default)]
    pub npm: Vec<String>,
    /// R packages from the configured repository, installed into `~/R/library`
    /// (`R_LIBS_USER`).
    #[serde(default)]
    pub r: Vec<String>,
}

impl Packages {
    /// Whether it names no package.
    pub fn is_empty(&self) -> bool {
        self.pip.is_empty() && self.npm.is_empty() && self.r.is_empty()
    }

    /// Checks every specifier: 1 to [`MAX_PACKAGE_CHARS`] characters of letters, digits and
    /// `. _ - [ ] < > = ! ~ , @ / : + ^ *`, never starting with `-` (never read as an option);
    /// R names only letters, digits and `.`; at most [`MAX_PACKAGES`] per installer.
    pub fn check(&self) -> Result<(), crate::ValidationError> {
        let bad = |m: String| Err(crate::ValidationError(m));
        for (installer, list, r) in [
            ("pip", &self.pip, false),
            ("npm", &self.npm, false),
            ("r", &self.r, true),
        ] {
            if list.len() > MAX_PACKAGES {
                return bad(format!(
                    "packages.{installer}: at most {MAX_PACKAGES} packages, got {}",
                    list.len()
                ));
            }
            for p in list {
                let charset = |b: u8| {
                    b.is_ascii_alphanumeric()
                        || if r {
                            b == b'.'
                        } else {
                            b"._-[]<>=!~,@/:+^*".contains(&b)
                        }
                };
                if p.is_empty()
                    || p.len() > MAX_PACKAGE_CHARS
                    || p.starts_with('-')
                    || !p.bytes().all(charset)
                {
                    return bad(format!(
                        "packages.{installer}: '{p}' is not a package name or specifier (1 to \
                         {MAX_PACKAGE_CHARS} characters of letters, digits and {}, not starting \
                         with '-')",
                        if r { "'.'" } else { "._-[]<>=!~,@/:+^*" }
                    ));
                }
            }
        }
        Ok(())
    }
}

/// How a sandbox's packages were installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PackagesReport {
    /// Served from the cache of an earlier install of the same list (no registry reached).
    pub cached: bool,
    /// How long installing (or unpacking the cached install) took.
    pub duration_ms: u64,
    /// Files the install put into the sandbox.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The sandbox came from a warm pool that had installed the list while it waited
    /// (`duration_ms` is that install's).
    #[serde(default)]
    pub from_pool: bool,
}

/// Limits in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitsInfo {
    /// Memory in MiB.
    pub memory_mb: Option<u64>,
    /// CPUs.
    pub cpus: Option<f64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// `/workspace` size in MiB.
    pub disk_mb: u64,
    /// `/tmp` size in MiB.
    pub tmp_mb: u64,
    /// `/home/sandbox` size in MiB.
    pub home_mb: u64,
    /// Open files per process.
    pub open_files: u64,
    /// Default exec timeout in seconds.
    pub exec_timeout_secs: Option<u64>,
}

/// A page of sandboxes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxList {
    /// The sandboxes.
    pub items: Vec<SandboxInfo>,
    /// Pass as `cursor` for the next page; absent at the end.
    pub next_cursor: Option<String>,
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now until the sandbox is stopped.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub timeout_secs: Seconds,
}
