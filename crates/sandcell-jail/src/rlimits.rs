//! Per-process resource limits, and the fallbacks used when cgroups cannot limit the sandbox.
//!
//! Limits are only ever lowered: without `CAP_SYS_RESOURCE` (which root lacks on some hosts)
//! a hard limit cannot be raised, so a request above it is clamped and the clamp reported.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use sandcell_protocol::isolation::{Feature, FeatureState};

use crate::config::Limits;
use crate::error::JailError;

/// Applies `limits` as rlimits to the calling process; `*_by_cgroup` say which limits a
/// cgroup already enforces for the whole sandbox (the rlimit fallback is then skipped).
pub fn apply(
    limits: &Limits,
    memory_by_cgroup: bool,
    pids_by_cgroup: bool,
) -> Result<Vec<Feature>, JailError> {
    let mut set = Vec::new();
    let mut features = Vec::new();

    set.push(lower(Resource::Nofile, "RLIMIT_NOFILE", limits.nofile)?);
    // No core dumps: they would leak sandbox memory into files and waste the workspace.
    set.push(lower(Resource::Core, "RLIMIT_CORE", 0)?);
    if let Some(fsize) = limits.fsize_bytes {
        set.push(lower(Resource::Fsize, "RLIMIT_FSIZE", fsize)?);
    }
    if !pids_by_cgroup && let Some(pids) = limits.pids {
        // Since Linux 5.14 RLIMIT_NPROC counts per (user namespace, uid): it caps this sandbox.
        let applied = lower(Resource::Nproc, "RLIMIT_NPROC", pids)?;
        features.push(Feature {
            name: "pids_limit".into(),
            state: FeatureState::Degraded,
            detail: format!("{} for the sandbox user (no pids cgroup)", applied),
        });
        set.push(applied);
    }
    if !memory_by_cgroup && let Some(memory) = limits.memory_bytes {
        // RLIMIT_DATA, not RLIMIT_AS: V8 and others reserve far more address space than they use.
        let applied = lower(Resource::Data, "RLIMIT_DATA", memory)?;
        features.push(Feature {
            name: "memory_limit".into(),
            state: FeatureState::Degraded,
            detail: format!(
                "per-process {} (no memory cgroup: whole-sandbox limit and OOM detection \
                 unavailable)",
                applied
            ),
        });
        set.push(applied);
    }

    features.insert(
        0,
        Feature {
            name: "rlimits".into(),
            state: FeatureState::Active,
            detail: set.join(", "),
        },
    );
    Ok(features)
}

/// Sets soft = hard = `want`, or the current hard limit when `want` exceeds it; returns what
/// was set, e.g. `RLIMIT_NOFILE=1024`.
fn lower(resource: Resource, name: &str, want: u64) -> Result<String, JailError> {
    let hard = getrlimit(resource).maximum;
    let (value, text) = match hard {
        Some(h) if h < want => (
            h,
            format!("{name}={h} (asked {want}; capped at the existing hard limit)"),
        ),
        _ => (want, format!("{name}={want}")),
    };
    setrlimit(
        resource,
        Rlimit {
            current: Some(value),
            maximum: Some(value),
        },
    )
    .map_err(|e| JailError::io(format!("setrlimit({name}, {value})"), e.into()))?;
    Ok(text)
}
