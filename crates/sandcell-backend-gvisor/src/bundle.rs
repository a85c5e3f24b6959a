//! The OCI bundle of one sandbox: `config.json` for `runsc`, over the root skeleton the
//! `process` backend uses too (read-only system binds, synthesized `/etc`, tmpfs for the
//! writable folders), with the Sandcell binary bound at [`GUEST_DIR`].

use serde_json::{Value, json};

use crate::guest::{NETWORK_LOOPBACK, NETWORK_OFF};
use sandcell_engine::{MountMode, NetworkPolicy, SandboxSpec};
use sandcell_protocol::SANDBOX_UID;

/// Where the Sandcell binary is bound inside (read-only).
pub const GUEST_DIR: &str = "/.sandcell";

/// The tmpfs folders every sandbox gets, with their permission bits.
pub const TMPFS: [(&str, &str); 3] = [
    ("/workspace", "755"),
    ("/home/sandbox", "755"),
    ("/tmp", "1777"),
];

/// Host memory gVisor's own kernel needs besides the sandbox's: the cgroup limit is the
/// sandbox's plus this (the whole sandbox, gVisor included, is what the host limits).
pub const MEMORY_OVERHEAD: u64 = 128 * 1024 * 1024;

/// Host tasks gVisor's own kernel needs besides the sandbox's processes (its threads; under
/// the ptrace platform each sandbox process is one host task too).
pub const PIDS_OVERHEAD: u64 = 256;

/// What a bundle is made from besides the spec.
#[derive(Debug, Clone)]
pub struct BundleInputs<'a> {
    /// The root skeleton (host folder), bound read-only as `/`.
    pub root: &'a str,
    /// Where the system comes from: `/` (the host's own) or an image's unpacked root.
    pub system_root: &'a str,
    /// System paths bound read-only from under `system_root` to the same place inside.
    pub binds: &'a [String],
    /// The host folder holding the Sandcell binary (bound at [`GUEST_DIR`]).
    pub guest_dir: &'a str,
    /// The host folder of the sandbox's egress proxy socket (bound at
    /// [`sandcell_protocol::EGRESS_DIR`]; `None`: its network is `off`).
    pub egress_dir: Option<&'a str>,
    /// The cgroup path (relative to each hierarchy's root).
    pub cgroup_path: &'a str,
    /// The hostname inside.
    pub hostname: &'a str,
}

/// The bundle's `config.json` for sandbox `spec`.
pub fn config(spec: &SandboxSpec, inputs: &BundleInputs<'_>) -> Value {
    let l = &spec.limits;
    let uid = SANDBOX_UID;
    let mut mounts = vec![json!({"destination": "/proc", "type": "proc", "source": "proc"})];
    for (path, mode) in TMPFS {
        let size = match path {
            "/workspace" => l.disk_bytes,
            "/home/sandbox" => l.home_bytes,
            _ => l.tmp_bytes,
        };
        let mut options = vec![format!("mode={mode}"), format!("size={size}")];
        if path != "/tmp" {
            options.push(format!("uid={uid}"));
            options.push(format!("gid={uid}"));
        }
        mounts.push(json!({
            "destination": path, "type": "tmpfs", "source": "tmpfs", "options": options,
        }));
    }
    // Host folders and volumes (the spec's rules put them side by side in the sandbox's own
    // folders).
    for m in &spec.mounts {
        let access = if m.mode == MountMode::Rw { "rw" } else { "ro" };
        mounts.push(json!({
            "destination": m.target.trim_end_matches('/'), "type": "bind", "source": m.source,
            "options": ["bind", access, "nosuid", "nodev"],
        }));
    }
    // As on `process`: POSIX shared memory and semaphores (Python's multiprocessing) need a
    // writable /dev/shm; gVisor's own is root's, mode 755.
    mounts.push(json!({
        "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
        "options": ["nosuid", "nodev", "mode=1777", format!("size={}", sandcell_jail::rootfs::SHM_BYTES)],
    }));
    let system_root = inputs.system_root.trim_end_matches('/');
    for path in inputs.binds {
        mounts.push(json!({
            "destination": path, "type": "bind", "source": format!("{system_root}{path}"),
            "options": ["rbind", "ro", "nosuid", "nodev"],
        }));
    }
    mounts.push(json!({
        "destination": GUEST_DIR, "type": "bind", "source": inputs.guest_dir,
        "options": ["rbind", "ro"],
    }));
    if let Some(dir) = inputs.egress_dir {
        // runsc's `--host-uds=open` lets the sandbox connect to the socket in it.
        mounts.push(json!({
            "destination": sandcell_protocol::EGRESS_DIR, "type": "bind", "source": dir,
            "options": ["bind", "ro", "nosuid", "nodev", "noexec"],
        }));
    }
    let mut resources = json!({});
    if let Some(m) = l.memory_bytes {
        let limit = m.saturating_add(MEMORY_OVERHEAD);
        resources["memory"] = json!({"limit": limit, "swap": limit});
    }
    if let Some(p) = l.pids {
        resources["pids"] = json!({"limit": p.saturating_add(PIDS_OVERHEAD)});
    }
    if let Some(c) = l.cpus {
        let period: u64 = 100_000;
        resources["cpu"] = json!({"quota": (c * period as f64).round() as i64, "period": period});
    }
    let network = match spec.network {
        NetworkPolicy::Off => NETWORK_OFF,
        // Egress leaves through the proxy, never through the sandbox's own network.
        NetworkPolicy::Loopback | NetworkPolicy::Full | NetworkPolicy::Allow(_) => NETWORK_LOOPBACK,
    };
    let mut args = vec![
        format!("{GUEST_DIR}/sandcell"),
        "__gvisor-guest".to_string(),
        network.to_string(),
    ];
    if inputs.egress_dir.is_some() {
        args.push(crate::guest::EGRESS.to_string());
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": uid},
            // The agent installs the seccomp filter for this policy before it serves.
            "args": args,
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/sandbox"],
            "cwd": "/workspace",
            "noNewPrivileges": true,
            // The agent keeps CAP_SYS_ADMIN (in gVisor's kernel) only to rename a restored
            // sandbox; with no bounding, inheritable or ambient set, nothing it starts has any.
            "capabilities": {"bounding": [], "effective": ["CAP_SYS_ADMIN"], "inheritable": [], "permitted": ["CAP_SYS_ADMIN"], "ambient": []},
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": l.open_files, "soft": l.open_files},
            ],
        },
        "root": {"path": inputs.root, "readonly": true},
        "hostname": inputs.hostname,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": inputs.cgroup_path,
            "resources": resources,
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                {"type": "network"},
            ],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> BundleInputs<'static> {
        BundleInputs {
            root: "/run/sandcell/rootfs/root-x",
            system_root: "/",
            binds: &[],
            guest_dir: "/run/sandcell/gvisor/bin",
            egress_dir: None,
            cgroup_path: "/sandcell/sb-1",
            hostname: "sandcell",
        }
    }

    #[test]
    fn limits_reach_the_bundle_with_gvisors_own_share() {
        let spec = SandboxSpec::default();
        let c = config(&spec, &inputs());
        let mem = spec.limits.memory_bytes.unwrap();
        assert_eq!(
            c["linux"]["resources"]["memory"]["limit"],
            json!(mem + MEMORY_OVERHEAD)
        );
        assert_eq!(
            c["linux"]["resources"]["pids"]["limit"],
            json!(spec.limits.pids.unwrap() + PIDS_OVERHEAD)
        );
        let ws = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/workspace")
            .unwrap();
        let opts: Vec<&str> = ws["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert!(opts.contains(&format!("size={}", spec.limits.disk_bytes).as_str()));
        assert!(opts.contains(&format!("uid={SANDBOX_UID}").as_str()));
        assert_eq!(c["process"]["user"]["uid"], json!(SANDBOX_UID));
        let shm = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/dev/shm")
            .unwrap();
        assert!(
            shm["options"]
                .as_array()
                .unwrap()
                .contains(&json!("mode=1777"))
        );
        assert_eq!(c["root"]["readonly"], json!(true));
        assert_eq!(c["process"]["args"][2], json!(NETWORK_LOOPBACK));
        let off = SandboxSpec {
            network: NetworkPolicy::Off,
            ..SandboxSpec::default()
        };
        assert_eq!(
            config(&off, &inputs())["process"]["args"][2],
            json!(NETWORK_OFF)
        );
    }

    #[test]
    fn a_bound_egress_folder_is_mounted_read_only_and_named_to_the_agent() {
        let with = BundleInputs {
            egress_dir: Some("/run/sandcell/egress/sb-1"),
            ..inputs()
        };
        let c = config(&SandboxSpec::default(), &with);
        assert_eq!(c["process"]["args"][3], json!(crate::guest::EGRESS));
        let mount = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == sandcell_protocol::EGRESS_DIR)
            .unwrap();
        assert_eq!(mount["source"], json!("/run/sandcell/egress/sb-1"));
        assert!(mount["options"].as_array().unwrap().contains(&json!("ro")));
        // Without one, neither.
        let c = config(&SandboxSpec::default(), &inputs());
        assert!(c["process"]["args"].get(3).is_none());
        assert!(
            !c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["destination"] == sandcell_protocol::EGRESS_DIR)
        );
    }

    #[test]
    fn an_images_system_is_bound_from_its_root_read_only_and_without_setuid() {
        let binds = ["/usr".to_string(), "/app".to_string()];
        let from_image = BundleInputs {
            system_root: "/var/lib/sandcell/images/roots/abc/",
            binds: &binds,
            ..inputs()
        };
        let c = config(&SandboxSpec::default(), &from_image);
        let mounts = c["mounts"].as_array().unwrap();
        for path in binds {
            let m = mounts.iter().find(|m| m["destination"] == path).unwrap();
            assert_eq!(
                m["source"],
                json!(format!("/var/lib/sandcell/images/roots/abc{path}"))
            );
            for option in ["ro", "nosuid", "nodev"] {
                assert!(m["options"].as_array().unwrap().contains(&json!(option)));
            }
        }
    }
}
