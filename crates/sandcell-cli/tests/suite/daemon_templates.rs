//! Sandboxes from image templates, through the real daemon: a tiny root filesystem (busybox)
//! is imported into the daemon's home with `sandcell image import`, and a sandbox created
//! with `template: "tiny:v1"` runs on it — not on the host's system — with every restriction
//! of a host-based sandbox (uid 65532, a read-only system, the synthesized /etc). A kernel the
//! image lacks fails clearly; an unknown template is 404; gVisor says it cannot yet; a warm
//! pool of the image serves creates naming it.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::common::BIN;
use super::daemon::{Daemon, send, wait_for};

/// The programs of the busybox image here.
const TOOLS: &[&str] = &[
    "sh", "ls", "cat", "id", "touch", "echo", "wc", "head", "grep",
];

/// A root filesystem tarball with busybox as its whole system, `tools` linked to it.
pub(super) fn busybox_rootfs(dir: &Path, tools: &[&str]) -> Option<std::path::PathBuf> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        return None;
    }
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::copy(busybox, root.join("usr/bin/busybox")).unwrap();
    for tool in tools {
        symlink("busybox", root.join("usr/bin").join(tool)).unwrap();
    }
    symlink("usr/bin", root.join("bin")).unwrap();
    std::fs::write(root.join("etc/os-release"), "ID=tiny\n").unwrap();
    let tarball = dir.join("tiny.tar");
    super::images::tar_folder(&root, &tarball);
    Some(tarball)
}

/// `sandcell image ARGS --home HOME`, which must succeed; its output.
fn image(home: &Path, args: &[&str]) -> String {
    let (code, out, err) = super::images::sandcell(home, args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

#[test]
fn a_sandbox_from_an_image_template_runs_on_that_image() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(tarball) = busybox_rootfs(tmp.path(), TOOLS) else {
        sandcell_testkit::skip::skip(
            "/bin/busybox is missing (scripts/setup.sh installs busybox-static)",
        );
        return;
    };
    let mut d = Daemon::start(&[]);
    let tarball = tarball.to_str().unwrap().to_string();
    image(d.home(), &["import", &tarball, "--as", "tiny:v1"]);

    let r = d.post("/v1/sandboxes", json!({"template": "tiny:v1"}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["template"], "tiny:v1");
    let id = r.body["id"].as_str().unwrap().to_string();
    // Its system is the image's: busybox, the image's os-release, few programs.
    let out = d.exec(
        &id,
        "busybox | head -1; cat /etc/os-release; ls /usr/bin | wc -l",
    );
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("BusyBox"), "{}", out.stdout);
    assert_eq!(lines[1], "ID=tiny");
    assert_eq!(
        lines[2].trim(),
        (TOOLS.len() + 1).to_string(),
        "the image's programs only: {}",
        out.stdout
    );
    // With a host-based sandbox's restrictions: its user, a read-only system, its own /etc.
    let out = d.exec(&id, "id -u; touch /usr/x 2>&1; grep ^sandbox: /etc/passwd");
    assert!(out.stdout.starts_with("65532\n"), "{}", out.stdout);
    assert!(
        out.stdout.contains("Read-only file system"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("sandbox:x:65532:65532"),
        "{}",
        out.stdout
    );
    let out = d.exec(&id, "echo kept > /workspace/f; cat /workspace/f");
    assert_eq!(out.stdout, "kept\n");
    // A kernel the image lacks: a clear error naming the interpreter.
    let r = d.post(
        &format!("/v1/sandboxes/{id}/code"),
        json!({"code": "print(1)", "language": "python"}),
    );
    assert!(r.status >= 400, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("/usr/bin/python3"),
        "{}",
        r.body
    );

    // `sandcell run --template` (in its own process, on the same home) as well.
    let out = Command::new(BIN)
        .env("SANDCELL_HOME", d.home())
        .args([
            "run",
            "--template",
            "tiny:v1",
            "--",
            "cat",
            "/etc/os-release",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ID=tiny\n");
    let out = Command::new(BIN)
        .env("SANDCELL_HOME", d.home())
        .args(["run", "--template", "nope", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no image named 'nope'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Removed while a sandbox runs on it: the name goes, the unpacked root stays (pruning
    // it would pull the system from under the sandbox) until the sandbox is gone.
    image(d.home(), &["rm", "tiny:v1"]);
    let pruned: serde_json::Value =
        serde_json::from_str(&image(d.home(), &["prune", "--json"])).unwrap();
    assert_eq!(
        (pruned["roots"].as_u64(), pruned["roots_in_use"].as_u64()),
        (Some(0), Some(1)),
        "{pruned}"
    );
    let out = d.exec(&id, "busybox | head -1");
    assert!(
        out.stdout.starts_with("BusyBox"),
        "still running on it: {}",
        out.stdout
    );
    let r = d.post("/v1/sandboxes", json!({"template": "tiny:v1"}));
    r.expect_error(404, "not_found");
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    let pruned: serde_json::Value =
        serde_json::from_str(&image(d.home(), &["prune", "--json"])).unwrap();
    assert_eq!(
        (pruned["roots"].as_u64(), pruned["roots_in_use"].as_u64()),
        (Some(1), Some(0)),
        "{pruned}"
    );
    assert_eq!(
        std::fs::read_dir(d.home().join("images/roots"))
            .unwrap()
            .count(),
        0,
        "the unpacked root is gone"
    );

    // A template neither built in nor imported.
    let r = d.post("/v1/sandboxes", json!({"template": "nope:v1"}));
    r.expect_error(404, "not_found");
    assert!(
        r.body.to_string().contains("sandcell image import"),
        "{}",
        r.body
    );
    let r = d.post("/v1/sandboxes", json!({"template": "Bad Name"}));
    r.expect_error(400, "invalid_argument");
    image(d.home(), &["import", &tarball, "--as", "tiny:v1"]);
    // On gVisor too: the image's system, read-only, under gVisor's kernel.
    let r = d.post(
        "/v1/sandboxes",
        json!({"template": "tiny:v1", "backend": "gvisor"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["backend"], "gvisor", "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let out = d.exec(
        &id,
        "cat /etc/os-release; id -u; echo x > /bin/new || echo ro",
    );
    assert!(
        out.stdout.starts_with("ID=tiny\n65532\n"),
        "{out:?}\n{}",
        d.log()
    );
    assert!(out.stdout.ends_with("ro\n"), "{out:?}");
    // A process checkpoint of it restores on the same image, with its processes and files.
    let sleep = d.exec(
        &id,
        "echo kept > /workspace/k; sleep 1000 >/dev/null 2>&1 & echo $!",
    );
    let sleep = sleep.stdout.trim().to_string();
    let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["fidelity"], "process", "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    let r = d.post("/v1/sandboxes", json!({ "snapshot_id": snap }));
    assert_eq!(r.status, 201, "{}", r.body);
    let restored = r.body["id"].as_str().unwrap().to_string();
    let out = d.exec(
        &restored,
        &format!("cat /workspace/k /etc/os-release /proc/{sleep}/comm"),
    );
    assert_eq!(
        out.stdout, "kept\nID=tiny\nsleep\n",
        "the sleep goes on: {out:?}"
    );
    for sandbox in [&id, &restored] {
        assert_eq!(d.delete(&format!("/v1/sandboxes/{sandbox}")).status, 204);
    }
    assert_eq!(d.delete(&format!("/v1/snapshots/{snap}")).status, 204);

    // A warm pool of the image: its sandboxes wait ready, and a create naming the image
    // takes one.
    d.terminate();
    d.restart(&["pools.warm=tiny:v1/small=1"]);
    let metrics = || {
        let r = send(d.req_as(Some(&d.key), reqwest::Method::GET, "/metrics"));
        r.body.as_str().unwrap_or_default().to_string()
    };
    wait_for(Duration::from_secs(60), || {
        metrics()
            .contains("sandcell_pool_ready{pool=\"tiny:v1/small\"} 1")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the pool never filled: {}\n{}", metrics(), d.log()));
    let r = d.post("/v1/sandboxes", json!({"template": "tiny:v1"}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(
        metrics().contains("sandcell_pool_requests_total{result=\"hit\"} 1"),
        "{}",
        metrics()
    );
    let out = d.exec(r.body["id"].as_str().unwrap(), "cat /etc/os-release");
    assert_eq!(out.stdout, "ID=tiny\n");
}

#[test]
fn the_daemon_collects_the_image_stores_garbage_on_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(tarball) = busybox_rootfs(tmp.path(), TOOLS) else {
        sandcell_testkit::skip::skip(
            "/bin/busybox is missing (scripts/setup.sh installs busybox-static)",
        );
        return;
    };
    let d = Daemon::start(&["templates.gc_interval_secs=1"]);
    let tarball = tarball.to_str().unwrap().to_string();
    image(d.home(), &["import", &tarball, "--as", "doomed:v1"]);
    let blobs = d.home().join("images/blobs/sha256");
    let count = || std::fs::read_dir(&blobs).map_or(0, |r| r.count());
    // A sandbox unpacks its root; the name goes once it has ended.
    let id = d.create_id(json!({"template": "doomed:v1"}));
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    let before = count();
    assert!(before >= 3, "a manifest, a config and a layer: {before}");
    assert_eq!(d.delete("/v1/templates/doomed:v1").status, 204);
    // Unpacked roots are named by their chain id (dot-names are the store's own).
    let roots = || -> Vec<String> {
        std::fs::read_dir(d.home().join("images/roots"))
            .map(|r| {
                r.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(roots().len(), 1, "{:?}", roots());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while count() != 0 || !roots().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} blobs and roots {:?} left after 20 s:\n{}",
            count(),
            roots(),
            d.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
