//! `SandboxSpec`: what a sandbox should be, as plain data every backend translates.

use std::collections::BTreeMap;

use sandcell_protocol::Language;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;

const MIB: u64 = 1024 * 1024;

/// Which isolation backend runs a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Linux namespaces, seccomp, Landlock and cgroups around the guest agent.
    #[default]
    Process,
    /// gVisor's `runsc`: a user-space kernel between the sandbox and the host, with full
    /// process checkpoints.
    Gvisor,
}

impl BackendKind {
    /// Every backend Sandcell has, in the order it lists them.
    pub const ALL: [BackendKind; 2] = [Self::Process, Self::Gvisor];

    /// The name used in specs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Gvisor => "gvisor",
        }
    }
}

/// What a sandbox's network reaches (one type from the wire to the backends).
pub use sandcell_api::network::NetworkPolicy;

/// Resource limits. `None` means unlimited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxLimits {
    /// Memory for the whole sandbox, swap excluded.
    pub memory_bytes: Option<u64>,
    /// CPUs (fractions allowed, e.g. 0.5).
    pub cpus: Option<f64>,
    /// Processes and threads in the whole sandbox.
    pub pids: Option<u64>,
    /// Size of the writable `/workspace`.
    pub disk_bytes: u64,
    /// Size of the writable `/tmp`.
    pub tmp_bytes: u64,
    /// Size of the writable `/home/sandbox`.
    pub home_bytes: u64,
    /// Open files per process.
    pub open_files: u64,
    /// Default timeout of an exec that sets none, in milliseconds.
    pub exec_timeout_ms: Option<u64>,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_bytes: Some(512 * MIB),
            cpus: None,
            pids: Some(256),
            disk_bytes: 1024 * MIB,
            tmp_bytes: 256 * MIB,
            home_bytes: 64 * MIB,
            open_files: 1024,
            exec_timeout_ms: Some(300_000),
        }
    }
}

/// What a sandbox should be.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxSpec {
    /// The isolation backend.
    pub backend: BackendKind,
    /// Resource limits.
    pub limits: SandboxLimits,
    /// Network policy.
    pub network: NetworkPolicy,
    /// Environment variables set for every exec and kernel (an exec's or a context's own
    /// variables win).
    pub env: BTreeMap<String, String>,
    /// Kernels started while the sandbox is created, so the first execution in them does not
    /// wait for an interpreter to start.
    pub warm_kernels: Vec<Language>,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// The template it was made from, when a service made it from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Made so that CRIU can checkpoint its processes (`process` backend, with a working
    /// `criu`): its snapshots then have `process` fidelity. It runs without Landlock, which
    /// CRIU cannot carry.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub checkpointable: bool,
    /// Its secrets without their values (the egress proxy's [`crate::egress::EgressHub`]
    /// holds those, in memory): so that a restore, a fork or a reattachment knows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<sandcell_api::sandboxes::SecretRef>,
    /// The root filesystem its system comes from (a template image's, unpacked on the host);
    /// `None`: the host's own `/usr` and the like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_root: Option<String>,
    /// Host folders and volumes mounted into it, resolved by the service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<SandboxMount>,
    /// Where commands and kernels that name no working directory run (a template's
    /// `WORKDIR`); `None`: `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// A host folder mounted into a sandbox (a volume is one too: its folder under the home).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxMount {
    /// The host folder, absolute, its symbolic links resolved.
    pub source: String,
    /// Where it appears inside (see [`sandcell_api::volumes::check_mount_path`]).
    pub target: String,
    /// How the sandbox sees it.
    pub mode: sandcell_api::volumes::MountMode,
    /// The host uid whose files the sandbox sees as its own (`process` backend, through an
    /// idmapped mount; gVisor shows the host's ids).
    pub owner_uid: u32,
    /// The host gid shown as the sandbox's group, as `owner_uid`.
    pub owner_gid: u32,
    /// The volume it is, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

impl SandboxSpec {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), EngineError> {
        let l = &self.limits;
        let bad = |m: String| Err(EngineError::InvalidSpec(m));
        if let Some(m) = l.memory_bytes
            && m < 16 * MIB
        {
            return bad(format!(
                "memory limit {m} bytes is below the 16 MiB minimum"
            ));
        }
        if let Some(c) = l.cpus
            && !(c.is_finite() && (0.01..=1024.0).contains(&c))
        {
            return bad(format!("cpus {c} must be between 0.01 and 1024"));
        }
        if let Some(p) = l.pids
            && p < 8
        {
            return bad(format!("pids limit {p} is below the minimum of 8"));
        }
        for (name, v) in [
            ("disk", l.disk_bytes),
            ("tmp", l.tmp_bytes),
            ("home", l.home_bytes),
        ] {
            if v < MIB {
                return bad(format!("{name} size {v} bytes is below the 1 MiB minimum"));
            }
        }
        if !(16..=1 << 20).contains(&l.open_files) {
            return bad(format!(
                "open files {} must be between 16 and 1048576",
                l.open_files
            ));
        }
        if l.exec_timeout_ms == Some(0) {
            return bad("exec timeout must be positive".into());
        }
        for (k, v) in &self.env {
            validate_env(k, v).map_err(EngineError::InvalidSpec)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(dup) = self.warm_kernels.iter().find(|l| !seen.insert(**l)) {
            return bad(format!("warm kernel {dup} is listed twice"));
        }
        sandcell_api::volumes::check_targets(self.mounts.iter().map(|m| m.target.as_str()))
            .map_err(|e| EngineError::InvalidSpec(e.0))?;
        for m in &self.mounts {
            sandcell_api::volumes::check_mount_path(&m.target)
                .map_err(|e| EngineError::InvalidSpec(e.0))?;
            if !std::path::Path::new(&m.source).is_absolute() {
                return bad(format!("mount source '{}' must be absolute", m.source));
            }
        }
        if let Some(w) = &self.workdir
            && (!w.starts_with('/') || w.contains('\0') || w.split('/').any(|c| c == ".."))
        {
            return bad(format!(
                "working directory '{w}' must be an absolute path without '..'"
            ));
        }
        if self.checkpointable && !self.mounts.is_empty() {
            return bad(
                "a checkpointable sandbox cannot have mounts: CRIU cannot carry them".into(),
            );
        }
        if let Some(root) = &self.system_root {
            let path = std::path::Path::new(root);
            if !path.is_absolute() || !path.join("usr").is_dir() {
                return bad(format!(
                    "system root '{root}' must be an absolute folder holding usr/"
                ));
            }
            if self.checkpointable {
                return bad(
                    "a checkpointable sandbox cannot start from an image template yet".into(),
                );
            }
        }
        Ok(())
    }
}

/// Checks an environment variable's name and value.
pub fn validate_env(name: &str, value: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(format!(
            "environment variable name '{name}' is empty or contains '=' or NUL"
        ));
    }
    if value.contains('\0') {
        return Err(format!("environment variable {name} contains a NUL byte"));
    }
    Ok(())
}

/// Parses a size such as `512m`, `1g`, `64MiB`, `1000` (bytes).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a size (try 512m or 2g)"))?;
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => 1024 * MIB,
        "t" | "tb" | "tib" => 1024 * 1024 * MIB,
        other => return Err(format!("unknown size unit '{other}' in '{text}'")),
    };
    let bytes = value * mult as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(format!("size '{text}' is out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_spec_is_valid() {
        SandboxSpec::default().validate().unwrap();
    }

    #[test]
    fn bad_limits_are_named() {
        let mut spec = SandboxSpec::default();
        spec.limits.memory_bytes = Some(1024);
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("memory limit"), "{err}");
        let mut spec = SandboxSpec::default();
        spec.env.insert("A=B".into(), "x".into());
        assert!(spec.validate().unwrap_err().to_string().contains("A=B"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64m").unwrap(), 64 * MIB);
        assert_eq!(parse_size("1.5GiB").unwrap(), 1536 * MIB);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn spec_json_fills_defaults() {
        let spec: SandboxSpec = serde_json::from_str(r#"{"limits":{"pids":64}}"#).unwrap();
        assert_eq!(spec.limits.pids, Some(64));
        assert_eq!(spec.limits.memory_bytes, Some(512 * MIB));
    }
}
