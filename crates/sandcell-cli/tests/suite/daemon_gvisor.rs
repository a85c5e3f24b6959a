//! The `gvisor` backend through the daemon: pause really stops a loop, and a snapshot is a
//! process checkpoint — restored, the same interpreter goes on (even an open file), each
//! fork independent with its own random stream, across a daemon restart; egress goes on
//! through the proxy after every kind of checkpoint and restore.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use super::daemon::{CodeResultExt, Daemon, wait_for};
use super::daemon_network::{daemon as egress_daemon, web_server};
use super::daemon_pause::{count, start_counter};
use super::egress::HOLD_TUNNEL;

/// The daemon lists gvisor as available here (setup installs runsc); it says what it
/// cannot do.
fn check_available(d: &Daemon) {
    let sys = d.get("/v1/system").body;
    let gvisor = sys["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["kind"] == "gvisor")
        .cloned()
        .unwrap_or_else(|| panic!("no gvisor backend in {sys}"));
    assert_eq!(gvisor["available"], true, "{gvisor}");
    assert_eq!(gvisor["checkpoint_fidelity"], "process", "{gvisor}");
    assert_eq!(gvisor["isolation_level"], "user-space kernel");
    let unavailable: Vec<&str> = gvisor["host"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["state"] == "unavailable")
        .filter_map(|f| f["name"].as_str())
        .collect();
    for gap in ["survive_service_restart", "oom_per_process"] {
        assert!(unavailable.contains(&gap), "{gap} not listed: {gvisor}");
    }
    // The agent's seccomp filter refuses inet sockets with the network off, as on process.
    assert!(!unavailable.contains(&"network_off"), "{gvisor}");
}

#[test]
fn daemon_gvisor_pause_stops_a_loop_and_resume_continues_it() {
    let d = Daemon::start(&[]);
    check_available(&d);
    let id = d.create_id(json!({"backend": "gvisor", "template": "python"}));
    assert_eq!(d.sandbox(&id).backend, "gvisor");
    start_counter(&d, &id);
    // About 200 counts a second while it runs; a second paused adds none.
    let before = count(&d, &id).unwrap();
    let r = d.call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "paused");
    std::thread::sleep(Duration::from_secs(1));
    let r = d.call(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None);
    assert_eq!(r.status, 200, "{}", r.body);
    let after = count(&d, &id).unwrap();
    assert!(
        after >= before && after - before < 100,
        "the loop ran while paused: {before} -> {after}"
    );
    // It goes on from where it stopped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&d, &id).unwrap() < after + 50 {
        assert!(Instant::now() < deadline, "the loop did not continue");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
}

#[test]
fn daemon_gvisor_snapshots_restore_the_same_process_forks_and_survive_a_restart() {
    let mut d = Daemon::start(&[]);
    let src = d.create_id(json!({"backend": "gvisor", "template": "python"}));
    d.exec(&src, "echo base > /workspace/base && echo tmp > /tmp/kept");
    // ~50 MB of list, a function, a class and its instance, and an open file: a process
    // checkpoint carries them all (language fidelity could not carry the file).
    let r = d.code(
        &src,
        "import random\nbig = list(range(6_000_000))\ndef f(x): return x * 2\n\
         class C:\n    def v(self): return 7\nc = C()\nfh = open('/workspace/base')",
    );
    assert_eq!(r.done.status, "ok", "{r:?}");
    let r = d.post(
        &format!("/v1/sandboxes/{src}/snapshots"),
        json!({"name": "gv"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["fidelity"], "process", "{}", r.body);
    assert!(r.body["manifest"]["sha256"].as_str().unwrap().len() == 64);
    let snap = r.body["id"].as_str().unwrap().to_string();
    // The source runs on with its kernel and files (answered in time, or the daemon's log
    // says why).
    let v = code_within(&d, &src, "(len(big), f(21))", Duration::from_secs(60));
    assert_eq!(v["result"]["text/plain"], "(6000000, 42)", "{v}");
    assert_eq!(d.exec(&src, "cat /tmp/kept").stdout, "tmp\n");

    let r = d.post(&format!("/v1/snapshots/{snap}/fork"), json!({"count": 3}));
    assert_eq!(r.status, 201, "{}", r.body);
    let forks: Vec<String> = r.body["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["sandbox"]["id"].as_str().unwrap().to_string())
        .collect();
    let restore = &r.body["sandboxes"][0]["restore"];
    assert_eq!(restore["fidelity"], "process", "{restore}");
    assert!(
        restore["kernels"][0]["restored"]
            .to_string()
            .contains("\"fh\""),
        "{restore}"
    );
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(d.sandbox(f).backend, "gvisor");
        // The same interpreter: the open file reads on, /tmp came too.
        let v = d.code(
            f,
            "(len(big), big[-1], f(21), c.v(), isinstance(c, C), fh.read().strip())",
        );
        assert_eq!(
            v.plain(),
            "(6000000, 5999999, 42, 7, True, 'base')",
            "{v:?}"
        );
        assert_eq!(d.exec(f, "cat /tmp/kept").stdout, "tmp\n");
        // A new identity: its own hostname.
        assert_eq!(d.exec(f, "hostname").stdout, format!("{f}\n"));
        d.exec(f, &format!("echo fork{i} > /workspace/mine"));
        d.code(f, &format!("big.append({i})"));
    }
    for (i, f) in forks.iter().enumerate() {
        let v = d.code(f, "big[-1]");
        assert_eq!(v.plain(), i.to_string(), "{v:?}");
        assert_eq!(
            d.exec(f, "cat /workspace/mine").stdout,
            format!("fork{i}\n")
        );
    }
    let draws: std::collections::BTreeSet<String> = forks
        .iter()
        .map(|f| d.code(f, "random.random()").plain().to_string())
        .collect();
    assert_eq!(draws.len(), 3, "forks share a random stream: {draws:?}");

    // Source destroyed, daemon killed with -9 and restarted: the snapshot still restores
    // the same process.
    assert_eq!(d.delete(&format!("/v1/sandboxes/{src}")).status, 204);
    d.kill9();
    d.restart(&[]);
    let r = d.post("/v1/sandboxes", json!({ "snapshot_id": snap }));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["backend"], "gvisor", "{}", r.body);
    let again = r.body["id"].as_str().unwrap().to_string();
    let v = d.code(&again, "(len(big), f(21), c.v())");
    assert_eq!(v.plain(), "(6000000, 42, 7)", "{v:?}");
    // The forks ended with the daemon that served them (listed in /v1/system): lost now.
    assert_eq!(
        d.sandbox(&forks[0]).state,
        "lost",
        "{:?}",
        d.sandbox(&forks[0])
    );
    // A corrupted checkpoint is refused by its checksum.
    let archive = d
        .home()
        .join("snapshots")
        .join(&snap)
        .join("checkpoint.tar");
    let mut bytes = std::fs::read(&archive).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&archive, bytes).unwrap();
    d.post("/v1/sandboxes", json!({ "snapshot_id": snap }))
        .expect_error(409, "snapshot_corrupt");
}

/// Runs Python code with a bounded wait: a request that gets no answer fails the test with
/// the daemon's log (its home is removed with the test) instead of hanging it.
fn code_within(d: &Daemon, id: &str, code: &str, limit: Duration) -> serde_json::Value {
    let sent = d
        .req(Method::POST, &format!("/v1/sandboxes/{id}/code"))
        .json(&json!({ "code": code }))
        .timeout(limit)
        .send();
    let resp =
        sent.unwrap_or_else(|e| panic!("no answer to {code:?} within {limit:?}: {e}\n{}", d.log()));
    let status = resp.status();
    let body: serde_json::Value = resp.json().unwrap();
    assert_eq!(status, 200, "{body}\n{}", d.log());
    body
}

#[test]
fn daemon_gvisor_in_place_restores_answer_at_once() {
    // Each snapshot restores the source in place, after an exec (its pipes come and go) and
    // with a kernel holding state; the next request is answered within a bound.
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"backend": "gvisor", "template": "python"}));
    let r = code_within(
        &d,
        &id,
        "big = list(range(2_000_000))",
        Duration::from_secs(60),
    );
    assert_eq!(r["done"]["status"], "ok", "{r}");
    let rounds: usize = std::env::var("SANDCELL_TEST_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        assert_eq!(d.exec(&id, "echo x > /tmp/x").exit_code, Some(0));
        let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
        assert_eq!(r.status, 201, "{}", r.body);
        let snap = r.body["id"].as_str().unwrap().to_string();
        let v = code_within(&d, &id, "len(big)", Duration::from_secs(30));
        assert_eq!(v["result"]["text/plain"], "2000000", "round {round}: {v}");
        assert_eq!(d.delete(&format!("/v1/snapshots/{snap}")).status, 204);
    }
}

/// Starts `code` as a background Python program in `id` and waits (at most 30 s) until the
/// file `marker` it writes says `ready`; its pid.
fn start_python(d: &Daemon, id: &str, code: &str, marker: &str, ready: &str) -> u64 {
    let bg = d.post(
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"cmd": format!("exec python3 -c \"{code}\"")}),
    );
    assert_eq!(bg.status, 201, "{}", bg.body);
    wait_for(Duration::from_secs(30), || {
        (d.exec(id, &format!("cat {marker} 2>/dev/null")).stdout == ready).then_some(())
    })
    .unwrap_or_else(|| panic!("{marker} never said {ready}"));
    bg.body["pid"].as_u64().expect("the program's pid")
}

#[test]
fn daemon_gvisor_a_snapshot_a_listening_server_would_break_is_refused_and_the_sandbox_goes_on() {
    // This runsc cannot save a TCP socket an epoll instance watches, and a failed save ends
    // the sandbox: an asyncio server listening inside gets the snapshot refused, saying why,
    // and the sandbox keeps everything.
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"backend": "gvisor", "template": "python"}));
    let r = code_within(&d, &id, "kept = 41 + 1", Duration::from_secs(60));
    assert_eq!(r["done"]["status"], "ok", "{r}");
    let server = "import asyncio\nasync def m():\n    await asyncio.start_server(lambda r, w: None, '127.0.0.1', 8125)\n    open('/tmp/srv.out', 'w').write('ready')\n    await asyncio.sleep(600)\nasyncio.run(m())";
    let pid = start_python(&d, &id, server, "/tmp/srv.out", "ready");
    let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.body["code"], "unsupported", "{}", r.body);
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("python3") && message.contains("epoll"),
        "{message}"
    );
    // Nothing was lost: the kernel's state, the server, and the sandbox's records.
    let v = code_within(&d, &id, "kept", Duration::from_secs(30));
    assert_eq!(v["result"]["text/plain"], "42", "{v}");
    assert_eq!(
        d.get(&format!("/v1/sandboxes/{id}")).body["state"],
        "running"
    );
    let listening = d.exec(&id, "cat /proc/net/tcp").stdout;
    assert!(
        listening.contains(":1FBD"),
        "the server is gone: {listening}"
    );
    // Without the server, the snapshot is taken.
    assert_eq!(d.exec(&id, &format!("kill {pid}")).exit_code, Some(0));
    wait_for(Duration::from_secs(10), || {
        (!d.exec(&id, "cat /proc/net/tcp").stdout.contains(":1FBD")).then_some(())
    })
    .expect("the server did not end");
    checkpoint(&d, &id);
    let v = code_within(&d, &id, "kept", Duration::from_secs(30));
    assert_eq!(v["result"]["text/plain"], "42", "{v}");
}

#[test]
fn daemon_gvisor_a_sandbox_a_failed_checkpoint_ended_is_recorded_so_at_once() {
    // What the agent cannot see beforehand still ends the sandbox (a program holding a
    // connection to the host's proxy socket: runsc's save of it fails); its record then says
    // so with the cause instead of `running`.
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"backend": "gvisor", "template": "python"}));
    let holder = "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/sandcell/egress.sock')\nopen('/tmp/held', 'w').write('yes')\ntime.sleep(600)";
    start_python(&d, &id, holder, "/tmp/held", "yes");
    let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    if r.status == 201 {
        // A runsc that can save it: nothing to record.
        sandcell_testkit::skip::skip("this runsc checkpoints a connection to a host socket");
        return;
    }
    let info = d.get(&format!("/v1/sandboxes/{id}")).body;
    assert_eq!(info["state"], "stopped", "{info}");
    assert!(
        info["reason"]
            .as_str()
            .is_some_and(|r| r.contains("during a snapshot")),
        "{info}"
    );
}

/// `curl <args>` inside `id`: what it printed and `code=<http code>` on the last line.
fn curl(d: &Daemon, id: &str, args: &str) -> String {
    d.exec(
        id,
        &format!("curl -sS --max-time 20 -w '\\ncode=%{{http_code}}' {args} 2>&1"),
    )
    .stdout
}

/// Asserts that `id` reaches the host's web server by its allowed name, through its proxy.
fn reaches(d: &Daemon, id: &str, port: u16, path: &str) {
    let out = curl(d, id, &format!("http://web.test:{port}/{path}"));
    assert!(
        out.ends_with(&format!("hello /{path}\ncode=200")),
        "{id} /{path}: {out}\n{}",
        d.log()
    );
}

/// Asserts that `id`'s proxy refuses a name its policy does not allow (a CONNECT).
fn refused(d: &Daemon, id: &str, port: u16) {
    let out = curl(d, id, &format!("-p http://other.test:{port}/"));
    assert!(out.contains("403"), "{id}: {out}");
}

/// Takes a snapshot of `id` (a process checkpoint); its id.
fn checkpoint(d: &Daemon, id: &str) -> String {
    let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}\n{}", r.body, d.log());
    assert_eq!(r.body["fidelity"], "process", "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

/// The ids of `count` sandboxes forked from `snap`.
fn fork(d: &Daemon, snap: &str, count: u32) -> Vec<String> {
    let r = super::daemon_snapshots::fork(d, snap, count);
    assert_eq!(r.status, 201, "{}\n{}", r.body, d.log());
    super::daemon_snapshots::fork_ids(&r)
}

/// Waits (at most 20 s) until /tmp/held.out inside `id` says `word`.
fn held_says(d: &Daemon, id: &str, word: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = d.exec(id, "cat /tmp/held.out 2>/dev/null").stdout;
        if out.lines().any(|l| l == word) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the tunnel's program never said {word}: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn daemon_gvisor_egress_goes_on_after_snapshots_forks_and_in_place_restores() {
    let port = web_server();
    let d = egress_daemon();
    let id = d.create_id(json!({
        "backend": "gvisor", "template": "python", "network": {"allow": ["web.test"]},
    }));
    reaches(&d, &id, port, "before");
    refused(&d, &id, port);
    assert_eq!(d.code(&id, "x = 41").done.status, "ok");
    // A tunnel held open across the snapshot: this runsc cannot save the bridge's
    // connections (a failed save ends the sandbox), so the agent closes them first.
    let script = format!("cat > /tmp/hold.py <<'EOF'\n{HOLD_TUNNEL}EOF");
    assert_eq!(d.exec(&id, &script).exit_code, Some(0));
    let r = d.post(
        &format!("/v1/sandboxes/{id}/processes"),
        json!({ "cmd": format!("python3 /tmp/hold.py web.test:{port}") }),
    );
    assert!(r.status == 200 || r.status == 201, "{}", r.body);
    held_says(&d, &id, "established");

    let snap = checkpoint(&d, &id);
    held_says(&d, &id, "ended");
    // The source, restored in place, goes on: its kernel and its egress.
    reaches(&d, &id, port, "source");
    refused(&d, &id, port);
    assert_eq!(d.code(&id, "x + 1").plain(), "42");
    // And again, in place: the bridge closes and opens each time.
    for round in 0..2 {
        checkpoint(&d, &id);
        reaches(&d, &id, port, &format!("again{round}"));
    }

    let forks = fork(&d, &snap, 2);
    for f in &forks {
        // A restored agent has the proxy variables it was made with, and its own proxy.
        let env = d
            .exec(f, "env | grep -c '^https_proxy=http://127.0.0.1:3128$'")
            .stdout;
        assert_eq!(env.trim(), "1", "{f}: {env}");
        reaches(&d, f, port, "fork");
        refused(&d, f, port);
        assert_eq!(d.code(f, "x + 1").plain(), "42");
    }
    let evs = d
        .get(&format!("/v1/sandboxes/{}/network/events", forks[1]))
        .body;
    let evs = evs["events"].as_array().unwrap();
    assert!(
        evs.iter()
            .any(|e| e["decision"] == "allowed" && e["host"] == "web.test"),
        "{evs:?}"
    );
    // A restored sandbox is checkpointed in turn, and so is what is forked from it.
    let again = checkpoint(&d, &forks[0]);
    reaches(&d, &forks[0], port, "fork-after");
    let grandchild = fork(&d, &again, 1);
    reaches(&d, &grandchild[0], port, "grandchild");
    refused(&d, &grandchild[0], port);
}

#[test]
fn daemon_gvisor_loopback_sandboxes_get_egress_live_and_keep_it_across_a_snapshot() {
    let port = web_server();
    let d = egress_daemon();
    let id = d.create_id(json!({"backend": "gvisor"}));
    // `loopback` has the proxy too: it refuses everything, saying why.
    let out = curl(&d, &id, &format!("http://web.test:{port}/"));
    assert!(
        out.contains("code=403") && out.contains("'loopback'"),
        "{out}"
    );
    let r = d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(json!({"network": {"allow": ["web.test"]}})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    reaches(&d, &id, port, "live");
    refused(&d, &id, port);
    checkpoint(&d, &id);
    reaches(&d, &id, port, "after");
    let r = d.call(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(json!({"network": "loopback"})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let out = curl(&d, &id, &format!("http://web.test:{port}/"));
    assert!(out.contains("code=403"), "{out}");
}
