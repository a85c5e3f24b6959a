//! Language kernels in real sandboxes, through the engine.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use sandcell_engine::{CodeEvent, CodeRun, Sandbox, SandboxSpec};
use sandcell_protocol::{CodeStatus, Completeness, ErrorCode, Language, RunCodeRequest};
use serde_json::json;

use super::common::*;

fn req(context: &str, code: &str) -> RunCodeRequest {
    RunCodeRequest {
        context: Some(context.into()),
        language: None,
        code: code.into(),
        timeout_ms: None,
    }
}

async fn py(sb: &Sandbox, code: &str) -> CodeRun {
    sb.run(Language::Python, code).await.expect("run python")
}

fn png(b64: &str) {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .expect("base64");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

#[tokio::test]
async fn python_state_results_and_rich_output() {
    let sb = sandbox().await;
    let r = py(&sb, "x = 41").await;
    assert!(r.ok() && r.result().is_none(), "{r:?}");
    let r = py(&sb, "x + 1").await;
    assert_eq!(r.result_text(), Some("42"), "{r:?}");
    assert_eq!(py(&sb, "_ * 2").await.result_text(), Some("84"));
    // A plot without plt.show() comes back as a PNG; a DataFrame as HTML.
    let r = py(
        &sb,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('plotted')",
    )
    .await;
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.stdout, "plotted\n");
    let images = r.png_images();
    assert_eq!(images.len(), 1, "{r:?}");
    png(images[0]);
    let r = py(
        &sb,
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
    )
    .await;
    let result = r.result().expect("a result");
    assert!(
        result["text/html"].as_str().unwrap().contains("<table"),
        "{r:?}"
    );
    assert!(result["text/plain"].as_str().unwrap().contains('a'));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn events_keep_their_order() {
    let sb = sandbox().await;
    let code = "import sys\nprint('one')\nprint('two', file=sys.stderr)\ndisplay(1)\nprint('three')\ndisplay('four')\nsys.stderr.write('five\\n')\n6";
    let mut stream = sb
        .run_code_stream(RunCodeRequest {
            context: None,
            language: Some(Language::Python),
            code: code.into(),
            timeout_ms: None,
        })
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(e) = stream.next().await {
        match e.unwrap() {
            CodeEvent::Stdout { text } | CodeEvent::Stderr { text } => {
                seen.extend(text.lines().map(str::to_string))
            }
            CodeEvent::Display { data } | CodeEvent::Result { data } => seen.push(
                data["text/plain"]
                    .as_str()
                    .unwrap()
                    .trim_matches('\'')
                    .to_string(),
            ),
            CodeEvent::Error(e) => panic!("{e:?}"),
            CodeEvent::Done(_) => {}
        }
    }
    assert_eq!(seen, ["one", "two", "1", "three", "four", "five", "6"]);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn top_level_await_in_python_and_node() {
    let sb = sandbox().await;
    let r = py(&sb, "import asyncio\nawait asyncio.sleep(0.01)\n40 + 2").await;
    assert_eq!(r.result_text(), Some("42"), "{r:?}");
    let r = py(&sb, "async def f():\n    return 7\nf()").await;
    assert_eq!(
        r.result_text(),
        Some("7"),
        "a coroutine as the last value is awaited: {r:?}"
    );
    let node = |code: &'static str| sb.run(Language::Node, code);
    let r = node("const v = await Promise.resolve(41); v + 1")
        .await
        .unwrap();
    assert_eq!(r.result_text(), Some("42"), "{r:?}");
    let r = node("v * 2").await.unwrap();
    assert_eq!(r.result_text(), Some("82"), "declarations persist: {r:?}");
    let r = node("new Promise(res => setTimeout(() => res('later'), 20))")
        .await
        .unwrap();
    assert_eq!(r.result_text(), Some("'later'"), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn node_bash_and_r_keep_state() {
    let sb = sandbox().await;
    let node = |code: &'static str| sb.run(Language::Node, code);
    node("let a = 20").await.unwrap();
    node("const f = (v) => v * 2").await.unwrap();
    let r = node("console.log('hi'); f(a) + 2").await.unwrap();
    assert_eq!(
        (r.stdout.as_str(), r.result_text()),
        ("hi\n", Some("42")),
        "{r:?}"
    );
    let r = node("require('path').join('a', 'b')").await.unwrap();
    assert_eq!(r.result_text(), Some("'a/b'"), "{r:?}");

    let bash = |code: &'static str| sb.run(Language::Bash, code);
    bash("cd /tmp").await.unwrap();
    bash("export K=4").await.unwrap();
    bash("f() { echo \"$K$1\"; }").await.unwrap();
    let r = bash("f 2; pwd").await.unwrap();
    assert_eq!(r.stdout, "42\n/tmp\n", "{r:?}");
    let r = bash("false").await.unwrap();
    assert_eq!(
        (r.done.status, r.done.exit_code),
        (CodeStatus::Error, Some(1))
    );

    let r = sb.run(Language::R, "x <- 21").await.unwrap();
    assert!(r.ok(), "{r:?}");
    let r = sb.run(Language::R, "x * 2").await.unwrap();
    assert!(r.result_text().unwrap_or_default().contains("42"), "{r:?}");
    let r = sb.run(Language::R, "plot(1:10)").await.unwrap();
    let images = r.png_images();
    assert_eq!(images.len(), 1, "{r:?}");
    png(images[0]);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn errors_point_at_the_users_code() {
    let sb = sandbox().await;
    let r = py(&sb, "def f(n):\n    return 1 / n\nf(0)").await;
    assert_eq!(r.done.status, CodeStatus::Error);
    let e = r.error.expect("an error");
    assert_eq!(e.ename, "ZeroDivisionError");
    let tb = e.traceback.join("\n");
    assert!(tb.contains("<cell") && tb.contains("return 1 / n"), "{tb}");
    assert!(!tb.contains("kernel"), "kernel frames leak: {tb}");
    // State survives an error.
    py(&sb, "y = 5").await;
    assert!(!py(&sb, "raise ValueError('no')").await.ok());
    assert_eq!(py(&sb, "y").await.result_text(), Some("5"));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn interrupt_keeps_state_and_timeout_interrupts() {
    let sb = sandbox().await;
    py(&sb, "kept = 'yes'").await;
    let running = {
        let sb = sb.clone();
        tokio::spawn(async move { py(&sb, "n = 0\nwhile True:\n    n += 1").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    sb.interrupt("python").await.unwrap();
    let r = running.await.unwrap();
    assert_eq!(r.done.status, CodeStatus::Interrupted, "{r:?}");
    assert_eq!(r.error.unwrap().ename, "KeyboardInterrupt");
    assert_eq!(py(&sb, "kept").await.result_text(), Some("'yes'"));
    assert!(py(&sb, "n > 0").await.result_text() == Some("True"));

    // A timeout interrupts first: the state survives.
    let start = Instant::now();
    let mut slow = req("python", "while True:\n    pass");
    slow.timeout_ms = Some(1000);
    let r = sb.run_code(slow).await.unwrap();
    assert_eq!(r.done.status, CodeStatus::Timeout);
    assert!(!r.done.state_lost);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(py(&sb, "kept").await.result_text(), Some("'yes'"));

    // Code that ignores the interrupt is killed after the grace period: state lost, said so.
    let mut stubborn = req(
        "python",
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
    );
    stubborn.timeout_ms = Some(500);
    let r = sb.run_code(stubborn).await.unwrap();
    assert_eq!(r.done.status, CodeStatus::Timeout);
    assert!(r.done.state_lost, "{r:?}");
    let r = py(&sb, "1 + 1").await;
    assert!(
        r.done.kernel_restarted && r.result_text() == Some("2"),
        "{r:?}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_crashed_kernel_is_reported_and_replaced() {
    let sb = sandbox().await;
    py(&sb, "before = 1").await;
    let r = py(&sb, "import ctypes\nctypes.string_at(0)").await;
    assert_eq!(r.done.status, CodeStatus::Crashed, "{r:?}");
    assert!(r.done.state_lost);
    assert!(
        r.done.crash.as_deref().unwrap().contains("SIGSEGV"),
        "{r:?}"
    );
    let r = py(&sb, "'before' in globals()").await;
    assert!(r.done.kernel_restarted, "{r:?}");
    assert!(r.done.notice.as_deref().unwrap().contains("fresh kernel"));
    assert_eq!(r.result_text(), Some("False"));
    let r = py(&sb, "import os\nos._exit(3)").await;
    assert_eq!(r.done.crash.as_deref(), Some("exited with code 3"), "{r:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn out_of_memory_kills_the_kernel_and_says_so() {
    let mut spec = SandboxSpec::default();
    spec.limits.memory_bytes = Some(192 * 1024 * 1024);
    let sb = sandbox_with(spec).await;
    sandcell_testkit::require!(cgroups_active(&sb), "no memory cgroup here (rootless)");
    let r = py(&sb, "blob = bytearray(1024 * 2**20)").await;
    assert_eq!(r.done.status, CodeStatus::Crashed, "{r:?}");
    assert!(r.done.state_lost);
    assert!(
        r.done.crash.as_deref().unwrap().contains("out-of-memory"),
        "{r:?}"
    );
    assert_eq!(py(&sb, "2 * 21").await.result_text(), Some("42"));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn huge_and_binary_output_is_cut_and_survived() {
    let sb = sandbox().await;
    let start = Instant::now();
    let r = py(&sb, "for _ in range(100):\n    print('x' * (1 << 20))").await;
    assert!(r.ok(), "{:?}", r.done);
    assert!(
        r.stdout.len() < 2 << 20,
        "{} bytes came through",
        r.stdout.len()
    );
    assert!(r.stdout.contains("output truncated"));
    assert!(r.done.stdout_dropped > 90 << 20, "{:?}", r.done);
    assert!(start.elapsed() < Duration::from_secs(30));
    // Output written below the language (a subprocess) is capped by the agent.
    let r = py(
        &sb,
        "import subprocess\nsubprocess.run('head -c 5000000 /dev/zero | tr \"\\\\0\" y', shell=True)",
    )
    .await;
    assert!(
        r.stdout.contains("output truncated") && r.stdout.len() < 2 << 20,
        "{}",
        r.stdout.len()
    );
    // Bytes that are not UTF-8 are replaced, not fatal.
    let r = py(
        &sb,
        "import sys, os\nsys.stdout.buffer.write(b'a\\xffb\\n')\nsys.stdout.flush()\nos.write(1, b'c\\xfe\\n')",
    )
    .await;
    assert!(r.ok(), "{r:?}");
    assert!(
        r.stdout.contains("a\u{fffd}b") && r.stdout.contains("c\u{fffd}"),
        "{:?}",
        r.stdout
    );
    assert_eq!(py(&sb, "'alive'").await.result_text(), Some("'alive'"));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn variables_as_json() {
    let sb = sandbox().await;
    py(
        &sb,
        "a = 1\nb = {'k': [1, 2.5, None]}\nimport math\nc = math.nan\ndef f(): pass",
    )
    .await;
    let v = sb.get_variables("python", None).await.unwrap();
    assert_eq!(v.values["a"], json!(1));
    assert_eq!(v.values["b"], json!({"k": [1, 2.5, null]}));
    assert_eq!(v.unrepresentable["c"].type_name, "float");
    assert!(v.unrepresentable["f"].repr.contains("function"));
    let v = sb
        .get_variables("python", Some(vec!["a".into(), "zz".into()]))
        .await
        .unwrap();
    assert_eq!(v.missing, ["zz"]);
    let set = sb
        .set_variables("python", BTreeMap::from([("g".into(), json!({"x": [3]}))]))
        .await
        .unwrap();
    assert_eq!(set, ["g"]);
    assert_eq!(py(&sb, "g['x'][0] * 14").await.result_text(), Some("42"));
    let bad = sb
        .set_variables("python", BTreeMap::from([("not a name".into(), json!(1))]))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), ErrorCode::InvalidArgument, "{bad}");
    let names: Vec<String> = sb
        .list_variables("python")
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert!(
        names.contains(&"a".to_string()) && names.contains(&"g".to_string()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"math".to_string()),
        "modules are not variables: {names:?}"
    );
    sb.clear_variables("python", Some(vec!["a".into()]))
        .await
        .unwrap();
    assert!(!py(&sb, "a").await.ok());

    sb.run(Language::Node, "let n = 5; var m = [1]")
        .await
        .unwrap();
    let v = sb.get_variables("node", None).await.unwrap();
    assert_eq!(
        (v.values["n"].clone(), v.values["m"].clone()),
        (json!(5), json!([1]))
    );
    let err = sb.get_variables("bash", None).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn contexts_are_separate_and_restart_clears() {
    let sb = sandbox().await;
    let one = sb
        .create_context(Language::Python, None, BTreeMap::new())
        .await
        .unwrap();
    let two = sb
        .create_context(
            Language::Python,
            None,
            BTreeMap::from([("MARK".into(), "two".into())]),
        )
        .await
        .unwrap();
    assert_ne!(one.id, two.id);
    sb.run_code(req(&one.id, "secret = 1")).await.unwrap();
    let r = sb
        .run_code(req(&two.id, "'secret' in globals()"))
        .await
        .unwrap();
    assert_eq!(r.result_text(), Some("False"));
    let r = sb
        .run_code(req(&two.id, "import os\nos.environ['MARK']"))
        .await
        .unwrap();
    assert_eq!(r.result_text(), Some("'two'"));
    let listed: Vec<String> = sb
        .list_contexts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert!(
        listed.contains(&one.id) && listed.contains(&two.id),
        "{listed:?}"
    );

    sb.restart_context(&one.id).await.unwrap();
    let r = sb
        .run_code(req(&one.id, "'secret' in globals()"))
        .await
        .unwrap();
    assert_eq!(r.result_text(), Some("False"));
    assert!(
        !r.done.kernel_restarted,
        "a restart on request is not a crash"
    );

    sb.destroy_context(&two.id).await.unwrap();
    let err = sb.run_code(req(&two.id, "1")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");

    // One execution at a time per context.
    let busy = {
        let sb = sb.clone();
        let id = one.id.clone();
        tokio::spawn(async move { sb.run_code(req(&id, "import time\ntime.sleep(1)")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = sb.run_code(req(&one.id, "1")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidState, "{err}");
    assert!(busy.await.unwrap().unwrap().ok());
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn bad_code_requests_are_refused_clearly() {
    let sb = sandbox().await;
    let err = sb
        .run_code(RunCodeRequest {
            context: None,
            language: None,
            code: "1".into(),
            timeout_ms: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let mut mismatch = req("python", "1");
    mismatch.language = Some(Language::Node);
    let err = sb.run_code(mismatch).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    let (status, _) = sb
        .is_complete(None, Some(Language::Python), "for i in range(3):\n")
        .await
        .unwrap();
    assert_eq!(status, Completeness::Incomplete);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn files_in_the_outputs_folder_are_artifacts() {
    let sb = sandbox().await;
    let r = py(
        &sb,
        "import os\nos.makedirs('/workspace/outputs', exist_ok=True)\nopen('/workspace/outputs/table.csv', 'w').write('a,b\\n1,2\\n')",
    )
    .await;
    assert_eq!(r.done.artifacts.len(), 1, "{:?}", r.done);
    let a = &r.done.artifacts[0];
    assert_eq!(
        (a.path.as_str(), a.size, a.mime.as_str()),
        ("/workspace/outputs/table.csv", 8, "text/csv")
    );
    // Unchanged files are not listed again.
    assert!(py(&sb, "1").await.done.artifacts.is_empty());
    // The folder emptied (its stamp is remembered), then a file in a new subfolder, then
    // that file rewritten in place: each change is seen.
    let names = |r: &sandcell_engine::CodeRun| -> Vec<String> {
        r.done.artifacts.iter().map(|a| a.path.clone()).collect()
    };
    assert!(
        py(&sb, "os.remove('/workspace/outputs/table.csv')")
            .await
            .done
            .artifacts
            .is_empty()
    );
    assert!(py(&sb, "2").await.done.artifacts.is_empty());
    let r = py(&sb, "os.makedirs('/workspace/outputs/plots')\nopen('/workspace/outputs/plots/a.txt', 'w').write('1')").await;
    assert_eq!(names(&r), ["/workspace/outputs/plots/a.txt"]);
    let r = py(
        &sb,
        "open('/workspace/outputs/plots/a.txt', 'w').write('22')",
    )
    .await;
    assert_eq!(names(&r), ["/workspace/outputs/plots/a.txt"]);
    assert_eq!(r.done.artifacts[0].size, 2);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn kernels_are_confined_like_everything_else() {
    let marker = std::path::Path::new("/root")
        .join(format!("sandcell-kernel-marker-{}", std::process::id()));
    std::fs::write(&marker, "secret").unwrap();
    let sb = sandbox().await;
    let r = py(
        &sb,
        &format!(
            "import os\nprint(os.getuid(), os.path.exists({:?}))",
            marker.display().to_string()
        ),
    )
    .await;
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(r.stdout, "65532 False\n", "{r:?}");
    let r = sb
        .run(
            Language::Node,
            "require('fs').writeFileSync('/usr/evil', 'x')",
        )
        .await
        .unwrap();
    assert_eq!(r.done.status, CodeStatus::Error);
    // Read-only (process) or not the sandbox user's to write (gVisor checks that first).
    let why = r.error.unwrap().evalue;
    assert!(why.contains("EROFS") || why.contains("EACCES"), "{why}");
    let r = sb.run(Language::Bash, "cat /etc/shadow").await.unwrap();
    assert_ne!(r.done.exit_code, Some(0));
    // The host's loopback is out of reach from a kernel too; ptrace is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = py(
        &sb,
        &format!(
            "import socket, ctypes\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\nexcept OSError:\n    print('refused')\nprint(ctypes.CDLL(None).ptrace(16, 1, 0, 0))"
        ),
    )
    .await;
    assert_eq!(r.stdout, "refused\n-1\n", "{r:?}");
    sb.destroy().await.unwrap();
}
