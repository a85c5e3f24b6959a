//! The daemon's lifecycle: sandboxes stopped for their lifetime or idleness, a graceful stop
//! that keeps them for the next start, and a daemon killed with -9 that finds its sandboxes
//! again (or reports the ones that died meanwhile as lost).

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use super::daemon::{
    CodeResultExt, Daemon, parent_of, processes_in_cgroup_of, start_time, wait_for,
};

#[test]
fn daemon_lifetime_idle_timeout_and_set_timeout_stop_sandboxes() {
    let d = Daemon::start(&["limits.gc_interval_secs=1"]);
    let start = Instant::now();
    let lifetime = d.create_id(json!({"timeout_secs": 2}));
    let idle = d.create_id(json!({"idle_timeout_secs": 2}));
    // Used all the time: its idle timeout never comes.
    let busy = d.create_id(json!({"idle_timeout_secs": 2}));
    // A long lifetime, cut short by a new timeout.
    let cut = d.create_id(json!({"timeout_secs": 3600}));
    let r = d.post(
        &format!("/v1/sandboxes/{cut}/timeout"),
        json!({"timeout_secs": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // A long one that stays.
    let long = d.create_id(json!({"timeout_secs": 3600, "idle_timeout_secs": 3600}));

    // Touch `busy` every 300 ms while the others run out (and for longer than its timeout).
    let mut ended = std::collections::BTreeMap::new();
    while start.elapsed() < Duration::from_secs(15) {
        assert_eq!(d.exec(&busy, "true").exit_code, Some(0));
        for id in [&lifetime, &idle, &cut] {
            if !ended.contains_key(id) {
                let s = d.sandbox(id);
                if s.state != "running" {
                    ended.insert(id.clone(), (s, start.elapsed()));
                }
            }
        }
        if ended.len() == 3 && start.elapsed() > Duration::from_secs(4) {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let reason = |id: &String| {
        let (s, at) = ended
            .get(id)
            .unwrap_or_else(|| panic!("{id} still runs after 15 s:\n{}", d.log()));
        assert_eq!(s.state, "stopped", "{s:?}");
        (s.reason.as_deref().unwrap_or("").to_string(), *at)
    };
    let (why, at) = reason(&lifetime);
    assert!(why.contains("lifetime"), "{why}");
    assert!(at >= Duration::from_millis(1500), "stopped after {at:?}");
    let (why, at) = reason(&idle);
    assert!(why.contains("idle"), "{why}");
    assert!(at >= Duration::from_millis(1500), "stopped after {at:?}");
    let (why, _) = reason(&cut);
    assert!(why.contains("lifetime"), "{why}");
    assert_eq!(d.sandbox(&busy).state, "running");
    assert_eq!(d.sandbox(&long).state, "running");
    // Stopped for good: nothing runs in them, and their processes are gone.
    d.post(
        &format!("/v1/sandboxes/{idle}/exec"),
        json!({"cmd": "true"}),
    )
    .expect_error(409, "sandbox_gone");
    for id in [&lifetime, &idle, &cut] {
        let rt = d.runtime_of(id);
        assert!(
            wait_for(Duration::from_secs(10), || (!rt.alive()).then_some(())).is_some(),
            "{id} still has processes"
        );
    }
    // The lifecycle shows in the metrics.
    let m = super::daemon::send(d.req_as(Some(&d.key), Method::GET, "/metrics")).body;
    assert!(
        m.as_str()
            .unwrap()
            .contains("sandcell_sandboxes_expired_total 3"),
        "{m}"
    );
}

#[test]
fn daemon_graceful_stop_keeps_sandboxes_for_the_next_start() {
    let mut d = Daemon::start(&["shutdown.sandboxes=keep"]);
    let id = d.create_id(json!({"template": "python", "labels": {"k": "v"}}));
    let before = d.sandbox(&id);
    assert_eq!(d.code(&id, "x = 41\nx").plain(), "41");
    d.exec(
        &id,
        "echo kept > /workspace/f; sleep 300 > /dev/null 2>&1 &",
    );
    let rt = d.runtime_of(&id);
    assert!(rt.alive());

    // SIGTERM: the daemon ends cleanly, removes its daemon.json, leaves the sandbox running.
    d.terminate();
    assert!(!d.home().join("daemon.json").exists());
    assert!(rt.alive(), "a kept sandbox was stopped");
    assert!(!processes_in_cgroup_of(&id).is_empty() || rt.cgroups.is_empty());

    // The next start finds it as it was.
    d.restart(&[]);
    let s = d.sandbox(&id);
    assert_eq!(s.state, "running", "{s:?}");
    assert!(
        s.reason.as_deref().is_some_and(|r| r.contains("reattach")),
        "{s:?}"
    );
    assert_eq!(s.created_at, before.created_at);
    assert_eq!(s.expires_at, before.expires_at);
    assert_eq!(json!(s.labels), json!({"k": "v"}));
    let r = d.code(&id, "x += 1\nx");
    assert_eq!(r.plain(), "42", "{r:?}");
    assert_eq!(d.exec(&id, "cat /workspace/f").stdout, "kept\n");
    let ps = d.get(&format!("/v1/sandboxes/{id}/processes"));
    assert!(
        ps.body["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["cmdline"] == "sleep 300"),
        "{}",
        ps.body
    );
    assert_eq!(d.get("/v1/system").body["running"], 1);

    // This start stops its sandboxes on SIGTERM: nothing of it is left afterwards.
    d.terminate();
    assert_eq!(d.kill_leftovers(), Vec::<String>::new());
    assert!(!rt.alive());
    assert!(processes_in_cgroup_of(&id).is_empty());
    d.restart(&[]);
    let s = d.sandbox(&id);
    assert_eq!(s.state, "stopped", "{s:?}");
    assert!(
        s.reason
            .as_deref()
            .is_some_and(|r| r.contains("service stopped")),
        "{s:?}"
    );
}

#[test]
fn daemon_killed_with_sigkill_reattaches_live_sandboxes_and_reports_dead_ones_lost() {
    let mut d = Daemon::start(&[]);
    let live = d.create_id(json!({"template": "python"}));
    let dead = d.create_id(json!({"template": "python"}));
    assert_eq!(d.code(&live, "x = 41").done.status, "ok");
    assert_eq!(d.code(&dead, "y = 1").done.status, "ok");
    let live_rt = d.runtime_of(&live);
    let dead_rt = d.runtime_of(&dead);
    // The launcher above the dead one's PID 1 (`sandcell __jail`), and its start time.
    let launcher = parent_of(dead_rt.host_pid).unwrap();
    let launcher_start = start_time(launcher);
    assert!(
        std::fs::read_to_string(format!("/proc/{launcher}/cmdline"))
            .unwrap()
            .contains("__jail")
    );
    if let Some(sock) = &dead_rt.agent_socket {
        assert!(sock.exists(), "{}", sock.display());
        assert!(sock.to_string_lossy().ends_with(&format!("{dead}.sock")));
    }

    // kill -9: no cleanup at all; then the `dead` sandbox's processes are killed by hand.
    d.kill9();
    assert!(
        live_rt.alive() && dead_rt.alive(),
        "kill -9 of the daemon ended sandboxes"
    );
    let host_pid = u32::try_from(dead_rt.host_pid).unwrap();
    // The sandbox's PID 1, read from its record and checked alive above.
    let pid = rustix::process::Pid::from_raw(i32::try_from(host_pid).unwrap()).unwrap();
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    assert!(wait_for(Duration::from_secs(10), || (!dead_rt.alive()).then_some(())).is_some());

    // The next start: `live` is back with its state, `dead` is lost with the reason.
    d.restart(&[]);
    let s = d.sandbox(&live);
    assert_eq!(s.state, "running", "{s:?}");
    let reason = s.reason.as_deref().unwrap_or("");
    assert!(reason.contains("reattach"), "{s:?}");
    let r = d.code(&live, "x");
    assert_eq!(r.plain(), "41", "{r:?}");
    assert_eq!(d.exec(&live, "echo alive").stdout, "alive\n");
    let s = d.sandbox(&dead);
    assert_eq!(s.state, "lost", "{s:?}");
    let reason = s.reason.as_deref().unwrap_or("");
    assert!(
        reason.contains("not reattached") && reason.contains(&dead_rt.host_pid.to_string()),
        "{s:?}"
    );
    d.post(&format!("/v1/sandboxes/{dead}/code"), json!({"code": "y"}))
        .expect_error(409, "sandbox_gone");
    // Lost ones are listed with state=lost, not among the active.
    let lost = d.get("/v1/sandboxes?state=lost");
    assert_eq!(super::daemon::ids(&lost.body), [dead.as_str()]);
    assert_eq!(
        super::daemon::ids(&d.get("/v1/sandboxes").body),
        [live.as_str()]
    );
    // Nothing of it is left: no process in its cgroup, no launcher, no socket, no cgroup.
    assert!(
        wait_for(Duration::from_secs(10), || {
            let gone = launcher_start.is_none() || start_time(launcher) != launcher_start;
            (gone && processes_in_cgroup_of(&dead).is_empty()).then_some(())
        })
        .is_some(),
        "left of {dead}: launcher {launcher} {:?}, in its cgroup {:?}",
        start_time(launcher),
        processes_in_cgroup_of(&dead)
    );
    if let Some(sock) = &dead_rt.agent_socket {
        assert!(!sock.exists(), "{} is left", sock.display());
    }
    for cg in &dead_rt.cgroups {
        assert!(!cg.exists(), "{} is left", cg.display());
    }
    // A lost sandbox does not count against the caps and can be deleted (it stays lost).
    let r = d.delete(&format!("/v1/sandboxes/{dead}"));
    assert!(
        r.status == 204 || r.status == 409,
        "{} {}",
        r.status,
        r.body
    );
    assert_eq!(d.sandbox(&dead).state, "lost");

    // Killed again while the reattached one runs: it is found once more.
    d.kill9();
    d.restart(&[]);
    assert_eq!(d.code(&live, "x + 1").plain(), "42");
}
