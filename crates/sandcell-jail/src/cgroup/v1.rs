//! cgroup v1: one directory per controller hierarchy (memory, pids, cpu, cpuacct, freezer).

use std::fs;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use sandcell_protocol::{Feature, FeatureState};

use super::{
    CPU_PERIOD_US, Counters, Dir, FREEZE_TIMEOUT, SandboxCgroup, cgroup_mounts, cpu_quota_us, cpus,
    feature, mkdir_new, mkdir_parent, own_cgroup_dir, own_cgroups, parse_flat_keyed, read_u64,
    rollback, try_write, write_file,
};
use crate::config::Limits;
use crate::error::JailError;

/// Controllers that make a v1 setup worth using.
pub(super) const CORE: [&str; 3] = ["memory", "pids", "cpu"];
/// Every controller Sandcell uses on v1: limits, cpu accounting, and freezing for kill_all.
const USED: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// One v1 hierarchy and the controllers (of those we use) attached to it.
pub(super) struct Hierarchy {
    pub(super) controllers: Vec<String>,
    pub(super) mount: PathBuf,
    /// The cgroup path the mount shows at its top (`/` unless mounted from a sub-cgroup).
    pub(super) mount_root: String,
}

/// Finds the hierarchies of the controllers we use under `root`: the real mount points from
/// mountinfo (so `cpu,cpuacct` co-mounts and unusual names are right), else `root/<name>`.
pub(super) fn discover(root: &Path) -> Vec<Hierarchy> {
    let mounts = cgroup_mounts();
    let mut out: Vec<Hierarchy> = Vec::new();
    for controller in USED {
        let mounted = mounts
            .iter()
            .find(|m| {
                m.fstype == "cgroup"
                    && m.mount_point.starts_with(root)
                    && m.options.iter().any(|o| o == controller)
            })
            .map(|m| (m.mount_point.clone(), m.root.clone()));
        let found = mounted.or_else(|| {
            let dir = root.join(controller);
            // Symlinks such as cpu -> cpu,cpuacct resolve to one hierarchy.
            dir.is_dir()
                .then(|| (fs::canonicalize(&dir).unwrap_or(dir), "/".to_string()))
        });
        let Some((mount, mount_root)) = found else {
            continue;
        };
        match out.iter_mut().find(|h| h.mount == mount) {
            Some(h) => h.controllers.push(controller.to_string()),
            None => out.push(Hierarchy {
                controllers: vec![controller.to_string()],
                mount,
                mount_root,
            }),
        }
    }
    out
}

/// The controllers (of those we use) a v1 cgroup directory serves, told by their files.
pub(super) fn controllers_in(dir: &Path) -> Vec<String> {
    [
        ("memory", "memory.limit_in_bytes"),
        ("pids", "pids.max"),
        ("cpu", "cpu.cfs_quota_us"),
        ("cpuacct", "cpuacct.usage"),
        ("freezer", "freezer.state"),
    ]
    .iter()
    .filter(|(_, marker)| dir.join(marker).exists())
    .map(|(c, _)| c.to_string())
    .collect()
}

/// Creates `<mount>/<parent…>/<id>` in the memory, pids and cpuacct hierarchies (and cpu's,
/// `with_cpu`).
pub(super) fn make(
    hierarchies: &[Hierarchy],
    parent: &[String],
    id: &str,
    with_cpu: bool,
) -> Result<Vec<Dir>, JailError> {
    let mut dirs = Vec::new();
    // Read once for every hierarchy: each /proc read costs as much as a mkdir here.
    let own = own_cgroups();

    // cpuacct always: it is what tells a sandbox's CPU use. freezer always: it is what
    // pauses a sandbox (killing needs none: PID 1's death ends the pid namespace).
    let needed = |c: &String| {
        c == "memory" || c == "pids" || c == "cpuacct" || c == "freezer" || (c == "cpu" && with_cpu)
    };
    for h in hierarchies
        .iter()
        .filter(|h| h.controllers.iter().any(needed))
    {
        let mut parent_dir = h.mount.clone();
        parent_dir.extend(parent);
        let path = parent_dir.join(id);
        if let Err(e) = mkdir_parent(&parent_dir).and_then(|()| mkdir_new(&path)) {
            rollback(&dirs);
            return Err(e);
        }
        let origin = own_cgroup_dir(
            &own,
            &h.mount,
            &h.mount_root,
            h.controllers.first().map(String::as_str),
        );
        dirs.push(Dir {
            path,
            controllers: h.controllers.clone(),
            hierarchy: h.mount.clone(),
            origin,
        });
    }
    Ok(dirs)
}

fn find<'a>(dirs: &'a [Dir], controller: &str) -> Option<&'a Path> {
    dirs.iter()
        .find(|d| d.controllers.iter().any(|c| c == controller))
        .map(|d| d.path.as_path())
}

pub(super) fn apply(dirs: &[Dir], limits: &Limits) -> Result<Vec<Feature>, JailError> {
    Ok(vec![
        memory(find(dirs, "memory"), limits.memory_bytes)?,
        pids(find(dirs, "pids"), limits.pids)?,
        cpu(find(dirs, "cpu"), limits.cpu_millis)?,
    ])
}

fn memory(dir: Option<&Path>, bytes: Option<u64>) -> Result<Feature, JailError> {
    const NAME: &str = "memory_limit";
    let Some(bytes) = bytes else {
        return Ok(feature(
            NAME,
            FeatureState::Disabled,
            "no memory limit requested",
        ));
    };
    let Some(dir) = dir else {
        return Ok(feature(
            NAME,
            FeatureState::Unavailable,
            "no cgroup v1 memory hierarchy mounted",
        ));
    };
    // oom_kill_disable is inherited from the parent; with it set an OOM would hang the
    // sandbox instead of killing the offending process.
    let oom = dir.join("memory.oom_control");
    let oom_text = fs::read_to_string(&oom).unwrap_or_default();
    if parse_flat_keyed(&oom_text, "oom_kill_disable") == Some(1) {
        write_file(&oom, "0")?;
    }
    let limit = dir.join("memory.limit_in_bytes");
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let value = bytes.to_string();
    if !memsw.exists() {
        write_file(&limit, &value)?;
        let swap = match try_write(&dir.join("memory.swappiness"), "0") {
            Ok(()) => "memory.swappiness=0 instead",
            Err(_) => "and memory.swappiness could not be set, so it may swap",
        };
        return Ok(feature(
            NAME,
            FeatureState::Degraded,
            format!(
                "cgroup v1 memory.limit_in_bytes={bytes}; swap accounting is off (no memory.memsw.limit_in_bytes), {swap}"
            ),
        ));
    }
    // The kernel keeps limit_in_bytes <= memsw.limit_in_bytes after every write: going above
    // the current memsw limit needs memsw raised first, going below needs limit_in_bytes
    // lowered first. A fresh cgroup has both unlimited, so this is the lowering order.
    if read_u64(&memsw).is_some_and(|current| bytes > current) {
        write_file(&memsw, &value)?;
        write_file(&limit, &value)?;
    } else {
        write_file(&limit, &value)?;
        write_file(&memsw, &value)?;
    }
    Ok(feature(
        NAME,
        FeatureState::Active,
        format!("cgroup v1 memory.limit_in_bytes={bytes} memsw={bytes} (no swap)"),
    ))
}

fn pids(dir: Option<&Path>, max: Option<u64>) -> Result<Feature, JailError> {
    const NAME: &str = "pids_limit";
    let Some(max) = max else {
        return Ok(feature(
            NAME,
            FeatureState::Disabled,
            "no pids limit requested",
        ));
    };
    let Some(dir) = dir else {
        return Ok(feature(
            NAME,
            FeatureState::Unavailable,
            "no cgroup v1 pids hierarchy mounted",
        ));
    };
    write_file(&dir.join("pids.max"), &max.to_string())?;
    Ok(feature(
        NAME,
        FeatureState::Active,
        format!("cgroup v1 pids.max={max}"),
    ))
}

fn cpu(dir: Option<&Path>, millis: Option<u64>) -> Result<Feature, JailError> {
    const NAME: &str = "cpu_limit";
    let Some(millis) = millis else {
        return Ok(feature(
            NAME,
            FeatureState::Disabled,
            "no cpu quota requested",
        ));
    };
    let Some(dir) = dir else {
        return Ok(feature(
            NAME,
            FeatureState::Unavailable,
            "no cgroup v1 cpu hierarchy mounted",
        ));
    };
    let (quota, raised) = cpu_quota_us(millis);
    write_file(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
    write_file(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
    let detail = format!(
        "cgroup v1 cpu.cfs_quota_us={quota} cpu.cfs_period_us={CPU_PERIOD_US} ({} cpus)",
        cpus(millis)
    );
    Ok(if raised {
        feature(
            NAME,
            FeatureState::Degraded,
            format!("{detail}, raised to the kernel's 1 ms minimum"),
        )
    } else {
        feature(NAME, FeatureState::Active, detail)
    })
}

pub(super) fn counters(cg: &SandboxCgroup) -> Counters {
    Counters {
        oom_kills: cg
            .read_keyed("memory", "memory.oom_control", "oom_kill")
            .unwrap_or(0),
        pids_limit_hits: cg.read_keyed("pids", "pids.events", "max").unwrap_or(0),
        memory_bytes: cg.read_value("memory", "memory.usage_in_bytes"),
        memory_peak_bytes: cg.read_value("memory", "memory.max_usage_in_bytes"),
        cpu_usage_us: cg
            .read_value("cpuacct", "cpuacct.usage")
            .map(|ns| ns / 1000),
        pids_current: cg.read_value("pids", "pids.current"),
    }
}

/// Freezes the cgroup when the freezer hierarchy is there; says whether it tried.
pub(super) fn freeze(cg: &SandboxCgroup) -> bool {
    // Kill anyway when it takes too long (a task in uninterruptible sleep can hold it up).
    freeze_within(cg, FREEZE_TIMEOUT).is_some()
}

/// The first wait for FROZEN before a thaw and a new attempt; doubled each attempt.
const FIRST_ATTEMPT: Duration = Duration::from_millis(25);

/// Freezes the cgroup: `None` without a freezer, else whether every task stopped within
/// `limit` (FREEZING until then).
///
/// The v1 freezer can stay FREEZING for good: a child that vfork(2) made and that is frozen
/// before it execs holds its parent in the vfork wait, which this freezer cannot freeze
/// (the parent shows state `D` in `kernel_clone`; cgroup v2 counts such a parent as frozen,
/// v1 does not). A shell loop that forks `sleep` hit it in ~1.6% of freezes here, each then
/// failing after the whole limit. A brief thaw lets the child exec and free its parent,
/// so the freeze is tried again with a longer wait each time (0 failures in 3,000 freezes,
/// the slowest 36 ms).
pub(super) fn freeze_within(cg: &SandboxCgroup, limit: Duration) -> Option<bool> {
    let dir = cg.dir_for("freezer")?;
    let state = dir.join("freezer.state");
    if !state.exists() {
        return None;
    }
    let deadline = Instant::now() + limit;
    let mut attempt = FIRST_ATTEMPT;
    loop {
        if try_write(&state, "FROZEN").is_err() {
            return None;
        }
        let until = deadline.min(Instant::now() + attempt);
        loop {
            if frozen(cg) == Some(true) {
                return Some(true);
            }
            if Instant::now() >= until {
                break;
            }
            sleep(Duration::from_micros(200));
        }
        if Instant::now() >= deadline {
            return Some(false);
        }
        thaw(cg);
        sleep(Duration::from_millis(1));
        attempt *= 2;
    }
}

/// Whether every task is frozen (`None` without a freezer).
pub(super) fn frozen(cg: &SandboxCgroup) -> Option<bool> {
    let dir = cg.dir_for("freezer")?;
    fs::read_to_string(dir.join("freezer.state"))
        .ok()
        .map(|s| s.trim() == "FROZEN")
}

/// Thaws the cgroup so pending SIGKILLs take effect.
pub(super) fn thaw(cg: &SandboxCgroup) {
    if let Some(dir) = cg.dir_for("freezer") {
        let _ = try_write(&dir.join("freezer.state"), "THAWED");
    }
}
