//! Pause and resume over HTTP: a paused sandbox's processes stop where they are (a counting
//! loop does not advance) and go on from there; its clocks stop; anything asked of it wakes
//! it; a restart of the daemon keeps it paused with its kernel's state.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use super::daemon::{CodeResultExt, Daemon};

/// Starts a loop in the background that counts about 200 times a second into /tmp/n.
pub(super) fn start_counter(d: &Daemon, id: &str) {
    let r = d.post(
        &format!("/v1/sandboxes/{id}/processes"),
        json!({
            "cmd": "python3 -c 'import time\ni = 0\nwhile True:\n    i += 1\n    open(\"/tmp/n.tmp\", \"w\").write(str(i))\n    __import__(\"os\").replace(\"/tmp/n.tmp\", \"/tmp/n\")\n    time.sleep(0.005)'"
        }),
    );
    assert!(r.status == 200 || r.status == 201, "{}", r.body);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(d, id).is_none() {
        assert!(Instant::now() < deadline, "the counter did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn count(d: &Daemon, id: &str) -> Option<u64> {
    d.exec(id, "cat /tmp/n 2>/dev/null")
        .stdout
        .trim()
        .parse()
        .ok()
}

fn post(d: &Daemon, path: &str) -> super::daemon::Resp {
    d.call(Method::POST, path, None)
}

#[test]
fn daemon_pause_freezes_processes_and_resume_continues_them() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"template": "python", "timeout_secs": 600}));
    assert_eq!(d.code(&id, "kept = 'before the pause'").done.status, "ok");
    start_counter(&d, &id);

    // Paused: the state says so, the loop stops, the CPU counter does not move.
    let before = count(&d, &id).unwrap();
    let started = Instant::now();
    let r = post(&d, &format!("/v1/sandboxes/{id}/pause"));
    let pause_took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "paused", "{}", r.body);
    let expires_paused = r.body["expires_at"].as_str().unwrap().to_string();
    assert_eq!(d.sandbox(&id).state, "paused");
    let cpu = |d: &Daemon| {
        let m = d.get(&format!("/v1/sandboxes/{id}/metrics")).body;
        m["cpu_seconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("no cpu figure: {m}"))
    };
    let cpu_paused = cpu(&d);
    assert!(
        cpu_paused > 0.0,
        "the counting loop used no CPU before the pause"
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(cpu(&d), cpu_paused, "a paused sandbox used CPU");
    assert_eq!(d.sandbox(&id).state, "paused", "reading metrics woke it");
    // Pausing again changes nothing.
    assert_eq!(
        post(&d, &format!("/v1/sandboxes/{id}/pause")).body["state"],
        "paused"
    );

    // Resumed: the loop goes on from where it was (1.5 s paused would be ~300 counts).
    let started = Instant::now();
    let r = post(&d, &format!("/v1/sandboxes/{id}/resume"));
    let resume_took = started.elapsed();
    assert_eq!(
        (r.status, r.body["state"].as_str()),
        (200, Some("running")),
        "{}",
        r.body
    );
    let after = count(&d, &id).unwrap();
    assert!(
        after >= before && after - before < 150,
        "counted {before} before and {after} after 1.5 s paused"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        count(&d, &id).unwrap() > after + 10,
        "the loop did not go on"
    );
    // The time paused is added to its lifetime.
    let expires_now = r.body["expires_at"].as_str().unwrap();
    assert!(
        expires_now > expires_paused.as_str(),
        "{expires_now} vs {expires_paused}"
    );
    assert_eq!(d.code(&id, "kept").plain(), "'before the pause'");
    eprintln!("pause {pause_took:?}, resume {resume_took:?} (over HTTP)");

    // Anything asked of a paused sandbox wakes it first.
    post(&d, &format!("/v1/sandboxes/{id}/pause"));
    assert_eq!(d.exec(&id, "echo awake").stdout, "awake\n");
    assert_eq!(d.sandbox(&id).state, "running");

    // A paused sandbox can be deleted (its frozen processes die too).
    post(&d, &format!("/v1/sandboxes/{id}/pause"));
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    assert_eq!(d.sandbox(&id).state, "stopped");
    post(&d, &format!("/v1/sandboxes/{id}/resume")).expect_error(409, "sandbox_gone");
    post(&d, "/v1/sandboxes/sb-000000000000/pause").expect_error(404, "not_found");
    let (bob, _) = d.key_for("bob");
    let other = d.create_id(json!({}));
    d.call_as(
        Some(&bob),
        Method::POST,
        &format!("/v1/sandboxes/{other}/pause"),
        None,
    )
    .expect_error(404, "not_found");
}

#[test]
fn daemon_paused_sandboxes_outlast_their_idle_timeout_and_a_restart() {
    let mut d = Daemon::start(&["limits.gc_interval_secs=1"]);
    let id = d.create_id(json!({"template": "python", "idle_timeout_secs": 1}));
    assert_eq!(d.code(&id, "x = 41").done.status, "ok");
    assert_eq!(
        d.call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
            .status,
        200
    );
    // Paused past its idle timeout (several collection rounds): still there.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(d.sandbox(&id).state, "paused");

    // kill -9 of the daemon: the next one finds it paused, and its kernel as it was.
    d.kill9();
    d.restart(&["limits.gc_interval_secs=1"]);
    let s = d.sandbox(&id);
    assert_eq!(s.state, "paused", "{s:?}");
    assert_eq!(d.code(&id, "x + 1").plain(), "42");
    assert_eq!(d.sandbox(&id).state, "running");
}
