//! Tracked processes: background execs, attaching (replay, follow, offsets, lost bytes),
//! stdin by pid, the exited-entry cap, the process list, and pty execs.

use std::time::{Duration, Instant};

use sandcell_protocol::exec::EXITED_PROCESSES_KEPT;
use sandcell_protocol::{
    Channel, ErrorCode, ExecRequest, Frame, GuestMessage, HostMessage, ProcessInfo, PtySize,
};

use super::client::{Agent, alive, expect_code, wait_dead};

fn list(agent: &mut Agent) -> Vec<ProcessInfo> {
    match agent.call(HostMessage::ListProcesses) {
        GuestMessage::Processes { processes } => processes,
        other => panic!("unexpected {other:?}"),
    }
}

fn tree_kill(pid: i32) -> HostMessage {
    HostMessage::Signal {
        exec_id: None,
        pid: Some(pid),
        signal: 9,
        tree: true,
    }
}

/// Writes `bytes` to `pid`'s stdin by pid and returns the reply.
fn write_stdin(agent: &mut Agent, pid: i32, bytes: &[u8]) -> GuestMessage {
    let id = agent.new_id();
    agent.send(id, &HostMessage::ProcessStdin { pid });
    agent.send_data(id, Channel::Stdin, 0, bytes);
    agent.send(id, &HostMessage::EndOfData);
    agent.reply(id)
}

/// Reads request `id`'s stdout chunks until `want` shows up in them; returns all of it.
fn read_until(agent: &mut Agent, id: u32, want: &str) -> String {
    let mut text = String::new();
    while !text.contains(want) {
        match agent.next_for(id) {
            Frame::Data { chunk, .. } => text.push_str(&String::from_utf8_lossy(&chunk.bytes)),
            Frame::Message { msg, .. } => panic!("ended before {want:?} came: {msg:?}; {text:?}"),
        }
    }
    text
}

#[test]
fn a_background_exec_answers_at_once_and_runs_on() {
    let mut agent = Agent::start();
    let started = Instant::now();
    let (id, pid) = agent.spawn_bg(ExecRequest::shell("sleep 0.4; echo done"));
    assert!(started.elapsed() < Duration::from_millis(300));
    // Nothing more comes on the exec's request, even after the process has ended.
    assert_eq!(agent.pending_for(id, Duration::from_millis(100)), 0);
    assert!(alive(pid), "the background process must keep running");
    let run = agent.attach_and_follow(pid);
    assert_eq!(run.stdout_text(), "done\n");
    assert_eq!(run.exit.exit_code, Some(0));
    assert!(run.exit.duration_us >= 400_000, "{:?}", run.exit);
    assert_eq!(agent.pending_for(id, Duration::from_millis(50)), 0);
    // The request is over: its id is free for a new request.
    agent.send(id, &HostMessage::Ping);
    assert_eq!(agent.reply(id), GuestMessage::Pong);
}

#[test]
fn an_attachment_replays_then_follows_then_reports_the_exit() {
    let mut agent = Agent::start();
    let (_, pid) = agent.spawn_bg(ExecRequest::shell(
        "echo one; sleep 0.3; echo two; echo three >&2; exit 4",
    ));
    std::thread::sleep(Duration::from_millis(150));
    let (id, out_at, err_at) = agent.attach(pid, [None, None]);
    assert_eq!((out_at, err_at), (0, 0));
    // "one" was buffered before the attachment; "two" only comes later.
    let first = read_until(&mut agent, id, "one\n");
    assert_eq!(first, "one\n");
    let attached_at = Instant::now();
    let run = agent.follow(id);
    assert_eq!(run.stdout_text(), "two\n");
    assert_eq!(run.stderr, b"three\n");
    assert!(attached_at.elapsed() >= Duration::from_millis(50));
    assert_eq!(run.exit.exit_code, Some(4));
    assert_eq!((run.exit.stdout_bytes, run.exit.stderr_bytes), (8, 6));
    assert!(run.lost.is_empty() && !run.exit.stdout_truncated);
}

#[test]
fn attaching_after_the_exit_gives_the_output_and_the_exit_each_time() {
    let mut agent = Agent::start();
    let (_, pid) = agent.spawn_bg(ExecRequest::shell("printf abc; printf err >&2; exit 3"));
    assert!(wait_dead(pid, Duration::from_secs(5)));
    for _ in 0..2 {
        let run = agent.attach_and_follow(pid);
        assert_eq!(run.stdout, b"abc");
        assert_eq!(run.stderr, b"err");
        assert_eq!(run.exit.exit_code, Some(3));
        assert_eq!(run.seqs, (0..run.seqs.len() as u64).collect::<Vec<_>>());
    }
}

#[test]
fn offsets_skip_what_came_before_them() {
    let mut agent = Agent::start();
    let (_, pid) = agent.spawn_bg(ExecRequest::shell("printf 0123456789; printf ABCDE >&2"));
    assert_eq!(agent.attach_and_follow(pid).exit.exit_code, Some(0));
    let (id, out_at, err_at) = agent.attach(pid, [Some(4), Some(2)]);
    assert_eq!((out_at, err_at), (4, 2));
    let run = agent.follow(id);
    assert_eq!(run.stdout, b"456789");
    assert_eq!(run.stderr, b"CDE");
    // An offset past the end means "new output only": here, none.
    let (id, out_at, err_at) = agent.attach(pid, [Some(u64::MAX), Some(1000)]);
    assert_eq!((out_at, err_at), (10, 5));
    let run = agent.follow(id);
    assert!(run.stdout.is_empty() && run.stderr.is_empty());
    assert_eq!(run.exit.stdout_bytes, 10);
}

#[test]
fn bytes_that_left_the_ring_buffer_are_reported_lost() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::shell("head -c 5000 /dev/zero | tr '\\0' a; printf end");
    req.buffer_bytes = Some(1000);
    let (_, pid) = agent.spawn_bg(req);
    assert!(wait_dead(pid, Duration::from_secs(5)));
    // From the start: 4003 of the 5003 bytes are gone, and said so first.
    let (id, out_at, _) = agent.attach(pid, [Some(0), None]);
    assert_eq!(out_at, 0);
    let run = agent.follow(id);
    assert_eq!(run.lost, vec![(Channel::Stdout, 0, 4003)]);
    assert_eq!(run.stdout.len(), 1000);
    assert!(run.stdout_text().ends_with("aaend"));
    assert!(run.exit.stdout_truncated, "this attachment lost bytes");
    assert_eq!(run.exit.stdout_bytes, 5003);
    // From the oldest buffered byte: nothing is lost for this attachment.
    let (id, out_at, _) = agent.attach(pid, [None, None]);
    assert_eq!(out_at, 4003);
    let run = agent.follow(id);
    assert!(run.lost.is_empty());
    assert_eq!(run.stdout.len(), 1000);
    assert!(!run.exit.stdout_truncated);
    // The kept exit says the buffer overflowed.
    let entry = list(&mut agent)
        .into_iter()
        .find(|p| p.pid == pid)
        .expect("the exited process is listed");
    assert!(entry.exit.expect("its exit").stdout_truncated);
}

#[test]
fn a_slow_attachment_loses_what_the_ring_overwrote_and_the_process_is_not_slowed() {
    let mut agent = Agent::start();
    // 20 MB through a 16 KiB ring while the host reads nothing: the attachment can only get
    // a few MB into the agent's queue and the socket before it waits, and meanwhile the
    // ring moves on. The process itself never waits for it.
    let total: u64 = 20_000_003;
    let mut req = ExecRequest::shell("head -c 20000000 /dev/zero; printf end");
    req.buffer_bytes = Some(16 * 1024);
    let (_, pid) = agent.spawn_bg(req);
    let (id, _, _) = agent.attach(pid, [Some(0), None]);
    assert!(
        wait_dead(pid, Duration::from_secs(10)),
        "a stalled attachment must not stall the process"
    );
    let run = agent.follow(id);
    let lost: u64 = run.lost.iter().map(|l| l.2).sum();
    assert!(lost > total / 2, "lost only {lost}: {:?}", run.lost);
    assert_eq!(run.stdout.len() as u64 + lost, total, "{:?}", run.lost);
    assert!(run.stdout.ends_with(b"end"));
    assert!(run.exit.stdout_truncated);
    assert_eq!(run.exit.stdout_bytes, total);
    // Losses are reported in stream order, each after the previous one.
    let mut at = 0;
    for (channel, offset, bytes) in &run.lost {
        assert_eq!(*channel, Channel::Stdout);
        assert!(*offset >= at, "{:?}", run.lost);
        at = offset + bytes;
    }
}

#[test]
fn two_attachments_see_the_same_bytes() {
    let mut agent = Agent::start();
    let (_, pid) = agent.spawn_bg(ExecRequest::shell(
        "for i in 1 2 3 4 5; do echo $i; sleep 0.05; done",
    ));
    let (a, _, _) = agent.attach(pid, [None, None]);
    std::thread::sleep(Duration::from_millis(120));
    let (b, _, _) = agent.attach(pid, [Some(0), Some(0)]);
    let run_b = agent.follow(b);
    let run_a = agent.follow(a);
    assert_eq!(run_a.stdout_text(), "1\n2\n3\n4\n5\n");
    assert_eq!(run_a.stdout, run_b.stdout);
    assert_eq!(run_a.exit, run_b.exit);
    assert_eq!(run_a.exit.exit_code, Some(0));
}

#[test]
fn a_foreground_exec_can_be_attached_too_and_is_gone_after_its_exit() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::shell("echo early; sleep 0.2; echo late"));
    let (att, _, _) = agent.attach(pid, [None, None]);
    let run = agent.follow(att);
    assert_eq!(run.stdout_text(), "early\nlate\n");
    let own = agent.finish_exec(id, pid);
    assert_eq!(own.stdout_text(), "early\nlate\n");
    assert_eq!(own.exit, run.exit);
    // Its exit went to its request: the entry is collected.
    let attach = HostMessage::Attach {
        pid,
        stdout_from: None,
        stderr_from: None,
    };
    expect_code(agent.call(attach), ErrorCode::NoSuchProcess);
}

#[test]
fn stdin_by_pid_reaches_a_background_process() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::argv(["cat"]);
    req.stdin = true;
    let (_, pid) = agent.spawn_bg(req);
    let (att, _, _) = agent.attach(pid, [None, None]);
    assert_eq!(write_stdin(&mut agent, pid, b"hello "), GuestMessage::Ok);
    assert_eq!(write_stdin(&mut agent, pid, b"world\n"), GuestMessage::Ok);
    assert_eq!(read_until(&mut agent, att, "world\n"), "hello world\n");
    assert!(alive(pid), "cat must wait for more input");
    let close = HostMessage::ProcessStdinClose { pid };
    assert_eq!(agent.call(close), GuestMessage::Ok);
    let run = agent.follow(att);
    assert_eq!(
        run.exit.exit_code,
        Some(0),
        "cat ends at the end of its input"
    );
    // Closed stdin, exited process: both refuse more input clearly.
    let msg = expect_code(
        write_stdin(&mut agent, pid, b"late"),
        ErrorCode::InvalidState,
    );
    assert!(msg.contains(&pid.to_string()), "{msg}");
}

#[test]
fn stdin_to_a_process_that_ended_while_it_was_written_is_answered() {
    // The process reads the first chunk and ends before the request's end arrives: the
    // request must still be answered (the process is gone), never left waiting.
    let mut agent = Agent::start();
    let mut req = ExecRequest::shell("read x; echo got:$x");
    req.stdin = true;
    let (_, pid) = agent.spawn_bg(req);
    let id = agent.new_id();
    agent.send(id, &HostMessage::ProcessStdin { pid });
    agent.send_data(id, Channel::Stdin, 0, b"v\n");
    assert!(wait_dead(pid, Duration::from_secs(5)));
    // The agent has seen it end too (its exit is in the list).
    let deadline = Instant::now() + Duration::from_secs(5);
    while list(&mut agent).iter().any(|p| p.pid == pid && !p.exited) {
        assert!(Instant::now() < deadline, "the agent never saw {pid} end");
        std::thread::sleep(Duration::from_millis(10));
    }
    agent.send(id, &HostMessage::EndOfData);
    let msg = expect_code(agent.reply(id), ErrorCode::InvalidState);
    assert!(msg.contains(&pid.to_string()), "{msg}");
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}

#[test]
fn stdin_by_pid_ended_with_stdin_close_closes_it() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::shell("wc -c");
    req.stdin = true;
    let (_, pid) = agent.spawn_bg(req);
    let id = agent.new_id();
    agent.send(id, &HostMessage::ProcessStdin { pid });
    agent.send_data(id, Channel::Stdin, 0, b"12345");
    agent.send(id, &HostMessage::StdinClose);
    assert_eq!(agent.reply(id), GuestMessage::Ok);
    let run = agent.attach_and_follow(pid);
    assert_eq!(run.stdout_text().trim(), "5");
}

#[test]
fn stdin_by_pid_is_refused_without_a_stdin() {
    let mut agent = Agent::start();
    let (_, pid) = agent.spawn_bg(ExecRequest::argv(["sleep", "100"]));
    let msg = expect_code(write_stdin(&mut agent, pid, b"x"), ErrorCode::InvalidState);
    assert!(msg.contains("stdin"), "{msg}");
    expect_code(
        agent.call(HostMessage::ProcessStdinClose { pid }),
        ErrorCode::InvalidState,
    );
    // The refused request's end is swallowed: the next request is answered normally.
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
    assert_eq!(agent.stray(), 0);
    assert_eq!(agent.call(tree_kill(pid)), GuestMessage::Ok);
}

#[test]
fn unknown_pids_are_no_such_process() {
    let mut agent = Agent::start();
    let bogus = 999_999;
    let attach = HostMessage::Attach {
        pid: bogus,
        stdout_from: None,
        stderr_from: None,
    };
    let msg = expect_code(agent.call(attach), ErrorCode::NoSuchProcess);
    assert!(msg.contains("999999"), "{msg}");
    expect_code(
        write_stdin(&mut agent, bogus, b"x"),
        ErrorCode::NoSuchProcess,
    );
    let resize = HostMessage::Resize {
        pid: bogus,
        rows: 1,
        cols: 1,
    };
    expect_code(agent.call(resize), ErrorCode::NoSuchProcess);
    expect_code(
        agent.call(HostMessage::ReleaseProcess { pid: bogus }),
        ErrorCode::NoSuchProcess,
    );
    assert_eq!(agent.stray(), 0);
}

#[test]
fn detach_ends_an_attachment_and_the_process_runs_on() {
    let mut agent = Agent::start();
    let (_, pid) = agent.spawn_bg(ExecRequest::shell(
        "while true; do echo tick; sleep 0.02; done",
    ));
    let (id, _, _) = agent.attach(pid, [None, None]);
    read_until(&mut agent, id, "tick\n");
    agent.send(id, &HostMessage::Detach);
    loop {
        match agent.next_for(id) {
            Frame::Message {
                msg: GuestMessage::Detached,
                ..
            } => break,
            Frame::Data { .. } => continue,
            Frame::Message { msg, .. } => panic!("unexpected {msg:?}"),
        }
    }
    assert_eq!(agent.pending_for(id, Duration::from_millis(150)), 0);
    assert!(alive(pid));
    // A later attachment still gets the newest output.
    let (id2, _, _) = agent.attach(pid, [Some(u64::MAX), None]);
    read_until(&mut agent, id2, "tick\n");
    assert_eq!(agent.call(tree_kill(pid)), GuestMessage::Ok);
    let run = agent.follow(id2);
    assert_eq!(run.exit.signal, Some(9));
    assert!(run.exit.killed);
}

#[test]
fn exited_entries_are_kept_up_to_the_cap_oldest_dropped_and_can_be_released() {
    let mut agent = Agent::start();
    let mut pids = Vec::new();
    for i in 0..EXITED_PROCESSES_KEPT + 2 {
        let (_, pid) = agent.spawn_bg(ExecRequest::shell(format!("echo {i}")));
        // One at a time, so exits come in spawn order.
        assert_eq!(agent.attach_and_follow(pid).stdout_text(), format!("{i}\n"));
        pids.push(pid);
    }
    let attach = |pid| HostMessage::Attach {
        pid,
        stdout_from: None,
        stderr_from: None,
    };
    for &gone in &pids[..2] {
        expect_code(agent.call(attach(gone)), ErrorCode::NoSuchProcess);
    }
    assert_eq!(agent.attach_and_follow(pids[2]).stdout_text(), "2\n");
    let kept = list(&mut agent).iter().filter(|p| p.exited).count();
    assert_eq!(kept, EXITED_PROCESSES_KEPT);
    // Released explicitly: gone at once.
    let last = *pids.last().expect("pids");
    assert_eq!(
        agent.call(HostMessage::ReleaseProcess { pid: last }),
        GuestMessage::Ok
    );
    expect_code(agent.call(attach(last)), ErrorCode::NoSuchProcess);
    // A running process cannot be released.
    let (_, running) = agent.spawn_bg(ExecRequest::argv(["sleep", "100"]));
    expect_code(
        agent.call(HostMessage::ReleaseProcess { pid: running }),
        ErrorCode::InvalidState,
    );
    assert_eq!(agent.call(tree_kill(running)), GuestMessage::Ok);
}

#[test]
fn the_process_list_describes_tracked_processes() {
    let mut agent = Agent::start();
    let (id, pid) = agent.spawn_bg(ExecRequest::shell("echo hi; exec sleep 100"));
    let (fg_id, fg_pid) = agent.start_exec(ExecRequest::argv(["sleep", "100"]));
    // Wait for "hi" so the byte count is settled.
    let (att, _, _) = agent.attach(pid, [None, None]);
    read_until(&mut agent, att, "hi\n");
    let procs = list(&mut agent);
    let bg = procs.iter().find(|p| p.pid == pid).expect("listed");
    assert!(bg.tracked && bg.background && !bg.exited && !bg.pty);
    assert_eq!(bg.exec_id, Some(id));
    assert_eq!(bg.stdout_bytes, Some(3));
    assert_eq!(bg.stderr_bytes, Some(0));
    assert!(bg.exit.is_none());
    assert!(bg.started_at_ms.expect("start time") > 1_600_000_000_000);
    assert_eq!(bg.cmdline, "sleep 100");
    let fg = procs.iter().find(|p| p.pid == fg_pid).expect("listed");
    assert!(fg.tracked && !fg.background);
    assert_eq!(fg.exec_id, Some(fg_id));
    // Killed: listed as exited, with how.
    assert_eq!(agent.call(tree_kill(pid)), GuestMessage::Ok);
    let run = agent.follow(att);
    assert!(run.exit.killed);
    let procs = list(&mut agent);
    let bg = procs.iter().find(|p| p.pid == pid).expect("still listed");
    assert!(bg.exited);
    assert_eq!(bg.state, "X");
    let exit = bg.exit.as_ref().expect("exit");
    assert_eq!((exit.signal, exit.killed), (Some(9), true));
    assert_eq!(agent.call(tree_kill(fg_pid)), GuestMessage::Ok);
    agent.finish_exec(fg_id, fg_pid);
}

#[test]
fn a_background_tree_kill_takes_its_children_and_its_timeout_applies_when_set() {
    let mut agent = Agent::start();
    let (_, pid) = agent.spawn_bg(ExecRequest::shell(
        "sleep 100 & echo $!; (setsid sleep 100 & echo $!); wait",
    ));
    let (att, _, _) = agent.attach(pid, [None, None]);
    let mut text = String::new();
    while text.lines().count() < 2 || !text.ends_with('\n') {
        match agent.next_for(att) {
            Frame::Data { chunk, .. } => text.push_str(&String::from_utf8_lossy(&chunk.bytes)),
            Frame::Message { msg, .. } => panic!("ended early: {msg:?}"),
        }
    }
    let children: Vec<i32> = text.lines().filter_map(|l| l.parse().ok()).collect();
    assert_eq!(children.len(), 2, "{text}");
    assert_eq!(agent.call(tree_kill(pid)), GuestMessage::Ok);
    let run = agent.follow(att);
    assert!(run.exit.killed);
    for child in children {
        assert!(wait_dead(child, Duration::from_secs(2)), "{child} survived");
    }
    let mut req = ExecRequest::argv(["sleep", "100"]);
    req.timeout_ms = Some(200);
    let (_, pid) = agent.spawn_bg(req);
    let run = agent.attach_and_follow(pid);
    assert!(run.exit.timed_out);
    assert_eq!(run.exit.signal, Some(9));
}

#[test]
fn a_pty_exec_runs_on_a_terminal_it_controls() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::shell("tty; stty size; echo $TERM; ps -o sid= -o pgid= -p $$");
    req.pty = Some(PtySize { rows: 30, cols: 90 });
    req.env.insert("TERM".into(), "dumb".into());
    let run = agent.exec(req);
    let text = run.stdout_text();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert!(lines[0].starts_with("/dev/pts/"), "{text:?}");
    assert_eq!(lines[1], "30 90");
    assert_eq!(lines[2], "dumb", "a request's TERM wins");
    let ids: Vec<i32> = lines[3]
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(ids, [run.pid, run.pid], "a session and group of its own");
    // One merged stream, with the terminal's line endings.
    assert!(run.stderr.is_empty());
    assert!(text.contains("\r\n"));
    assert_eq!(run.exit.exit_code, Some(0));
}

#[test]
fn a_pty_takes_input_resizes_and_interrupts() {
    let mut agent = Agent::start();
    let mut req =
        ExecRequest::shell("read line; echo got:$line; read x; stty size; exec sleep 100");
    req.pty = Some(PtySize { rows: 24, cols: 80 });
    let (id, pid) = agent.start_exec(req);
    agent.send_data(id, Channel::Stdin, 0, b"hello\n");
    read_until(&mut agent, id, "got:hello");
    let resize = HostMessage::Resize {
        pid,
        rows: 50,
        cols: 132,
    };
    assert_eq!(agent.call(resize), GuestMessage::Ok);
    // By pid as well as on the exec's request.
    assert_eq!(write_stdin(&mut agent, pid, b"\n"), GuestMessage::Ok);
    read_until(&mut agent, id, "50 132");
    // ^C: the terminal sends SIGINT to its foreground group.
    // Once the shell has become `sleep`: a shell waiting for a child that exits normally
    // would shrug a SIGINT off and go on.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap() != "sleep\n" {
        assert!(Instant::now() < deadline, "the shell never became sleep");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(write_stdin(&mut agent, pid, &[3]), GuestMessage::Ok);
    let run = agent.finish_exec(id, pid);
    assert_eq!(run.exit.signal, Some(2), "{:?}", run.exit);
    // A piped exec has no terminal to resize.
    let (_, plain) = agent.spawn_bg(ExecRequest::argv(["sleep", "100"]));
    let resize = HostMessage::Resize {
        pid: plain,
        rows: 1,
        cols: 1,
    };
    expect_code(agent.call(resize), ErrorCode::InvalidState);
    assert_eq!(agent.call(tree_kill(plain)), GuestMessage::Ok);
}

#[test]
fn closing_a_pty_stdin_sends_end_of_file() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::argv(["cat"]);
    req.pty = Some(PtySize { rows: 24, cols: 80 });
    let (id, pid) = agent.spawn_bg(req);
    let _ = id;
    assert_eq!(write_stdin(&mut agent, pid, b"abc\n"), GuestMessage::Ok);
    assert_eq!(
        agent.call(HostMessage::ProcessStdinClose { pid }),
        GuestMessage::Ok
    );
    let run = agent.attach_and_follow(pid);
    // The terminal's echo and cat's copy.
    assert_eq!(run.stdout_text(), "abc\r\nabc\r\n");
    assert_eq!(run.exit.exit_code, Some(0));
}

#[test]
fn a_pty_exec_timeout_kills_its_session() {
    let mut agent = Agent::start();
    let mut req = ExecRequest::shell("sleep 100 & echo $!; wait");
    req.pty = Some(PtySize { rows: 24, cols: 80 });
    req.timeout_ms = Some(300);
    let run = agent.exec(req);
    assert!(run.exit.timed_out);
    let child: i32 = run.stdout_text().trim().parse().expect("the child's pid");
    assert!(wait_dead(child, Duration::from_secs(2)), "{child} survived");
}

#[test]
fn a_pty_exec_gets_term_xterm_256color_unless_it_sets_its_own() {
    let mut agent = Agent::raw_with(|c| {
        c.base_env.retain(|(k, _)| k != "TERM");
        c.base_env.push(("TERM".into(), "vt100".into()));
    });
    agent.hello();
    let mut req = ExecRequest::shell("echo $TERM");
    req.pty = Some(PtySize { rows: 24, cols: 80 });
    assert_eq!(agent.exec(req).stdout_text(), "xterm-256color\r\n");
    let piped = agent.exec(ExecRequest::shell("echo $TERM"));
    assert_eq!(piped.stdout_text(), "vt100\n");
}
