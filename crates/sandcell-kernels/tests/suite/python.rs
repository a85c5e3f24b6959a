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
fn code_that_cannot_compile_for_any_reason_is_an_error_and_the_kernel_goes_on() {
    let mut k = Kernel::start(Python);
    // A NUL byte is a ValueError (not a SyntaxError) from compile() before Python 3.12; the
    // cell used to never end, leaving its context busy for good (found by schemathesis).
    let deep = format!("{}1{}", "(".repeat(300), ")".repeat(300));
    for code in ["x = 1\u{0}", "1+\u{0}|", deep.as_str()] {
        let ev = k.execute(code);
        assert_eq!(done(&ev)["status"], "error", "{code:?}: {ev:?}");
        assert_eq!(of_type(&ev, "error").len(), 1, "{code:?}: {ev:?}");
    }
    assert_eq!(result_text(&k.execute("1 + 1")).as_deref(), Some("2"));
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
    // Like Python's prompt: a block ends with a blank line, so it can have more lines.
    assert_eq!(
        c(&mut k, "for i in range(3):\n    print(i)\n"),
        "incomplete"
    );
    assert_eq!(
        c(&mut k, "for i in range(3):\n    print(i)\n\n"),
        "complete"
    );
    assert_eq!(c(&mut k, "if x:\n    pass\nelse:\n"), "incomplete");
    assert_eq!(c(&mut k, "x = (1,\n"), "incomplete");
    // Several statements at once (pasted) run when they compile.
    assert_eq!(c(&mut k, "x = 1\ny = 2\n"), "complete");
    assert_eq!(c(&mut k, "x = 1\nawait f()\n"), "complete");
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

#[test]
fn tracebacks_show_lines_of_earlier_cells() {
    // linecache is imported only when needed; the cells run before it still show.
    let mut k = Kernel::start(Python);
    k.execute("def inner():\n    raise ValueError('deep')");
    k.execute("def outer():\n    return inner()");
    let ev = k.execute(
        "import traceback\ntry:\n    outer()\nexcept ValueError:\n    traceback.print_exc()",
    );
    let err = stream(&ev, "stderr");
    for line in [
        "return inner()",
        "raise ValueError('deep')",
        "<cell 1>",
        "<cell 2>",
    ] {
        assert!(err.contains(line), "{line} missing: {err}");
    }
    let ev = k.execute("outer()");
    let tb = of_type(&ev, "error")[0]["traceback"].to_string();
    assert!(tb.contains("raise ValueError('deep')"), "{tb}");
}

#[test]
fn site_work_runs_when_an_import_first_misses() {
    // The kernel starts without `site`: its directories are on sys.path at once, and the
    // rest (user site-packages, .pth files) comes the first time an import finds nothing.
    let base = tempfile::tempdir().unwrap();
    let base_str = base.path().to_str().unwrap();
    let mut k = Kernel::start_with(Python, &[("PYTHONUSERBASE", base_str)]);
    let ev = k.execute("import sys\n(sys.flags.no_site, any(p.endswith('dist-packages') for p in sys.path), 'site' in sys.modules)");
    assert_eq!(result_text(&ev).as_deref(), Some("(1, True, True)"));
    // A user site made after start-up, with a module and a .pth file pointing elsewhere.
    let site = base.path().join("lib/python3.11/site-packages");
    let extra = base.path().join("extra");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::create_dir_all(&extra).unwrap();
    std::fs::write(site.join("late_mod.py"), "X = 7\n").unwrap();
    std::fs::write(extra.join("from_pth.py"), "Y = 8\n").unwrap();
    std::fs::write(site.join("extra.pth"), format!("{}\n", extra.display())).unwrap();
    let ev = k.execute("import late_mod, from_pth\nlate_mod.X + from_pth.Y");
    assert_eq!(result_text(&ev).as_deref(), Some("15"), "{ev:?}");
    // A module that exists nowhere still fails plainly.
    let ev = k.execute("import no_such_module_anywhere");
    assert_eq!(of_type(&ev, "error")[0]["ename"], "ModuleNotFoundError");
}

#[test]
fn events_and_requests_carry_any_value() {
    let mut k = Kernel::start(Python);
    // Non-ASCII, escapes, big and odd numbers, values JSON cannot hold (sent as their repr).
    let ev = k.execute("print('é漢字 \"q\" \\\\ \\t end')\ndisplay({'nan': float('nan'), 'big': 2**70, 'set': {1}})\n'ok'");
    assert_eq!(stream(&ev, "stdout"), "é漢字 \"q\" \\ \t end\n");
    let shown = of_type(&ev, "display")[0]["data"]["text/plain"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        shown.contains("nan") && shown.contains("1180591620717411303424"),
        "{shown}"
    );
    let r = k.call(json!({"op": "set_vars", "values": {"u": "\u{1F600} \u{0007}", "n": -1.5e300}}));
    assert_eq!(r["set"], json!(["n", "u"]));
    let v = k.call(json!({"op": "get_vars", "names": ["u", "n"]}));
    assert_eq!(v["values"]["u"], "\u{1F600} \u{0007}");
    assert_eq!(v["values"]["n"], -1.5e300);
    // A request that is not JSON gets an error reply and the kernel keeps serving.
    k.send_raw(b"{not json\n");
    let reply = k.next_event();
    assert_eq!(reply["type"], "reply");
    assert!(
        reply["error"].as_str().unwrap().contains("bad request"),
        "{reply}"
    );
    assert_eq!(result_text(&k.execute("1 + 1")).as_deref(), Some("2"));
}

#[test]
fn start_up_imports_stay_light() {
    // What makes a cold start slow must not creep back: these are imported only on use.
    let mut k = Kernel::start(Python);
    let ev = k.execute("import sys\nsorted(m for m in ('json', 're', 'enum', 'functools', 'collections', 'threading', 'signal', 'linecache', 'asyncio') if m in sys.modules)");
    assert_eq!(result_text(&ev).as_deref(), Some("[]"), "{ev:?}");
}
