//! Host calls in the Python kernel (PROTOCOL.md "Host calls"): the test stands in for the
//! agent, reading `host_call` events and writing `host_reply` lines.

use sandcell_protocol::Language::Python;
use serde_json::{Value, json};

use crate::common::*;

/// The next event of execution `id`, which must be a host call; returns it.
fn host_call(k: &mut Kernel, id: u64) -> Value {
    let ev = k.next_event();
    assert_eq!(ev["type"], "host_call", "{ev}");
    assert_eq!(ev["id"], json!(id), "{ev}");
    ev
}

fn reply(k: &mut Kernel, id: u64, call: &Value, answer: Value) {
    let mut line = json!({"op": "host_reply", "id": id, "call": call["call"]});
    for (key, v) in answer.as_object().expect("an object").clone() {
        line[key] = v;
    }
    k.send_raw(format!("{line}\n").as_bytes());
}

#[test]
fn a_call_blocks_until_its_reply_and_returns_the_answer() {
    let mut k = Kernel::start(Python);
    let id = k.send(json!({"op": "execute", "code": "a = llm_query('2+2?')\nb = llm_query_batched(['x', 'y'])\n(a, b)"}));
    let call = host_call(&mut k, id);
    assert_eq!(call["method"], "llm_query");
    assert_eq!(call["payload"], json!({"prompt": "2+2?"}));
    reply(&mut k, id, &call, json!({"ok": "4"}));
    let batch = host_call(&mut k, id);
    assert_eq!(batch["method"], "llm_query_batched");
    assert_eq!(batch["payload"], json!({"prompts": ["x", "y"]}));
    assert_ne!(batch["call"], call["call"], "calls are numbered apart");
    reply(&mut k, id, &batch, json!({"ok": ["X", "Y"]}));
    let ev = k.collect(id);
    assert_eq!(done(&ev)["status"], "ok", "{ev:?}");
    assert_eq!(result_text(&ev).as_deref(), Some("('4', ['X', 'Y'])"));
    // The functions are builtins, not the user's variables.
    let names = k.call(json!({"op": "list_vars"}));
    let listed: Vec<&str> = names["variables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(listed, ["a", "b"]);
}

#[test]
fn error_answers_raise_exceptions_of_their_kind() {
    let mut k = Kernel::start(Python);
    for (kind, ename) in [
        ("budget", "SandcellBudgetError"),
        ("cancelled", "SandcellCancelledError"),
        ("unavailable", "SandcellHostCallError"),
    ] {
        let id = k.send(json!({"op": "execute", "code": "llm_query('q')"}));
        let call = host_call(&mut k, id);
        reply(
            &mut k,
            id,
            &call,
            json!({"error": {"kind": kind, "message": "the run's sub-call budget is spent (budget:sub_calls)"}}),
        );
        let ev = k.collect(id);
        let err = of_type(&ev, "error")[0];
        assert_eq!(err["ename"], ename, "{err}");
        assert_eq!(
            err["evalue"],
            "llm_query: the run's sub-call budget is spent (budget:sub_calls)"
        );
        // The traceback shows the user's line, not the kernel's machinery.
        let tb = err["traceback"].to_string();
        assert!(tb.contains("<cell") && !tb.contains("_host_call"), "{tb}");
    }
    // Budget and cancellation are host-call errors too, and catchable as such.
    let id = k.send(json!({"op": "execute", "code": "try:\n    llm_query('q')\nexcept SandcellHostCallError as e:\n    caught = (type(e).__name__, e.kind)\ncaught"}));
    let call = host_call(&mut k, id);
    reply(
        &mut k,
        id,
        &call,
        json!({"error": {"kind": "budget", "message": "m"}}),
    );
    let ev = k.collect(id);
    assert_eq!(
        result_text(&ev).as_deref(),
        Some("('SandcellBudgetError', 'budget')")
    );
    // Bad arguments fail before anything is sent.
    let ev = k.execute("llm_query(42)");
    assert_eq!(of_type(&ev, "error")[0]["ename"], "TypeError");
    assert!(of_type(&ev, "host_call").is_empty());
    assert_eq!(
        result_text(&k.execute("llm_query_batched([])")).as_deref(),
        Some("[]")
    );
}

#[test]
fn final_and_final_var_send_the_answer() {
    let mut k = Kernel::start(Python);
    let id = k.send(
        json!({"op": "execute", "code": "answer = 6 * 7\nFINAL_VAR('answer')\nprint('after')"}),
    );
    let call = host_call(&mut k, id);
    assert_eq!(call["method"], "final");
    assert_eq!(call["payload"], json!({"answer": "42"}));
    reply(&mut k, id, &call, json!({"ok": null}));
    let ev = k.collect(id);
    assert_eq!(done(&ev)["status"], "ok");
    // The cell goes on after FINAL: the run ends after the block, not in the middle of it.
    assert_eq!(stream(&ev, "stdout"), "after\n");
    let ev = k.execute("FINAL_VAR('missing')");
    assert_eq!(of_type(&ev, "error")[0]["ename"], "NameError");
    assert!(of_type(&ev, "host_call").is_empty());
}

#[test]
fn an_interrupt_breaks_the_wait_and_a_late_reply_is_ignored() {
    let mut k = Kernel::start(Python);
    k.execute("kept = 1");
    let id = k.send(json!({"op": "execute", "code": "llm_query('slow')"}));
    let call = host_call(&mut k, id);
    k.interrupt();
    let ev = k.collect(id);
    assert_eq!(done(&ev)["status"], "interrupted", "{ev:?}");
    assert_eq!(of_type(&ev, "error")[0]["ename"], "KeyboardInterrupt");
    // The answer comes after all (the agent's "cancelled", or the host's late one): the kernel
    // reads it between executions and ignores it, answering nothing.
    reply(
        &mut k,
        id,
        &call,
        json!({"error": {"kind": "cancelled", "message": "late"}}),
    );
    assert_eq!(result_text(&k.execute("kept + 1")).as_deref(), Some("2"));
    // Host calls work again in the next cell.
    let id = k.send(json!({"op": "execute", "code": "llm_query('again')"}));
    let call = host_call(&mut k, id);
    reply(&mut k, id, &call, json!({"ok": "fine"}));
    assert_eq!(result_text(&k.collect(id)).as_deref(), Some("'fine'"));
}

#[test]
fn threads_waiting_at_once_each_get_their_own_answer() {
    let mut k = Kernel::start(Python);
    let code = "from concurrent.futures import ThreadPoolExecutor\n\
                with ThreadPoolExecutor(4) as pool:\n    \
                    got = list(pool.map(llm_query, ['a', 'b', 'c', 'd']))\n\
                got";
    let id = k.send(json!({"op": "execute", "code": code}));
    let mut calls: Vec<Value> = (0..4).map(|_| host_call(&mut k, id)).collect();
    // Answered in reverse order: each thread must still get the answer to its own prompt.
    calls.reverse();
    for call in &calls {
        let prompt = call["payload"]["prompt"].as_str().unwrap().to_uppercase();
        reply(&mut k, id, call, json!({ "ok": prompt }));
    }
    let ev = k.collect(id);
    assert_eq!(
        result_text(&ev).as_deref(),
        Some("['A', 'B', 'C', 'D']"),
        "{ev:?}"
    );
}

#[test]
fn a_host_call_outside_a_cell_is_refused() {
    let mut k = Kernel::start(Python);
    // A thread still running after its cell ended cannot ask the host.
    k.execute("import threading, time\nout = []\ndef late():\n    time.sleep(0.3)\n    try:\n        llm_query('x')\n    except Exception as e:\n        out.append(type(e).__name__ + ': ' + str(e))\nthreading.Thread(target=late).start()");
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert_eq!(
        result_text(&k.execute("out")).as_deref(),
        Some("['SandcellHostCallError: llm_query works only while a cell runs']")
    );
}

#[test]
fn a_thread_left_waiting_by_its_cell_gets_the_answer_sent_at_the_end() {
    let mut k = Kernel::start(Python);
    let code = "import threading, time\nout = []\ndef ask():\n    try:\n        out.append(llm_query('x'))\n    except Exception as e:\n        out.append(type(e).__name__)\nt = threading.Thread(target=ask)\nt.start()\ntime.sleep(0.3)";
    let id = k.send(json!({"op": "execute", "code": code}));
    let call = host_call(&mut k, id);
    let ev = k.collect(id);
    assert_eq!(done(&ev)["status"], "ok", "{ev:?}");
    // As the agent does at the end of a cell: every call still pending is answered, before
    // the next request.
    reply(
        &mut k,
        id,
        &call,
        json!({"error": {"kind": "cancelled", "message": "the cell ended"}}),
    );
    let ev = k.execute("t.join(5)\nout");
    assert_eq!(
        result_text(&ev).as_deref(),
        Some("['SandcellCancelledError']"),
        "{ev:?}"
    );
    // The pipe is in order: requests go on as before.
    assert_eq!(result_text(&k.execute("1 + 1")).as_deref(), Some("2"));
}
