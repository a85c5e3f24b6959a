//! The Python kernel over its protocol.

use sandcell_protocol::Language::Python;
use serde_json::json;

use crate::common::*;

#[test]
fn state_results_streams_and_displays_in_order() {
    let mut k = Kernel::start(Python);
    assert_eq!(k.ready["language"], "python");
    assert_eq!(done(&k.execute("x = 41"))["status"], "ok");
    let ev = k.execute("x + 1");
    assert_eq!(result_text(&ev).as_deref(), Some("42"));
    assert_eq!(done(&ev)["execution_count"], 2);
    let ev =
        k.execute("import sys\nprint('a')\nprint('b', file=sys.stderr)\ndisplay(1, 'two')\nNone");
    let order: Vec<String> = ev
        .iter()
        .map(|e| match e["type"].as_str().unwrap() {
            "stream" => e["text"].as_str().unwrap().trim().to_string(),
            "display" => e["data"]["text/plain"].as_str().unwrap().to_string(),
            other => other.to_string(),
        })
        .collect();
    assert_eq!(order, ["a", "b", "1", "'two'", "done"]);
    // Top-level await and an unawaited coroutine as the last value.
    let ev = k.execute("import asyncio\nawait asyncio.sleep(0)\nasync def f():\n    return 5\nf()");
    assert_eq!(result_text(&ev).as_deref(), Some("5"));
    assert_eq!(k.close().code(), Some(0));
}

#[test]
fn errors_show_only_the_users_code() {
    let mut k = Kernel::start(Python);
    let ev = k.execute("def f():\n    return 1 / 0\nf()");
    let err = of_type(&ev, "error")[0];
    let tb = err["traceback"].to_string();
    assert!(
        tb.contains("<cell 1>") && tb.contains("return 1 / 0"),
        "{tb}"
    );
    assert!(!tb.contains("<string>") && !tb.contains("kernel"), "{tb}");
    let ev = k.execute("x = )");
    let err = of_type(&ev, "error")[0];
    assert_eq!(err["ename"], "SyntaxError");
    assert!(!err["traceback"].to_string().contains("ast.py"), "{err}");
    assert_eq!(done(&ev)["status"], "error");
}

#[test]
fn interrupts_keep_state_and_idle_ones_are_ignored() {
    let mut k = Kernel::start(Python);
    k.execute("kept = 1");
    k.interrupt();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(result_text(&k.execute("kept")).as_deref(), Some("1"));
    let id = k.send(json!({"op": "execute", "code": "while True:\n    print('tick')"}));
    std::thread::sleep(std::time::Duration::from_millis(300));
    k.interrupt();
    let ev = k.collect(id);
    assert_eq!(done(&ev)["status"], "interrupted");
    assert_eq!(of_type(&ev, "error")[0]["ename"], "KeyboardInterrupt");
    // Every line on the event pipe parsed: an interrupt never cut one.
    assert!(ev.iter().all(|e| e["type"] != "unparsable"));
    assert_eq!(result_text(&k.execute("kept + 1")).as_deref(), Some("2"));
}

#[test]
fn output_past_the_limit_is_dropped_with_a_marker() {
    let mut k = Kernel::start_with(Python, &[("SANDCELL_STREAM_LIMIT", "1000")]);
    let ev = k.execute("for i in range(1000):\n    print('line', i)");
    let out = stream(&ev, "stdout");
    assert!(
        out.contains("[sandcell: output truncated after 1000 bytes]"),
        "{out}"
    );
    assert!(out.len() < 1200, "{}", out.len());
    assert!(done(&ev)["dropped"]["stdout"].as_u64().unwrap() > 5000);
    // Raw bytes that are not UTF-8 are replaced, not fatal.
    let ev = k.execute("import sys\nsys.stdout.buffer.write(b'a\\xffb\\n')");
    assert!(stream(&ev, "stdout").contains("a\u{fffd}b"));
    // fd-level output goes to the kernel's fd 1, not into events.
    let ev = k.execute("import os\nos.write(1, b'raw\\n')");
    assert_eq!(stream(&ev, "stdout"), "");
}

#[test]
fn matplotlib_figures_come_back_as_png() {
    let mut k = Kernel::start(Python);
    let ev =
        k.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nprint('after')");
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["display", "stream", "done"], "{ev:?}");
    assert_png(ev[0]["data"]["image/png"].as_str().unwrap());
}

#[test]
fn completeness_and_variables() {
    let mut k = Kernel::start(Python);
    let c = |k: &mut Kernel, code: &str| {
        k.call(json!({"op": "is_complete", "code": code}))["status"].clone()
    };
    assert_eq!(c(&mut k, "for i in range(3):\n"), "incomplete");
    assert_eq!(c(&mut k, "x = 1\n"), "complete");
    assert_eq!(c(&mut k, "x = )\n"), "invalid");
    assert_eq!(c(&mut k, "await f()\n"), "complete");
    k.execute("a = [1, 2]\nt = (1,)\ns = {1}\nimport os\ndef f(): pass");
    let v = k.call(json!({"op": "get_vars", "names": null}));
    assert_eq!(v["values"]["a"], json!([1, 2]));
    assert_eq!(v["unrepresentable"]["t"]["type"], "tuple");
    assert_eq!(v["unrepresentable"]["s"]["type"], "set");
    assert!(v["values"].get("os").is_none() && v["unrepresentable"].get("os").is_none());
    let r = k.call(json!({"op": "set_vars", "values": {"class": 1}}));
    assert!(r["error"].as_str().unwrap().contains("class"));
    let r = k.call(json!({"op": "set_vars", "values": {"b": {"k": null}}}));
    assert_eq!(r["set"], json!(["b"]));
    assert_eq!(result_text(&k.execute("b")).as_deref(), Some("{'k': None}"));
    let r = k.call(json!({"op": "clear_vars", "names": null}));
    assert!(r["cleared"].as_array().unwrap().len() >= 4);
    let r = k.call(json!({"op": "list_vars"}));
    assert_eq!(r["variables"], json!([]));
}
