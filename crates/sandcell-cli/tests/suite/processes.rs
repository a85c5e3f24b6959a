//! Background processes, reattaching and PTYs, in real sandboxes through the engine.

use std::time::{Duration, Instant};

use sandcell_engine::{AttachEvent, AttachFrom, ExecEvent, ExecStream, SandboxSpec};
use sandcell_protocol::{Channel, ErrorCode, ExecRequest, ExitCause, PtySize};

use super::common::*;

const LINES: &str = "for i in $(seq 5); do echo $i; sleep 0.1; done";

/// Reads an exec's stdout until `want` shows up; returns everything read.
async fn read_until(stream: &mut ExecStream, want: &str) -> String {
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !text.contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no {want:?} within 10 s; got {text:?}"));
        match event.expect("the exec ended early").expect("exec event") {
            ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => text.push_str(&text_of(&b)),
            ExecEvent::Exit(r) => panic!("exited before {want:?} came: {r:?}; got {text:?}"),
        }
    }
    text
}

fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until the process list says `pid` has exited (with its exit known).
async fn wait_exited(sb: &sandcell_engine::Sandbox, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let procs = sb.processes().await.expect("process list");
        if procs.iter().any(|p| p.pid == pid && p.exit.is_some()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} did not exit: {procs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pty(req: &mut ExecRequest) {
    req.pty = Some(PtySize { rows: 24, cols: 80 });
}

#[tokio::test]
async fn a_background_process_is_followed_from_midway_and_from_zero() {
    let sb = sandbox().await;
    let started = Instant::now();
    let bg = sb.spawn(ExecRequest::shell(LINES)).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(400));
    assert!(bg.pid > 1);
    // Wait until it is midway: two of its five lines are out.
    let mut probe = sb.attach(bg.pid, AttachFrom::start()).await.unwrap();
    let mut early = Vec::new();
    while !text(&early).contains("2\n") {
        match probe.next().await.expect("an event").unwrap() {
            AttachEvent::Stdout(b) => early.extend_from_slice(&b),
            other => panic!("unexpected {other:?}"),
        }
    }
    probe.detach().await.unwrap();
    // Midway, from what is buffered: the early lines are replayed, the rest followed.
    let midway = sb.attach(bg.pid, AttachFrom::buffered()).await.unwrap();
    assert_eq!(midway.stdout_offset(), 0);
    // Midway, new output only: starts after what was written so far.
    let fresh = sb.attach(bg.pid, AttachFrom::now()).await.unwrap();
    let fresh_from = fresh.stdout_offset();
    assert!(fresh_from >= 4, "{fresh_from}");
    let midway = midway.collect().await.unwrap();
    assert_eq!(text(&midway.stdout), "1\n2\n3\n4\n5\n");
    assert!(midway.result.success(), "{:?}", midway.result);
    let fresh = fresh.collect().await.unwrap();
    let whole = "1\n2\n3\n4\n5\n";
    assert_eq!(text(&fresh.stdout), whole[fresh_from as usize..]);
    assert!(fresh.stdout.len() < whole.len());
    // From zero, after it ended: everything, and the same exit.
    let zero = sb.attach(bg.pid, AttachFrom::start()).await.unwrap();
    let zero = zero.collect().await.unwrap();
    assert_eq!(text(&zero.stdout), whole);
    assert_eq!((zero.stdout_lost, zero.result.exit_code), (0, Some(0)));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_background_process_ignores_the_sandbox_exec_timeout() {
    let mut spec = SandboxSpec::default();
    spec.limits.exec_timeout_ms = Some(300);
    let sb = sandbox_with(spec).await;
    // A foreground exec gets the sandbox's timeout...
    let out = sh(&sb, "sleep 2").await;
    assert_eq!(out.result.cause, ExitCause::Timeout);
    // ...a background one does not, unless it asks.
    let bg = sb
        .spawn(ExecRequest::shell("sleep 0.8; echo survived"))
        .await
        .unwrap();
    let out = sb
        .attach(bg.pid, AttachFrom::buffered())
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "survived\n");
    assert!(out.result.success(), "{:?}", out.result);
    let mut req = ExecRequest::argv(["sleep", "100"]);
    req.timeout_ms = Some(200);
    let bg = sb.spawn(req).await.unwrap();
    let attach = sb.attach(bg.pid, AttachFrom::buffered()).await.unwrap();
    let out = attach.collect().await.unwrap();
    assert_eq!(out.result.cause, ExitCause::Timeout, "{:?}", out.result);
    assert!(
        out.result.message.contains("200 ms"),
        "{}",
        out.result.message
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn background_processes_are_listed_and_a_killed_one_says_so() {
    let sb = sandbox().await;
    let bg = sb.spawn(ExecRequest::argv(["sleep", "100"])).await.unwrap();
    let procs = sb.processes().await.unwrap();
    let listed = procs
        .iter()
        .find(|p| p.pid == bg.pid)
        .unwrap_or_else(|| panic!("pid {} not listed: {procs:?}", bg.pid));
    assert!(listed.tracked && listed.background && !listed.exited);
    assert_eq!(listed.exec_id, Some(bg.exec_id));
    assert_eq!(listed.cmdline, "sleep 100");
    let attach = sb.attach(bg.pid, AttachFrom::buffered()).await.unwrap();
    sb.kill_process(bg.pid, 9, true).await.unwrap();
    let out = attach.collect().await.unwrap();
    assert_eq!(out.result.cause, ExitCause::Killed, "{:?}", out.result);
    assert_eq!(out.result.signal_name.as_deref(), Some("SIGKILL"));
    assert!(
        out.result.message.contains("on request"),
        "{}",
        out.result.message
    );
    // Still listed after its exit, with how it ended, until released.
    let procs = sb.processes().await.unwrap();
    let listed = procs.iter().find(|p| p.pid == bg.pid).expect("kept");
    assert!(listed.exited);
    assert_eq!(listed.exit.as_ref().and_then(|e| e.signal), Some(9));
    sb.release_process(bg.pid).await.unwrap();
    let procs = sb.processes().await.unwrap();
    assert!(procs.iter().all(|p| p.pid != bg.pid), "{procs:?}");
    let err = sb
        .attach(bg.pid, AttachFrom::buffered())
        .await
        .err()
        .expect("a released pid cannot be attached");
    assert_eq!(err.code(), ErrorCode::NoSuchProcess, "{err}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn stdin_by_pid_and_lost_output() {
    let sb = sandbox().await;
    let mut req = ExecRequest::argv(["cat"]);
    req.stdin = true;
    let bg = sb.spawn(req).await.unwrap();
    sb.write_process_stdin(bg.pid, b"hello\n").await.unwrap();
    sb.close_process_stdin(bg.pid).await.unwrap();
    let out = sb
        .attach(bg.pid, AttachFrom::start())
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "hello\n");
    assert!(out.result.success());
    // A 4 KiB ring keeps the last 4 KiB of 100 KB: the rest is reported lost.
    let mut req = ExecRequest::shell("head -c 100000 /dev/zero; printf end");
    req.buffer_bytes = Some(4096);
    let bg = sb.spawn(req).await.unwrap();
    wait_exited(&sb, bg.pid).await;
    let mut attach = sb.attach(bg.pid, AttachFrom::start()).await.unwrap();
    let mut lost = 0;
    let mut got = Vec::new();
    let result = loop {
        match attach.next().await.expect("an event").unwrap() {
            AttachEvent::Lost { channel, bytes, .. } => {
                assert_eq!(channel, Channel::Stdout);
                lost += bytes;
            }
            AttachEvent::Stdout(b) => got.extend_from_slice(&b),
            AttachEvent::Stderr(b) => panic!("stderr {b:?}"),
            AttachEvent::Exit(r) => break r,
        }
    };
    assert_eq!((lost, got.len()), (100_003 - 4096, 4096));
    assert!(got.ends_with(b"end"));
    assert_eq!(attach.stdout_offset(), 100_003);
    assert!(result.stdout_truncated && result.success(), "{result:?}");
    let err = sb
        .write_process_stdin(bg.pid, b"x")
        .await
        .expect_err("it has no stdin");
    assert_eq!(err.code(), ErrorCode::InvalidState, "{err}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_pty_exec_has_a_terminal_that_echoes_and_resizes() {
    let sb = sandbox().await;
    let mut req = ExecRequest::argv(["tty"]);
    pty(&mut req);
    let out = sb.exec(req).await.unwrap();
    let name = text(&out.stdout);
    let n = name.trim().strip_prefix("/dev/pts/").expect("a pts path");
    assert!(n.parse::<u32>().is_ok(), "{name:?}");
    assert!(out.result.success());

    let mut req = ExecRequest::shell("read x; stty size");
    pty(&mut req);
    let mut stream = sb.exec_stream(req).await.unwrap();
    stream.resize(50, 132).await.unwrap();
    stream.write_stdin(b"\n").await.unwrap();
    let seen = read_until(&mut stream, "50 132").await;
    assert!(seen.contains("50 132"), "{seen:?}");

    let mut req = ExecRequest::argv(["cat"]);
    pty(&mut req);
    let mut stream = sb.exec_stream(req).await.unwrap();
    stream.write_stdin(b"hi\n").await.unwrap();
    // The terminal's echo, then cat's copy.
    let seen = read_until(&mut stream, "hi\r\nhi\r\n").await;
    assert_eq!(seen, "hi\r\nhi\r\n");
    if on_gvisor() {
        eprintln!(
            "on gvisor: ^D on a terminal ends no read there (listed in /v1/system); the rest held"
        );
        sb.destroy().await.unwrap();
        return;
    }
    stream.close_stdin().await.unwrap();
    let out = stream.collect().await.unwrap();
    assert!(out.result.success(), "cat must end at ^D: {:?}", out.result);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn ctrl_c_on_a_pty_interrupts_its_process() {
    sandcell_testkit::require!(
        !on_gvisor(),
        "^C on a terminal sends no SIGINT there (listed in /v1/system)"
    );
    let sb = sandbox().await;
    let mut req = ExecRequest::argv(["sleep", "100"]);
    pty(&mut req);
    let mut stream = sb.exec_stream(req).await.unwrap();
    stream.write_stdin(&[0x03]).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), stream.collect())
        .await
        .expect("^C must end sleep")
        .unwrap();
    assert_eq!(out.result.cause, ExitCause::Signaled, "{:?}", out.result);
    assert_eq!(out.result.signal_name.as_deref(), Some("SIGINT"));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_background_pty_is_driven_by_pid() {
    let sb = sandbox().await;
    let mut req = ExecRequest::shell("read x; stty size; echo $TERM");
    req.pty = Some(PtySize { rows: 10, cols: 20 });
    let bg = sb.spawn(req).await.unwrap();
    sb.resize_pty(bg.pid, 33, 99).await.unwrap();
    sb.write_process_stdin(bg.pid, b"go\n").await.unwrap();
    let out = sb
        .attach(bg.pid, AttachFrom::start())
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "go\r\n33 99\r\nxterm-256color\r\n");
    assert!(out.result.success());
    // A piped process has no terminal.
    let plain = sb.spawn(ExecRequest::argv(["sleep", "100"])).await.unwrap();
    let err = sb.resize_pty(plain.pid, 1, 1).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidState, "{err}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn streams_refuse_background_requests_and_detach_leaves_the_process_running() {
    let sb = sandbox().await;
    let mut req = ExecRequest::shell("true");
    req.background = true;
    let err = sb.exec_stream(req).await.err().expect("refused");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("spawn"), "{err}");

    let bg = sb
        .spawn(ExecRequest::shell(
            "while true; do echo tick; sleep 0.05; done",
        ))
        .await
        .unwrap();
    let mut attach = sb.attach(bg.pid, AttachFrom::buffered()).await.unwrap();
    match attach.next().await.expect("an event").unwrap() {
        AttachEvent::Stdout(b) => assert!(text(&b).starts_with("tick")),
        other => panic!("unexpected {other:?}"),
    }
    attach.detach().await.unwrap();
    // Dropping an attachment detaches too; the process runs on either way.
    drop(sb.attach(bg.pid, AttachFrom::now()).await.unwrap());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let procs = sb.processes().await.unwrap();
    let listed = procs.iter().find(|p| p.pid == bg.pid).expect("listed");
    assert!(!listed.exited);
    let before = listed.stdout_bytes.expect("tracked");
    let again = sb.attach(bg.pid, AttachFrom::now()).await.unwrap();
    assert!(again.stdout_offset() >= before);
    sb.kill_process(bg.pid, 9, true).await.unwrap();
    let out = again.collect().await.unwrap();
    assert_eq!(out.result.cause, ExitCause::Killed);
    let err = sb.attach(999_999, AttachFrom::buffered()).await.err();
    assert_eq!(err.expect("unknown pid").code(), ErrorCode::NoSuchProcess);
    sb.destroy().await.unwrap();
}
