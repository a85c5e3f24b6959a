//! Host folders and named volumes in sandboxes: read-only by default, read-write or an overlay
//! when asked; only folders of the operator's allow-list; volumes that outlive their
//! sandboxes, one owner's invisible to another; on both backends, through the daemon and
//! `sandcell run`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use serde_json::json;

use super::daemon::Daemon;

/// A host tree: `allowed/proj` (a readable file, a file only its owner reads, a folder), a
/// link inside `allowed` to `outside`, and `outside` (a file that must never be reached).
fn host_tree() -> tempfile::TempDir {
    let host = tempfile::tempdir().unwrap();
    let proj = host.path().join("allowed/proj");
    std::fs::create_dir_all(proj.join("src")).unwrap();
    std::fs::write(proj.join("a.txt"), "hello from the host").unwrap();
    std::fs::write(proj.join("owner-only.txt"), "for the owner").unwrap();
    std::fs::set_permissions(
        proj.join("owner-only.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let outside = host.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(&outside, host.path().join("allowed/escape")).unwrap();
    host
}

fn daemon_for(host: &tempfile::TempDir) -> Daemon {
    Daemon::start(&[&format!(
        "mounts.allowed_paths={}",
        host.path().join("allowed").display()
    )])
}

#[test]
fn host_folders_mount_read_only_unless_asked_and_only_from_the_allow_list() {
    let host = host_tree();
    let d = daemon_for(&host);
    let proj = host.path().join("allowed/proj").display().to_string();

    // Read-only by default: readable (its owner's files too: the owner is shown as the
    // sandbox user), never writable, not even by remounting.
    let id = d.create_id(json!({"mounts": [{"host_path": proj, "path": "/workspace/proj"}]}));
    let out = d.exec(
        &id,
        "cat /workspace/proj/a.txt; echo; cat /workspace/proj/owner-only.txt; echo; \
         stat -c %U /workspace/proj/a.txt",
    );
    assert_eq!(
        out.stdout, "hello from the host\nfor the owner\nsandbox\n",
        "{out:?}"
    );
    for attempt in [
        "echo x > /workspace/proj/new.txt",
        "rm /workspace/proj/a.txt",
        "mkdir /workspace/proj/d",
        "mount -o remount,rw /workspace/proj",
        "umount /workspace/proj && echo x > /workspace/proj/a.txt",
    ] {
        let out = d.exec(&id, attempt);
        assert!(!out.ok, "{attempt} succeeded: {out:?}");
    }
    assert!(!host.path().join("allowed/proj/new.txt").exists());
    assert!(host.path().join("allowed/proj/a.txt").exists());
    // Its own /workspace stays writable around the mount.
    assert!(d.exec(&id, "echo y > /workspace/mine.txt").ok);

    // Read-write: changes reach the host, owned by the folder's owner there.
    let id = d.create_id(
        json!({"mounts": [{"host_path": proj, "path": "/home/sandbox/proj", "mode": "rw"}]}),
    );
    let out = d.exec(&id, "echo written > /home/sandbox/proj/new.txt && id -u");
    assert!(out.ok, "{out:?}");
    let new = host.path().join("allowed/proj/new.txt");
    assert_eq!(std::fs::read_to_string(&new).unwrap(), "written\n");
    let owner = std::fs::metadata(host.path().join("allowed/proj")).unwrap();
    let made = std::fs::metadata(&new).unwrap();
    assert_eq!((made.uid(), made.gid()), (owner.uid(), owner.gid()));
    std::fs::remove_file(&new).unwrap();

    // Overlay on /workspace: the sandbox changes what it sees; the host folder is untouched.
    let id = d.create_id(
        json!({"mounts": [{"host_path": proj, "path": "/workspace", "mode": "overlay"}]}),
    );
    let out = d.exec(
        &id,
        "echo changed > a.txt && echo more > b.txt && rm owner-only.txt && cat a.txt && ls",
    );
    assert_eq!(out.stdout, "changed\na.txt\nb.txt\nsrc\n", "{out:?}");
    assert_eq!(
        std::fs::read_to_string(host.path().join("allowed/proj/a.txt")).unwrap(),
        "hello from the host"
    );
    assert!(!host.path().join("allowed/proj/b.txt").exists());
    assert!(host.path().join("allowed/proj/owner-only.txt").exists());

    // Refused before anything is made: outside the allow-list (a link out of it included),
    // a target outside the sandbox's own folders, two sources, a file.
    let before = d.get("/v1/sandboxes").body["items"]
        .as_array()
        .unwrap()
        .len();
    let outside = host.path().join("outside").display().to_string();
    let escape = host.path().join("allowed/escape").display().to_string();
    for (mount, status, code) in [
        (
            json!({"host_path": outside, "path": "/workspace/x"}),
            403,
            "permission_denied",
        ),
        (
            json!({"host_path": escape, "path": "/workspace/x"}),
            403,
            "permission_denied",
        ),
        (
            json!({"host_path": format!("{proj}/../../outside"), "path": "/workspace/x"}),
            403,
            "permission_denied",
        ),
        (
            json!({"host_path": proj, "path": "/etc"}),
            400,
            "invalid_argument",
        ),
        (
            json!({"host_path": proj, "path": "/workspace/../etc"}),
            400,
            "invalid_argument",
        ),
        (
            json!({"host_path": proj, "volume": "v", "path": "/workspace/x"}),
            400,
            "invalid_argument",
        ),
        (
            json!({"host_path": format!("{proj}/a.txt"), "path": "/workspace/x"}),
            400,
            "invalid_argument",
        ),
        (
            json!({"host_path": proj, "path": "/workspace/x", "mode": "rwx"}),
            400,
            "invalid_argument",
        ),
    ] {
        let r = d.post("/v1/sandboxes", json!({"mounts": [mount]}));
        r.expect_error(status, code);
        assert!(!r.body.to_string().contains("secret"), "{}", r.body);
    }
    // A mount inside another (its mount point could be a link a volume holds) is refused.
    let r = d.post(
        "/v1/sandboxes",
        json!({"mounts": [
            {"volume": "v", "path": "/workspace/v"},
            {"host_path": proj, "path": "/workspace/v/p"},
        ]}),
    );
    r.expect_error(400, "invalid_argument");
    assert!(
        r.body["message"].as_str().unwrap().contains("inside mount"),
        "{}",
        r.body
    );
    let after = d.get("/v1/sandboxes").body["items"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(before, after);
}

#[test]
fn a_daemon_without_an_allow_list_mounts_no_host_folder() {
    let host = host_tree();
    let d = Daemon::start(&[]);
    let proj = host.path().join("allowed/proj").display().to_string();
    let r = d.post(
        "/v1/sandboxes",
        json!({"mounts": [{"host_path": proj, "path": "/workspace/p"}]}),
    );
    r.expect_error(403, "permission_denied");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("mounts.allowed_paths"),
        "{}",
        r.body
    );
}

#[test]
fn a_volume_outlives_its_sandbox_belongs_to_its_owner_and_goes_only_when_unused() {
    let d = Daemon::start(&[]);
    let r = d.post("/v1/volumes", json!({"name": "data"}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["size_bytes"], 0, "{}", r.body);
    d.post("/v1/volumes", json!({"name": "data"}))
        .expect_error(409, "already_exists");
    d.post("/v1/volumes", json!({"name": "Bad Name"}))
        .expect_error(400, "invalid_argument");

    let first = d.create_id(json!({"mounts": [{"volume": "data", "path": "/home/sandbox/data"}]}));
    let out = d.exec(
        &first,
        "echo kept > /home/sandbox/data/f && stat -c %U /home/sandbox/data/f",
    );
    assert_eq!(out.stdout, "sandbox\n", "{out:?}");
    let shown = d.get("/v1/volumes/data").body;
    assert_eq!(shown["sandboxes"], json!([first]), "{shown}");
    assert_eq!(shown["size_bytes"], 5, "{shown}");
    d.delete("/v1/volumes/data")
        .expect_error(409, "invalid_state");

    // A snapshot does not copy it; its restore mounts it again, with what it holds then.
    let r = d.post(&format!("/v1/sandboxes/{first}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    assert!(
        r.body["manifest"]
            .to_string()
            .contains("/home/sandbox/data: a mounted folder"),
        "{}",
        r.body
    );
    assert_eq!(d.delete(&format!("/v1/sandboxes/{first}")).status, 204);

    // The next sandbox sees it; read-only when asked.
    let second =
        d.create_id(json!({"mounts": [{"volume": "data", "path": "/workspace/v", "mode": "ro"}]}));
    assert_eq!(d.exec(&second, "cat /workspace/v/f").stdout, "kept\n");
    assert!(!d.exec(&second, "echo no >> /workspace/v/f").ok);
    assert_eq!(d.delete(&format!("/v1/sandboxes/{second}")).status, 204);
    let restored = d.create_id(json!({"snapshot_id": snap}));
    assert_eq!(
        d.exec(&restored, "cat /home/sandbox/data/f").stdout,
        "kept\n"
    );
    assert_eq!(d.delete(&format!("/v1/sandboxes/{restored}")).status, 204);

    // Another owner has volumes of its own: the same name is another folder.
    let (bobs_key, _) = d.key_for("bob");
    let bobs = d.create_as(
        &bobs_key,
        json!({"mounts": [{"volume": "data", "path": "/workspace/v"}]}),
    );
    let req = sandcell_api::exec::ExecInput {
        cmd: Some("ls -A /workspace/v".into()),
        ..Default::default()
    };
    let out = d
        .block_on(d.client_as(&bobs_key).exec(&bobs.id, &req))
        .unwrap();
    assert_eq!(out.stdout, "", "{out:?}");

    // Unused now: deleted, files and all.
    assert_eq!(d.delete("/v1/volumes/data").status, 204);
    d.get("/v1/volumes/data").expect_error(404, "not_found");
    assert_eq!(d.get("/v1/volumes").body["volumes"], json!([]));
}

/// A snapshot asked to copy volumes keeps their files as they were; each sandbox made from
/// it gets new volumes of its own filled from the copies, and the live volume is untouched.
fn snapshot_copies_volumes_on(backend: &str) {
    let d = Daemon::start(&[]);
    let src = d.create_id(json!({
        "backend": backend,
        "mounts": [{"volume": "data", "path": "/workspace/data"}],
    }));
    let out = d.exec(
        &src,
        "mkdir -p /workspace/data/sub && echo then > /workspace/data/sub/f && \
         ln -s /etc/passwd /workspace/data/link && echo mine > /workspace/own",
    );
    assert!(out.ok, "{out:?}");
    let r = d.post(
        &format!("/v1/sandboxes/{src}/snapshots"),
        json!({"volumes": "copy"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    let manifest = &r.body["manifest"];
    assert_eq!(
        r.body["volumes"],
        json!([{"volume": "data", "path": "/workspace/data", "bytes": r.body["volumes"][0]["bytes"]}]),
        "{}",
        r.body
    );
    assert!(
        r.body["volumes"][0]["bytes"].as_u64() > Some(1024)
            && r.body["size"].as_u64() > manifest["archive_bytes"].as_u64(),
        "the copy counts in its size: {}",
        r.body
    );
    if backend == "process" {
        assert!(
            manifest.to_string().contains("volume 'data', copied"),
            "{manifest}"
        );
    }
    // The live volume goes on changing.
    assert!(d.exec(&src, "echo now > /workspace/data/sub/f").ok);

    let r = d.post(&format!("/v1/snapshots/{snap}/fork"), json!({"count": 2}));
    assert_eq!(r.status, 201, "{}", r.body);
    let mut copies = Vec::new();
    for forked in r.body["sandboxes"].as_array().unwrap() {
        let id = forked["sandbox"]["id"].as_str().unwrap();
        let made = &forked["restore"]["volumes"][0];
        assert_eq!(made["from"], "data", "{forked}");
        assert_eq!(made["path"], "/workspace/data", "{forked}");
        let name = made["volume"].as_str().unwrap().to_string();
        assert!(name.starts_with("data-") && name.len() == 11, "{name}");
        let out = d.exec(
            id,
            "cat /workspace/data/sub/f; readlink /workspace/data/link; stat -c %U /workspace/data/sub/f",
        );
        assert_eq!(out.stdout, "then\n/etc/passwd\nsandbox\n", "{out:?}");
        // Its own: a write reaches neither the other fork nor the live volume.
        assert!(d.exec(id, &format!("echo {id} > /workspace/data/sub/f")).ok);
        copies.push((id.to_string(), name));
    }
    for (id, name) in &copies {
        assert_eq!(
            d.exec(id, "cat /workspace/data/sub/f").stdout,
            format!("{id}\n")
        );
        let shown = d.get(&format!("/v1/volumes/{name}")).body;
        assert_eq!(shown["sandboxes"], json!([id]), "{shown}");
    }
    assert_eq!(d.exec(&src, "cat /workspace/data/sub/f").stdout, "now\n");
    // Without the copy, a restore mounts the live volume.
    let r = d.post(&format!("/v1/sandboxes/{src}/snapshots"), json!({}));
    let plain = r.body["id"].as_str().unwrap().to_string();
    let restored = d.create_id(json!({"snapshot_id": plain}));
    assert_eq!(
        d.exec(&restored, "cat /workspace/data/sub/f").stdout,
        "now\n"
    );
    d.post(
        &format!("/v1/sandboxes/{src}/snapshots"),
        json!({"volumes": "all"}),
    )
    .expect_error(400, "invalid_argument");
    // A copy that changed on disk is refused, and no volume is left from the attempt.
    let dir = d.home().join("snapshots").join(&snap);
    let archive = dir.join("volume-data.tar");
    let mut bytes = std::fs::read(&archive).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&archive, bytes).unwrap();
    let before = d.get("/v1/volumes").body["volumes"]
        .as_array()
        .unwrap()
        .len();
    d.post("/v1/sandboxes", json!({"snapshot_id": snap}))
        .expect_error(409, "snapshot_corrupt");
    assert_eq!(
        d.get("/v1/volumes").body["volumes"]
            .as_array()
            .unwrap()
            .len(),
        before
    );
}

#[test]
fn a_snapshot_copies_volumes_when_asked_and_each_restore_gets_its_own() {
    snapshot_copies_volumes_on("process");
}

#[test]
fn a_gvisor_snapshot_copies_volumes_when_asked_and_each_restore_gets_its_own() {
    snapshot_copies_volumes_on("gvisor");
}

#[test]
fn gvisor_sandboxes_mount_host_folders_and_volumes_too() {
    let host = host_tree();
    let d = daemon_for(&host);
    let proj = host.path().join("allowed/proj").display().to_string();
    let id = d.create_id(json!({
        "backend": "gvisor",
        "mounts": [
            {"host_path": proj, "path": "/workspace/proj"},
            {"volume": "shared", "path": "/workspace/shared"},
        ],
    }));
    assert_eq!(
        d.exec(&id, "cat /workspace/proj/a.txt").stdout,
        "hello from the host"
    );
    assert!(!d.exec(&id, "echo x > /workspace/proj/new.txt").ok);
    assert!(!host.path().join("allowed/proj/new.txt").exists());
    let out = d.exec(
        &id,
        "echo from-gvisor > /workspace/shared/g && cat /workspace/shared/g",
    );
    assert_eq!(out.stdout, "from-gvisor\n", "{out:?}");
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    // A process sandbox sees what the gVisor one wrote.
    let id = d.create_id(json!({"mounts": [{"volume": "shared", "path": "/workspace/shared"}]}));
    assert_eq!(
        d.exec(&id, "cat /workspace/shared/g").stdout,
        "from-gvisor\n"
    );
    // An overlay is the process backend's: refused with the reason.
    let r = d.post(
        "/v1/sandboxes",
        json!({"backend": "gvisor", "mounts": [{"host_path": proj, "path": "/workspace", "mode": "overlay"}]}),
    );
    r.expect_error(400, "invalid_argument");
    assert!(r.body.to_string().contains("process backend"), "{}", r.body);
}

#[test]
fn sandcell_run_mounts_folders_and_volumes_of_its_home() {
    let host = host_tree();
    let home = tempfile::tempdir().unwrap();
    let proj = host.path().join("allowed/proj").display().to_string();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sandcell"))
            .env("SANDCELL_HOME", home.path())
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "run",
        "-q",
        "--mount",
        &format!("{proj}:/workspace/p"),
        "--volume",
        "cache:/home/sandbox/cache",
        "--",
        "sh",
        "-c",
        "cat /workspace/p/a.txt && echo v1 > /home/sandbox/cache/f && ! touch /workspace/p/x",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from the host");
    let out = run(&[
        "run",
        "-q",
        "--volume",
        "cache:/tmp/c:ro",
        "--",
        "cat",
        "/tmp/c/f",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "v1\n", "{out:?}");
    let out = run(&["volume", "ls", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["name"], "cache", "{list}");
    assert_eq!(list[0]["size_bytes"], 3, "{list}");
    // Bad flags are refused before a sandbox is made.
    for bad in [
        vec![
            "run",
            "--mount",
            "/nonexistent-folder:/workspace/x",
            "--",
            "true",
        ],
        vec!["run", "--mount", &proj, "--", "true"],
        vec!["run", "--volume", "cache:/etc", "--", "true"],
    ] {
        let out = run(&bad);
        assert_eq!(out.status.code(), Some(125), "{bad:?}: {out:?}");
    }
    assert!(run(&["volume", "rm", "cache"]).status.success());
    let out = run(&["volume", "ls", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}
