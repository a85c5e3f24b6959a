//! Exec: output streaming, exit reporting, limits, stdin, timeouts and tree kills.

use std::time::{Duration, Instant};

use sandcell_protocol::{Channel, ErrorCode, ExecRequest, GuestMessage, HostMessage};

use super::client::{Agent, alive, expect_code, pids_in, wait_dead};

#[test]
fn echo_streams_stdout_and_exits_zero() {
    let mut agent = Agent::start();
    let run = agent.exec(ExecRequest::argv(["echo", "hello", "world"]));
    assert_eq!(run.stdout, b"hello world\n");
    assert!(run.stderr.is_empty());
    assert_eq!(run.exit.exit_code, Some(0));
    assert_eq!(run.exit.signal, None);
    assert_eq!(run.exit.stdout_bytes, 12);
    assert!(!run.exit.timed_out && !run.exit.killed && !run.exit.stdout_truncated);
    assert!(run.pid > 0);
    assert!(run.exit.duration_us > 0);
}

#[test]
fn both_streams_and_the_exit_code_arrive_with_increasing_seq() {
    let mut agent = Agent::start();
    let run = agent.exec(ExecRequest::shell(
        "echo out; echo err >&2; echo out2; echo err2 >&2; exit 3",
    ));
    assert_eq!(run.stdout_text(), "out\nout2\n");
    assert_eq!(String::from_utf8_lossy(&run.stderr), "err\nerr2\n");
    assert_eq!(run.exit.exit_code, Some(3));
    assert_eq!((run.exit.stdout_bytes, run.exit.stderr_bytes), (9, 9));
    let seqs: Vec<u64> = run.chunks.iter().map(|(_, s)| *s).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] > w[0]),
        "seq not increasing: {seqs:?}"
    );
    assert_eq!(seqs[0], 0);
    assert!(run.chunks.iter().any(|(c, _)| *c == Channel::Stdout));
    assert!(run.chunks.iter().any(|(c, _)| *c == Channel::Stderr));
}

#[test]
fn a_missing_program_is_spawn_failed() {
    let mut agent = Agent::start();
    let msg = expect_code(
        agent.call(HostMessage::Exec(ExecRequest::argv([
            "no-such-program-xyz",
        ]))),
        ErrorCode::SpawnFailed,
    );
    assert_eq!(
        msg,
        "cannot run 'no-such-program-xyz': no such file or directory"
    );
    let mut req = ExecRequest::argv(["true"]);
    req.cwd = Some("/no/such/dir".into());
    let msg = expect_code(agent.call(HostMessage::Exec(req)), ErrorCode::SpawnFailed);
    assert!(
        msg.contains("working directory '/no/such/dir' does not exist"),
        "{msg}"
    );
}

#[test]
fn invalid_requests_are_rejected_before_spawning() {
    let mut agent = Agent::start();
    let empty = ExecRequest::argv(Vec::<String>::new());
    let msg = expect_code(
        agent.call(HostMessage::Exec(empty)),
        ErrorCode::InvalidArgument,
    );
    assert_eq!(msg, "argv is empty");
    let nul = ExecRequest::argv(["echo", "a\0b"]);
    expect_code(
        agent.call(HostMessage::Exec(nul)),
        ErrorCode::InvalidArgument,
    );
    let mut bad_env = ExecRequest::argv(["true"]);
    bad_env.env.insert("X".into(), "a\0".into());
    expect_code(
        agent.call(HostMessage::Exec(bad_env)),
        ErrorCode::InvalidArgument,
    );
}

#[test]
fn a_signal_death_is_reported() {
    let mut agent = Agent::start();
    let run = agent.exec(ExecRequest::shell("kill -SEGV $$"));
    assert_eq!(run.exit.signal, Some(11));
    assert_eq!(run.exit.exit_code, None);
    assert!(!run.exit.killed && !run.exit.timed_out);
}

#[test]
fn env_cwd_and_exec_id_reach_the_process() {
    let mut agent = Agent::start();
    std::fs::create_dir(agent.workspace().join("sub")).unwrap();
    let mut req = ExecRequest::shell("echo $HOME $LANG $FOO $SANDCELL_EXEC_ID; pwd");
    req.env.insert("FOO".into(), "bar".into());
    req.env.insert("HOME".into(), "/elsewhere".into());
    req.cwd = Some("sub".into());
    let (id, pid) = agent.start_exec(req);
    let run = agent.finish_exec(id, pid);
    let expected = format!(
        "/elsewhere C.UTF-8 bar {id}\n{}\n",
        agent.workspace().join("sub").display()
    );
    assert_eq!(run.stdout_text(), expected);
    // The environment is exactly the base plus the request: nothing leaks from the agent.
    let run = agent.exec(ExecRequest::argv(["env"]));
    let names: Vec<String> = run
        .stdout_text()
        .lines()
        .filter_map(|l| l.split('=').next().map(str::to_string))
        .collect();
    assert!(names.contains(&"PATH".to_string()));
    assert!(!names.contains(&"CARGO_PKG_NAME".to_string()), "{names:?}");
}

#[test]
fn processes_do_not_inherit_the_host_socket() {
    let mut agent = Agent::start();
    let run = agent.exec(ExecRequest::shell(
        "for f in /proc/self/fd/*; do readlink $f; done",
    ));
    let fds = run.stdout_text();
    assert!(fds.contains("pipe:"), "{fds}");
    // Only this agent's socket counts: the other tests' agents share this process, and
    // theirs is inheritable for a moment while they start (as in a sandbox, where it is the
    // only one).
    let own = format!("socket:[{}]", agent.guest_socket_inode.unwrap());
    assert!(!fds.contains(&own), "the host socket leaked: {fds}");
}

#[test]
fn timeout_kills_the_whole_tree() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::shell("sleep 100 & echo $!; sleep 100 & echo $!; wait");
    req.timeout_ms = Some(300);
    let started = Instant::now();
    let run = agent.exec(req);
    let took = started.elapsed();
    assert!(run.exit.timed_out);
    assert_eq!(run.exit.signal, Some(9));
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    assert!(took >= Duration::from_millis(300), "took {took:?}");
    let children = pids_in(&run.stdout_text());
    assert_eq!(children.len(), 2, "{}", run.stdout_text());
    for pid in children {
        assert!(
            wait_dead(pid, Duration::from_secs(2)),
            "sleep {pid} survived the timeout"
        );
    }
}

#[test]
fn timeout_also_kills_a_double_forked_daemon() {
    let mut agent = Agent::start();
    // The setsid'd sleep leaves the exec's group and session and is reparented away.
    let mut req = ExecRequest::shell("(setsid sleep 100 & echo $!); sleep 100");
    req.timeout_ms = Some(300);
    let run = agent.exec(req);
    assert!(run.exit.timed_out);
    let daemons = pids_in(&run.stdout_text());
    assert_eq!(daemons.len(), 1, "{}", run.stdout_text());
    let daemon = daemons[0];
    assert!(
        wait_dead(daemon, Duration::from_secs(2)),
        "daemon {daemon} survived the timeout"
    );
}

#[test]
fn output_over_the_limit_is_dropped_but_counted() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::argv(["head", "-c", "3000000", "/dev/zero"]);
    req.stdout_limit = 1000;
    let run = agent.exec(req);
    assert_eq!(run.stdout.len(), 1000);
    assert!(run.exit.stdout_truncated);
    assert_eq!(run.exit.stdout_bytes, 3_000_000);
    assert_eq!(run.exit.exit_code, Some(0));
    assert!(!run.exit.stderr_truncated);
}

#[test]
fn large_output_arrives_whole_in_bounded_chunks() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::argv(["head", "-c", "700000", "/dev/zero"]);
    req.stdout_limit = 1 << 20;
    let run = agent.exec(req);
    assert_eq!(run.stdout.len(), 700_000);
    assert!(
        run.chunks.len() >= 11,
        "64 KiB chunks expected, got {}",
        run.chunks.len()
    );
    assert!(!run.exit.stdout_truncated);
}

#[test]
fn stdin_chunks_reach_the_process() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::argv(["cat"]);
    req.stdin = true;
    let (id, pid) = agent.start_exec(req);
    agent.send_data(id, Channel::Stdin, 0, b"hello ");
    agent.send_data(id, Channel::Stdin, 1, b"stdin\n");
    agent.send(id, &HostMessage::StdinClose);
    let run = agent.finish_exec(id, pid);
    assert_eq!(run.stdout, b"hello stdin\n");
    assert_eq!(run.exit.exit_code, Some(0));
}

#[test]
fn stdin_to_a_process_that_closed_it_is_ignored() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::shell("exec 0<&-; sleep 0.2; echo done");
    req.stdin = true;
    let (id, pid) = agent.start_exec(req);
    agent.send_data(id, Channel::Stdin, 0, &vec![b'x'; 200_000]);
    agent.send(id, &HostMessage::StdinClose);
    let run = agent.finish_exec(id, pid);
    assert_eq!(run.stdout, b"done\n");
    assert_eq!(run.exit.exit_code, Some(0));
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}

#[test]
fn a_background_child_holding_the_pipe_does_not_hold_the_exit() {
    let mut agent = Agent::start();
    let started = Instant::now();
    let run = agent.exec(ExecRequest::shell("sleep 30 & echo $!; echo hi"));
    let took = started.elapsed();
    assert_eq!(run.exit.exit_code, Some(0));
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    let out = run.stdout_text();
    assert!(out.ends_with("hi\n"), "{out}");
    // It still held the exec's output pipe, which nobody reads any more: it was ended.
    let pid = pids_in(&out)[0];
    assert!(
        wait_dead(pid, Duration::from_secs(2)),
        "pipe holder {pid} survived"
    );
}

#[test]
fn a_background_process_with_redirected_output_keeps_running() {
    let mut agent = Agent::start();
    let started = Instant::now();
    let run = agent.exec(ExecRequest::shell("sleep 30 >/dev/null 2>&1 & echo $!"));
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(run.exit.exit_code, Some(0));
    let pid = pids_in(&run.stdout_text())[0];
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        alive(pid),
        "a detached background process must survive its exec"
    );
    let kill = HostMessage::Signal {
        exec_id: None,
        pid: Some(pid),
        signal: 9,
        tree: false,
    };
    assert_eq!(agent.call(kill), GuestMessage::Ok);
    assert!(wait_dead(pid, Duration::from_secs(2)));
}

#[test]
fn the_exec_path_adds_little_over_a_bare_spawn() {
    let mut agent = Agent::start();
    let rounds = 40;
    // Warm up both paths.
    agent.exec(ExecRequest::argv(["true"]));
    let bare_start = Instant::now();
    for _ in 0..rounds {
        let status = std::process::Command::new("true").status().unwrap();
        assert!(status.success());
    }
    let bare = bare_start.elapsed() / rounds;
    let agent_start = Instant::now();
    for _ in 0..rounds {
        let run = agent.exec(ExecRequest::argv(["true"]));
        assert_eq!(run.exit.exit_code, Some(0));
    }
    let through_agent = agent_start.elapsed() / rounds;
    eprintln!("exec `true`: bare spawn+wait {bare:?}, through the agent {through_agent:?}");
    // Generous bound so a loaded test machine does not flake; the figure is printed above.
    assert!(
        through_agent < bare + Duration::from_millis(10),
        "agent round trip {through_agent:?} vs bare {bare:?}"
    );
}
