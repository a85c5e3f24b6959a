//! The agent as the real PID 1 of a pid namespace: this test binary re-runs itself under
//! `unshare --pid --fork --mount-proc`, where an ignored entry test serves on stdin.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sandcell_guest::{GuestConfig, GuestError, serve};
use sandcell_protocol::{ExecRequest, GuestMessage, HostMessage, ProcessInfo};

use super::client::{Agent, pids_in};

/// Set (to the test's directory) only in the re-run child.
const ENTRY_ENV: &str = "SANDCELL_GUEST_TEST_PID1_DIR";

#[test]
#[ignore = "entry point of as_pid1_orphans_are_reaped_and_trees_die; needs a pid namespace"]
fn pid1_agent_entry() {
    let dir = PathBuf::from(std::env::var_os(ENTRY_ENV).expect("run by the pid1 test"));
    assert_eq!(std::process::id(), 1, "must be pid 1 of its namespace");
    let fd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let roots: Vec<PathBuf> = ["workspace", "home", "tmp"]
        .iter()
        .map(|n| dir.join(n))
        .collect();
    let config = GuestConfig {
        default_cwd: roots[0].clone(),
        file_roots: roots,
        pid1: true,
        ..GuestConfig::default()
    };
    serve(UnixStream::from(fd), config).unwrap();
}

fn processes(agent: &mut Agent) -> Vec<ProcessInfo> {
    match agent.call(HostMessage::ListProcesses) {
        GuestMessage::Processes { processes } => processes,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn as_pid1_orphans_are_reaped_and_trees_die() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stderr(Stdio::null())
        .status();
    sandcell_testkit::require!(
        probe.is_ok_and(|s| s.success()),
        "cannot create a pid namespace here"
    );
    let dir = tempfile::tempdir().unwrap();
    for n in ["workspace", "home", "tmp"] {
        std::fs::create_dir(dir.path().join(n)).unwrap();
    }
    let (host, guest) = UnixStream::pair().unwrap();
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "suite::pid1::pid1_agent_entry"])
        .env(ENTRY_ENV, dir.path())
        .stdin(Stdio::from(OwnedFd::from(guest)))
        // The child's libtest report goes nowhere; its panics (stderr) show in ours.
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        let result = match child.wait() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(GuestError::Read(std::io::Error::other(format!(
                "the pid1 agent ended with {s}"
            )))),
            Err(e) => Err(GuestError::Read(e)),
        };
        let _ = tx.send(result);
    });
    let mut agent = Agent::connected(host, dir, done);
    agent.hello();

    // Two orphans: a sleeping one and one that exits at once. Both are reparented to the
    // agent; the one that exits must be reaped, not left as a zombie.
    let run = agent.exec(ExecRequest::shell(
        "(sleep 100 >/dev/null 2>&1 & echo $!); (true & echo $!); echo end",
    ));
    let orphans = pids_in(&run.stdout_text());
    assert_eq!(orphans.len(), 2, "{}", run.stdout_text());
    std::thread::sleep(Duration::from_millis(100));
    let list = processes(&mut agent);
    let sleeper = list
        .iter()
        .find(|p| p.pid == orphans[0])
        .expect("orphan sleep listed");
    assert_eq!(sleeper.ppid, 1, "orphans are reparented to the agent");
    assert!(
        list.iter().all(|p| p.pid != orphans[1]),
        "exited orphan not reaped: {list:?}"
    );
    assert!(
        list.iter().all(|p| p.state != "Z"),
        "zombies left: {list:?}"
    );
    assert!(list.iter().all(|p| p.pid != 1), "the agent lists itself");

    // A double-forked daemon is found by its environment and killed on timeout.
    let mut req = ExecRequest::shell("(setsid sleep 100 & echo $!); sleep 100");
    req.timeout_ms = Some(300);
    let run = agent.exec(req);
    assert!(run.exit.timed_out);
    let daemon = pids_in(&run.stdout_text())[0];
    std::thread::sleep(Duration::from_millis(50));
    let list = processes(&mut agent);
    assert!(
        list.iter().all(|p| p.pid != daemon),
        "daemon survived: {list:?}"
    );
    assert!(
        list.iter().all(|p| p.state != "Z"),
        "zombies left: {list:?}"
    );

    assert_eq!(agent.call(HostMessage::Shutdown), GuestMessage::Ok);
    let ended = agent.wait_done(Duration::from_secs(10));
    assert!(ended.is_ok(), "{ended:?}");
}
