//! What isolation this host can give a sandbox, probed without starting one.

use std::path::Path;

use sandcell_protocol::{FeatureState, IsolationReport};

use crate::cgroup::{self, CgroupVersion};
use crate::landlock_policy;

/// Probes the host: namespaces, seccomp, Landlock, cgroups. `cgroup_parent` is where sandbox
/// cgroups would go (relative to each hierarchy's root).
pub fn host_report(cgroup_root: &Path, cgroup_parent: &str) -> IsolationReport {
    let mut r = IsolationReport::default();
    let root = nix::unistd::geteuid().is_root();

    let max_userns = read_u64("/proc/sys/user/max_user_namespaces");
    let unpriv_clone = read_u64("/proc/sys/kernel/unprivileged_userns_clone");
    let apparmor_restrict = read_u64("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    let (state, detail) = if max_userns == Some(0) {
        (
            FeatureState::Unavailable,
            "user.max_user_namespaces is 0".to_string(),
        )
    } else if !root && unpriv_clone == Some(0) {
        (
            FeatureState::Unavailable,
            "kernel.unprivileged_userns_clone is 0: run as root or set it to 1".into(),
        )
    } else if !root && apparmor_restrict == Some(1) {
        (FeatureState::Unavailable, "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)".into())
    } else {
        (
            FeatureState::Active,
            format!(
                "user namespaces allowed (max {})",
                max_userns.map_or("?".into(), |m| m.to_string())
            ),
        )
    };
    r.set("user_ns", state, detail);
    for ns in ["pid", "mnt", "net", "ipc", "uts", "cgroup"] {
        let name = if ns == "mnt" {
            "mount_ns".to_string()
        } else {
            format!("{ns}_ns")
        };
        if Path::new(&format!("/proc/self/ns/{ns}")).exists() {
            r.set(
                &name,
                FeatureState::Active,
                format!("{ns} namespaces supported"),
            );
        } else {
            r.set(
                &name,
                FeatureState::Unavailable,
                format!("kernel has no {ns} namespaces"),
            );
        }
    }

    let seccomp = std::fs::read_to_string("/proc/self/status")
        .ok()
        .is_some_and(|s| s.lines().any(|l| l.starts_with("Seccomp:")));
    if seccomp {
        r.set("seccomp", FeatureState::Active, "seccomp filters supported");
    } else {
        r.set(
            "seccomp",
            FeatureState::Unavailable,
            "kernel built without seccomp",
        );
    }

    match landlock_policy::abi_version() {
        Some(v) => r.set(
            "landlock",
            FeatureState::Active,
            format!("Landlock ABI v{v}"),
        ),
        None => r.set(
            "landlock",
            FeatureState::Unavailable,
            "kernel has no Landlock (or it is not enabled in the lsm= list)",
        ),
    }

    let support = cgroup::detect(cgroup_root);
    match (support.version, support.writable) {
        (Some(v), true) => {
            let name = match v {
                CgroupVersion::V1 => "v1",
                CgroupVersion::V2 => "v2",
            };
            r.set(
                "cgroups",
                FeatureState::Active,
                format!(
                    "cgroup {name}, controllers {}, sandboxes under {cgroup_parent}",
                    support.controllers.join(",")
                ),
            );
            for (feature, controller) in [
                ("memory_limit", "memory"),
                ("pids_limit", "pids"),
                ("cpu_limit", "cpu"),
            ] {
                if support.controllers.iter().any(|c| c == controller) {
                    r.set(
                        feature,
                        FeatureState::Active,
                        format!("{controller} cgroup controller"),
                    );
                } else {
                    r.set(
                        feature,
                        FeatureState::Unavailable,
                        format!("no {controller} controller"),
                    );
                }
            }
        }
        _ => {
            let why = support
                .reason
                .unwrap_or_else(|| "no usable cgroup hierarchy".into());
            r.set("cgroups", FeatureState::Unavailable, why);
            r.set(
                "memory_limit",
                FeatureState::Degraded,
                "per-process RLIMIT_DATA instead of a whole-sandbox limit; no OOM detection",
            );
            r.set(
                "pids_limit",
                FeatureState::Degraded,
                "RLIMIT_NPROC for the sandbox user instead of a pids cgroup",
            );
            r.set(
                "cpu_limit",
                FeatureState::Unavailable,
                "needs the cpu cgroup controller",
            );
        }
    }
    r
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Host settings that make sandboxes slower than they need to be, with the fix for each.
/// Sandcell never changes them itself: they are machine-wide.
pub fn tuning_hints(cgroup_root: &Path) -> Vec<String> {
    let mut hints = Vec::new();
    // On v1 the sandbox moves itself into its cgroup, which skips the lock below; on v2 the
    // launcher moves it from outside.
    let v2 = cgroup::detect(cgroup_root).version == Some(CgroupVersion::V2);
    if v2 && read_u64("/sys/kernel/rcu_expedited") == Some(0) {
        hints.push(
            "cgroup v2: moving the sandbox into its cgroup waits for an RCU grace period \
             (~6-10 ms on a slow VM when sandboxes start apart); \
             `echo 1 > /sys/kernel/rcu_expedited` or mounting cgroup2 with favordynmods \
             removes most of it"
                .to_string(),
        );
    }
    hints
}
