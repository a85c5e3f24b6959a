//! Signals and the process list.

use std::time::Duration;

use sandcell_protocol::{ErrorCode, ExecRequest, Frame, GuestMessage, HostMessage};

use super::client::{Agent, alive, expect_code, pids_in, wait_dead};

fn signal(exec_id: Option<u32>, pid: Option<i32>, signal: i32, tree: bool) -> HostMessage {
    HostMessage::Signal {
        exec_id,
        pid,
        signal,
        tree,
    }
}

/// Reads an exec's output until it holds `n` pid lines.
fn read_pids(agent: &mut Agent, id: u32, n: usize) -> Vec<i32> {
    let mut text = String::new();
    while pids_in(&text).len() < n {
        match agent.next_for(id) {
            Frame::Data { chunk, .. } => text.push_str(&String::from_utf8_lossy(&chunk.bytes)),
            Frame::Message { msg, .. } => panic!("exec ended early: {msg:?}"),
        }
    }
    pids_in(&text)
}

#[test]
fn a_tree_kill_ends_a_running_exec_and_its_children() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::shell(
        "sleep 100 & echo $!; (setsid sleep 100 & echo $!); sleep 100",
    ));
    let children = read_pids(&mut agent, id, 2);
    assert!(children.iter().all(|p| alive(*p)));
    assert_eq!(
        agent.call(signal(Some(id), None, 9, true)),
        GuestMessage::Ok
    );
    let run = agent.finish_exec(id, pid);
    assert_eq!(run.exit.signal, Some(9));
    assert!(run.exit.killed, "a host tree kill must be marked killed");
    assert!(!run.exit.timed_out);
    for child in children {
        assert!(
            wait_dead(child, Duration::from_secs(2)),
            "{child} survived the tree kill"
        );
    }
}

#[test]
fn a_plain_signal_reaches_only_the_main_process() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::shell(
        "trap 'exit 42' TERM; sleep 100 >/dev/null 2>&1 & echo $!; wait",
    ));
    let child = read_pids(&mut agent, id, 1)[0];
    assert_eq!(
        agent.call(signal(Some(id), None, 15, false)),
        GuestMessage::Ok
    );
    let run = agent.finish_exec(id, pid);
    assert_eq!(run.exit.exit_code, Some(42));
    assert!(!run.exit.killed);
    // The child was not signalled; clean it up by pid.
    assert!(alive(child));
    assert_eq!(
        agent.call(signal(None, Some(child), 9, false)),
        GuestMessage::Ok
    );
    assert!(wait_dead(child, Duration::from_secs(2)));
}

#[test]
fn a_real_time_signal_is_delivered() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::argv(["sleep", "100"]));
    assert_eq!(
        agent.call(signal(Some(id), None, 40, false)),
        GuestMessage::Ok
    );
    let run = agent.finish_exec(id, pid);
    assert_eq!(run.exit.signal, Some(40));
}

#[test]
fn bad_signals_and_unknown_targets_are_rejected() {
    let mut agent = Agent::start();
    let msg = expect_code(
        agent.call(signal(Some(1), None, 0, false)),
        ErrorCode::InvalidArgument,
    );
    assert!(msg.contains("signal 0"), "{msg}");
    expect_code(
        agent.call(signal(Some(1), None, 65, false)),
        ErrorCode::InvalidArgument,
    );
    expect_code(
        agent.call(signal(Some(999), None, 9, true)),
        ErrorCode::NoSuchProcess,
    );
    expect_code(
        agent.call(signal(None, None, 9, false)),
        ErrorCode::InvalidArgument,
    );
    // Outside a pid namespace, processes the agent did not start are not in the sandbox.
    let init = signal(None, Some(1), 15, false);
    expect_code(agent.call(init), ErrorCode::NoSuchProcess);
    let parent = std::os::unix::process::parent_id() as i32;
    expect_code(
        agent.call(signal(None, Some(parent), 15, true)),
        ErrorCode::NoSuchProcess,
    );
}

#[test]
fn the_process_list_shows_a_running_exec() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::argv(["sleep", "77"]));
    let processes = match agent.call(HostMessage::ListProcesses) {
        GuestMessage::Processes { processes } => processes,
        other => panic!("unexpected {other:?}"),
    };
    let sleep = processes
        .iter()
        .find(|p| p.pid == pid)
        .expect("the sleep is listed");
    assert_eq!(sleep.cmdline, "sleep 77");
    assert_eq!(sleep.exec_id, Some(id));
    assert_eq!(sleep.pgid, pid, "an exec leads its own process group");
    assert!(sleep.rss_bytes > 0);
    assert!(
        ["S", "R"].contains(&sleep.state.as_str()),
        "{}",
        sleep.state
    );
    let me = std::process::id() as i32;
    assert!(
        processes.iter().all(|p| p.pid != me),
        "the agent lists itself"
    );
    assert_eq!(
        agent.call(signal(Some(id), None, 9, true)),
        GuestMessage::Ok
    );
    agent.finish_exec(id, pid);
}

#[test]
fn descendants_carry_their_exec_id() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::shell("sleep 100 & echo $!; wait"));
    let child = read_pids(&mut agent, id, 1)[0];
    let processes = match agent.call(HostMessage::ListProcesses) {
        GuestMessage::Processes { processes } => processes,
        other => panic!("unexpected {other:?}"),
    };
    let listed = processes
        .iter()
        .find(|p| p.pid == child)
        .expect("child listed");
    assert_eq!(listed.exec_id, Some(id));
    assert_eq!(listed.ppid, pid);
    assert_eq!(
        agent.call(signal(None, Some(pid), 9, true)),
        GuestMessage::Ok
    );
    let run = agent.finish_exec(id, pid);
    assert!(run.exit.killed);
    assert!(wait_dead(child, Duration::from_secs(2)));
}
