//! Exec semantics through the engine.

use sandcell_engine::{ExecEvent, SandboxSpec};
use sandcell_protocol::{ErrorCode, ExecRequest, ExitCause};

use super::common::*;

#[tokio::test]
async fn exit_codes_and_signals_are_exact() {
    let sb = sandbox().await;
    let out = sh(&sb, "exit 7").await;
    assert_eq!(
        (out.result.cause, out.result.exit_code),
        (ExitCause::Exited, Some(7))
    );
    let out = sh(&sb, "kill -SEGV $$").await;
    assert_eq!(out.result.cause, ExitCause::Signaled);
    assert_eq!(out.result.signal_name.as_deref(), Some("SIGSEGV"));
    assert_eq!(out.result.shell_status(), 139);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn languages_run() {
    let sb = sandbox().await;
    let py = py(&sb, "print(6*7)").await;
    assert_eq!(text(&py.stdout), "42\n", "{}", text(&py.stderr));
    let node = sb
        .exec(ExecRequest::argv(["node", "-e", "console.log(6*7)"]))
        .await
        .unwrap();
    assert_eq!(text(&node.stdout), "42\n", "{}", text(&node.stderr));
    let bash = sb
        .exec(ExecRequest::argv([
            "bash",
            "-c",
            "echo $((6*7)) $HOME $PWD",
        ]))
        .await
        .unwrap();
    assert_eq!(text(&bash.stdout), "42 /home/sandbox /workspace\n");
    sb.destroy().await.unwrap();
}

/// Every backend gives the sandbox user a writable, sticky /dev/shm: POSIX shared memory and
/// the semaphores Python's multiprocessing needs.
#[tokio::test]
async fn dev_shm_is_writable_for_shared_memory_and_semaphores() {
    let sb = sandbox().await;
    let out = py(
        &sb,
        "import multiprocessing as m, os, stat\n\
         from multiprocessing import shared_memory\n\
         s = shared_memory.SharedMemory(create=True, size=4096); s.buf[0] = 7\n\
         lock = m.Lock(); lock.acquire(); lock.release()\n\
         print(oct(stat.S_IMODE(os.stat('/dev/shm').st_mode)), s.buf[0])\n\
         s.close(); s.unlink()",
    )
    .await;
    assert_eq!(text(&out.stdout), "0o1777 7\n", "{}", text(&out.stderr));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn output_streams_in_order() {
    let sb = sandbox().await;
    let mut stream = sb
        .exec_stream(ExecRequest::shell(
            "for i in 1 2 3; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done",
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev.unwrap() {
            ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => seen.push(text(&b).trim().to_string()),
            ExecEvent::Exit(r) => assert!(r.success()),
        }
    }
    assert_eq!(seen, ["out1", "err1", "out2", "err2", "out3", "err3"]);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn env_cwd_and_stdin() {
    let mut spec = SandboxSpec::default();
    spec.env.insert("FROM_SPEC".into(), "spec".into());
    spec.env.insert("OVERRIDDEN".into(), "spec".into());
    let sb = sandbox_with(spec).await;
    sb.make_dir("/workspace/sub").await.unwrap();
    let mut req = ExecRequest::shell("echo $FROM_SPEC $OVERRIDDEN $PWD; cat");
    req.env.insert("OVERRIDDEN".into(), "exec".into());
    req.cwd = Some("/workspace/sub".into());
    let out = sb.exec_with_stdin(req, b"piped in\n").await.unwrap();
    assert_eq!(text(&out.stdout), "spec exec /workspace/sub\npiped in\n");
    // The host's environment does not leak in.
    let out = sh(&sb, "env").await;
    assert!(
        !text(&out.stdout).contains("CARGO"),
        "{}",
        text(&out.stdout)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn kill_and_process_list() {
    let sb = sandbox().await;
    let mut stream = sb
        .exec_stream(ExecRequest::shell("sleep 100 & sleep 200"))
        .await
        .unwrap();
    // The shell starts `sleep 200` a moment after the exec itself starts.
    let mut procs = Vec::new();
    for _ in 0..100 {
        procs = sb.processes().await.unwrap();
        if procs.iter().any(|p| p.cmdline == "sleep 200") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        procs
            .iter()
            .any(|p| p.cmdline == "sleep 200" && p.exec_id == Some(stream.exec_id())),
        "{procs:?}"
    );
    sb.signal_exec(stream.exec_id(), 9, true).await.unwrap();
    let mut result = None;
    while let Some(ev) = stream.next().await {
        if let ExecEvent::Exit(r) = ev.unwrap() {
            result = Some(r);
        }
    }
    let result = result.unwrap();
    assert_eq!(result.cause, ExitCause::Killed, "{result:?}");
    let procs = sb.processes().await.unwrap();
    assert!(
        procs.iter().all(|p| !p.cmdline.starts_with("sleep")),
        "{procs:?}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_lose_nothing() {
    let sb = sandbox().await;
    let err = sb
        .exec(ExecRequest::argv(Vec::<String>::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = sb
        .exec(ExecRequest::argv(["/no/such/program"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpawnFailed, "{err}");
    assert!(err.to_string().contains("/no/such/program"));
    let mut req = ExecRequest::shell("true");
    req.cwd = Some("/workspace/missing".into());
    assert!(sb.exec(req).await.is_err());
    // The sandbox still serves.
    assert_eq!(
        text(&sh(&sb, "echo still here").await.stdout),
        "still here\n"
    );
    sb.destroy().await.unwrap();
    let err = sb.exec(ExecRequest::shell("true")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidState);
}

#[tokio::test]
async fn invalid_specs_are_refused() {
    let mut spec = spec();
    spec.limits.memory_bytes = Some(10);
    let err = engine().create(spec).await.err().unwrap();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("memory"));
}

#[tokio::test]
async fn destroy_leaves_nothing_behind() {
    let sb = sandbox().await;
    let pid = sb.host_pid().unwrap();
    sh(&sb, "sleep 1000 &").await;
    sb.destroy().await.unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid),
        "agent {pid} alive"
    );
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z"))
        .unwrap_or(true)
}

#[tokio::test]
async fn a_sandbox_that_dies_mid_exec_gives_a_clear_error() {
    // Destroyed by its owner while a command runs.
    let sb = sandbox().await;
    let mut stream = sb
        .exec_stream(ExecRequest::argv(["sleep", "100"]))
        .await
        .unwrap();
    sb.destroy().await.unwrap();
    let err = loop {
        match stream.next().await {
            Some(Err(e)) => break e,
            Some(Ok(_)) => continue,
            None => panic!("stream ended without an error"),
        }
    };
    assert_eq!(err.code(), ErrorCode::InvalidState, "{err}");
    assert!(err.to_string().contains("destroyed"), "{err}");

    // Killed from outside (as an OOM killer or an operator would).
    let sb = sandbox().await;
    let mut stream = sb
        .exec_stream(ExecRequest::argv(["sleep", "100"]))
        .await
        .unwrap();
    let pid = sb.host_pid().unwrap();
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let err = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            match stream.next().await {
                Some(Err(e)) => break e,
                Some(Ok(_)) => continue,
                None => panic!("stream ended without an error"),
            }
        }
    })
    .await
    .expect("no error within 5 s");
    assert!(err.to_string().contains("is gone"), "{err}");
    let err = sb.exec(ExecRequest::shell("true")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidState, "{err}");
}

#[tokio::test]
async fn create_and_exec_runs_the_first_command_and_keeps_the_sandbox() {
    let env = std::collections::BTreeMap::from([("GREETING".to_string(), "hi".to_string())]);
    let spec = SandboxSpec { env, ..spec() };
    let (sb, stream) = engine()
        .create_and_exec(
            sandcell_engine::new_sandbox_id(),
            spec,
            ExecRequest::shell("echo $GREETING; exit 3"),
        )
        .await
        .unwrap();
    let out = stream.collect().await.unwrap();
    // The sandbox's env reached the first command, and its exit is exact.
    assert_eq!(text(&out.stdout), "hi\n");
    assert_eq!(out.result.exit_code, Some(3));
    // The sandbox serves further commands afterwards.
    assert_eq!(text(&sh(&sb, "echo again").await.stdout), "again\n");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn create_and_exec_refuses_a_bad_request_before_starting() {
    let bad = ExecRequest::argv(Vec::<String>::new());
    let err = engine()
        .create_and_exec(sandcell_engine::new_sandbox_id(), spec(), bad)
        .await
        .err()
        .expect("an empty argv must be refused");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
}
