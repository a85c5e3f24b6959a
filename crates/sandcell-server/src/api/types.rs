//! The wire types of `/v1`: what clients send and get, with their OpenAPI schemas. They are
//! the server's own (mapped from the engine's), so the API stays stable as the engine moves.

use std::collections::BTreeMap;

use sandcell_engine::fleet::{Millis, SandboxRecord};
use sandcell_engine::{BackendKind, NetworkPolicy, SandboxLimits, SandboxSpec};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ApiError;

const MIB: u64 = 1024 * 1024;

/// A named set of limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

impl Size {
    /// The limits this size stands for.
    pub fn limits(self) -> SandboxLimits {
        let (memory_mb, cpus, pids, disk_mb) = match self {
            Size::Nano => (256, Some(0.5), 64, 256),
            Size::Small => (512, None, 256, 1024),
            Size::Medium => (2048, Some(2.0), 512, 4096),
            Size::Large => (8192, Some(4.0), 1024, 16384),
        };
        SandboxLimits {
            memory_bytes: Some(memory_mb * MIB),
            cpus,
            pids: Some(pids),
            disk_bytes: disk_mb * MIB,
            ..SandboxLimits::default()
        }
    }
}

/// Limits that override the size's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
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
    pub exec_timeout_secs: Option<u64>,
}

/// Network policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// The sandbox's own loopback only.
    Loopback,
    /// No sockets but Unix sockets.
    Off,
}

/// A language with a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// The template: `default` (the host's system), or `python`, `node`, `bash`, `r` (the
    /// same with that kernel started during creation).
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
    pub labels: BTreeMap<String, String>,
    /// Metadata (filterable, e.g. `?metadata=run:42`).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Lifetime in seconds from now (default: the service's).
    pub timeout_secs: Option<u64>,
    /// Stopped after this many seconds without a request (default: the service's).
    pub idle_timeout_secs: Option<u64>,
    /// Forget the sandbox's record when it stops.
    #[serde(default)]
    pub ephemeral: bool,
    /// Network policy (default `loopback`).
    pub network: Option<Network>,
    /// Kernels to start during creation, so the first code in them runs at once.
    #[serde(default)]
    pub kernels: Vec<Lang>,
    /// The isolation backend (default `process`; `GET /v1/system` lists those available).
    pub backend: Option<String>,
    /// On the `process` backend: make the sandbox so that CRIU can checkpoint every process
    /// (snapshots of `process` fidelity; needs a working `criu`, see `GET /v1/system`). Such a
    /// sandbox runs without Landlock.
    #[serde(default)]
    pub checkpointable: bool,
    /// Automatic snapshots: on an interval, and/or just before it is reclaimed.
    pub auto_snapshot: Option<super::snapshots::AutoSnapshot>,
    /// Restore a snapshot: the new sandbox gets the snapshot's settings and files (then
    /// `template`, `size`, `limits`, `env`, `network` and `kernels` must not be given).
    pub snapshot_id: Option<String>,
}

impl CreateSandbox {
    /// The engine spec this asks for.
    pub fn spec(&self) -> Result<SandboxSpec, ApiError> {
        let backend = match self.backend.as_deref() {
            None => BackendKind::Process,
            Some(b) => [BackendKind::Process, BackendKind::Gvisor]
                .into_iter()
                .find(|k| k.as_str() == b)
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "unknown backend '{b}' (Sandcell has: process, gvisor)"
                    ))
                })?,
        };
        let template = self.template.as_deref().unwrap_or(DEFAULT_TEMPLATE);
        let mut warm_kernels: Vec<sandcell_protocol::Language> = template_kernels(template)
            .ok_or_else(|| ApiError::not_found("template", template))?
            .iter()
            .map(|&l| l.into())
            .collect();
        for &k in &self.kernels {
            let k = k.into();
            if !warm_kernels.contains(&k) {
                warm_kernels.push(k);
            }
        }
        let mut limits = self.size.unwrap_or(Size::Small).limits();
        if let Some(l) = &self.limits {
            let mib = |name: &str, v: u64| {
                v.checked_mul(MIB)
                    .ok_or_else(|| ApiError::invalid(format!("limits.{name} {v} is too large")))
            };
            if let Some(v) = l.memory_mb {
                limits.memory_bytes = Some(mib("memory_mb", v)?);
            }
            if let Some(v) = l.cpus {
                limits.cpus = Some(v);
            }
            if let Some(v) = l.pids {
                limits.pids = Some(v);
            }
            if let Some(v) = l.disk_mb {
                limits.disk_bytes = mib("disk_mb", v)?;
            }
            if let Some(v) = l.tmp_mb {
                limits.tmp_bytes = mib("tmp_mb", v)?;
            }
            if let Some(v) = l.home_mb {
                limits.home_bytes = mib("home_mb", v)?;
            }
            if let Some(v) = l.open_files {
                limits.open_files = v;
            }
            if let Some(v) = l.exec_timeout_secs {
                limits.exec_timeout_ms = Some(secs_to_ms("limits.exec_timeout_secs", v)?);
            }
        }
        let spec = SandboxSpec {
            limits,
            network: match self.network.unwrap_or(Network::Loopback) {
                Network::Loopback => NetworkPolicy::Loopback,
                Network::Off => NetworkPolicy::Off,
            },
            env: self.env.clone(),
            warm_kernels,
            template: Some(template.to_string()),
            backend,
            checkpointable: self.checkpointable,
            ..SandboxSpec::default()
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Seconds to milliseconds, refusing what would overflow.
/// The fleet's create options from a request's own settings (seconds as the API takes
/// them, checked).
pub fn create_options(
    spec: SandboxSpec,
    labels: BTreeMap<String, String>,
    metadata: BTreeMap<String, String>,
    idle_timeout_secs: Option<u64>,
    timeout_secs: Option<u64>,
    ephemeral: bool,
) -> Result<sandcell_engine::fleet::CreateOptions, ApiError> {
    Ok(sandcell_engine::fleet::CreateOptions {
        spec,
        labels,
        metadata,
        idle_timeout_ms: idle_timeout_secs
            .map(|v| secs_to_ms("idle_timeout_secs", v))
            .transpose()?,
        lifetime_ms: timeout_secs
            .map(|v| secs_to_ms("timeout_secs", v))
            .transpose()?,
        ephemeral,
        checkpoint: None,
    })
}

pub fn secs_to_ms(field: &str, secs: u64) -> Result<u64, ApiError> {
    secs.checked_mul(1000)
        .ok_or_else(|| ApiError::invalid(format!("{field} {secs} is too large")))
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
    /// Its network policy.
    pub network: Network,
    /// The isolation backend.
    pub backend: String,
    /// The template it was made from.
    pub template: String,
    /// Only when it was just restored from a snapshot: what came back (fidelity, files,
    /// what was not carried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<serde_json::Value>,
}

/// Limits in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

impl From<&SandboxRecord> for SandboxInfo {
    fn from(r: &SandboxRecord) -> Self {
        let l = &r.spec.limits;
        Self {
            id: r.id.clone(),
            restore: None,
            state: r.state.as_str().to_string(),
            reason: r.reason.clone(),
            created_at: rfc3339(r.created_at_ms),
            last_active_at: rfc3339(r.last_active_ms),
            expires_at: r.expires_at_ms.map(rfc3339),
            idle_timeout_secs: r.idle_timeout_ms.map(|ms| ms / 1000),
            ephemeral: r.ephemeral,
            labels: r.labels.clone(),
            metadata: r.metadata.clone(),
            limits: LimitsInfo {
                memory_mb: l.memory_bytes.map(|b| b / MIB),
                cpus: l.cpus,
                pids: l.pids,
                disk_mb: l.disk_bytes / MIB,
                tmp_mb: l.tmp_bytes / MIB,
                home_mb: l.home_bytes / MIB,
                open_files: l.open_files,
                exec_timeout_secs: l.exec_timeout_ms.map(|ms| ms / 1000),
            },
            network: match r.spec.network {
                NetworkPolicy::Loopback => Network::Loopback,
                NetworkPolicy::Off => Network::Off,
            },
            backend: r.spec.backend.as_str().to_string(),
            template: r
                .spec
                .template
                .clone()
                .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
        }
    }
}

/// A page of sandboxes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    /// The sandboxes.
    pub items: Vec<SandboxInfo>,
    /// Pass as `cursor` for the next page; absent at the end.
    pub next_cursor: Option<String>,
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now until the sandbox is stopped.
    pub timeout_secs: u64,
}

/// Formats milliseconds since the epoch as RFC 3339 (UTC, millisecond precision).
pub fn rfc3339(ms: Millis) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if mo <= 2 { y + 1 } else { y };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_483_800_000), "2026-11-24T01:30:00.000Z");
    }

    #[test]
    fn sizes_and_limits_make_specs() {
        let spec = CreateSandbox::default().spec().unwrap();
        assert_eq!(spec.limits.memory_bytes, Some(512 * MIB));
        let req = CreateSandbox {
            size: Some(Size::Nano),
            limits: Some(LimitsInput {
                memory_mb: Some(128),
                ..LimitsInput::default()
            }),
            ..CreateSandbox::default()
        };
        let spec = req.spec().unwrap();
        assert_eq!(
            (spec.limits.memory_bytes, spec.limits.pids),
            (Some(128 * MIB), Some(64))
        );
        let bad = CreateSandbox {
            limits: Some(LimitsInput {
                memory_mb: Some(1),
                ..LimitsInput::default()
            }),
            ..CreateSandbox::default()
        };
        assert_eq!(bad.spec().unwrap_err().code(), "invalid_argument");
        let unknown = CreateSandbox {
            template: Some("gpu".into()),
            ..CreateSandbox::default()
        };
        assert_eq!(unknown.spec().unwrap_err().code(), "not_found");
        assert!(serde_json::from_str::<CreateSandbox>(r#"{"sise": "nano"}"#).is_err());
    }
}
