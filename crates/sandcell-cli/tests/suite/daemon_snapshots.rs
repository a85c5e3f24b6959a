//! Snapshots over HTTP: taken while the sandbox runs on, forked many times into independent
//! sandboxes, kept across a daemon restart, checked by checksum, traced by lineage, and never
//! left half-written when the disk fills.

use std::process::Command;

use reqwest::Method;
use serde_json::{Value, json};

use super::daemon::{CodeResultExt, Daemon, Resp};

fn snapshot(d: &Daemon, id: &str, body: Value) -> Resp {
    d.post(&format!("/v1/sandboxes/{id}/snapshots"), body)
}

pub(super) fn fork(d: &Daemon, snap: &str, count: u32) -> Resp {
    d.post(
        &format!("/v1/snapshots/{snap}/fork"),
        json!({ "count": count }),
    )
}

pub(super) fn fork_ids(r: &Resp) -> Vec<String> {
    r.body["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["sandbox"]["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn daemon_snapshots_fork_independent_sandboxes_and_survive_a_restart() {
    let mut d = Daemon::start(&[]);
    let src = d.create_id(json!({"template": "python"}));
    let out = d.exec(
        &src,
        "mkdir -p /workspace/data/deep && head -c 3000000 /dev/urandom > /workspace/data/deep/blob \
         && sha256sum /workspace/data/deep/blob | cut -c1-64 > /workspace/sum \
         && printf 'echo hi' > /workspace/run.sh && chmod 750 /workspace/run.sh \
         && ln -s data/deep/blob /workspace/link && printf rc > /home/sandbox/.rc \
         && echo scratch > /tmp/scratch && cat /workspace/sum",
    );
    let sum = out.stdout.as_str().trim().to_string();
    // Kernel state: ~50 MB of list, a function, a class and its instance, and an open file
    // (which cannot be carried).
    let r = d.code(
        &src,
        "big = list(range(6_000_000))\ndef f(x): return x * 2\nclass C:\n    def v(self): return 7\n\
         c = C()\nfh = open('/workspace/run.sh')",
    );
    assert_eq!(r.done.status, "ok", "{r:?}");

    let r = snapshot(
        &d,
        &src,
        json!({"name": "base", "description": "d", "tags": {"k": "v"}}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(r.body["fidelity"], "language", "{}", r.body);
    let kernel = &r.body["manifest"]["kernels"][0];
    assert_eq!(kernel["context"], "python", "{}", r.body);
    for name in ["big", "f", "C", "c"] {
        assert!(
            kernel["saved"].to_string().contains(&format!("\"{name}\"")),
            "{kernel}"
        );
    }
    assert_eq!(kernel["skipped"][0]["name"], "fh", "{kernel}");
    assert_eq!(
        (r.body["name"].clone(), r.body["tags"]["k"].clone()),
        (json!("base"), json!("v"))
    );
    // Five files, and the kernel's state file.
    assert_eq!(r.body["files"], 6, "{}", r.body);
    assert!(r.body["size"].as_u64().unwrap() > 10_000_000);
    assert!(r.body["manifest"]["sha256"].as_str().unwrap().len() == 64);
    let gaps = r.body["manifest"]["not_carried"].to_string();
    assert!(
        gaps.contains("language fidelity")
            && gaps.contains("outside /workspace, /home/sandbox, /tmp ("),
        "{gaps}"
    );
    // The source runs on, unchanged.
    assert_eq!(d.sandbox(&src).state, "running");
    assert_eq!(d.exec(&src, "echo still").stdout, "still\n");

    // Three forks: each has the files (bytes, modes, links), none sees another's changes.
    let r = fork(&d, &snap, 3);
    assert_eq!(r.status, 201, "{}", r.body);
    let forks = fork_ids(&r);
    assert_eq!(forks.len(), 3);
    assert_eq!(
        r.body["sandboxes"][0]["restore"]["files"]["files"], 6,
        "{}",
        r.body
    );
    let restore = &r.body["sandboxes"][0]["restore"];
    assert_eq!(restore["fidelity"], "language");
    assert!(
        restore["kernels"][0]["restored"]
            .to_string()
            .contains("\"big\""),
        "{restore}"
    );
    assert_eq!(
        restore["kernels"][0]["skipped"][0]["name"], "fh",
        "{restore}"
    );
    for (i, f) in forks.iter().enumerate() {
        assert_ne!(f, &src);
        let out = d.exec(
            f,
            "sha256sum /workspace/data/deep/blob | cut -c1-64; stat -c %a /workspace/run.sh; \
             readlink /workspace/link; cat /home/sandbox/.rc; echo; ls /tmp; id -un",
        );
        assert_eq!(
            out.stdout,
            format!("{sum}\n750\ndata/deep/blob\nrc\nscratch\nsandbox\n"),
            "{out:?}"
        );
        // A new identity: its own hostname.
        assert_eq!(d.exec(f, "hostname").stdout, format!("{f}\n"));
        d.exec(f, &format!("echo fork{i} > /workspace/mine"));
        let v = d.code(f, "(len(big), big[-1], f(21), c.v(), isinstance(c, C))");
        assert_eq!(v.plain(), "(6000000, 5999999, 42, 7, True)", "{v:?}");
        d.code(f, &format!("big.append({i})"));
    }
    // Each fork's kernel is its own.
    for (i, f) in forks.iter().enumerate() {
        let v = d.code(f, "big[-1]");
        assert_eq!(v.plain(), i.to_string(), "{v:?}");
    }
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(
            d.exec(f, "cat /workspace/mine").stdout,
            format!("fork{i}\n")
        );
    }
    let none = d.exec(&src, "ls /workspace/mine 2>&1; true");
    assert!(none.stdout.as_str().contains("No such file"), "{none:?}");
    // Different random streams in each fork.
    let draws: std::collections::BTreeSet<String> = forks
        .iter()
        .map(|f| {
            d.code(f, "import random; random.random()")
                .plain()
                .to_string()
        })
        .collect();
    assert_eq!(draws.len(), 3, "{draws:?}");

    // Lineage: a snapshot of a fork is the first one's child.
    let r = snapshot(&d, &forks[0], json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let child = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(r.body["parent_id"], snap.as_str());
    let shown = d.get(&format!("/v1/snapshots/{snap}"));
    assert_eq!(shown.body["children"], json!([child]), "{}", shown.body);
    assert_eq!(shown.body["sandboxes"].as_array().unwrap().len(), 3);
    d.delete(&format!("/v1/snapshots/{snap}"))
        .expect_error(409, "has_children");

    // The source destroyed, the daemon killed with -9 and restarted: the snapshot is still
    // there and restores the kernel's values.
    assert_eq!(d.delete(&format!("/v1/sandboxes/{src}")).status, 204);
    d.kill9();
    d.restart(&[]);
    let listed = d.get(&format!("/v1/snapshots?sandbox={src}"));
    assert_eq!(
        listed.body["snapshots"][0]["id"],
        snap.as_str(),
        "{}",
        listed.body
    );
    let r = fork(&d, &snap, 1);
    assert_eq!(r.status, 201, "{}", r.body);
    let again = &fork_ids(&r)[0];
    assert_eq!(
        d.exec(again, "cat /workspace/sum").stdout,
        format!("{sum}\n")
    );
    let v = d.code(again, "(len(big), f(21), c.v())");
    assert_eq!(v.plain(), "(6000000, 42, 7)", "{v:?}");
    // POST /v1/sandboxes with snapshot_id restores one, and says what came back.
    let r = d.post(
        "/v1/sandboxes",
        json!({ "snapshot_id": snap, "labels": {"from": "snap"} }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["restore"]["fidelity"], "language", "{}", r.body);
    assert_eq!(r.body["labels"]["from"], "snap");
    d.post(
        "/v1/sandboxes",
        json!({ "snapshot_id": snap, "template": "node" }),
    )
    .expect_error(400, "invalid_argument");

    // Another owner sees none of it.
    let (bob, _) = d.key_for("bob");
    d.call_as(
        Some(&bob),
        Method::GET,
        &format!("/v1/snapshots/{snap}"),
        None,
    )
    .expect_error(404, "not_found");
    d.call_as(
        Some(&bob),
        Method::POST,
        &format!("/v1/snapshots/{snap}/fork"),
        Some(json!({})),
    )
    .expect_error(404, "not_found");
    let r = d.call_as(Some(&bob), Method::GET, "/v1/snapshots", None);
    assert_eq!(r.body["snapshots"], json!([]));

    // Children first, then the parent.
    assert_eq!(d.delete(&format!("/v1/snapshots/{child}")).status, 204);
    assert_eq!(d.delete(&format!("/v1/snapshots/{snap}")).status, 204);
    d.get(&format!("/v1/snapshots/{snap}"))
        .expect_error(404, "not_found");
    assert!(!d.home().join("snapshots").join(&snap).exists());

    // Bad input.
    fork(&d, "sn-0000000000000000", 1).expect_error(404, "not_found");
    d.post("/v1/snapshots/nope/fork", json!({}))
        .expect_error(400, "invalid_argument");
    let other = d.create_id(json!({}));
    let s2 = snapshot(&d, &other, json!({})).body["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Ephemeral forks leave no record once deleted.
    let r = d.post(
        &format!("/v1/snapshots/{s2}/fork"),
        json!({"count": 1, "ephemeral": true}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let eph = fork_ids(&r).remove(0);
    assert!(d.sandbox(&eph).ephemeral);
    assert_eq!(d.delete(&format!("/v1/sandboxes/{eph}")).status, 204);
    d.get(&format!("/v1/sandboxes/{eph}"))
        .expect_error(404, "not_found");
    // Never set: automatic snapshots off, shown with the default `keep`.
    let a = d.get(&format!("/v1/sandboxes/{other}/auto-snapshot"));
    assert_eq!(
        a.body,
        json!({"interval_secs": null, "before_reclaim": false, "keep": 3})
    );
    fork(&d, &s2, 0).expect_error(400, "invalid_argument");
    fork(&d, &s2, 17).expect_error(400, "invalid_argument");
    snapshot(&d, &other, json!({"nope": 1})).expect_error(400, "invalid_argument");
    // Backends: an unknown one is refused, saying which there are.
    let r = d.post("/v1/sandboxes", json!({"backend": "firecracker"}));
    r.expect_error(400, "invalid_argument");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("process, gvisor"),
        "{}",
        r.body
    );
    assert_eq!(
        d.post("/v1/sandboxes", json!({"backend": "process"}))
            .status,
        201
    );
}

/// Writes a nested folder with a binary file and a CSV in `/tmp`; returns the binary's
/// SHA-256.
pub(super) fn fill_tmp(d: &Daemon, id: &str) -> String {
    let out = d.exec(
        id,
        "mkdir -p /tmp/nest/deep && head -c 300000 /dev/urandom > /tmp/nest/deep/blob.bin \
         && printf 'a,b\\n1,2\\n' > /tmp/data.csv && sha256sum /tmp/nest/deep/blob.bin | cut -c1-64",
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    out.stdout.as_str().trim().to_string()
}

/// What [`fill_tmp`] wrote is in sandbox `id`'s `/tmp`, and `/tmp` is still sticky.
pub(super) fn check_tmp(d: &Daemon, id: &str, sum: &str) {
    let out = d.exec(
        id,
        "sha256sum /tmp/nest/deep/blob.bin | cut -c1-64; cat /tmp/data.csv; stat -c %a /tmp",
    );
    assert_eq!(
        out.stdout,
        format!("{sum}\na,b\n1,2\n1777\n"),
        "/tmp of {id}: {out:?}"
    );
}

#[test]
fn daemon_snapshots_carry_tmp_at_files_and_language_fidelity() {
    let d = Daemon::start(&[]);
    for (fidelity, spec) in [
        ("files", json!({})),
        ("language", json!({"template": "python"})),
    ] {
        let src = d.create_id(spec);
        if fidelity == "language" {
            let r = d.code(&src, "x = 41");
            assert_eq!(r.done.status, "ok", "{r:?}");
        }
        let sum = fill_tmp(&d, &src);
        let r = snapshot(&d, &src, json!({}));
        assert_eq!(r.status, 201, "{}", r.body);
        assert_eq!(r.body["fidelity"], fidelity, "{}", r.body);
        let gaps = r.body["manifest"]["not_carried"].to_string();
        assert!(
            gaps.contains("outside /workspace, /home/sandbox, /tmp ("),
            "{gaps}"
        );
        let snap = r.body["id"].as_str().unwrap().to_string();
        // The source's /tmp is as it was (the kernel's state file removed).
        check_tmp(&d, &src, &sum);
        assert_eq!(d.exec(&src, "ls -A /tmp").stdout, "data.csv\nnest\n");

        let r = fork(&d, &snap, 2);
        assert_eq!(r.status, 201, "{}", r.body);
        // Written whole: /tmp's own mode included, nothing skipped.
        assert_eq!(
            r.body["sandboxes"][0]["restore"]["files"]["skipped"],
            json!([]),
            "{}",
            r.body
        );
        let restored = d.create_id(json!({ "snapshot_id": snap }));
        for f in fork_ids(&r).iter().chain([&restored]) {
            check_tmp(&d, f, &sum);
            // Nothing else: the kernel's state file is gone again.
            assert_eq!(d.exec(f, "ls -A /tmp").stdout, "data.csv\nnest\n");
            if fidelity == "language" {
                let v = d.code(f, "x + 1");
                assert_eq!(v.plain(), "42", "{v:?}");
            }
        }
    }

    // /tmp is held to the target's size like every carried folder: content that no longer
    // fits (a sparse file restores whole) is refused, and no sandbox is left behind.
    let small = d.create_id(json!({"limits": {"tmp_mb": 2}}));
    let out = d.exec(&small, "truncate -s 4M /tmp/sparse && echo ok");
    assert_eq!(out.stdout, "ok\n", "{out:?}");
    let r = snapshot(&d, &small, json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let before = d.get("/v1/sandboxes?state=running").body["items"]
        .as_array()
        .unwrap()
        .len();
    let r = fork(&d, r.body["id"].as_str().unwrap(), 1);
    r.expect_error(507, "no_space");
    assert!(
        r.body["message"].as_str().unwrap().contains("/tmp/sparse"),
        "{}",
        r.body
    );
    let after = d.get("/v1/sandboxes?state=running").body["items"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(before, after, "a failed fork left a sandbox");
}

#[test]
fn daemon_gvisor_checkpoints_carry_tmp() {
    let d = Daemon::start(&[]);
    let system = d.get("/v1/system").body;
    let gvisor = system["backends"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["kind"] == "gvisor" && b["available"] == true);
    sandcell_testkit::require!(gvisor, "gvisor is not available here");
    let src = d.create_id(json!({"backend": "gvisor"}));
    let sum = fill_tmp(&d, &src);
    let r = snapshot(&d, &src, json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["fidelity"], "process", "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    // Restored in place, and into a fork.
    let r = fork(&d, &snap, 1);
    assert_eq!(r.status, 201, "{}", r.body);
    for id in [&src, &fork_ids(&r)[0]] {
        check_tmp(&d, id, &sum);
    }
}

#[test]
fn daemon_corrupt_snapshot_is_refused_and_others_still_restore() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    d.exec(&id, "echo one > /workspace/f");
    let a = snapshot(&d, &id, json!({})).body["id"]
        .as_str()
        .unwrap()
        .to_string();
    d.exec(&id, "echo two > /workspace/f");
    let b = snapshot(&d, &id, json!({})).body["id"]
        .as_str()
        .unwrap()
        .to_string();

    // One byte changed on disk.
    let archive = d.home().join("snapshots").join(&a).join("files.tar");
    let mut bytes = std::fs::read(&archive).unwrap();
    bytes[600] ^= 0xff;
    std::fs::write(&archive, bytes).unwrap();
    let r = fork(&d, &a, 1);
    r.expect_error(409, "snapshot_corrupt");
    assert!(
        r.body["message"].as_str().unwrap().contains("checksum"),
        "{}",
        r.body
    );
    // No sandbox was left behind by the failed fork.
    let running = d.get("/v1/sandboxes?state=running");
    assert_eq!(
        running.body["items"].as_array().unwrap().len(),
        1,
        "{}",
        running.body
    );

    let r = fork(&d, &b, 1);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(d.exec(&fork_ids(&r)[0], "cat /workspace/f").stdout, "two\n");

    // A snapshot of a paused sandbox leaves it paused.
    let r = d.call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(snapshot(&d, &id, json!({})).status, 201);
    assert_eq!(d.sandbox(&id).state, "paused");
    assert_eq!(d.get(&format!("/v1/sandboxes/{id}/metrics")).status, 200);
}

#[test]
fn daemon_snapshot_on_a_full_disk_leaves_nothing_and_the_sandbox_running() {
    sandcell_testkit::require!(
        sandcell_testkit::skip::is_root(),
        "mounting a small tmpfs needs root"
    );
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    d.exec(&id, "head -c 4000000 /dev/urandom > /workspace/big");
    let dir = d.home().join("snapshots");
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(mounted.success());
    let r = snapshot(&d, &id, json!({}));
    let listed = d.get("/v1/snapshots");
    let leftovers = std::fs::read_dir(&dir).unwrap().count();
    let _ = Command::new("umount").arg(&dir).status();
    r.expect_error(507, "no_space");
    assert_eq!(
        listed.body["snapshots"],
        json!([]),
        "a half snapshot is listed"
    );
    assert_eq!(leftovers, 0, "a half snapshot was left on disk");
    assert_eq!(d.sandbox(&id).state, "running");
    assert_eq!(d.exec(&id, "wc -c < /workspace/big").stdout, "4000000\n");
}

#[test]
fn daemon_auto_snapshots_on_an_interval_and_before_reclaim() {
    let d = Daemon::start(&["limits.gc_interval_secs=1"]);
    let every = d.create_id(json!({"auto_snapshot": {"interval_secs": 1, "keep": 2}}));
    d.exec(&every, "echo a > /workspace/a");
    let idle =
        d.create_id(json!({"idle_timeout_secs": 2, "auto_snapshot": {"before_reclaim": true}}));
    d.exec(&idle, "echo kept > /workspace/b");
    let a = d.get(&format!("/v1/sandboxes/{every}/auto-snapshot"));
    assert_eq!(
        a.body,
        json!({"interval_secs": 1, "before_reclaim": false, "keep": 2}),
        "{}",
        a.body
    );

    let stopped = super::daemon::wait_for(std::time::Duration::from_secs(20), || {
        (d.sandbox(&idle).state == "stopped").then_some(())
    });
    assert!(stopped.is_some(), "the idle sandbox was not reclaimed");
    std::thread::sleep(std::time::Duration::from_secs(3));

    // Interval snapshots: taken every round, the oldest pruned to `keep`.
    let list = d.get(&format!("/v1/snapshots?sandbox={every}"));
    let snaps = list.body["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 2, "{}", list.body);
    assert!(
        snaps.iter().all(|s| s["tags"]["auto"] == "interval"),
        "{}",
        list.body
    );

    // Before reclaim: one snapshot, and it brings the files back.
    let list = d.get(&format!("/v1/snapshots?sandbox={idle}"));
    let snaps = list.body["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 1, "{}", list.body);
    assert_eq!(snaps[0]["tags"]["auto"], "before-reclaim");
    assert!(
        snaps[0]["name"].as_str().unwrap().contains("idle"),
        "{}",
        list.body
    );
    let r = fork(&d, snaps[0]["id"].as_str().unwrap(), 1);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        d.exec(&fork_ids(&r)[0], "cat /workspace/b").stdout,
        "kept\n"
    );

    // Settings: replaced by PUT, checked.
    let path = format!("/v1/sandboxes/{every}/auto-snapshot");
    let r = d.call(Method::PUT, &path, Some(json!({"before_reclaim": true})));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["interval_secs"], Value::Null);
    d.call(Method::PUT, &path, Some(json!({"keep": 0})))
        .expect_error(400, "invalid_argument");
    d.post(
        "/v1/sandboxes",
        json!({"auto_snapshot": {"interval_secs": 0}}),
    )
    .expect_error(400, "invalid_argument");
}
