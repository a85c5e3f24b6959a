//! Durable agent runs through a real daemon, end to end: a snapshot of the sandbox at each
//! step that changed it, and `kill -9` of the daemon in the middle of a run (during a model
//! call, during a tool call), after which the restarted daemon resumes the run to the same
//! answer, each model answer paid once and each step's effect on the sandbox made once.

use std::time::Duration;

use sandcell_testkit::llm::{Script, Turn};
use serde_json::Value;

use super::daemon::{CodeResultExt, Daemon, wait_for};
use super::runs_api::{MODEL, Model, code_call, slow, wait_for_event};

/// The run's events as stored.
fn events(d: &Daemon, run: &str) -> Vec<Value> {
    let r = d.get(&format!("/v1/runs/{run}/events?format=json"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["events"].as_array().cloned().unwrap_or_default()
}

/// Waits for run `run` to end; its record.
fn ended(d: &Daemon, run: &str) -> Value {
    wait_for(Duration::from_secs(120), || {
        let r = d.get(&format!("/v1/runs/{run}"));
        (r.body["status"] != "running").then_some(r.body)
    })
    .unwrap_or_else(|| panic!("run {run} did not end:\n{}", d.log()))
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// Numbered 1, 2, 3, … without a gap or a repeat, across the restart.
fn contiguous(events: &[Value]) {
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
}

fn start(d: &Daemon) -> String {
    let r = d.post(
        "/v1/runs",
        serde_json::json!({"task": "Set x to 21, then double it.", "model": MODEL}),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

#[test]
fn a_run_killed_during_a_model_call_resumes_and_asks_only_that_call_again() {
    sandcell_testkit::skip_unless_root!();
    let model = Model::start(Script::new().turns([
        code_call("x = 21\nprint('SET', x)"),
        // Step 2's first ask: the daemon dies while it waits.
        slow(60_000, "never read"),
        code_call("print('DOUBLE', x * 2)"),
        Turn::text("the answer is 42"),
    ]));
    let mut d = model.daemon();
    let run = start(&d);
    wait_for(Duration::from_secs(60), || {
        (model.llm.requests().len() >= 2).then_some(())
    })
    .expect("step 2's request");
    d.kill9();
    d.restart(&[&format!(
        "agent.openai.base_url={}",
        model.llm.openai_base()
    )]);
    let info = ended(&d, &run);
    assert_eq!(info["status"], "succeeded", "{info}\n{}", d.log());
    assert_eq!(info["answer"], "the answer is 42");

    let requests = model.llm.requests();
    assert_eq!(
        requests.len(),
        4,
        "step 1, step 2 twice (unanswered once), step 3"
    );
    // Step 1 was asked once; step 2 again with the same conversation.
    assert_eq!(requests[1].messages().len(), requests[2].messages().len());
    assert!(requests[0].messages().len() < requests[1].messages().len());
    let events = events(&d, &run);
    contiguous(&events);
    let results: Vec<&str> = of_type(&events, "tool_result")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    // The kernel kept x from step 1 across the restart.
    assert!(
        results.iter().any(|t| t.contains("DOUBLE 42")),
        "{results:?}"
    );
    let resumed = of_type(&events, "resumed");
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["after_step"], 1);
    assert_eq!(resumed[0]["reused_response"], false);
    // Step 1 ran code: its snapshot is recorded.
    let step1 = of_type(&events, "step_committed")[0];
    assert!(
        step1["snapshot"]["snapshot_id"].as_str().is_some(),
        "{step1}"
    );
    assert_eq!(events.last().unwrap()["type"], "run_finished");
}

#[test]
fn a_run_killed_during_a_tool_call_reruns_it_once_on_the_restored_sandbox() {
    sandcell_testkit::skip_unless_root!();
    let model = Model::start(Script::new().turns([
        code_call("x = 21"),
        // Appends a line, then runs long enough for the daemon to be killed.
        code_call(
            "import time\nopen('log.txt', 'a').write('line\\n')\ntime.sleep(4)\nprint('slept')",
        ),
        code_call("print('LINES', open('log.txt').read().count('line'), 'X', x)"),
        Turn::text("done"),
    ]));
    let mut d = model.daemon();
    let run = start(&d);
    // In step 2's cell.
    wait_for(Duration::from_secs(60), || {
        let e = events(&d, &run);
        (of_type(&e, "tool_call").len() >= 2).then_some(())
    })
    .expect("step 2's tool call");
    std::thread::sleep(Duration::from_millis(1500));
    d.kill9();
    d.restart(&[&format!(
        "agent.openai.base_url={}",
        model.llm.openai_base()
    )]);
    let info = ended(&d, &run);
    assert_eq!(info["status"], "succeeded", "{info}\n{}", d.log());
    // Each step's answer was asked for once: step 2's was recorded and reused.
    assert_eq!(model.llm.requests().len(), 4);
    let events = events(&d, &run);
    contiguous(&events);
    let resumed = of_type(&events, "resumed");
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["reused_response"], true, "{}", resumed[0]);
    assert_eq!(resumed[0]["rerun_tool_calls"], 1, "{}", resumed[0]);
    assert!(
        resumed[0]["restored_from"].as_str().is_some(),
        "{}",
        resumed[0]
    );
    // The line was written once: the restored sandbox did not keep the killed call's.
    let results: Vec<&str> = of_type(&events, "tool_result")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        results.iter().any(|t| t.contains("LINES 1 X 21")),
        "{results:?}"
    );
    // The run's sandbox is the restored one, and the old one is gone with the run.
    assert_eq!(
        info["sandbox_id"].as_str(),
        resumed[0]["sandbox_id"].as_str()
    );
    let _ = wait_for_event;
}

#[test]
fn a_fork_from_step_2_sees_step_2s_state_and_leaves_the_original_alone() {
    sandcell_testkit::skip_unless_root!();
    let model = Model::start(Script::new().turns([
        code_call("x = 1"),
        code_call("x = 2"),
        code_call("x = 3"),
        Turn::text("original done"),
        // The fork, through the CLI.
        code_call("print('X IS', x)"),
        Turn::text("fork done"),
        // A run whose earlier step snapshots are pruned at its end.
        code_call("y = 1"),
        code_call("y = 2"),
        Turn::text("pruned"),
    ]));
    let d = model.daemon();
    let r = d.post(
        "/v1/runs",
        // All its step snapshots kept, so it can be forked from any step after its end.
        serde_json::json!({"task": "Count.", "model": MODEL, "wait": true, "keep_sandbox": true, "keep_snapshots": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let run = r.body["id"].as_str().unwrap().to_string();
    let original_sandbox = r.body["sandbox_id"].as_str().unwrap().to_string();
    let before = events(&d, &run);
    // Three code steps, each with its snapshot.
    let commits = of_type(&before, "step_committed");
    assert_eq!(commits.len(), 3);
    assert!(
        commits
            .iter()
            .all(|c| c["snapshot"]["snapshot_id"].is_string())
    );

    let out = std::process::Command::new(super::common::BIN)
        .args([
            "runs",
            "fork",
            &run,
            "--from-step",
            "2",
            "--task",
            "Print x.",
            "--json",
        ])
        .env("SANDCELL_HOME", d.home())
        .env_remove("SANDCELL_API_URL")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let fork: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fork["answer"], "fork done");
    let fork_id = fork["run_id"].as_str().unwrap();
    let fork_events = events(&d, fork_id);
    contiguous(&fork_events);
    let printed: Vec<&str> = of_type(&fork_events, "tool_result")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    // Step 2's x, not step 3's.
    assert!(printed.iter().any(|t| t.contains("X IS 2")), "{printed:?}");
    let forked = of_type(&fork_events, "forked")[0];
    assert_eq!(
        (&forked["from_run_id"], &forked["from_step"]),
        (&serde_json::json!(run), &serde_json::json!(2))
    );
    // The fork's model saw the original's history up to step 2 and the new instruction.
    let asked = model.llm.requests();
    let history = asked[4].messages();
    let tool_results = history.iter().filter(|m| m["role"] == "tool").count();
    assert_eq!(tool_results, 2, "steps 1 and 2 only: {history:?}");
    assert!(history.iter().any(|m| m.to_string().contains("x = 2")));
    assert!(!history.iter().any(|m| m.to_string().contains("x = 3")));
    assert!(asked[4].transcript().contains("Print x."));
    let info = d.get(&format!("/v1/runs/{fork_id}"));
    assert_eq!(info.body["forked_from"]["run_id"], run.as_str());

    // The original is as it was, its sandbox too.
    assert_eq!(events(&d, &run), before);
    assert_eq!(d.code(&original_sandbox, "x").plain(), "3");

    // A sandbox at step 1, without a run.
    let r = d.post(
        &format!("/v1/runs/{run}/steps/1/sandbox"),
        serde_json::json!({}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let at1 = r.body["sandbox_id"].as_str().unwrap();
    assert_eq!(d.code(at1, "x").plain(), "1");

    // Bad input and other owners.
    d.post(
        &format!("/v1/runs/{run}/fork"),
        serde_json::json!({"from_step": 9}),
    )
    .expect_error(400, "invalid_argument");
    d.post(
        &format!("/v1/runs/{run}/fork"),
        serde_json::json!({"from_step": 1, "colour": 1}),
    )
    .expect_error(400, "invalid_argument");
    let (bob, _) = d.key_for("bob");
    for path in [
        format!("/v1/runs/{run}/fork"),
        format!("/v1/runs/{run}/steps/1/sandbox"),
        format!("/v1/runs/{run}/resume"),
    ] {
        d.call_as(
            Some(&bob),
            reqwest::Method::POST,
            &path,
            Some(serde_json::json!({"from_step": 1})),
        )
        .expect_error(404, "not_found");
    }
    // An ended run is not resumed.
    d.post(&format!("/v1/runs/{run}/resume"), serde_json::json!({}))
        .expect_error(409, "invalid_state");

    // Pruned: the last step's snapshot stays, the earlier ones go, and a fork from one of
    // them says why it cannot be.
    let r = d.post(
        "/v1/runs",
        serde_json::json!({"task": "Again.", "model": MODEL, "wait": true}),
    );
    let pruned = r.body["id"].as_str().unwrap().to_string();
    let _ = d.post(
        "/v1/runs",
        serde_json::json!({"task": "noop", "model": MODEL, "wait": true}),
    );
    let commits = of_type(&events(&d, &pruned), "step_committed")
        .iter()
        .map(|c| c["snapshot"]["snapshot_id"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert_eq!(commits.len(), 2);
    assert_eq!(d.get(&format!("/v1/snapshots/{}", commits[0])).status, 404);
    assert_eq!(d.get(&format!("/v1/snapshots/{}", commits[1])).status, 200);
    let r = d.post(
        &format!("/v1/runs/{pruned}/fork"),
        serde_json::json!({"from_step": 1}),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.to_string().contains("pruned"), "{}", r.body);
}

#[test]
fn a_thread_goes_on_after_a_restart_with_its_conversation_and_its_kernel() {
    sandcell_testkit::skip_unless_root!();
    let model = Model::start(Script::new().turns([
        code_call("x = 41"),
        Turn::text("x is set"),
        code_call("print('X', x + 1)"),
        Turn::text("42"),
    ]));
    let mut d = model.daemon();
    let r = d.post("/v1/threads", serde_json::json!({"name": "work"}));
    assert_eq!(r.status, 201, "{}", r.body);
    let thread = r.body["id"].as_str().unwrap().to_string();
    let run = |d: &Daemon, task: &str| {
        let r = d.post(
            "/v1/runs",
            serde_json::json!({"task": task, "model": MODEL, "thread_id": thread, "wait": true}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["status"], "succeeded", "{}", r.body);
        r.body
    };
    let first = run(&d, "Set x to 41.");
    let sandbox = first["sandbox_id"].as_str().unwrap().to_string();

    // The daemon dies; the thread, its sandbox and its kernel are there after the restart.
    d.kill9();
    d.restart(&[&format!(
        "agent.openai.base_url={}",
        model.llm.openai_base()
    )]);
    let second = run(&d, "Add one to x.");
    assert_eq!(second["answer"], "42");
    assert_eq!(second["sandbox_id"].as_str(), Some(sandbox.as_str()));
    let results: Vec<String> = of_type(&events(&d, second["id"].as_str().unwrap()), "tool_result")
        .iter()
        .filter_map(|e| e["text"].as_str().map(str::to_string))
        .collect();
    assert!(results.iter().any(|t| t.contains("X 42")), "{results:?}");
    // The model saw the first run's conversation and answer before the new task.
    let asked = model.llm.requests();
    let transcript = asked[2].transcript();
    let (set, answered, added) = (
        transcript.find("Set x to 41."),
        transcript.find("x is set"),
        transcript.find("Add one to x."),
    );
    assert!(
        set < answered && answered < added && set.is_some(),
        "{transcript}"
    );

    let t = d.get(&format!("/v1/threads/{thread}"));
    assert_eq!(t.body["runs"], 2, "{}", t.body);
    assert_eq!(t.body["last_run_id"], second["id"]);
    assert_eq!(t.body["sandbox_id"].as_str(), Some(sandbox.as_str()));
    let r = d.call(
        reqwest::Method::PATCH,
        &format!("/v1/threads/{thread}"),
        Some(serde_json::json!({"name": "renamed"})),
    );
    assert_eq!(r.body["name"], "renamed", "{}", r.body);
    let list = d.get("/v1/threads");
    assert_eq!(list.body["threads"].as_array().map(Vec::len), Some(1));
    // Bad input, other owners.
    d.post("/v1/threads", serde_json::json!({"name": "renamed"}))
        .expect_error(409, "already_exists");
    d.post("/v1/threads", serde_json::json!({"name": ""}))
        .expect_error(400, "invalid_argument");
    d.post(
        "/v1/runs",
        serde_json::json!({"task": "t", "model": MODEL, "thread_id": "th-0123456789abcdef"}),
    )
    .expect_error(404, "not_found");
    let (bob, _) = d.key_for("bob");
    d.call_as(
        Some(&bob),
        reqwest::Method::GET,
        &format!("/v1/threads/{thread}"),
        None,
    )
    .expect_error(404, "not_found");
    // Deleted with its sandbox; its runs stay.
    let r = d.call(
        reqwest::Method::DELETE,
        &format!("/v1/threads/{thread}"),
        None,
    );
    assert_eq!(r.status, 204, "{}", r.body);
    let state = d.sandbox(&sandbox).state;
    assert!(state == "stopped" || state == "deleted", "{state}");
    assert_eq!(
        d.get(&format!("/v1/runs/{}", second["id"].as_str().unwrap()))
            .status,
        200
    );
}

/// A repl-mode reply: one python block.
fn block(code: &str) -> Turn {
    Turn::text(format!("```python\n{code}\n```"))
}

#[test]
fn a_repl_run_killed_during_a_cell_resumes_on_the_restored_sandbox_with_its_kernel() {
    sandcell_testkit::skip_unless_root!();
    let model = Model::start(Script::new().turns([
        block("x = len(context)\nopen('log.txt', 'a').write('a\\n')"),
        // Appends a line, then runs long enough for the daemon to be killed.
        block("import time\nopen('log.txt', 'a').write('b\\n')\ntime.sleep(4)\nprint('slept')"),
        block("print('LINES', open('log.txt').read().count('\\n'), 'X', x, context[:5])"),
        Turn::text("FINAL(done)"),
    ]));
    let mut d = model.daemon();
    let r = d.post(
        "/v1/runs",
        serde_json::json!({"task": "Measure the input.", "mode": "repl", "context": "HELLO world", "model": MODEL}),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let run = r.body["id"].as_str().unwrap().to_string();
    // In step 2's cell.
    wait_for(Duration::from_secs(60), || {
        let e = events(&d, &run);
        (of_type(&e, "tool_call").len() >= 2).then_some(())
    })
    .expect("step 2's code block");
    std::thread::sleep(Duration::from_millis(1500));
    d.kill9();
    d.restart(&[&format!(
        "agent.openai.base_url={}",
        model.llm.openai_base()
    )]);
    let info = ended(&d, &run);
    assert_eq!(info["status"], "succeeded", "{info}\n{}", d.log());
    assert_eq!(info["answer"], "done");
    // Each step's answer was asked for once: step 2's was recorded and reused.
    let requests = model.llm.requests();
    assert_eq!(requests.len(), 4);
    // After the restart the model saw the same conversation it would have: the input's
    // description first, then steps 1 and 2.
    assert!(requests[2].transcript().contains("HELLO world"));
    assert!(requests[2].transcript().contains("Output of code block 1"));
    let events = events(&d, &run);
    contiguous(&events);
    let resumed = of_type(&events, "resumed");
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["reused_response"], true, "{}", resumed[0]);
    assert_eq!(resumed[0]["rerun_tool_calls"], 1, "{}", resumed[0]);
    assert!(resumed[0]["restored_from"].is_string(), "{}", resumed[0]);
    // The kernel came back with the snapshot: the same context, with `x` and `context`.
    let kernels = of_type(&events, "kernel_ready");
    assert_eq!(kernels.len(), 2, "{kernels:?}");
    assert_eq!(kernels[0]["context_id"], kernels[1]["context_id"]);
    assert_eq!(kernels[1]["fresh"], false);
    let results: Vec<&str> = of_type(&events, "tool_result")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    // Two lines: step 1's and step 2's once (the killed cell's line went with its sandbox).
    assert!(
        results.iter().any(|t| t.contains("LINES 2 X 11 HELLO")),
        "{results:?}"
    );
    assert_eq!(events.last().unwrap()["type"], "run_finished");
}

#[test]
fn a_repl_run_forked_from_step_1_has_step_1s_variables_and_its_input() {
    sandcell_testkit::skip_unless_root!();
    let model = Model::start(Script::new().turns([
        block("x = 1"),
        block("x = 2"),
        Turn::text("original done"),
        // The fork.
        block("print('X IS', x, 'INPUT', context)"),
        Turn::text("fork done"),
    ]));
    let d = model.daemon();
    let r = d.post(
        "/v1/runs",
        serde_json::json!({"task": "Count.", "mode": "repl", "context": "the input", "model": MODEL, "wait": true, "keep_snapshots": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let run = r.body["id"].as_str().unwrap().to_string();
    let before = events(&d, &run);
    let r = d.post(
        &format!("/v1/runs/{run}/fork"),
        serde_json::json!({"from_step": 1, "task": "Print x.", "wait": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["answer"], "fork done", "{}", r.body);
    assert_eq!(r.body["mode"], "repl", "{}", r.body);
    let fork = r.body["id"].as_str().unwrap().to_string();
    let fork_events = events(&d, &fork);
    contiguous(&fork_events);
    let printed: Vec<&str> = of_type(&fork_events, "tool_result")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        printed.iter().any(|t| t.contains("X IS 1 INPUT the input")),
        "{printed:?}"
    );
    // The fork's model saw the input's description, step 1 (not step 2) and the new task.
    let asked = model.llm.requests();
    let transcript = asked[3].transcript();
    assert!(transcript.contains("the input"), "{transcript}");
    assert!(transcript.contains("x = 1") && !transcript.contains("x = 2"));
    assert!(transcript.contains("Print x."));
    assert_eq!(events(&d, &run), before, "the original is not changed");
}
