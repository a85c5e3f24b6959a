//! node kernel tests (written with the kernel).

use std::time::{Duration, Instant};

use sandcell_protocol::Language::Node;
use serde_json::{Value, json};

use crate::common::*;

fn start() -> Kernel {
    Kernel::start(Node)
}

/// Runs `code` and asserts it ends with status `ok`.
fn ok(k: &mut Kernel, code: &str) -> Vec<Value> {
    let ev = k.execute(code);
    assert_eq!(done(&ev)["status"], "ok", "{code}: {ev:?}");
    ev
}

/// The result's text/plain of `code`, which must succeed.
fn value(k: &mut Kernel, code: &str) -> Option<String> {
    result_text(&ok(k, code))
}

/// The single error event of a failed execution.
fn error_of(ev: &[Value]) -> Value {
    let errors = of_type(ev, "error");
    assert_eq!(errors.len(), 1, "{ev:?}");
    errors[0].clone()
}

fn traceback(err: &Value) -> Vec<String> {
    err["traceback"]
        .as_array()
        .expect("traceback is a list")
        .iter()
        .map(|l| l.as_str().expect("traceback lines are strings").to_string())
        .collect()
}

/// Starts `code` (which prints before it blocks), waits for its first output, sends SIGINT
/// and returns the execution's events.
fn interrupted(k: &mut Kernel, code: &str) -> Vec<Value> {
    let id = k.send(json!({"op": "execute", "code": code}));
    let first = k.next_event();
    assert_eq!(first["type"], "stream", "{first}");
    std::thread::sleep(Duration::from_millis(50));
    k.interrupt();
    let mut ev = vec![first];
    ev.extend(k.collect(id));
    ev
}

#[test]
fn ready_then_clean_exit_on_eof() {
    let k = start();
    assert_eq!(k.ready["language"], "node");
    assert!(
        k.ready["version"]
            .as_str()
            .is_some_and(|v| v.starts_with(char::is_numeric)),
        "{}",
        k.ready
    );
    assert_eq!(k.ready["pid"], json!(k.child.id()));
    let status = k.close();
    assert!(status.success(), "{status:?}");
}

#[test]
fn state_persists_across_cells() {
    let mut k = start();
    // The acceptance check.
    assert_eq!(value(&mut k, "let a = 20"), None);
    assert_eq!(value(&mut k, "const f = (v) => v * 2"), None);
    assert_eq!(value(&mut k, "f(a) + 2").as_deref(), Some("42"));
    // Function and class declarations, destructuring, var in blocks.
    ok(
        &mut k,
        "function twice(x) { return 2 * x }\nclass Box { constructor(v) { this.v = v } }\n\
         const { p, q: [r] } = { p: 1, q: [2] }\nif (true) { var inBlock = 3 }",
    );
    assert_eq!(
        value(&mut k, "twice(new Box(p + r + inBlock).v)").as_deref(),
        Some("12")
    );
    // Re-running a cell that declares the same let/const works (as in the Node REPL).
    ok(&mut k, "let a = 1; const f = (v) => v + 100");
    assert_eq!(value(&mut k, "f(a)").as_deref(), Some("101"));
    // A function is usable before its declaration in the same cell (hoisting), and globally.
    assert_eq!(
        value(
            &mut k,
            "const got = early()\nfunction early() { return 'hoisted' }\ngot"
        )
        .as_deref(),
        Some("'hoisted'")
    );
    assert_eq!(value(&mut k, "typeof early").as_deref(), Some("'function'"));
    // A "use strict" cell still defines globals.
    ok(&mut k, "'use strict'\nlet strictVar = 5");
    assert_eq!(value(&mut k, "strictVar").as_deref(), Some("5"));
}

#[test]
fn result_is_the_last_expression() {
    let mut k = start();
    assert_eq!(value(&mut k, "1 + 1").as_deref(), Some("2"));
    assert_eq!(value(&mut k, "undefined"), None);
    assert_eq!(value(&mut k, "let x = 5"), None);
    assert_eq!(value(&mut k, "'text'").as_deref(), Some("'text'"));
    assert_eq!(
        value(&mut k, "({ a: [1, 2], b: { c: 'd' } })").as_deref(),
        Some("{ a: [ 1, 2 ], b: { c: 'd' } }")
    );
    assert_eq!(value(&mut k, "x = 3").as_deref(), Some("3"));
    assert_eq!(value(&mut k, "x\n\n;;").as_deref(), Some("3"));
    assert_eq!(value(&mut k, "null").as_deref(), Some("null"));
    // At most one result, after the printed text.
    let ev = ok(&mut k, "console.log('first'); 7");
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(ev[0]["type"], "stream");
    assert_eq!(ev[1]["type"], "result");
    assert_eq!(ev[1]["data"]["text/plain"], "7");
    assert_eq!(ev[1]["metadata"], json!({}));
}

#[test]
fn a_promise_last_value_is_awaited() {
    let mut k = start();
    assert_eq!(value(&mut k, "Promise.resolve(7)").as_deref(), Some("7"));
    assert_eq!(
        value(
            &mut k,
            "new Promise((res) => setTimeout(() => res('late'), 20))"
        )
        .as_deref(),
        Some("'late'")
    );
    // A rejection is an error.
    let ev = k.execute("Promise.reject(new RangeError('nope'))");
    assert_eq!(done(&ev)["status"], "error");
    let err = error_of(&ev);
    assert_eq!(err["ename"], "RangeError");
    assert_eq!(err["evalue"], "nope");
}

#[test]
fn top_level_await() {
    let mut k = start();
    assert_eq!(
        value(&mut k, "const r = await Promise.resolve(41); r + 1").as_deref(),
        Some("42")
    );
    assert_eq!(value(&mut k, "r").as_deref(), Some("41"));
    let t = Instant::now();
    assert_eq!(
        value(
            &mut k,
            "await new Promise(res => setTimeout(() => res('done'), 20))"
        )
        .as_deref(),
        Some("'done'")
    );
    assert!(t.elapsed() >= Duration::from_millis(20));
    // Declarations of every kind in an awaiting cell persist; `let x;` resets to undefined.
    ok(
        &mut k,
        "const sleep = (ms) => new Promise((res) => setTimeout(res, ms))\n\
         await sleep(5)\n\
         let { m, n = 3 } = { m: 1 }, [o] = [4]\n\
         var v1 = 'v'\n\
         let unset\n\
         class K { get k() { return 'k' } }\n\
         async function later() { await sleep(1); return 'later' }\n\
         for await (const piece of [Promise.resolve(1)]) { m += piece }",
    );
    assert_eq!(
        value(&mut k, "[m, n, o, v1, unset, new K().k, await later()]").as_deref(),
        Some("[ 2, 3, 4, 'v', undefined, 'k', 'later' ]")
    );
    // Output printed while awaiting comes before done, in order.
    let ev = ok(
        &mut k,
        "console.log('before'); await sleep(10); console.log('after'); 'end'",
    );
    assert_eq!(stream(&ev, "stdout"), "before\nafter\n");
    assert_eq!(result_text(&ev).as_deref(), Some("'end'"));
    // The cell does not wait for timers it did not await.
    let t = Instant::now();
    ok(&mut k, "setTimeout(() => {}, 3000); await sleep(1)");
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn console_streams_keep_their_order() {
    let mut k = start();
    let ev = ok(
        &mut k,
        "console.log('1'); console.error('2'); console.info('3', { a: 1 }); console.warn('4'); \
         console.debug('5'); process.stdout.write('6\\n'); process.stderr.write('7\\n')",
    );
    let streams: Vec<(String, String)> = of_type(&ev, "stream")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("stdout", "1\n"),
        ("stderr", "2\n"),
        ("stdout", "3 { a: 1 }\n"),
        ("stderr", "4\n"),
        ("stdout", "5\n6\n"),
        ("stderr", "7\n"),
    ];
    // Batching may merge neighbouring text of one stream, never reorder across streams.
    let mut merged: Vec<(String, String)> = Vec::new();
    for (name, text) in streams {
        match merged.last_mut() {
            Some((n, t)) if *n == name => t.push_str(&text),
            _ => merged.push((name, text)),
        }
    }
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(merged, expected);
    // console.trace goes to stderr with the user's frames only.
    let ev = ok(
        &mut k,
        "function where() { console.trace('here') }\nwhere()",
    );
    let err = stream(&ev, "stderr");
    assert!(err.starts_with("Trace: here\n"), "{err}");
    assert!(err.contains("at where (<cell "), "{err}");
    assert!(!err.contains("[eval]") && !err.contains("node:vm"), "{err}");
}

#[test]
fn require_builtins_and_node_modules() {
    let mut k = start();
    assert_eq!(
        value(&mut k, "require('path').join('a', 'b')").as_deref(),
        Some("'a/b'")
    );
    assert_eq!(
        value(&mut k, "typeof require('node:fs').readFileSync").as_deref(),
        Some("'function'")
    );
    let dir = std::env::temp_dir().join(format!("sandcell-node-kernel-{}", std::process::id()));
    let module = dir.join("node_modules").join("sandcell-greet");
    std::fs::create_dir_all(&module).unwrap();
    std::fs::write(
        module.join("index.js"),
        "module.exports = (name) => 'hello ' + name;\n",
    )
    .unwrap();
    let dir_js = serde_json::to_string(dir.to_str().unwrap()).unwrap();
    let by_path = serde_json::to_string(module.to_str().unwrap()).unwrap();
    assert_eq!(
        value(&mut k, &format!("require({by_path})('path')")).as_deref(),
        Some("'hello path'")
    );
    // `require` resolves from the working directory (as /workspace in a sandbox).
    assert_eq!(
        value(
            &mut k,
            &format!("process.chdir({dir_js}); require('sandcell-greet')('cwd')")
        )
        .as_deref(),
        Some("'hello cwd'")
    );
    assert_eq!(
        value(
            &mut k,
            "require.resolve('sandcell-greet').endsWith('index.js')"
        )
        .as_deref(),
        Some("true")
    );
    // Dynamic import() works too.
    assert_eq!(
        value(&mut k, "const os = await import('node:os'); typeof os.cpus").as_deref(),
        Some("'function'")
    );
    // The usual globals are there.
    assert_eq!(
        value(
            &mut k,
            "[typeof setTimeout, typeof setImmediate, typeof queueMicrotask, typeof URL, \
             typeof TextEncoder, typeof Buffer, typeof process.pid, typeof module.exports, \
             typeof __dirname, global === globalThis].join()"
        )
        .as_deref(),
        Some("'function,function,function,function,function,function,number,object,string,true'")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_show_the_users_frames_only() {
    let mut k = start();
    let ev = k.execute("function boom() {\n  throw new TypeError('bad')\n}\nboom()");
    assert_eq!(done(&ev)["status"], "error");
    let err = error_of(&ev);
    assert_eq!(err["ename"], "TypeError");
    assert_eq!(err["evalue"], "bad");
    let tb = traceback(&err);
    let n = done(&ev)["execution_count"].as_u64().unwrap();
    assert_eq!(
        tb,
        vec![
            "TypeError: bad".to_string(),
            format!("    at boom (<cell {n}>:2:9)"),
            format!("    at <cell {n}>:4:1"),
        ]
    );
    // A frame in an earlier cell keeps that cell's name and position.
    let ev = k.execute("  boom()");
    let tb = traceback(&error_of(&ev)).join("\n");
    assert!(tb.contains(&format!("at boom (<cell {n}>:2:9)")), "{tb}");
    assert!(tb.contains(&format!("<cell {}>:1:3", n + 1)), "{tb}");
    // After an await, and with a rewritten declaration on the line.
    let ev = k.execute("await null\nconst v = null.x");
    let err = error_of(&ev);
    assert_eq!(err["ename"], "TypeError");
    let tb = traceback(&err).join("\n");
    assert!(tb.contains(&format!("<cell {}>:2:16", n + 2)), "{tb}");
    for bad in ["[eval]", "node:vm", "node:internal", "kernel"] {
        assert!(!tb.contains(bad), "{bad} in {tb}");
    }
    // Thrown non-errors.
    let ev = k.execute("throw 'plain'");
    let err = error_of(&ev);
    assert_eq!(err["ename"], "Error");
    assert_eq!(err["evalue"], "plain");
    // An error thrown by a timer while the cell awaits fails the cell.
    let ev = k.execute("await new Promise(() => setTimeout(() => { null.y }, 5))");
    assert_eq!(done(&ev)["status"], "error");
    assert_eq!(error_of(&ev)["ename"], "TypeError");
    // State is intact.
    assert_eq!(value(&mut k, "typeof boom").as_deref(), Some("'function'"));
}

#[test]
fn syntax_errors() {
    let mut k = start();
    let ev = k.execute("let ok = 1\nfoo bar");
    assert_eq!(done(&ev)["status"], "error");
    let err = error_of(&ev);
    assert_eq!(err["ename"], "SyntaxError");
    let tb = traceback(&err);
    assert!(
        tb[0].starts_with("<cell ") && tb[0].ends_with(":2"),
        "{tb:?}"
    );
    assert!(tb.contains(&"foo bar".to_string()), "{tb:?}");
    assert!(tb.last().unwrap().starts_with("SyntaxError: "), "{tb:?}");
    // Nothing of the failed cell ran.
    assert_eq!(value(&mut k, "typeof ok").as_deref(), Some("'undefined'"));
    // In a cell with top-level await too.
    let ev = k.execute("await 1\nlet = = 2");
    assert_eq!(error_of(&ev)["ename"], "SyntaxError");
    let ev = k.execute("await foo(");
    assert_eq!(error_of(&ev)["ename"], "SyntaxError");
}

#[test]
fn interrupt_a_busy_loop_keeps_state() {
    let mut k = start();
    ok(&mut k, "let keep = 7");
    let ev = interrupted(
        &mut k,
        "console.log('spinning'); let i = 0; while (true) { i++ }",
    );
    assert_eq!(stream(&ev, "stdout"), "spinning\n");
    assert_eq!(done(&ev)["status"], "interrupted", "{ev:?}");
    assert_eq!(error_of(&ev)["ename"], "Interrupted");
    assert_eq!(value(&mut k, "keep").as_deref(), Some("7"));
    assert_eq!(value(&mut k, "i > 0").as_deref(), Some("true"));
}

#[test]
fn interrupt_a_pending_await_keeps_state() {
    let mut k = start();
    ok(&mut k, "const kept = 'yes'");
    let ev = interrupted(
        &mut k,
        "console.log('waiting'); await new Promise(() => {})",
    );
    assert_eq!(done(&ev)["status"], "interrupted", "{ev:?}");
    assert_eq!(error_of(&ev)["ename"], "Interrupted");
    assert_eq!(stream(&ev, "stdout"), "waiting\n");
    assert_eq!(value(&mut k, "kept").as_deref(), Some("'yes'"));
}

#[test]
fn sigint_while_idle_is_ignored() {
    let mut k = start();
    ok(&mut k, "let alive = true");
    k.interrupt();
    std::thread::sleep(Duration::from_millis(200));
    assert!(k.child.try_wait().unwrap().is_none(), "kernel exited");
    assert_eq!(value(&mut k, "alive").as_deref(), Some("true"));
}

#[test]
fn huge_output_is_truncated_quickly() {
    let mut k = start();
    let t = Instant::now();
    let ev = ok(
        &mut k,
        "const chunk = 'x'.repeat(1 << 20); for (let i = 0; i < 100; i++) console.log(chunk); 'end'",
    );
    let elapsed = t.elapsed();
    let out = stream(&ev, "stdout");
    let marker = "\n[sandcell: output truncated after 1048576 bytes]\n";
    assert!(
        out.ends_with(marker),
        "{}",
        &out[out.len().saturating_sub(100)..]
    );
    assert_eq!(out.len(), 1048576 + marker.len());
    let dropped = done(&ev)["dropped"]["stdout"].as_u64().unwrap();
    assert_eq!(dropped, 100 * (1048576 + 1) - 1048576);
    assert_eq!(done(&ev)["dropped"]["stderr"], 0);
    assert_eq!(result_text(&ev).as_deref(), Some("'end'"));
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    // The next execution starts from zero.
    let ev = ok(&mut k, "console.log('small')");
    assert_eq!(stream(&ev, "stdout"), "small\n");
    assert_eq!(done(&ev)["dropped"], json!({"stdout": 0, "stderr": 0}));
}

#[test]
fn stream_limit_from_the_environment() {
    let mut k = Kernel::start_with(Node, &[("SANDCELL_STREAM_LIMIT", "100")]);
    let ev = ok(
        &mut k,
        "for (let i = 0; i < 50; i++) console.log('0123456789'); console.error('é'.repeat(60))",
    );
    let marker = "\n[sandcell: output truncated after 100 bytes]\n";
    let out = stream(&ev, "stdout");
    assert_eq!(
        out,
        format!("{}{marker}", &"0123456789\n".repeat(10)[..100])
    );
    // stderr is cut at a character boundary: 50 two-byte characters.
    let err = stream(&ev, "stderr");
    assert_eq!(err, format!("{}{marker}", "é".repeat(50)));
    let n_marker = of_type(&ev, "stream")
        .iter()
        .filter(|e| e["text"] == marker)
        .count();
    assert_eq!(n_marker, 2);
    assert_eq!(
        done(&ev)["dropped"],
        json!({"stdout": 550 - 100, "stderr": 121 - 100})
    );
}

#[test]
fn output_of_background_work_goes_to_the_next_execution() {
    let mut k = start();
    let ev = ok(&mut k, "setTimeout(() => console.log('later'), 10); 1");
    assert_eq!(stream(&ev, "stdout"), "");
    std::thread::sleep(Duration::from_millis(100));
    let ev = ok(&mut k, "2");
    assert_eq!(stream(&ev, "stdout"), "later\n");
    // An error thrown by a timer between executions does not kill the kernel.
    ok(&mut k, "setTimeout(() => { throw new Error('bg') }, 10)");
    std::thread::sleep(Duration::from_millis(100));
    let ev = ok(&mut k, "3");
    assert!(
        stream(&ev, "stderr").starts_with("Uncaught Error: bg"),
        "{ev:?}"
    );
}

#[test]
fn variables() {
    let mut k = start();
    ok(
        &mut k,
        "a = 1; s = 'x'; obj = { k: [1, 2, { z: null }], t: true }; fn = () => 1; nan = NaN; \
         m = new Map([[1, 2]]); cyc = {}; cyc.self = cyc; _hidden = 3; big = 10n\n\
         const fs = require('fs')\nlet lex = 5",
    );
    let list = k.call(json!({"op": "list_vars"}));
    let vars: Vec<(String, String, bool)> = list["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["type"].as_str().unwrap().to_string(),
                v["json"].as_bool().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("a", "number", true),
        ("big", "bigint", false),
        ("cyc", "Object", false),
        ("fn", "function", false),
        ("lex", "number", true),
        ("m", "Map", false),
        ("nan", "number", false),
        ("obj", "Object", true),
        ("s", "string", true),
    ];
    let expected: Vec<(String, String, bool)> = expected
        .iter()
        .map(|(n, t, j)| (n.to_string(), t.to_string(), *j))
        .collect();
    assert_eq!(vars, expected);

    let all = k.call(json!({"op": "get_vars", "names": null}));
    assert_eq!(
        all["values"],
        json!({"a": 1, "s": "x", "obj": {"k": [1, 2, {"z": null}], "t": true}, "lex": 5})
    );
    let unrep = &all["unrepresentable"];
    assert_eq!(unrep["fn"]["type"], "function");
    assert_eq!(unrep["nan"], json!({"type": "number", "repr": "NaN"}));
    assert_eq!(
        unrep["m"],
        json!({"type": "Map", "repr": "Map(1) { 1 => 2 }"})
    );
    assert!(unrep["cyc"]["repr"].as_str().unwrap().contains("Circular"));
    assert_eq!(all["missing"], json!([]));

    let some = k.call(json!({"op": "get_vars", "names": ["a", "nope", "_hidden"]}));
    assert_eq!(some["values"], json!({"a": 1, "_hidden": 3}));
    assert_eq!(some["missing"], json!(["nope"]));

    let set = k.call(json!({"op": "set_vars", "values": {"x": 2, "cfg": {"a": [1, 2]}}}));
    assert_eq!(set["set"], json!(["cfg", "x"]));
    assert_eq!(
        value(
            &mut k,
            "[cfg.a.length + x, Array.isArray(cfg.a), cfg.a instanceof Array, \
             Object.getPrototypeOf(cfg) === Object.prototype]"
        )
        .as_deref(),
        Some("[ 4, true, true, true ]")
    );
    for bad in ["1x", "class", "a-b", "", "let"] {
        let r = k.call(json!({"op": "set_vars", "values": {bad: 1}}));
        assert!(r["error"].is_string(), "{bad}: {r}");
    }
    // A long repr is capped.
    ok(
        &mut k,
        "long = new Set(Array.from({ length: 5000 }, (_, i) => i))",
    );
    let r = k.call(json!({"op": "get_vars", "names": ["long"]}));
    assert!(
        r["unrepresentable"]["long"]["repr"]
            .as_str()
            .unwrap()
            .chars()
            .count()
            <= 1000
    );

    let cleared = k.call(json!({"op": "clear_vars", "names": ["x", "console", "nope"]}));
    assert_eq!(cleared["cleared"], json!(["x"]));
    assert_eq!(value(&mut k, "typeof x").as_deref(), Some("'undefined'"));
    k.call(json!({"op": "clear_vars", "names": null}));
    let list = k.call(json!({"op": "list_vars"}));
    assert_eq!(list["variables"], json!([]));
    // Built-ins survive, and names can be declared again.
    assert_eq!(
        value(&mut k, "const lex = 'again'; typeof console.log + lex").as_deref(),
        Some("'functionagain'")
    );
}

/// What this process's descriptors point at (`pipe:[123]`, ...).
fn fd_targets() -> std::collections::HashSet<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn kernel_pipes_stay_away_from_user_processes() {
    let before = fd_targets();
    let mut k = start();
    // The pipes the harness made for this kernel (and maybe for kernels of parallel tests).
    let harness: Vec<String> = fd_targets()
        .difference(&before)
        .filter(|t| t.starts_with("pipe:"))
        .cloned()
        .collect();
    assert!(harness.len() >= 2, "{harness:?}");
    // What a process started by user code holds.
    let ev = ok(
        &mut k,
        "require('child_process').execFileSync('/bin/sh', ['-c', \
         'cd /proc/$$/fd && for f in *; do readlink \"$f\" || true; done']).toString()",
    );
    let child = result_text(&ev).unwrap();
    for t in &harness {
        assert!(!child.contains(t.as_str()), "{t} leaked: {child}");
    }
    assert_eq!(
        value(
            &mut k,
            "[process.env.SANDCELL_KERNEL_CTL_FD, process.env.SANDCELL_KERNEL_EVENT_FD, \
             process.execArgv.length]"
        )
        .as_deref(),
        Some("[ undefined, undefined, 0 ]")
    );
}

#[test]
fn is_complete() {
    let mut k = start();
    let cases = [
        ("x = 1", "complete"),
        ("function f() { return 1 }", "complete"),
        ("await Promise.resolve(1)", "complete"),
        ("if (x) {", "incomplete"),
        ("foo(1,", "incomplete"),
        ("const s = `abc", "incomplete"),
        ("/* open comment", "incomplete"),
        ("x = ", "incomplete"),
        ("const r = await", "incomplete"),
        ("foo bar", "invalid"),
        ("x = )", "invalid"),
        ("'unterminated", "invalid"),
        ("}", "invalid"),
    ];
    for (code, want) in cases {
        let r = k.call(json!({"op": "is_complete", "code": code}));
        assert_eq!(r["status"], want, "{code}: {r}");
    }
}

#[test]
fn execution_count_and_unknown_requests() {
    let mut k = start();
    assert_eq!(done(&ok(&mut k, "1"))["execution_count"], 1);
    assert_eq!(
        done(&k.execute("throw new Error('x')"))["execution_count"],
        2
    );
    assert_eq!(done(&k.execute("syntax error here"))["execution_count"], 3);
    assert_eq!(done(&ok(&mut k, ""))["execution_count"], 4);
    let r = k.call(json!({"op": "frobnicate"}));
    assert!(r["error"].is_string(), "{r}");
    assert_eq!(done(&ok(&mut k, "5"))["execution_count"], 5);
}

#[test]
fn timings() {
    let t = Instant::now();
    let mut k = start();
    let ready = t.elapsed();
    let mut round_trip = |code: &str| {
        for _ in 0..20 {
            ok(&mut k, code);
        }
        let n: u32 = 200;
        let t = Instant::now();
        for _ in 0..n {
            k.execute(code);
        }
        t.elapsed() / n
    };
    let simple = round_trip("x = 1");
    // A cell that calls something runs under the SIGINT watchdog.
    let call = round_trip("y = Math.max(x, 2)");
    eprintln!(
        "node kernel: ready after {ready:?}; round trip `x = 1` {simple:?}, \
         `y = Math.max(x, 2)` {call:?}"
    );
    assert!(ready < Duration::from_secs(5), "{ready:?}");
    assert!(simple < Duration::from_millis(20), "{simple:?}");
    assert!(call < Duration::from_millis(20), "{call:?}");
}
