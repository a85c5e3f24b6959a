//! Sandcell run by an unprivileged user: every namespace still, rlimits instead of cgroups,
//! and the report says so.

use std::process::Command;

use super::common::*;

/// Runs the binary as `nobody` (needs root and runuser); `None`, the test reported skipped,
/// when that is not possible.
fn as_nobody(args: &[&str]) -> Option<serde_json::Value> {
    let root = Command::new("id").arg("-u").output().ok()?.stdout == b"0\n";
    if !root || Command::new("runuser").arg("--help").output().is_err() {
        sandcell_testkit::skip::skip("needs root and runuser to switch to an unprivileged user");
        return None;
    }
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", BIN, "run", "--json"])
        .args(args)
        .current_dir("/")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr))),
    )
}

fn state(v: &serde_json::Value, name: &str) -> String {
    v["isolation"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .map(|f| f["state"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[test]
fn rootless_runs_isolated_and_reports_degraded_limits() {
    let Some(v) = as_nobody(&[
        "--",
        "sh",
        "-c",
        "id -u; cat /proc/self/status | grep -E '^(CapEff|Seccomp):'",
    ]) else {
        return;
    };
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("65532\n"), "{out}");
    assert!(
        out.contains("CapEff:\t0000000000000000") && out.contains("Seccomp:\t2"),
        "{out}"
    );
    assert_eq!(state(&v, "cgroups"), "unavailable", "{v}");
    assert_eq!(state(&v, "memory_limit"), "degraded");
    assert_eq!(state(&v, "pids_limit"), "degraded");
    for active in [
        "user_ns",
        "pid_ns",
        "net_ns",
        "seccomp",
        "landlock",
        "capabilities",
    ] {
        assert_eq!(state(&v, active), "active", "{active}");
    }
}

#[test]
fn rootless_memory_and_fork_bombs_are_contained_by_rlimits() {
    let Some(v) = as_nobody(&[
        "--memory",
        "64m",
        "--",
        "/usr/bin/python3",
        "-c",
        "a = bytearray(400 * 2**20)",
    ]) else {
        return;
    };
    assert_ne!(v["result"]["exit_code"], 0, "{v}");
    assert!(v["stderr"].as_str().unwrap().contains("MemoryError"), "{v}");
    let fork_many = "import os, time\nkids, refused = [], 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(5)\n            os._exit(0)\n        kids.append(pid)\n    except BlockingIOError:\n        refused += 1\nprint(refused)\nfor pid in kids:\n    os.kill(pid, 9)";
    let Some(v) = as_nobody(&["--pids", "32", "--", "/usr/bin/python3", "-c", fork_many]) else {
        return;
    };
    let refused: u32 = v["stdout"].as_str().unwrap().trim().parse().unwrap_or(0);
    assert!(refused > 0, "no fork was refused: {v}");
}

#[tokio::test]
async fn sandbox_user_maps_to_an_unprivileged_host_id() {
    let sb = sandbox().await;
    let pid = sb.host_pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap();
    assert_ne!(uid, 0, "the sandbox runs as host root");
    sb.destroy().await.unwrap();
}
