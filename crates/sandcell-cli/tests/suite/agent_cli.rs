//! `sandcell agent` end to end: the real binary, embedded (no daemon on its home), real
//! sandboxes and kernels, against the test kit's scripted model on loopback speaking the
//! OpenAI and Anthropic wire formats.

use std::path::Path;

use sandcell_testkit::llm::{Fault, Protocol, Script, ScriptedCall, ScriptedLlm, Turn, Usage};
use serde_json::{Value, json};

use super::common::BIN;

const OPENAI_KEY: &str = "sk-test-openai-0123456789abcdef";
const ANTHROPIC_KEY: &str = "sk-ant-test-0123456789abcdef";

/// A 1×1 PNG.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }
}

async fn sandcell(llm: &ScriptedLlm, home: &Path, args: &[&str]) -> Outcome {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("SANDCELL_HOME", home)
        .env("OPENAI_BASE_URL", llm.openai_base())
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .env("ANTHROPIC_BASE_URL", llm.anthropic_base())
        .env("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .output()
        .await
        .expect("run sandcell");
    Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn agent(llm: &ScriptedLlm, home: &Path, model: &str, extra: &[&str]) -> Outcome {
    let mut args = vec!["agent", "--json", "--model", model];
    args.extend_from_slice(extra);
    args.push("Set x to 21 in Python, then double it.");
    sandcell(llm, home, &args).await
}

fn code_call(code: &str) -> Turn {
    Turn::ToolCalls(vec![ScriptedCall::new(
        "execute_code",
        json!({ "code": code }),
    )])
}

/// The three turns of the classic task: set x, double it (state must persist), answer.
fn doubling(answer: Turn) -> Script {
    Script::new()
        .turn(code_call("x = 21\nprint('SET', x)"))
        .turn(code_call("print('DOUBLE', x * 2)"))
        .turn(answer)
}

/// The trajectory as `sandcell logs RUN --json` prints it.
async fn trajectory(llm: &ScriptedLlm, home: &Path, run: &str) -> Vec<Value> {
    let out = sandcell(llm, home, &["logs", run, "--json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_mode_over_openai_streaming_keeps_state_and_counts_the_scripted_usage() {
    let llm = ScriptedLlm::start(doubling(Turn::text("ANSWER: 42")))
        .await
        .expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = agent(&llm, home.path(), "openai/scripted", &[]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["reason"], "text");
    assert_eq!(run["answer"], "ANSWER: 42");
    assert_eq!(
        (
            &run["usage"]["input_tokens"],
            &run["usage"]["output_tokens"]
        ),
        (&json!(300), &json!(30))
    );
    assert_eq!(
        run["usage"]["cost_usd"],
        Value::Null,
        "an unknown price is not $0"
    );

    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    for r in &requests {
        assert_eq!(r.protocol, Protocol::OpenAi);
        assert!(r.stream, "streamed by default");
        assert_eq!(r.body["stream_options"]["include_usage"], true);
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {OPENAI_KEY}").as_str())
        );
        assert!(r.tool_names().contains(&"execute_code".to_string()));
    }
    // The kernel kept x between the two tool calls.
    assert!(requests[2].transcript().contains("DOUBLE 42"));

    let id = run["run_id"].as_str().expect("run id");
    let events = trajectory(&llm, home.path(), id).await;
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(
        seqs,
        (1..=events.len() as u64).collect::<Vec<_>>(),
        "contiguous"
    );
    assert_eq!(events[0]["type"], "run_started");
    assert_eq!(events.last().expect("events")["type"], "run_finished");
    assert_eq!(of_type(&events, "llm_response").len(), 3);
    let results = of_type(&events, "tool_result");
    assert!(
        results[1]["text"]
            .as_str()
            .is_some_and(|t| t.contains("DOUBLE 42"))
    );
    // The JSONL mirror holds the same events.
    let mirror = std::fs::read_to_string(home.path().join(format!("trajectories/{id}.jsonl")))
        .expect("the mirror");
    let mirrored: Vec<Value> = mirror
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(mirrored, events);

    let listed = sandcell(&llm, home.path(), &["runs", "list", "--json"]).await;
    assert!(listed.stdout.contains(id), "{}", listed.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_mode_over_anthropic_ends_with_the_final_answer_tool() {
    let answer = Turn::ToolCalls(vec![ScriptedCall::new(
        "final_answer",
        json!({"answer": "42"}),
    )]);
    let llm = ScriptedLlm::start(doubling(answer))
        .await
        .expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = agent(&llm, home.path(), "anthropic/scripted", &[]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(
        (&run["status"], &run["reason"]),
        (&json!("succeeded"), &json!("final"))
    );
    assert_eq!(run["answer"], "42");
    assert_eq!(run["usage"]["input_tokens"], 300);
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    for r in &requests {
        assert_eq!(r.protocol, Protocol::Anthropic);
        assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_KEY));
        assert!(r.body["max_tokens"].as_u64().is_some_and(|m| m > 0));
    }
    assert!(requests[2].transcript().contains("DOUBLE 42"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_ends_the_run_and_no_request_could_pass_it() {
    // Each answer uses 950 tokens; 2000 allow two calls, not a third.
    let script = Script::new()
        .usage(Usage {
            input_tokens: 900,
            output_tokens: 50,
        })
        .turn(code_call("print(1)"))
        .turn(code_call("print(2)"))
        .turn(code_call("print(3)"));
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = agent(
        &llm,
        home.path(),
        "openai/scripted",
        &["--token-budget", "2000"],
    )
    .await;
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(
        (&run["status"], &run["reason"]),
        (&json!("failed"), &json!("budget:tokens"))
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "the third call was never sent");
    // Each request's worst case fit in what was left: 950 per earlier answer.
    for (i, r) in requests.iter().enumerate() {
        let max = r.body["max_tokens"].as_u64().expect("max_tokens");
        assert!(950 * i as u64 + max <= 2000, "request {i} asked for {max}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_limit_holds_at_the_configured_price() {
    // $1000 per million tokens either way: each 950-token answer costs $0.95.
    let script = Script::new()
        .usage(Usage {
            input_tokens: 900,
            output_tokens: 50,
        })
        .turn(code_call("print(1)"))
        .turn(code_call("print(2)"))
        .turn(code_call("print(3)"));
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    std::fs::write(
        home.path().join("config.toml"),
        "[agent]\nprices = [\"openai/priced=1000,1000\"]\n",
    )
    .expect("config");
    let out = agent(&llm, home.path(), "openai/priced", &["--cost-limit", "2"]).await;
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(run["reason"], "budget:cost", "{run}");
    let cost = run["usage"]["cost_usd"].as_f64().expect("a known cost");
    assert!((cost - 1.9).abs() < 1e-9, "{cost}");
    assert_eq!(llm.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_faults_are_retried_and_the_run_goes_on() {
    let script = Script::new()
        .turn(Turn::Fault(Fault::Status {
            status: 429,
            retry_after: Some("0".into()),
            message: "slow down".into(),
        }))
        .turn(code_call("x = 21\nprint('SET', x)"))
        .turn(Turn::Fault(Fault::DropStream))
        .turn(code_call("print('DOUBLE', x * 2)"))
        .turn(Turn::Fault(Fault::Overloaded))
        .turn(Turn::text("ANSWER: 42"));
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = agent(&llm, home.path(), "anthropic/scripted", &[]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(run["answer"], "ANSWER: 42");
    // Usage counts answered calls only: three.
    assert_eq!(run["usage"]["input_tokens"], 300);
    let events = trajectory(&llm, home.path(), run["run_id"].as_str().expect("id")).await;
    let attempts: Vec<u64> = of_type(&events, "llm_response")
        .iter()
        .filter_map(|e| e["attempts"].as_u64())
        .collect();
    assert_eq!(attempts, [2, 2, 2], "each call retried once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_ends_the_run_at_once_and_the_key_is_nowhere() {
    let llm = ScriptedLlm::start(Script::new().turn(Turn::Fault(Fault::Unauthorized)))
        .await
        .expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = agent(&llm, home.path(), "openai/scripted", &[]).await;
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(
        (&run["status"], &run["reason"]),
        (&json!("failed"), &json!("provider_error"))
    );
    assert_eq!(llm.requests().len(), 1, "a 401 is not retried");
    let id = run["run_id"].as_str().expect("id");
    let events = trajectory(&llm, home.path(), id).await;
    let error = of_type(&events, "llm_error");
    assert_eq!(error.len(), 1);
    assert_eq!(error[0]["kind"], "auth");
    assert_eq!(error[0]["status"], 401);
    let mirror = std::fs::read_to_string(home.path().join(format!("trajectories/{id}.jsonl")))
        .expect("mirror");
    for (what, text) in [
        ("stdout", out.stdout.as_str()),
        ("stderr", out.stderr.as_str()),
        ("the trajectory", mirror.as_str()),
    ] {
        assert!(!text.contains(OPENAI_KEY), "the key is in {what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_go_back_where_each_protocol_wants_them() {
    let plot = format!(
        "import base64\nclass Plot:\n    def _repr_png_(self):\n        return base64.b64decode('{PNG_1X1}')\nPlot()"
    );
    for (model, protocol) in [
        ("openai/scripted", Protocol::OpenAi),
        ("anthropic/scripted", Protocol::Anthropic),
    ] {
        let script = Script::new()
            .turn(code_call(&plot))
            .turn(Turn::text("a plot"));
        let llm = ScriptedLlm::start(script).await.expect("scripted model");
        let home = tempfile::tempdir().expect("home");
        let out = agent(&llm, home.path(), model, &[]).await;
        assert_eq!(out.code, 0, "{model}: {}\n{}", out.stdout, out.stderr);
        let requests = llm.requests();
        assert_eq!(requests.len(), 2);
        let images = requests[1].images();
        assert_eq!(images.len(), 1, "{model}: {images:?}");
        let image = &images[0];
        assert_eq!(image.media_type.as_deref(), Some("image/png"));
        match protocol {
            // Tool messages are text only: the image follows them in a user message.
            Protocol::OpenAi => {
                assert_eq!(image.role, "user");
                let messages = requests[1].messages();
                assert_eq!(messages[image.message_index - 1]["role"], "tool");
            }
            Protocol::Anthropic => assert!(image.in_tool_result, "{image:?}"),
        }
        // The trajectory keeps the image as a file, not inline.
        let run = out.json();
        let events = trajectory(&llm, home.path(), run["run_id"].as_str().expect("id")).await;
        let result = of_type(&events, "tool_result")[0];
        let path = result["images"][0]["path"].as_str().expect("an artifact");
        assert!(std::fs::metadata(path).is_ok_and(|m| m.len() > 0), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_any_run() {
    let llm = ScriptedLlm::start(Script::new())
        .await
        .expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    for (args, wanted) in [
        (vec!["agent", "--model", "nosuch/model", "task"], "provider"),
        (
            vec![
                "agent",
                "--model",
                "openai/m",
                "--max-iterations",
                "51",
                "task",
            ],
            "max_iterations",
        ),
        (
            vec!["agent", "--model", "openai/m", "--cost-limit", "11", "task"],
            "cost_limit_usd",
        ),
        (vec!["agent", "--model", "openai/m", "   "], "task"),
        (
            vec!["agent", "--model", "openai/m", "--sandbox", "SB-1", "task"],
            "sandbox id",
        ),
    ] {
        let out = sandcell(&llm, home.path(), &args).await;
        assert_eq!(out.code, 125, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(wanted), "{args:?}: {}", out.stderr);
    }
    assert!(llm.requests().is_empty());

    // The official endpoint without a key: refused before a sandbox is made, naming the
    // variable.
    let out = tokio::process::Command::new(BIN)
        .args(["agent", "--model", "openai/gpt-4o-mini", "task"])
        .env("SANDCELL_HOME", home.path())
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("SANDCELL_API_URL")
        .output()
        .await
        .expect("run sandcell");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("OPENAI_API_KEY"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_refuses_images_gets_the_step_again_without_them() {
    let plot = format!(
        "import base64\nclass Plot:\n    def _repr_png_(self):\n        return base64.b64decode('{PNG_1X1}')\nPlot()"
    );
    let first = std::sync::atomic::AtomicBool::new(true);
    let script = Script::new().respond_with(move |r| {
        if !r.images().is_empty() {
            return Turn::Fault(Fault::Status {
                status: 400,
                retry_after: None,
                message: "this model does not support image input".into(),
            });
        }
        if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            code_call(&plot)
        } else {
            Turn::text("no images needed")
        }
    });
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = agent(&llm, home.path(), "openai/scripted", &[]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(run["answer"], "no images needed");
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "the refused step is asked once more");
    assert!(requests[2].images().is_empty());
    assert!(requests[2].transcript().contains("does not take images"));
    let events = trajectory(&llm, home.path(), run["run_id"].as_str().expect("id")).await;
    let warnings: Vec<&str> = of_type(&events, "warning")
        .iter()
        .filter_map(|w| w["message"].as_str())
        .collect();
    assert!(
        warnings.iter().any(|w| w.contains("vision is off")),
        "{warnings:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_steps_are_condensed_as_the_conversation_nears_the_context_window() {
    // Each step prints ~12k characters (~3k tokens); an 8k-token window fills by step 4.
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let script = Script::new().respond_with(move |r| {
        if r.tool_names().is_empty() {
            return Turn::text("SUMMARY-OK: printed A blocks");
        }
        if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 4 {
            code_call("print('A' * 12000)")
        } else {
            Turn::text("done")
        }
    });
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    std::fs::write(
        home.path().join("config.toml"),
        "[agent]\nprices = [\"openai/tiny=0,0,8000\"]\n",
    )
    .expect("config");
    let out = agent(&llm, home.path(), "openai/tiny", &[]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(run["answer"], "done");
    let events = trajectory(&llm, home.path(), run["run_id"].as_str().expect("id")).await;
    let condensed = of_type(&events, "condensed");
    assert!(!condensed.is_empty(), "no condensation");
    let c = condensed[0];
    assert!(
        c["messages_replaced"].as_u64().is_some_and(|n| n >= 2),
        "{c}"
    );
    assert!(
        c["tokens_after"].as_u64() < c["tokens_before"].as_u64(),
        "{c}"
    );
    let last = llm.requests().pop().expect("requests");
    assert!(last.transcript().contains("SUMMARY-OK"));
    assert!(last.transcript().contains("Summary of the earlier steps"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_runs_in_repl_mode_with_the_input_as_a_kernel_variable() {
    // The model sees the input's length and start, not the input: its code reads it.
    let script = Script::new().turn(Turn::text(
        "```python\nwords = context.split()\nFINAL(str(len(words)))\n```",
    ));
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let input = home.path().join("input.txt");
    std::fs::write(&input, "alpha beta gamma ".repeat(20_000)).expect("input");
    let out = sandcell(
        &llm,
        home.path(),
        &[
            "complete",
            "--json",
            "--model",
            "openai/scripted",
            "--context-file",
            input.to_str().expect("utf-8 path"),
            "How many words are there?",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(
        (&run["status"], &run["reason"]),
        (&json!("succeeded"), &json!("final"))
    );
    assert_eq!(run["answer"], "60000");
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].tool_names().is_empty(),
        "repl mode offers no tools"
    );
    assert!(
        requests[0].body.to_string().len() < 40_000,
        "the 340 kB input stayed out of the prompt"
    );
}

/// Writes a module whose `add` subtracts, and a pytest file for it.
const BUGGY: &str = "open('calc.py', 'w').write('def add(a, b):\\n    return a - b\\n')\n\
open('test_calc.py', 'w').write('from calc import add\\n\\ndef test_add():\\n    assert add(2, 3) == 5\\n')\n\
print('written')";

fn final_answer(answer: &str) -> Turn {
    Turn::ToolCalls(vec![ScriptedCall::new(
        "final_answer",
        json!({ "answer": answer }),
    )])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_check_goes_back_to_the_model_which_fixes_it_on_the_second_attempt() {
    let script = Script::new()
        .turn(code_call(BUGGY))
        .turn(final_answer("calc.add is written"))
        .turn(code_call(
            // Another size than the buggy file: a bytecode cache keyed on the file's mtime
            // (seconds) and size must not hand pytest the old module.
            "open('calc.py', 'w').write('def add(a, b):\\n    return b + a  # fixed\\n')\nprint('fixed')",
        ))
        .turn(final_answer("calc.add is fixed"));
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = sandcell(
        &llm,
        home.path(),
        &[
            "agent",
            "--json",
            "--model",
            "openai/scripted",
            "--validate",
            "PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider test_calc.py",
            "Write calc.add with a test.",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["reason"], "validated");
    assert_eq!(run["answer"], "calc.add is fixed");
    // The model read pytest's failure as the result of its final_answer call.
    let requests = llm.requests();
    assert_eq!(requests.len(), 4);
    let told = requests[2].transcript();
    assert!(told.contains("the check failed (attempt 1 of 3)"), "{told}");
    assert!(told.contains("exited with code 1"), "{told}");
    assert!(told.contains("1 failed"), "{told}");
    let events = trajectory(&llm, home.path(), run["run_id"].as_str().expect("id")).await;
    let checks = of_type(&events, "validation");
    assert_eq!(checks.len(), 2, "{checks:?}");
    assert_eq!(
        (checks[0]["passed"].clone(), checks[0]["exit_code"].clone()),
        (json!(false), json!(1))
    );
    assert_eq!(
        (checks[1]["passed"].clone(), checks[1]["attempt"].clone()),
        (json!(true), json!(2))
    );
    let started = of_type(&events, "run_started")[0];
    assert_eq!(
        started["validate"]["command"],
        "PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider test_calc.py"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_never_fixed_ends_the_run_validation_failed() {
    // The model answers in plain text each time and never fixes anything.
    let script = Script::new().respond_with(|r| {
        if r.transcript().contains("written") {
            Turn::text("it is done")
        } else {
            code_call(BUGGY)
        }
    });
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = sandcell(
        &llm,
        home.path(),
        &[
            "agent",
            "--json",
            "--model",
            "openai/scripted",
            "--validate",
            "PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider test_calc.py",
            "--validate-attempts",
            "2",
            "Write calc.add with a test.",
        ],
    )
    .await;
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    assert_eq!(run["status"], "failed");
    assert_eq!(run["reason"], "validation_failed");
    assert_eq!(run["answer"], "it is done");
    // One code step, then two answers, each checked.
    assert_eq!(llm.requests().len(), 3);
    let events = trajectory(&llm, home.path(), run["run_id"].as_str().expect("id")).await;
    let checks = of_type(&events, "validation");
    assert_eq!(checks.len(), 2);
    assert!(checks.iter().all(|c| c["passed"] == false));

    // Bad validation input is refused before any run.
    for (args, wanted) in [
        (vec!["--validate", "  "], "validate.command"),
        (
            vec!["--validate", "true", "--validate-attempts", "0"],
            "validate.max_attempts",
        ),
        (
            vec!["--validate", "true", "--validate-timeout", "601"],
            "validate.timeout_s",
        ),
    ] {
        let mut all = vec!["agent", "--model", "openai/scripted"];
        all.extend(args.iter().copied());
        all.push("task");
        let out = sandcell(&llm, home.path(), &all).await;
        assert_eq!(out.code, 125, "{all:?}: {}", out.stderr);
        assert!(out.stderr.contains(wanted), "{all:?}: {}", out.stderr);
    }
    assert_eq!(llm.requests().len(), 3, "no request for refused input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_remembers_and_recalls_with_the_memory_tools() {
    let call = |name: &str, args: Value| Turn::ToolCalls(vec![ScriptedCall::new(name, args)]);
    let script = Script::new()
        .turn(Turn::ToolCalls(vec![
            ScriptedCall::new(
                "memory_add",
                json!({"text": "the deploy key lives in the vault", "category": "ops"}),
            ),
            ScriptedCall::new("memory_add", json!({"text": "lunch is at noon"})),
            ScriptedCall::new(
                "memory_add",
                json!({"text": "owner-wide: prefers metric units", "scope": "owner"}),
            ),
        ]))
        .turn(call(
            "memory_search",
            json!({"query": "where is the deploy key"}),
        ))
        .turn(call("memory_add", json!({"text": "   "})))
        .turn(Turn::text("recalled"));
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let out = agent(&llm, home.path(), "openai/scripted", &[]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let run = out.json();
    let events = trajectory(&llm, home.path(), run["run_id"].as_str().expect("id")).await;
    let results: Vec<&Value> = of_type(&events, "tool_result");
    assert_eq!(results.len(), 5);
    assert!(
        results[..3].iter().all(|r| r["is_error"] == false),
        "{results:?}"
    );
    // The search found the sandbox's memories, the relevant one first, not the owner's.
    let found: Value = serde_json::from_str(results[3]["text"].as_str().expect("text"))
        .expect("the search's JSON");
    let texts: Vec<&str> = found["memories"]
        .as_array()
        .expect("memories")
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(
        texts.first(),
        Some(&"the deploy key lives in the vault"),
        "{found}"
    );
    assert!(!texts.iter().any(|t| t.contains("metric")), "{found}");
    // A blank memory is refused as the tool's error, naming the field.
    assert_eq!(results[4]["is_error"], true);
    assert!(
        results[4]["text"]
            .as_str()
            .is_some_and(|t| t.contains("text")),
        "{}",
        results[4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_run_killed_mid_call_goes_on_with_runs_resume() {
    let script = Script::new()
        .turn(code_call("x = 21\nprint('SET', x)"))
        // Step 2's first ask: the CLI is killed while it waits.
        .turn(Turn::Fault(Fault::Slow {
            delay_ms: 60_000,
            then: Box::new(Turn::text("never read")),
        }))
        .turn(code_call("print('DOUBLE', x * 2)"))
        .turn(Turn::text("the answer is 42"));
    let llm = ScriptedLlm::start(script).await.expect("scripted model");
    let home = tempfile::tempdir().expect("home");
    let mut child = tokio::process::Command::new(BIN)
        .args(["agent", "--json", "--model", "openai/scripted", "Double x."])
        .env("SANDCELL_HOME", home.path())
        .env("OPENAI_BASE_URL", llm.openai_base())
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .env_remove("SANDCELL_API_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start sandcell agent");
    let asked = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while llm.requests().len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(asked.is_ok(), "step 2 was never asked");
    child.kill().await.expect("kill -9 the command");
    let listed = sandcell(&llm, home.path(), &["runs", "list", "--json"]).await;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let runs: Value = serde_json::from_str(&listed.stdout).expect("runs");
    let run = runs[0]["id"].as_str().expect("the run").to_string();
    // Left `running` by a process that is gone (the next engine on the home marks it
    // interrupted; `runs list` only reads the store).
    assert_eq!(runs[0]["status"], "running", "{runs}");

    let out = sandcell(&llm, home.path(), &["runs", "resume", &run, "--json"]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let done = out.json();
    assert_eq!(done["run_id"], run.as_str());
    assert_eq!(done["answer"], "the answer is 42");
    let events = trajectory(&llm, home.path(), &run).await;
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    assert_eq!(of_type(&events, "resumed").len(), 1);
    let results: Vec<&str> = of_type(&events, "tool_result")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    // x from step 1 is there: the kernel survived, or came back from step 1's snapshot.
    assert!(
        results.iter().any(|t| t.contains("DOUBLE 42")),
        "{results:?}"
    );
    // Step 1 was asked once, step 2 twice (once unanswered), step 3 once.
    assert_eq!(llm.requests().len(), 4);
}
