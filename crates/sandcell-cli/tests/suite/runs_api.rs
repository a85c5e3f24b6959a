//! Agent runs through the daemon, end to end: `/v1/runs` over real HTTP (started, followed as
//! server-sent events and resumed, waited for, kept from other owners, cancelled in a slow
//! model call), the typed client, `sandcell agent` / `runs` / `logs` going through the daemon,
//! and the MCP agent tools through the official MCP client. The runs are real: real
//! sandboxes and kernels, and the test kit's scripted model on loopback, which the daemon is
//! pointed at by its settings (`agent.openai.base_url`).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::Method;
use sandcell_api::runs::{BudgetsInput, StartRun};
use sandcell_client::{SseEvent, SseParser};
use sandcell_testkit::llm::{Fault, Script, ScriptedCall, ScriptedLlm, Turn};
use serde_json::{Value, json};

use super::common::BIN;
use super::daemon::{Daemon, wait_for};

pub(super) const MODEL: &str = "openai/test-model";

/// The scripted model, served by a runtime of its own (the tests' threads block).
pub(super) struct Model {
    pub(super) llm: ScriptedLlm,
    _rt: tokio::runtime::Runtime,
}

impl Model {
    pub(super) fn start(script: Script) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let llm = rt.block_on(ScriptedLlm::start(script)).unwrap();
        Self { llm, _rt: rt }
    }

    /// A daemon whose runs ask this model.
    pub(super) fn daemon(&self) -> Daemon {
        Daemon::start(&[&format!("agent.openai.base_url={}", self.llm.openai_base())])
    }
}

pub(super) fn code_call(code: &str) -> Turn {
    Turn::ToolCalls(vec![ScriptedCall::new(
        "execute_code",
        json!({ "code": code }),
    )])
}

/// The three turns of the classic task: set x, double it (the kernel keeps x), answer.
fn doubling() -> [Turn; 3] {
    [
        code_call("x = 21\nprint('SET', x)"),
        code_call("print('DOUBLE', x * 2)"),
        Turn::text("the answer is 42"),
    ]
}

pub(super) fn slow(ms: u64, text: &str) -> Turn {
    Turn::Fault(Fault::Slow {
        delay_ms: ms,
        then: Box::new(Turn::text(text)),
    })
}

fn start_body(wait: bool) -> Value {
    json!({"task": "Set x to 21 in Python, then double it.", "model": MODEL, "wait": wait})
}

/// `GET /v1/runs/{run}/events` as server-sent events (with `Last-Event-ID` when given), read
/// to the end of the stream through the client's parser.
fn sse(d: &Daemon, run: &str, query: &str, last_event_id: Option<&str>) -> Vec<SseEvent> {
    let mut req = d.req(Method::GET, &format!("/v1/runs/{run}/events{query}"));
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let mut resp = req.send().unwrap();
    assert_eq!(resp.status(), 200);
    let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = std::io::Read::read(&mut resp, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        events.extend(parser.push(&buf[..n]));
    }
    events.extend(parser.finish());
    events
}

/// Asserts `events` are numbered from `first` without a gap, each named after its type, the
/// last one `run_finished`; their data.
fn contiguous(events: &[SseEvent], first: u64) -> Vec<Value> {
    assert!(!events.is_empty(), "no events");
    let data: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    for (i, (e, v)) in events.iter().zip(&data).enumerate() {
        let seq = first + i as u64;
        assert_eq!(
            e.id.as_deref(),
            Some(seq.to_string().as_str()),
            "{events:?}"
        );
        assert_eq!(v["seq"], seq, "{events:?}");
        assert_eq!(v["type"], e.event.as_str(), "{events:?}");
    }
    assert_eq!(
        events.last().map(|e| e.event.as_str()),
        Some("run_finished"),
        "{events:?}"
    );
    data
}

/// Waits until run `run` has written an event of type `kind`.
pub(super) fn wait_for_event(d: &Daemon, run: &str, kind: &str) {
    let seen = wait_for(Duration::from_secs(60), || {
        let r = d.get(&format!("/v1/runs/{run}/events?format=json"));
        r.body["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["type"] == kind))
            .then_some(())
    });
    assert!(seen.is_some(), "run {run} wrote no {kind}:\n{}", d.log());
}

#[test]
fn runs_over_rest_stream_resume_wait_cancel_and_stay_their_owners() {
    sandcell_testkit::skip_unless_root!();
    let [set, double, answer] = doubling();
    let model = Model::start(Script::new().turns([
        set,
        double,
        answer,
        Turn::text("waited: 42"),
        slow(30_000, "too late"),
    ]));
    let d = model.daemon();

    // Started: 202, running, at once.
    let r = d.post("/v1/runs", start_body(false));
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["status"], "running", "{}", r.body);
    let run = r.body["id"].as_str().unwrap().to_string();

    // Followed: every event once, in order, ending with run_finished; the kernel kept x.
    let all = contiguous(&sse(&d, &run, "", None), 1);
    let finished = all.last().unwrap();
    assert_eq!(
        (&finished["status"], &finished["answer"]),
        (&json!("succeeded"), &json!("the answer is 42")),
        "{finished}"
    );
    let results: Vec<&str> = all
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        results.iter().any(|t| t.contains("DOUBLE 42")),
        "{results:?}"
    );
    // Resumed after event 3: from 4, the same events.
    assert_eq!(contiguous(&sse(&d, &run, "", Some("3")), 4), all[3..]);
    assert_eq!(contiguous(&sse(&d, &run, "?after=3", None), 4), all[3..]);
    // The typed client reads the same trajectory.
    let client = d.client();
    assert_eq!(d.block_on(client.run_events(&run, 0)).unwrap(), all);
    let followed: Vec<Value> = d.block_on(async {
        let mut stream = client.follow_run(&run, 10).await.unwrap();
        let mut got = Vec::new();
        while let Some(e) = stream.next().await {
            got.push(e.unwrap());
        }
        got
    });
    assert_eq!(followed, all[10..]);
    let info = d.block_on(client.run(&run)).unwrap();
    assert_eq!(
        (info.status.as_str(), info.answer.as_deref()),
        ("succeeded", Some("the answer is 42"))
    );
    assert_eq!(info.usage.llm_calls, 3);

    // Waited for: 200, ended, with its answer.
    let r = d.post("/v1/runs", start_body(true));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.body["status"], &r.body["answer"]),
        (&json!("succeeded"), &json!("waited: 42")),
        "{}",
        r.body
    );
    // The sandbox the run made is deleted when it ends (nobody asked to keep it).
    let made = r.body["sandbox_id"].as_str().unwrap();
    let state = d.sandbox(made).state;
    assert!(state == "stopped" || state == "deleted", "{made}: {state}");

    // Another owner: 404 on each run route, and not in their list.
    let (bob, _) = d.key_for("bob");
    for (m, p) in [
        (Method::GET, format!("/v1/runs/{run}")),
        (Method::GET, format!("/v1/runs/{run}/events")),
        (Method::GET, format!("/v1/runs/{run}/events?format=json")),
        (Method::POST, format!("/v1/runs/{run}/cancel")),
    ] {
        d.call_as(Some(&bob), m, &p, None)
            .expect_error(404, "not_found");
    }
    let theirs = d.block_on(d.client_as(&bob).runs(None)).unwrap();
    assert!(theirs.runs.is_empty(), "{theirs:?}");
    let mine = d.block_on(client.runs(Some(10))).unwrap();
    assert!(mine.runs.iter().any(|r| r.id == run), "{mine:?}");
    // A bad body is a 400 naming the field; an unknown run a 404.
    d.post("/v1/runs", json!({"task": "x", "budget": {}}))
        .expect_error(400, "invalid_argument");
    d.post("/v1/runs", json!({"task": "", "model": MODEL}))
        .expect_error(400, "invalid_argument");
    d.get("/v1/runs/run-0000000000000000")
        .expect_error(404, "not_found");

    // Stuck in a slow model call: cancelled at once, through the typed client.
    let started = d
        .block_on(client.start_run(&StartRun {
            task: "Wait for it.".into(),
            model: Some(MODEL.into()),
            budgets: BudgetsInput {
                timeout_secs: Some(120.0),
                ..BudgetsInput::default()
            },
            ..StartRun::default()
        }))
        .unwrap();
    assert_eq!(started.status, "running");
    wait_for_event(&d, &started.id, "llm_request");
    let asked = Instant::now();
    let ended = d.block_on(client.cancel_run(&started.id)).unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        (ended.status.as_str(), ended.reason.as_deref()),
        ("cancelled", Some("cancelled"))
    );
    let events = contiguous(&sse(&d, &started.id, "", None), 1);
    assert_eq!(events.last().unwrap()["status"], "cancelled");
}

/// `sandcell …` on the daemon's home, without the environment that would point elsewhere (nor
/// any model: a run that went embedded could not reach the scripted one).
fn sandcell(d: &Daemon, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--home")
        .arg(d.home())
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn the_cli_runs_follows_and_cancels_through_the_daemon() {
    sandcell_testkit::skip_unless_root!();
    let [set, double, answer] = doubling();
    let model = Model::start(Script::new().turns([
        set,
        double,
        answer,
        slow(1500, "slow but done"),
        slow(30_000, "too late"),
        slow(30_000, "too late again"),
    ]));
    let d = model.daemon();

    // `sandcell agent` goes through the daemon: the run's sandbox is the daemon's and, kept,
    // outlives the command.
    let out = sandcell(
        &d,
        &[
            "agent",
            "--json",
            "--keep-sandbox",
            "--model",
            MODEL,
            "Double 21.",
        ],
    );
    let summary = json_of(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        (&summary["status"], &summary["answer"]),
        (&json!("succeeded"), &json!("the answer is 42")),
        "{summary}"
    );
    assert_eq!(summary["usage"]["llm_calls"], 3, "{summary}");
    let run = summary["run_id"].as_str().unwrap().to_string();
    let sandbox = summary["sandbox_id"].as_str().unwrap();
    assert_eq!(d.sandbox(sandbox).state, "running");

    // `runs list`, `runs status`, `logs` read it from the daemon.
    let out = sandcell(&d, &["runs", "list", "--json"]);
    assert!(out.status.success());
    assert_eq!(json_of(&out)[0]["id"], run.as_str());
    let out = sandcell(&d, &["runs", "status", &run, "--json"]);
    assert_eq!(json_of(&out)["status"], "succeeded");
    let out = sandcell(&d, &["logs", &run, "--json"]);
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, d.block_on(d.client().run_events(&run, 0)).unwrap());

    // `logs -f` follows a run that goes on to its end.
    let r = d.post("/v1/runs", start_body(false));
    assert_eq!(r.status, 202, "{}", r.body);
    let slow_run = r.body["id"].as_str().unwrap().to_string();
    let out = sandcell(&d, &["logs", &slow_run, "-f", "--json"]);
    assert!(out.status.success());
    let followed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        followed.last().unwrap()["type"],
        "run_finished",
        "{followed:?}"
    );
    assert_eq!(followed.last().unwrap()["answer"], "slow but done");
    let seqs: Vec<u64> = followed
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // `runs cancel` ends a run stuck in a model call.
    let r = d.post("/v1/runs", start_body(false));
    let stuck = r.body["id"].as_str().unwrap().to_string();
    wait_for_event(&d, &stuck, "llm_request");
    let out = sandcell(&d, &["runs", "cancel", &stuck, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out)["status"], "cancelled");

    // Ctrl-C on `sandcell agent` cancels its run on the daemon: exit 1, cancelled.
    let child = Command::new(BIN)
        .args([
            "agent",
            "--json",
            "--model",
            MODEL,
            "Wait for it.",
            "--home",
        ])
        .arg(d.home())
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waiting = wait_for(Duration::from_secs(60), || {
        let list = d.block_on(d.client().runs(Some(1))).unwrap();
        let newest = list.runs.first()?;
        (newest.id != stuck && newest.id != slow_run && newest.status == "running")
            .then(|| newest.id.clone())
    })
    .expect("the command's run");
    wait_for_event(&d, &waiting, "llm_request");
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let summary = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{summary}");
    assert_eq!(
        (&summary["run_id"], &summary["status"]),
        (&json!(waiting), &json!("cancelled")),
        "{summary}"
    );

    // A run that ends otherwise exits 1 (a token budget no call fits in).
    let out = sandcell(
        &d,
        &[
            "agent",
            "--json",
            "--model",
            MODEL,
            "--token-budget",
            "10",
            "Hi.",
        ],
    );
    let summary = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{summary}");
    assert_eq!(summary["status"], "failed", "{summary}");
    assert!(
        summary["reason"].as_str().unwrap().starts_with("budget"),
        "{summary}"
    );
}

#[test]
fn runs_cancel_needs_a_daemon() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["runs", "cancel", "run-0000000000000000", "--home"])
        .arg(home.path())
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no daemon runs on"), "{stderr}");
    // Without a daemon, `runs list` reads the home's store.
    let out = Command::new(BIN)
        .args(["runs", "list", "--json", "--home"])
        .arg(home.path())
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out), json!([]));
}

/// The tools virtualenv's Python with the `mcp` package (scripts/tools.sh).
fn python() -> PathBuf {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import mcp"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot import mcp: run scripts/tools.sh",
        py.display()
    );
    py
}

/// Runs tests/mcp/agent.py with `args`; asserts it reached its end with every check passing.
fn agent_scenario(args: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/agent.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(r#"{"done": true}"#),
        "agent.py {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(!stdout.contains(r#""ok": false"#), "{stdout}");
    stdout
}

#[test]
fn agent_tools_through_the_official_mcp_client() {
    sandcell_testkit::skip_unless_root!();
    let [set, double, answer] = doubling();
    let [set2, double2, answer2] = doubling();
    let model = Model::start(Script::new().turns([
        set,
        double,
        answer,
        slow(30_000, "too late"),
        set2,
        double2,
        answer2,
        slow(30_000, "too late"),
    ]));
    let d = model.daemon();
    // Over streamable HTTP on the daemon (the tools call its runner in process), then over
    // stdio through the daemon (`sandcell mcp --daemon`: the typed client).
    for args in [
        vec!["http".to_string(), format!("{}/mcp", d.url), d.key.clone()],
        vec![
            "stdio-daemon".to_string(),
            BIN.to_string(),
            d.url.clone(),
            d.key.clone(),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stdout = agent_scenario(&args);
        for check in [
            "agent tools listed",
            "agent_run answers at once",
            "the run succeeded",
            "recent events",
            "cancelled at once",
            "unknown run",
        ] {
            assert!(stdout.contains(check), "{check} did not run:\n{stdout}");
        }
    }
}
