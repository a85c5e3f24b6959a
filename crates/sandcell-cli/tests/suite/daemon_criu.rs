//! Process-fidelity snapshots on the process backend through CRIU (`checkpointable: true`),
//! with the CRIU scripts/tools.sh builds. Skipped, with the reason, where no working CRIU is.

use std::time::Duration;

use serde_json::json;

use super::daemon::{Daemon, wait_for};
use super::daemon_snapshots::{check_tmp, fill_tmp};

/// Whether the daemon has a working CRIU; reports the test skipped when it has not.
fn criu_ready(d: &Daemon) -> bool {
    let system = d.get("/v1/system").body;
    let text = system.to_string();
    let ok = text.contains("passes criu check");
    if !ok {
        sandcell_testkit::skip::skip(format_args!(
            "no working criu on this host (run scripts/tools.sh): {text:.400}"
        ));
    }
    ok
}

#[test]
fn a_checkpointable_sandbox_is_snapshotted_with_every_process_and_forks_keep_them() {
    let d = Daemon::start(&[]);
    if !criu_ready(&d) {
        return;
    }
    let id = d.create_id(json!({"checkpointable": true}));
    // Its processes still run with no_new_privs.
    let ps = d.exec(&id, "cat /proc/self/status | grep NoNewPrivs");
    assert!(ps.stdout.contains("1"), "{ps:?}");
    // Attack: the agent here was exec'd (which makes a process dumpable); it must not be
    // readable by the sandbox's processes, which share its uid.
    for file in ["environ", "mem", "maps"] {
        let r = d.exec(&id, &format!("cat /proc/1/{file} > /dev/null"));
        assert_ne!(
            r.exit_code,
            Some(0),
            "/proc/1/{file} of the agent was readable: {r:?}"
        );
    }
    let r = d.code(
        &id,
        "import random\nbig = list(range(1_500_000))\ndef triple(a): return a * 3\nclass Box:\n    size = 7\nseed = random.random()",
    );
    assert!(r.error.is_none(), "{r:?}");
    // A background process: with process fidelity it keeps running in every fork.
    let bg = d.post(
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"cmd": "n=0; while true; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.05; done"}),
    );
    assert_eq!(bg.status, 201, "{:?}", bg.body);
    d.exec(&id, "echo source > /workspace/who");
    // Files in /tmp, and POSIX shared memory in /dev/shm: both in the checkpoint.
    let tmp_sum = fill_tmp(&d, &id);
    d.exec(&id, "echo seg > /dev/shm/seg");
    std::thread::sleep(Duration::from_millis(300));

    let snap = d.post(
        &format!("/v1/sandboxes/{id}/snapshots"),
        json!({"name": "criu"}),
    );
    assert_eq!(snap.status, 201, "{:?}", snap.body);
    assert_eq!(snap.body["fidelity"], "process", "{:?}", snap.body);
    let snap_id = snap.body["id"].as_str().unwrap().to_string();
    // The source runs on.
    assert_eq!(d.code(&id, "print(triple(2))").stdout, "6\n");

    let fork = d.post(
        &format!("/v1/snapshots/{snap_id}/fork"),
        json!({"count": 2}),
    );
    assert_eq!(fork.status, 201, "{:?}", fork.body);
    let forks: Vec<String> = fork.body["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["restore"]["fidelity"], "process", "{s}");
            s["sandbox"]["id"].as_str().unwrap().to_string()
        })
        .collect();
    let mut streams = Vec::new();
    for f in &forks {
        let out = d
            .code(f, "print(len(big), triple(5), Box.size, seed)")
            .stdout;
        let source = d
            .code(&id, "print(len(big), triple(5), Box.size, seed)")
            .stdout;
        assert_eq!(out, source, "fork {f} has the source's interpreter state");
        // The background loop came back running: its counter moves.
        let a = d.exec(f, "cat /tmp/counter").stdout;
        std::thread::sleep(Duration::from_millis(300));
        let b = d.exec(f, "cat /tmp/counter").stdout;
        assert!(
            b.trim().parse::<u64>().unwrap() > a.trim().parse::<u64>().unwrap(),
            "the background process runs on in {f}: {a} then {b}"
        );
        // A new identity: its own hostname.
        assert_eq!(d.exec(f, "hostname").stdout, format!("{f}\n"));
        check_tmp(&d, f, &tmp_sum);
        assert_eq!(d.exec(f, "cat /dev/shm/seg").stdout, "seg\n");
        streams.push(d.code(f, "import random; print(random.random())").stdout);
        d.exec(f, &format!("echo {f} > /workspace/who"));
    }
    assert_ne!(
        streams[0], streams[1],
        "forks have their own random streams"
    );
    for f in &forks {
        assert_eq!(
            d.exec(f, "cat /workspace/who").stdout.trim(),
            f,
            "forks are independent"
        );
    }
    assert_eq!(d.exec(&id, "cat /workspace/who").stdout.trim(), "source");
    // A restore keeps the agent unreadable, and the sandbox user without privileges.
    let r = d.exec(&forks[0], "cat /proc/1/mem > /dev/null");
    assert_ne!(
        r.exit_code,
        Some(0),
        "the restored agent's memory was readable: {r:?}"
    );
    let caps = d
        .exec(&forks[0], "grep -E 'CapEff|NoNewPrivs' /proc/self/status")
        .stdout;
    assert!(
        caps.contains("0000000000000000") && caps.contains("NoNewPrivs:\t1"),
        "{caps}"
    );
    // Each fork has a cgroup of its own.
    let cg = d.exec(&forks[0], "cat /proc/self/cgroup").stdout;
    assert!(cg.contains(&forks[0]), "{cg}");

    // A fork is checkpointable in turn (its agent moved to a connection made inside it), and
    // a restore of that second checkpoint has the fork's own state.
    d.code(&forks[0], "second = 'generation'");
    let again = d.post(&format!("/v1/sandboxes/{}/snapshots", forks[0]), json!({}));
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert_eq!(again.body["fidelity"], "process", "{:?}", again.body);
    let grand = d.create(json!({"snapshot_id": again.body["id"]}));
    let gid = grand.id.as_str();
    assert_eq!(d.exec(gid, "hostname").stdout, format!("{gid}\n"));
    check_tmp(&d, gid, &tmp_sum);
    let r = d.exec(gid, "cat /proc/1/mem > /dev/null");
    assert_ne!(
        r.exit_code,
        Some(0),
        "the agent's memory was readable: {r:?}"
    );
    // And the third generation again.
    let third = d.post(&format!("/v1/sandboxes/{gid}/snapshots"), json!({}));
    assert_eq!(third.body["fidelity"], "process", "{:?}", third.body);
    assert_eq!(
        d.code(gid, "print(second, triple(3))").stdout,
        "generation 9\n"
    );
    assert_eq!(
        d.code(&forks[0], "print(triple(4))").stdout,
        "12\n",
        "the fork runs on"
    );

    // The source gone, the snapshot still restores.
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    let restored = d.create(json!({"snapshot_id": snap_id}));
    let rid = restored.id.as_str();
    assert_eq!(d.code(rid, "print(triple(7))").stdout, "21\n");
    check_tmp(&d, rid, &tmp_sum);
}

#[test]
fn checkpointable_is_refused_where_it_does_not_apply() {
    let d = Daemon::start(&[]);
    let r = d.post(
        "/v1/sandboxes",
        json!({"checkpointable": true, "backend": "gvisor"}),
    );
    r.expect_error(400, "invalid_argument");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("checkpointable"),
        "{:?}",
        r.body
    );
}

/// A threaded web server on 127.0.0.1:8000 inside: `/slow` answers `slow` after 3 s, anything
/// else `quick` at once.
const SLOW_SERVER: &str = r#"import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(3)
        body = b"slow" if self.path == "/slow" else b"quick"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
"#;

/// `GET path` to the daemon at `url` with `key`, on a connection of its own; (status, body).
fn get_raw(url: &str, key: &str, path: &str) -> (u16, String) {
    let (status, _, body) =
        super::daemon_previews::get_raw(url, "localhost", path, &format!("X-API-Key: {key}\r\n"));
    (status, body)
}

#[test]
fn a_checkpoint_taken_while_a_preview_is_served_keeps_it_and_forks_serve_their_own() {
    // CRIU refused to dump a sandbox with an established TCP connection inside (a preview
    // being served is one: the agent's connection to the server), and the snapshot failed.
    let d = Daemon::start(&[]);
    if !criu_ready(&d) {
        return;
    }
    let id = d.create_id(json!({"checkpointable": true}));
    d.exec(
        &id,
        &format!("cat > /workspace/slow.py <<'PY'\n{SLOW_SERVER}PY"),
    );
    let bg = d.post(
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"cmd": "exec python3 /workspace/slow.py"}),
    );
    assert_eq!(bg.status, 201, "{}", bg.body);
    wait_for(Duration::from_secs(20), || {
        (d.get(&format!("/v1/sandboxes/{id}/ports/8000/")).status == 200).then_some(())
    })
    .expect("the server never answered");
    let (url, key, path) = (
        d.url.clone(),
        d.key.clone(),
        format!("/v1/sandboxes/{id}/ports/8000/slow"),
    );
    let slow = std::thread::spawn(move || get_raw(&url, &key, &path));
    // The request is at the server, waiting on its sleep.
    std::thread::sleep(Duration::from_millis(800));
    let snap = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(snap.status, 201, "{}\n{}", snap.body, d.log());
    assert_eq!(snap.body["fidelity"], "process", "{}", snap.body);
    // The source's request was not cut.
    assert_eq!(slow.join().unwrap(), (200, "slow".to_string()));
    // A fork has the server, serving its own requests (the copy of the old request's
    // connection, whose other end is not in the fork, was closed).
    let forked = super::daemon_snapshots::fork(&d, snap.body["id"].as_str().unwrap(), 1);
    assert_eq!(forked.status, 201, "{}", forked.body);
    let fid = super::daemon_snapshots::fork_ids(&forked).remove(0);
    let r = d.get(&format!("/v1/sandboxes/{fid}/ports/8000/"));
    assert_eq!((r.status, r.body), (200, json!("quick")));
    let (url, key) = (d.url.clone(), d.key.clone());
    assert_eq!(
        get_raw(&url, &key, &format!("/v1/sandboxes/{fid}/ports/8000/slow")),
        (200, "slow".to_string())
    );
}
