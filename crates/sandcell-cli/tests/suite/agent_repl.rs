//! `repl` mode (recursive language models) over the service in process, real sandboxes and a
//! real Python kernel, against the test kit's scripted model on loopback: a large `context`
//! kept out of the prompt, `llm_query_batched` answered on the host (the sandbox has no
//! network and no key), `FINAL_VAR`, and `rlm_query` stopping at `max_depth`.

use std::sync::Arc;

use sandcell_agent::budget::Pool;
use sandcell_agent::journal::{Journal, now_ms};
use sandcell_agent::repl::drive_repl;
use sandcell_agent::run::{Ended, RunContext, SandboxPlan};
use sandcell_agent::settings::{AgentDefaults, llm_config};
use sandcell_api::runs::{BudgetsInput, RunUsage};
use sandcell_engine::fleet::Fleet;
use sandcell_llm::Llm;
use sandcell_service::ledger::StoreLedger;
use sandcell_service::signed_url::UrlSigner;
use sandcell_service::{Caller, Service};
use sandcell_store::{RunRecord, Store};
use sandcell_testkit::llm::{Fault, Recorded, Script, ScriptedLlm, Turn};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::common::engine;

const OPENAI_KEY: &str = "sk-test-repl-0123456789abcdef";

struct Harness {
    service: Arc<Service>,
    llm: Arc<Llm>,
    _home: tempfile::TempDir,
}

fn harness(scripted: &ScriptedLlm) -> Harness {
    harness_with(scripted, "")
}

/// A harness whose settings file says `config`.
fn harness_with(scripted: &ScriptedLlm, config: &str) -> Harness {
    let home = tempfile::tempdir().expect("home");
    std::fs::write(home.path().join("config.toml"), config).expect("settings file");
    let (config, _) =
        sandcell_service::config::load(home.path(), None, &[], &[]).expect("settings");
    let store = Arc::new(Store::open(&config.database).expect("store"));
    let fleet = Arc::new(Fleet::new(
        engine(),
        Arc::new(StoreLedger::new(store.clone())),
        config.fleet_limits(),
    ));
    let signer = UrlSigner::load_or_create(home.path()).expect("signing key");
    let base = scripted.openai_base();
    let llm = Llm::new(llm_config(&config.agent, |k| match k {
        "OPENAI_BASE_URL" => Some(base.clone()),
        "OPENAI_API_KEY" => Some(OPENAI_KEY.to_string()),
        _ => None,
    }))
    .expect("model client");
    Harness {
        service: Arc::new(Service::new(fleet, store, config, signer)),
        llm: Arc::new(llm),
        _home: home,
    }
}

fn caller() -> Caller {
    Caller {
        owner: "alice".into(),
        key_id: "key-alice".into(),
        admin: false,
        request_id: None,
    }
}

/// A top-level repl run's context (recorded, not started) and its id.
fn start(
    h: &Harness,
    task: &str,
    budgets: BudgetsInput,
    cancel: CancellationToken,
) -> (RunContext, String) {
    start_with(h, "openai/scripted", task, budgets, cancel)
}

/// [`start`] with another model.
fn start_with(
    h: &Harness,
    model: &str,
    task: &str,
    budgets: BudgetsInput,
    cancel: CancellationToken,
) -> (RunContext, String) {
    let defaults = AgentDefaults::from_config(&h.service.config.agent);
    let budgets = defaults.budgets(&budgets).expect("budgets");
    let id = sandcell_service::caller::new_record_id("run").expect("id");
    let now = now_ms();
    let record = RunRecord {
        id: id.clone(),
        owner: "alice".into(),
        root_id: id.clone(),
        parent_id: None,
        depth: 0,
        mode: "repl".into(),
        model: model.into(),
        task: task.into(),
        sandbox_id: None,
        status: "running".into(),
        reason: None,
        answer: None,
        settings: serde_json::json!({ "budgets": budgets }),
        totals: serde_json::to_value(RunUsage::default()).expect("usage"),
        created_at: now,
        updated_at: now,
        ended_at: None,
    };
    let (live, _) = tokio::sync::broadcast::channel(64);
    let journal = Journal::create(
        h.service.store.clone(),
        &h.service.config.home,
        record,
        live,
    )
    .expect("journal");
    let ctx = RunContext {
        service: h.service.clone(),
        llm: h.llm.clone(),
        caller: caller(),
        model: model.parse().expect("model"),
        stream: true,
        pool: Arc::new(Pool::new(budgets)),
        cancel,
        journal,
        sandbox: SandboxPlan::Create {
            template: "python".into(),
            // Kept: the tests look into the kernel after the run.
            keep: true,
        },
        runs: Arc::default(),
        validate: None,
        durability: sandcell_agent::run::Durability::default(),
    };
    (ctx, id)
}

/// Runs a top-level repl run to its end; returns how it ended and its id.
async fn run(
    h: &Harness,
    task: &str,
    context: Option<String>,
    budgets: BudgetsInput,
) -> (Ended, String) {
    let (ctx, id) = start(h, task, budgets, CancellationToken::new());
    let ended = tokio::time::timeout(
        std::time::Duration::from_secs(180),
        drive_repl(ctx, task.into(), context),
    )
    .await
    .expect("the run ends");
    (ended, id)
}

/// A message's text, whether its content is a string or a list of parts.
fn text_of(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A step of a run (its system prompt first), as opposed to a sub-call (a lone prompt).
fn is_step(r: &Recorded) -> bool {
    r.messages().first().is_some_and(|m| m["role"] == "system")
}

fn first_user(r: &Recorded) -> String {
    r.messages()
        .iter()
        .find(|m| m["role"] == "user")
        .map(text_of)
        .unwrap_or_default()
}

fn python(code: &str) -> Turn {
    Turn::text(format!("Let me work on it.\n```python\n{code}\n```"))
}

fn events(h: &Harness, run: &str) -> Vec<Value> {
    h.service
        .store
        .run_events(run, 0, 10_000)
        .expect("events")
        .into_iter()
        .map(|e| e.event)
        .collect()
}

fn contiguous(events: &[Value]) {
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0]["type"], "run_started");
    assert_eq!(events.last().expect("events")["type"], "run_finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_context_stays_in_the_kernel_and_batched_sub_calls_are_answered_by_the_host() {
    sandcell_testkit::skip_unless_root!();
    let port_cell = Arc::new(std::sync::OnceLock::<u16>::new());
    let port = port_cell.clone();
    let script = Script::new().respond_with(move |r: &Recorded| {
        if !is_step(r) {
            // A sub-call: answer which part it was asked about.
            let prompt = first_user(r);
            let part = prompt
                .split_whitespace()
                .nth(2)
                .unwrap_or("?")
                .trim_end_matches(':');
            return Turn::text(format!("summary-{part}"));
        }
        let last = r
            .messages()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(text_of)
            .unwrap_or_default();
        if !last.contains("Output of code block") {
            let port = port.get().copied().unwrap_or(1);
            return python(&format!(
                "import os, socket\n\
                 print('size', len(context), context.count('MIDDLE' + '-NEEDLE'))\n\
                 print('keys', [k for k in os.environ if k.endswith('_API_KEY')])\n\
                 try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    \
                 print('net reached')\n\
                 except OSError:\n    print('net blocked')\n\
                 parts = [context[:1000], context[1000:2000], context[-1000:]]\n\
                 answers = llm_query_batched(['summarize part %d: %s' % (i, p) for i, p in enumerate(parts)])\n\
                 print(answers)"
            ));
        }
        python("result = ' + '.join(answers)\nFINAL_VAR('result')")
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let _ = port_cell.set(scripted.addr().port());
    let h = harness(&scripted);

    // ~1.5 MB: a head the model may see, a needle in the middle it must not.
    let filler: String = (0..20_000)
        .map(|i| format!("line {i:06}: lorem ipsum dolor sit amet, consectetur adipiscing\n"))
        .collect();
    let context = format!("HEAD-OF-CONTEXT\n{filler}MIDDLE-NEEDLE\n{filler}END\n");
    assert!(context.len() > 1 << 20);
    let (ended, id) = run(
        &h,
        "Summarize the document in three parts.",
        Some(context.clone()),
        BudgetsInput::default(),
    )
    .await;
    assert_eq!(
        (ended.status, ended.reason.as_str()),
        ("succeeded", "final"),
        "{ended:?}"
    );
    assert_eq!(
        ended.answer.as_deref(),
        Some("summary-0 + summary-1 + summary-2")
    );

    let requests = scripted.requests();
    assert_eq!(requests.len(), 5, "two steps and three sub-calls");
    assert_eq!(requests.iter().filter(|r| !is_step(r)).count(), 3);
    for r in &requests {
        let body = r.body.to_string();
        assert!(
            !body.contains("MIDDLE-NEEDLE"),
            "the context leaked into a prompt"
        );
        assert!(body.len() < 64 * 1024, "a prompt of {} bytes", body.len());
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {OPENAI_KEY}").as_str())
        );
    }
    let first = first_user(&requests[0]);
    assert!(first.contains("HEAD-OF-CONTEXT"), "{first}");
    assert!(
        first.contains(&format!("a str of {} characters", context.chars().count())),
        "{first}"
    );
    // What the code printed, as the model read it in its second step.
    let second = requests
        .iter()
        .filter(|r| is_step(r))
        .nth(1)
        .expect("step 2");
    let fed_back = text_of(second.messages().last().expect("feedback"));
    assert!(
        fed_back.contains(&format!("size {} 1", context.chars().count())),
        "{fed_back}"
    );
    assert!(fed_back.contains("keys []"), "{fed_back}");
    assert!(fed_back.contains("net blocked"), "{fed_back}");
    assert!(
        fed_back.contains("['summary-0', 'summary-1', 'summary-2']"),
        "{fed_back}"
    );

    // The usage counts the sub-calls: 5 calls of 100 in / 10 out.
    let record = h.service.store.get_run(&id).expect("store").expect("run");
    let usage: RunUsage = serde_json::from_value(record.totals.clone()).expect("totals");
    assert_eq!((usage.llm_calls, usage.sub_calls), (5, 3));
    assert_eq!((usage.input_tokens, usage.output_tokens), (500, 50));
    assert_eq!(record.status, "succeeded");
    let events = events(&h, &id);
    contiguous(&events);
    let sub_requests = events
        .iter()
        .filter(|e| e["type"] == "llm_request" && e["sub_call"] == true)
        .count();
    assert_eq!(sub_requests, 3);
    let blocks: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_call" && e["name"] == "repl")
        .collect();
    assert_eq!(blocks.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlm_query_runs_a_sub_run_and_stops_at_max_depth() {
    sandcell_testkit::skip_unless_root!();
    let script = Script::new().respond_with(|r: &Recorded| {
        if !is_step(r) {
            return Turn::text(format!("leaf answer to [{}]", first_user(r)));
        }
        let task = first_user(r);
        if task.starts_with("ROOT") {
            python("r = rlm_query('CHILD: ask further')\nFINAL(r)")
        } else {
            // The sub-run (depth 1 = max_depth): its rlm_query can go no deeper.
            python("FINAL('child got: ' + rlm_query('LEAF'))")
        }
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness(&scripted);
    let (ended, id) = run(
        &h,
        "ROOT: delegate this",
        None,
        BudgetsInput {
            max_depth: Some(1),
            ..BudgetsInput::default()
        },
    )
    .await;
    assert_eq!(
        (ended.status, ended.reason.as_str()),
        ("succeeded", "final"),
        "{ended:?}"
    );
    assert_eq!(
        ended.answer.as_deref(),
        Some("child got: leaf answer to [LEAF]")
    );
    // The root's step, the child's step, the leaf's plain sub-call: no run at depth 2.
    let requests = scripted.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests.iter().filter(|r| is_step(r)).count(), 2);

    let runs = h
        .service
        .store
        .list_runs(Some("alice"), 10, None)
        .expect("runs");
    assert_eq!(runs.len(), 2, "{runs:?}");
    let child = runs.iter().find(|r| r.id != id).expect("the sub-run");
    assert_eq!(
        (
            child.depth,
            child.parent_id.as_deref(),
            child.root_id.as_str()
        ),
        (1, Some(id.as_str()), id.as_str())
    );
    assert_eq!(child.mode, "repl");
    assert_eq!(
        (child.status.as_str(), child.reason.as_deref()),
        ("succeeded", Some("final"))
    );
    let child_events = events(&h, &child.id);
    contiguous(&child_events);
    assert!(
        child_events.iter().any(|e| e["type"] == "warning"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("max_depth"))),
        "{child_events:?}"
    );
    assert!(
        child_events
            .iter()
            .any(|e| e["type"] == "llm_request" && e["sub_call"] == true)
    );
    // The parent's trajectory links to the child.
    let root_events = events(&h, &id);
    contiguous(&root_events);
    let link = root_events
        .iter()
        .find(|e| e["type"] == "tool_call" && e["name"] == "rlm_query")
        .expect("the sub-run's call");
    assert_eq!(link["arguments"]["child_run_id"], child.id.as_str());
    assert_eq!(link["arguments"]["depth"], 1);
    // The pool is the tree's: the root's totals count the child's calls and the leaf's;
    // the sub-run and the leaf's plain query are its two sub-calls.
    let root = h.service.store.get_run(&id).expect("store").expect("run");
    let usage: RunUsage = serde_json::from_value(root.totals).expect("totals");
    assert_eq!((usage.llm_calls, usage.sub_calls), (3, 2));
    // The sub-run's context is gone with it; the root's stays for whoever looks afterwards.
    let sandbox_id = root.sandbox_id.expect("a sandbox");
    assert_eq!(child.sandbox_id.as_deref(), Some(sandbox_id.as_str()));
    let sandbox = h
        .service
        .fleet
        .sandbox("alice", &sandbox_id)
        .expect("the run's sandbox");
    let live: Vec<String> = sandbox
        .list_contexts()
        .await
        .expect("contexts")
        .into_iter()
        .map(|c| c.id)
        .collect();
    // (`python` is the template's warm default context, which repl runs leave alone.)
    let of_runs: Vec<&String> = live.iter().filter(|c| *c != "python").collect();
    assert_eq!(of_runs.len(), 1, "{live:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_refusal_is_an_exception_the_code_can_handle() {
    sandcell_testkit::skip_unless_root!();
    let script = Script::new().respond_with(|r: &Recorded| {
        assert!(is_step(r), "no sub-call may be sent past the budget");
        let last = r
            .messages()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(text_of)
            .unwrap_or_default();
        if last.contains("Output of code block") {
            return Turn::text("FINAL(done without sub-calls)");
        }
        python(
            "try:\n    llm_query_batched(['a', 'b', 'c'])\nexcept SandcellBudgetError as e:\n    print('refused:', e)",
        )
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness(&scripted);
    let (ended, id) = run(
        &h,
        "Use three sub-calls.",
        Some("some input".into()),
        BudgetsInput {
            max_sub_calls: Some(2),
            ..BudgetsInput::default()
        },
    )
    .await;
    assert_eq!(
        (ended.status, ended.reason.as_str(), ended.answer.as_deref()),
        ("succeeded", "text", Some("done without sub-calls")),
        "{ended:?}"
    );
    let requests = scripted.requests();
    assert_eq!(requests.len(), 2);
    let fed_back = text_of(requests[1].messages().last().expect("feedback"));
    assert!(
        fed_back.contains(
            "refused: llm_query_batched: the run's sub-call budget does not allow 3 more"
        ),
        "{fed_back}"
    );
    let record = h.service.store.get_run(&id).expect("store").expect("run");
    let usage: RunUsage = serde_json::from_value(record.totals).expect("totals");
    assert_eq!((usage.llm_calls, usage.sub_calls), (2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_breaks_a_pending_sub_call_and_keeps_the_kernel() {
    sandcell_testkit::skip_unless_root!();
    let script = Script::new().respond_with(|r: &Recorded| {
        if !is_step(r) {
            // The sub-call hangs far past the test.
            return Turn::Fault(Fault::Slow {
                delay_ms: 120_000,
                then: Box::new(Turn::text("too late")),
            });
        }
        python("kept = 7\nllm_query('take your time')")
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness(&scripted);
    let cancel = CancellationToken::new();
    let (ctx, id) = start(
        &h,
        "Wait for the model.",
        BudgetsInput::default(),
        cancel.clone(),
    );
    let running = tokio::spawn(drive_repl(ctx, "Wait for the model.".into(), None));
    let asked = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while scripted.requests().len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(asked.is_ok(), "the sub-call was never sent");
    let cancelled_at = std::time::Instant::now();
    cancel.cancel();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), running)
        .await
        .expect("the cancellation ends the run")
        .expect("the run's task");
    assert!(cancelled_at.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(
        (ended.status, ended.reason.as_str()),
        ("cancelled", "cancelled")
    );
    let record = h.service.store.get_run(&id).expect("store").expect("run");
    assert_eq!(record.status, "cancelled");
    contiguous(&events(&h, &id));
    // The kernel's state is intact: the cell was interrupted, not the kernel.
    let sandbox_id = record.sandbox_id.expect("a sandbox");
    let sandbox = h
        .service
        .fleet
        .sandbox("alice", &sandbox_id)
        .expect("the run's sandbox");
    let contexts = sandbox.list_contexts().await.expect("contexts");
    let mut found = None;
    for c in contexts
        .iter()
        .filter(|c| c.language == sandcell_protocol::Language::Python)
    {
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                match sandbox
                    .get_variables(&c.id, Some(vec!["kept".into()]))
                    .await
                {
                    Ok(v) => return v,
                    // Busy until the interrupt lands.
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                }
            }
        })
        .await
        .expect("the context is free again");
        if let Some(v) = got.values.get("kept") {
            found = Some(v.clone());
        }
    }
    assert_eq!(found, Some(serde_json::json!(7)));
}

/// A 1×1 PNG.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_the_code_shows_reaches_the_model_after_the_blocks_output() {
    sandcell_testkit::skip_unless_root!();
    let script = Script::new().respond_with(|r: &Recorded| {
        let last = r
            .messages()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(text_of)
            .unwrap_or_default();
        if last.contains("Output of code block") {
            python("FINAL('seen %d image(s)' % 1)")
        } else {
            python(&format!(
                "import base64\nclass Plot:\n    def _repr_png_(self):\n        return base64.b64decode('{PNG_1X1}')\nPlot()"
            ))
        }
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness(&scripted);
    let (ended, id) = run(&h, "Plot it.", None, BudgetsInput::default()).await;
    assert_eq!(
        (ended.status, ended.reason.as_str()),
        ("succeeded", "final"),
        "{ended:?}"
    );
    let requests = scripted.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[0].images().is_empty());
    let images = requests[1].images();
    assert_eq!(images.len(), 1, "{images:?}");
    assert_eq!(images[0].media_type.as_deref(), Some("image/png"));
    // In the user message that carries the block's output, after the model's code.
    assert_eq!(images[0].role, "user");
    let messages = requests[1].messages();
    assert_eq!(messages[images[0].message_index - 1]["role"], "assistant");
    assert!(text_of(&messages[images[0].message_index]).contains("Output of code block 1"));
    // The trajectory keeps it as a file.
    let events = events(&h, &id);
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .expect("a tool result");
    let path = result["images"][0]["path"].as_str().expect("an artifact");
    assert!(std::fs::metadata(path).is_ok_and(|m| m.len() > 0), "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_repl_steps_are_condensed_near_the_context_window() {
    sandcell_testkit::skip_unless_root!();
    // Each block prints ~12k characters (~3k tokens); an 8k-token window fills by step 3.
    let steps = std::sync::atomic::AtomicUsize::new(0);
    let script = Script::new().respond_with(move |r: &Recorded| {
        if !is_step(r) {
            return Turn::text("unused");
        }
        if r.messages()[0]["content"]
            .as_str()
            .is_some_and(|s| s.contains("condense"))
        {
            return Turn::text("SUMMARY-OK: printed A blocks");
        }
        if steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 4 {
            python("print('A' * 12000)")
        } else {
            python("FINAL('done')")
        }
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness_with(&scripted, "[agent]\nprices = [\"openai/tiny=0,0,8000\"]\n");
    let (ctx, id) = start_with(
        &h,
        "openai/tiny",
        "Print.",
        BudgetsInput::default(),
        CancellationToken::new(),
    );
    let ended = tokio::time::timeout(
        std::time::Duration::from_secs(180),
        drive_repl(ctx, "Print.".into(), None),
    )
    .await
    .expect("the run ends");
    assert_eq!(ended.answer.as_deref(), Some("done"), "{ended:?}");
    let events = events(&h, &id);
    contiguous(&events);
    let condensed: Vec<&Value> = events.iter().filter(|e| e["type"] == "condensed").collect();
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
    let last = scripted.requests().pop().expect("requests");
    assert!(last.transcript().contains("SUMMARY-OK"));
}

/// A runner over the harness's service, and a repl run it started whose task says ROOT.
async fn start_root(h: &Harness) -> (Arc<sandcell_agent::Runner>, sandcell_api::runs::RunInfo) {
    let runner = Arc::new(sandcell_agent::Runner::new(
        h.service.clone(),
        h.llm.clone(),
        AgentDefaults::from_config(&h.service.config.agent),
    ));
    let req = sandcell_api::runs::StartRun {
        task: "ROOT: delegate".into(),
        model: Some("openai/scripted".into()),
        mode: Some(sandcell_api::runs::RunMode::Repl),
        ..sandcell_api::runs::StartRun::default()
    };
    let root = runner.start(&caller(), req).await.expect("the run starts");
    (runner, root)
}

/// The sub-run of `root`, once it has started a cell (it is a run of its own, one level
/// down).
async fn sub_run_in_its_cell(
    runner: &sandcell_agent::Runner,
    root: &str,
) -> sandcell_api::runs::RunInfo {
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let runs = runner.list(&caller(), 50).expect("runs").runs;
            if let Some(c) = runs
                .into_iter()
                .find(|r| r.parent_id.as_deref() == Some(root))
            {
                let events = runner.events(&caller(), &c.id, 0, 100).expect("events");
                if events.iter().any(|e| e["type"] == "tool_call") {
                    return c;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the sub-run starts its cell")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_run_is_a_sub_call_and_can_be_followed_and_cancelled_by_its_own_id() {
    use futures_util::StreamExt;
    sandcell_testkit::skip_unless_root!();
    let script = Script::new().respond_with(|r: &Recorded| {
        let task = first_user(r);
        if task.contains("ROOT") {
            python(
                "try:\n    r = rlm_query('CHILD: wait')\nexcept Exception as e:\n    r = 'child ended: %s' % e\nFINAL(r)",
            )
        } else {
            python("import time\nstarted = True\ntime.sleep(120)")
        }
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness(&scripted);
    let (runner, root) = start_root(&h).await;
    let child = sub_run_in_its_cell(&runner, &root.id).await;
    assert_eq!((child.depth, child.root_id.as_str()), (1, root.id.as_str()));
    let followed = runner.follow(&caller(), &child.id, 0).expect("follow");
    let follower = tokio::spawn(followed.collect::<Vec<Value>>());
    let cancelled_at = std::time::Instant::now();
    let info = runner
        .cancel(&caller(), &child.id)
        .await
        .expect("cancel the sub-run");
    assert!(cancelled_at.elapsed() < std::time::Duration::from_secs(3));
    assert_eq!(info.status, "cancelled");
    let seen = tokio::time::timeout(std::time::Duration::from_secs(10), follower)
        .await
        .expect("the follower ends with the sub-run")
        .expect("the follower's task");
    assert_eq!(seen.last().expect("events")["type"], "run_finished");
    contiguous(&seen);
    // The parent goes on: its code caught the sub-run's end.
    let root = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        runner.wait(&caller(), &root.id),
    )
    .await
    .expect("the root ends")
    .expect("the root");
    assert_eq!(root.status, "succeeded", "{root:?}");
    let answer = root.answer.unwrap_or_default();
    assert!(
        answer.starts_with("child ended:") && answer.contains("cancelled"),
        "{answer}"
    );
    // The sub-run counted as one sub-call of the tree.
    assert_eq!(root.usage.sub_calls, 1, "{:?}", root.usage);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_root_cancels_its_sub_run_within_a_second_or_so() {
    sandcell_testkit::skip_unless_root!();
    let script = Script::new().respond_with(|r: &Recorded| {
        if first_user(r).contains("ROOT") {
            python("r = rlm_query('CHILD: wait')\nFINAL(r)")
        } else {
            python("import time\ntime.sleep(120)")
        }
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness(&scripted);
    let (runner, root) = start_root(&h).await;
    let child = sub_run_in_its_cell(&runner, &root.id).await;
    let cancelled_at = std::time::Instant::now();
    let info = runner.cancel(&caller(), &root.id).await.expect("cancel");
    let root_took = cancelled_at.elapsed();
    assert_eq!(info.status, "cancelled");
    let child = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        runner.wait(&caller(), &child.id),
    )
    .await
    .expect("the sub-run ends")
    .expect("the sub-run");
    let child_took = cancelled_at.elapsed();
    assert_eq!(child.status, "cancelled", "{child:?}");
    eprintln!("cancel recorded: root after {root_took:?}, sub-run after {child_took:?}");
    // "Within about a second"; bounded loosely here (a busy 2-core machine), measured above.
    assert!(
        child_took < std::time::Duration::from_secs(3),
        "{child_took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_answer_that_fails_its_check_is_told_so_and_tried_again() {
    sandcell_testkit::skip_unless_root!();
    let script = Script::new().respond_with(|r: &Recorded| {
        let last = r
            .messages()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(text_of)
            .unwrap_or_default();
        if last.contains("the check failed") {
            python("open('answer.txt', 'w').write('42')\nFINAL('42')")
        } else {
            python("open('answer.txt', 'w').write('41')\nFINAL('41')")
        }
    });
    let scripted = ScriptedLlm::start(script).await.expect("scripted model");
    let h = harness(&scripted);
    let (mut ctx, id) = start(
        &h,
        "Answer.",
        BudgetsInput::default(),
        CancellationToken::new(),
    );
    ctx.validate = Some(
        sandcell_api::runs::Validate::new("grep -qx 42 answer.txt".into(), None, None)
            .expect("a check"),
    );
    let ended = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        drive_repl(ctx, "Answer.".into(), None),
    )
    .await
    .expect("the run ends");
    assert_eq!(
        (ended.status, ended.reason.as_str(), ended.answer.as_deref()),
        ("succeeded", "validated", Some("42"))
    );
    assert_eq!(scripted.requests().len(), 2);
    let events = events(&h, &id);
    contiguous(&events);
    let checks: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "validation")
        .collect();
    assert_eq!(checks.len(), 2);
    assert_eq!(checks[0]["passed"], false);
    assert_eq!(checks[1]["passed"], true);
}
