//! cgroup v2: one directory in the unified hierarchy, controllers enabled down the path.

use std::fs;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use sandcell_protocol::{Feature, FeatureState};

use super::{
    CPU_PERIOD_US, Counters, Dir, FREEZE_TIMEOUT, SandboxCgroup, WriteFailure, cgroup_mounts,
    cpu_quota_us, cpus, describe, feature, mkdir_new, mkdir_parent, own_cgroup_dir, own_cgroups,
    parse_flat_keyed, read_words, try_write, write_error, write_file,
};
use crate::config::Limits;
use crate::error::JailError;

/// The controllers Sandcell enables for sandbox cgroups, in the order they are written.
const WANTED: [&str; 3] = ["memory", "pids", "cpu"];

/// Controllers that could not be had, with the reason.
type Missing = Vec<(String, String)>;

/// Enables the controllers from `root` down to `<root>/<parent…>` and creates the sandbox
/// directory; returns it with the controllers that could not be enabled.
pub(super) fn make(
    root: &Path,
    available: &[String],
    parent: &[String],
    id: &str,
) -> Result<(Dir, Missing), JailError> {
    let mut enabled: Vec<String> = Vec::new();
    let mut missing: Missing = Vec::new();
    for c in WANTED {
        if available.iter().any(|a| a == c) {
            enabled.push(c.to_string());
        } else {
            let why = format!("{}/cgroup.controllers does not offer {c}", root.display());
            missing.push((c.to_string(), why));
        }
    }
    let mut level = root.to_path_buf();
    enable(&level, &mut enabled, &mut missing)?;
    for component in parent {
        level.push(component);
        mkdir_parent(&level)?;
        enable(&level, &mut enabled, &mut missing)?;
    }
    let path = level.join(id);
    mkdir_new(&path)?;
    let mount_root = cgroup_mounts()
        .into_iter()
        .find(|m| m.mount_point == root)
        .map_or_else(|| "/".to_string(), |m| m.root);
    let origin = own_cgroup_dir(&own_cgroups(), root, &mount_root, None);
    let dir = Dir {
        path,
        controllers: enabled,
        hierarchy: root.to_path_buf(),
        origin,
    };
    Ok((dir, missing))
}

/// Turns the wanted controllers on in `level/cgroup.subtree_control` so its children get
/// them. Only the missing ones are written, so an already set-up (or delegated) parent
/// needs no write access.
fn enable(level: &Path, enabled: &mut Vec<String>, missing: &mut Missing) -> Result<(), JailError> {
    let file = level.join("cgroup.subtree_control");
    let on = read_words(&file);
    let todo: Vec<String> = enabled
        .iter()
        .filter(|c| !on.contains(c))
        .cloned()
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let line: Vec<String> = todo.iter().map(|c| format!("+{c}")).collect();
    let line = line.join(" ");
    match try_write(&file, &line) {
        Ok(()) => return Ok(()),
        Err(WriteFailure::Missing) => return Err(write_error(&file, &line, WriteFailure::Missing)),
        Err(WriteFailure::Failed(_)) => {}
    }
    // One controller can fail alone (cpu, while realtime threads run in a non-root cgroup):
    // find which, and keep the others.
    let mut reasons = Vec::new();
    for c in todo {
        if let Err(f) = try_write(&file, &format!("+{c}")) {
            let why = match f {
                WriteFailure::Missing => "interface file is missing".to_string(),
                WriteFailure::Failed(e) if e.raw_os_error() == Some(libc::EBUSY) => format!(
                    "{} (a non-root cgroup with processes in it cannot enable controllers for children)",
                    describe(&e)
                ),
                WriteFailure::Failed(e) => describe(&e),
            };
            let why = format!("cannot enable +{c} in {}: {why}", file.display());
            reasons.push(why.clone());
            enabled.retain(|x| *x != c);
            missing.push((c, why));
        }
    }
    if enabled.is_empty() {
        return Err(super::cg_err(&file, reasons.join("; ")));
    }
    Ok(())
}

pub(super) fn apply(
    dir: &Dir,
    missing: &[(String, String)],
    limits: &Limits,
) -> Result<Vec<Feature>, JailError> {
    let has = |c: &str| dir.controllers.iter().any(|x| x == c);
    let why_not = |c: &str| {
        missing
            .iter()
            .find(|(m, _)| m == c)
            .map_or_else(|| format!("no {c} controller"), |(_, why)| why.clone())
    };
    let path = &dir.path;
    let mut features = Vec::new();

    features.push(match limits.memory_bytes {
        None => feature(
            "memory_limit",
            FeatureState::Disabled,
            "no memory limit requested",
        ),
        Some(_) if !has("memory") => {
            feature("memory_limit", FeatureState::Unavailable, why_not("memory"))
        }
        Some(bytes) => memory(path, bytes)?,
    });
    features.push(match limits.pids {
        None => feature(
            "pids_limit",
            FeatureState::Disabled,
            "no pids limit requested",
        ),
        Some(_) if !has("pids") => {
            feature("pids_limit", FeatureState::Unavailable, why_not("pids"))
        }
        Some(max) => {
            write_file(&path.join("pids.max"), &max.to_string())?;
            feature(
                "pids_limit",
                FeatureState::Active,
                format!("cgroup v2 pids.max={max}"),
            )
        }
    });
    features.push(match limits.cpu_millis {
        None => feature(
            "cpu_limit",
            FeatureState::Disabled,
            "no cpu quota requested",
        ),
        Some(_) if !has("cpu") => feature("cpu_limit", FeatureState::Unavailable, why_not("cpu")),
        Some(millis) => {
            let (quota, raised) = cpu_quota_us(millis);
            write_file(&path.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
            let detail = format!(
                "cgroup v2 cpu.max={quota} {CPU_PERIOD_US} ({} cpus)",
                cpus(millis)
            );
            if raised {
                let detail = format!("{detail}, raised to the kernel's 1 ms minimum");
                feature("cpu_limit", FeatureState::Degraded, detail)
            } else {
                feature("cpu_limit", FeatureState::Active, detail)
            }
        }
    });
    Ok(features)
}

/// memory.max plus no swap. memory.oom.group stays off on purpose: on OOM only the
/// offending process should die, so the rest of the sandbox (its agent) survives to report.
fn memory(dir: &Path, bytes: u64) -> Result<Feature, JailError> {
    write_file(&dir.join("memory.max"), &bytes.to_string())?;
    let swap = dir.join("memory.swap.max");
    Ok(match try_write(&swap, "0") {
        Ok(()) => feature(
            "memory_limit",
            FeatureState::Active,
            format!("cgroup v2 memory.max={bytes} memory.swap.max=0 (no swap)"),
        ),
        Err(WriteFailure::Missing) => feature(
            "memory_limit",
            FeatureState::Degraded,
            format!(
                "cgroup v2 memory.max={bytes}; no memory.swap.max (swap accounting off), so swap is not limited"
            ),
        ),
        Err(f) => return Err(write_error(&swap, "0", f)),
    })
}

pub(super) fn counters(cg: &SandboxCgroup) -> Counters {
    Counters {
        oom_kills: cg
            .read_keyed("memory", "memory.events", "oom_kill")
            .unwrap_or(0),
        pids_limit_hits: cg.read_keyed("pids", "pids.events", "max").unwrap_or(0),
        memory_bytes: cg.read_value("memory", "memory.current"),
        memory_peak_bytes: cg.read_value("memory", "memory.peak"),
        cpu_usage_us: cg.read_keyed("cpu", "cpu.stat", "usage_usec"),
        pids_current: cg.read_value("pids", "pids.current"),
    }
}

/// Writes cgroup.kill (Linux 5.14+), which kills every process atomically, forks included.
/// `false` when the kernel has no cgroup.kill.
pub(super) fn kill_switch(dir: &Path) -> Result<bool, JailError> {
    let file = dir.join("cgroup.kill");
    if !file.exists() {
        return Ok(false);
    }
    write_file(&file, "1")?;
    Ok(true)
}

/// Freezes the cgroup (Linux 5.2+); says whether it tried.
pub(super) fn freeze(dir: &Path) -> bool {
    freeze_within(dir, FREEZE_TIMEOUT).is_some()
}

/// Freezes the cgroup: `None` without `cgroup.freeze`, else whether every task stopped
/// within `limit`.
pub(super) fn freeze_within(dir: &Path, limit: Duration) -> Option<bool> {
    let file = dir.join("cgroup.freeze");
    if !file.exists() || try_write(&file, "1").is_err() {
        return None;
    }
    let deadline = Instant::now() + limit;
    loop {
        if frozen(dir) == Some(true) {
            return Some(true);
        }
        if Instant::now() >= deadline {
            return Some(false);
        }
        sleep(Duration::from_micros(200));
    }
}

/// Whether every task is frozen (`None` without the freezer's files).
pub(super) fn frozen(dir: &Path) -> Option<bool> {
    let text = fs::read_to_string(dir.join("cgroup.events")).ok()?;
    parse_flat_keyed(&text, "frozen").map(|v| v == 1)
}

/// Thaws the cgroup so pending SIGKILLs take effect.
pub(super) fn thaw(dir: &Path) {
    let _ = try_write(&dir.join("cgroup.freeze"), "0");
}
