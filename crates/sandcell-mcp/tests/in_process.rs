//! The tools over [`InProcess`]: an MCP client's JSON-RPC lines in, the service called
//! directly (no HTTP server, no router, no JSON bodies), over a real store and a fleet whose
//! sandboxes run the real guest agent without isolation (sandcell-testkit's local backend).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{caller, service};
use sandcell_mcp::InProcess;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};

/// An MCP client on the other end of [`sandcell_mcp::serve_lines`].
struct Client {
    to_server: DuplexStream,
    from_server: Lines<BufReader<DuplexStream>>,
    next_id: u64,
}

impl Client {
    /// Serves the tools over `tools` and does the handshake.
    async fn start(tools: InProcess) -> Self {
        let (to_server, server_in) = tokio::io::duplex(1 << 20);
        let (server_out, from_server) = tokio::io::duplex(1 << 20);
        tokio::spawn(sandcell_mcp::serve_lines(
            Arc::new(tools),
            server_in,
            server_out,
        ));
        let mut client = Self {
            to_server,
            from_server: BufReader::new(from_server).lines(),
            next_id: 1,
        };
        let init = client
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"}}),
            )
            .await;
        assert_eq!(init["result"]["serverInfo"]["name"], "sandcell", "{init}");
        client
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        self.to_server.write_all(&line).await.expect("write");
    }

    /// Sends a request and waits for its answer (skipping anything else the server says).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let answer = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let line = self
                    .from_server
                    .next_line()
                    .await
                    .expect("read")
                    .expect("the server ended");
                let message: Value = serde_json::from_str(&line).expect("JSON");
                if message["id"] == json!(id) {
                    return message;
                }
            }
        })
        .await;
        answer.expect("an answer within a minute")
    }

    /// Calls a tool: whether it failed, and its text.
    async fn call(&mut self, tool: &str, arguments: Value) -> (bool, String) {
        let answer = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        let result = &answer["result"];
        let text = result["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        (result["isError"] == true, text)
    }
}

/// The session id in a tool's text (`session_id: sb-…`).
fn session_id(text: &str) -> String {
    text.split("session_id: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no session id in {text:?}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_reach_the_service_in_process_as_their_caller() {
    let home = tempfile::tempdir().expect("home");
    let service = service(home.path());
    let alice = caller("alice");
    let mut tools = Client::start(InProcess::new(service.clone(), alice.clone())).await;

    let (failed, text) = tools
        .call("create_session", json!({"runtime": "bash"}))
        .await;
    assert!(!failed, "{text}");
    let id = session_id(&text);
    // The session is the caller's, made by the service itself.
    let sandbox = service
        .get_sandbox(&alice, &id.parse().expect("a sandbox id"))
        .expect("alice's sandbox");
    assert_eq!(sandbox.labels.get("mcp").map(String::as_str), Some("true"));

    let (failed, text) = tools
        .call(
            "execute_terminal",
            json!({"session_id": id, "command": "echo hello from the tools; exit 3"}),
        )
        .await;
    assert!(!failed, "{text}");
    assert!(
        text.starts_with("stdout:\nhello from the tools\n") && text.contains("exit_code: 3"),
        "{text}"
    );

    // Another caller's tools do not see it: the service's own error, code and message.
    let mut bobs = Client::start(InProcess::new(service.clone(), caller("bob"))).await;
    let (failed, text) = bobs
        .call("destroy_session", json!({"session_id": id}))
        .await;
    assert!(failed);
    assert_eq!(text, format!("not_found: no sandbox '{id}'"));

    let (failed, text) = tools
        .call("destroy_session", json!({"session_id": id}))
        .await;
    assert!(!failed, "{text}");
    assert_eq!(text, format!("session {id} destroyed"));
    let (_, text) = tools.call("list_sessions", json!({})).await;
    assert_eq!(text, "no active sessions");
}

/// A field of a tool's JSON answer.
fn field(text: &str, key: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v[key].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_tools_start_follow_and_cancel_runs_as_their_caller() {
    use sandcell_testkit::llm::{Fault, Script, ScriptedLlm, Turn};
    let llm = ScriptedLlm::start(
        Script::new()
            .turn(Turn::Fault(Fault::Slow {
                delay_ms: 300,
                then: Box::new(Turn::text("the answer is 42")),
            }))
            .turn(Turn::Fault(Fault::Slow {
                delay_ms: 30_000,
                then: Box::new(Turn::text("too late")),
            })),
    )
    .await
    .expect("the scripted model");
    let home = tempfile::tempdir().expect("home");
    let base = llm.openai_base();
    let service = common::service_with(home.path(), &[("agent.openai.base_url", &base)]);
    let runner = common::runner(&service);
    let alice = caller("alice");
    let mut tools = Client::start(InProcess::with_runner(
        service.clone(),
        runner.clone(),
        alice.clone(),
    ))
    .await;

    let (failed, text) = tools
        .call(
            "agent_run",
            json!({"task": "What is 6 times 7?", "model": "openai/test-model", "max_iterations": 3}),
        )
        .await;
    assert!(!failed, "{text}");
    assert_eq!(field(&text, "status"), "running", "{text}");
    let run = field(&text, "run_id")
        .as_str()
        .expect("a run id")
        .to_string();
    // The run is the caller's, in the runner the tools were given.
    assert_eq!(
        runner.get(&alice, &run).expect("alice's run").model,
        "openai/test-model"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let text = loop {
        let (failed, text) = tools.call("agent_status", json!({"run_id": run})).await;
        assert!(!failed, "{text}");
        if field(&text, "status") != "running" {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(field(&text, "status"), "succeeded", "{text}");
    assert_eq!(field(&text, "reason"), "text", "{text}");
    assert_eq!(field(&text, "answer"), "the answer is 42", "{text}");
    assert_eq!(field(&text, "usage")["llm_calls"], 1, "{text}");
    let recent = field(&text, "recent_events");
    let lines: Vec<&str> = recent
        .as_array()
        .expect("recent events")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        lines
            .last()
            .is_some_and(|l| l.ends_with("run_finished: succeeded (text)")),
        "{lines:?}"
    );

    // Another caller's tools do not see it.
    let mut bobs = Client::start(InProcess::with_runner(
        service.clone(),
        runner.clone(),
        caller("bob"),
    ))
    .await;
    for tool in ["agent_status", "agent_cancel"] {
        let (failed, text) = bobs.call(tool, json!({"run_id": run})).await;
        assert!(failed, "{tool}: {text}");
        assert_eq!(text, format!("not_found: no run '{run}'"), "{tool}");
    }
    let (failed, text) = bobs
        .call("agent_fork", json!({"run_id": run, "from_step": 1}))
        .await;
    assert!(failed && text.starts_with("not_found: "), "{text}");
    // An ended run is forked, not resumed; a step it does not have is the model's to fix.
    let (failed, text) = tools.call("agent_resume", json!({"run_id": run})).await;
    assert!(failed && text.starts_with("invalid_state: "), "{text}");
    assert!(text.contains("fork it"), "{text}");
    let (failed, text) = tools
        .call("agent_fork", json!({"run_id": run, "from_step": 7}))
        .await;
    assert!(failed && text.starts_with("invalid_argument: "), "{text}");
    // A bad argument is the model's to fix.
    let (failed, text) = tools
        .call("agent_run", json!({"task": "x", "budgets": 1}))
        .await;
    assert!(failed && text.starts_with("invalid_argument: "), "{text}");

    // A run stuck in a slow model call ends `cancelled` at once.
    let (failed, text) = tools
        .call(
            "agent_run",
            json!({"task": "Wait for it.", "model": "openai/test-model"}),
        )
        .await;
    assert!(!failed, "{text}");
    let slow = field(&text, "run_id")
        .as_str()
        .expect("a run id")
        .to_string();
    while runner
        .last_events(&alice, &slow, 1)
        .expect("its events")
        .first()
        .is_none_or(|e| e["type"] != "llm_request")
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = tokio::time::Instant::now();
    let (failed, text) = tools.call("agent_cancel", json!({"run_id": slow})).await;
    assert!(!failed, "{text}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        (field(&text, "status"), field(&text, "reason")),
        (json!("cancelled"), json!("cancelled")),
        "{text}"
    );
    service.fleet.stop_all("the test is over").await;
}

/// The memory ids of a `memory_search` or `memory_list` answer, in its order.
fn memory_ids(text: &str, list: &str) -> Vec<String> {
    field(text, list)
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in {text}"))
        .iter()
        .map(|m| m["memory_id"].as_str().expect("a memory id").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_tools_keep_sessions_and_owners_apart_and_rank_what_matches() {
    let home = tempfile::tempdir().expect("home");
    let service = service(home.path());
    let mut tools = Client::start(InProcess::new(service.clone(), caller("alice"))).await;
    let (failed, text) = tools
        .call("create_session", json!({"runtime": "bash"}))
        .await;
    assert!(!failed, "{text}");
    let sid = session_id(&text);

    let mut add = async |args: Value| {
        let (failed, text) = tools.call("memory_add", args).await;
        assert!(!failed, "{text}");
        text
    };
    let text = add(
        json!({"session_id": sid, "text": "The staging database listens on port 5433",
        "category": "infra", "metadata": {"source": "runbook"}}),
    )
    .await;
    assert_eq!(field(&text, "scope"), "session", "{text}");
    assert_eq!(field(&text, "session_id"), json!(sid), "{text}");
    assert_eq!(field(&text, "metadata"), json!({"source": "runbook"}));
    let port = field(&text, "memory_id")
        .as_str()
        .expect("an id")
        .to_string();
    assert!(port.starts_with("mem-"), "{port}");
    add(json!({"session_id": sid, "text": "Deploys go out on Tuesdays"})).await;
    add(json!({"session_id": sid, "text": "The database backups run nightly"})).await;
    let text = add(json!({"text": "Alice prefers answers in British English"})).await;
    assert_eq!(field(&text, "scope"), "owner", "{text}");
    assert_eq!(field(&text, "session_id"), Value::Null, "{text}");
    assert_eq!(field(&text, "category"), "general", "{text}");
    let own = field(&text, "memory_id")
        .as_str()
        .expect("an id")
        .to_string();

    // Ranked: the memory with both words first, with ranks and falling scores.
    let (failed, text) = tools
        .call(
            "memory_search",
            json!({"session_id": sid, "query": "staging database port"}),
        )
        .await;
    assert!(!failed, "{text}");
    let ids = memory_ids(&text, "results");
    assert_eq!(ids.len(), 2, "{text}");
    assert_eq!(ids[0], port, "{text}");
    let results = field(&text, "results");
    assert_eq!(
        (&results[0]["rank"], &results[1]["rank"]),
        (&json!(1), &json!(2))
    );
    let score = |i: usize| results[i]["score"].as_f64().expect("a score");
    assert!(score(0) > score(1), "{text}");
    // A session's memories are not the owner's, and the other way round.
    let (_, text) = tools
        .call("memory_search", json!({"query": "database"}))
        .await;
    assert!(memory_ids(&text, "results").is_empty(), "{text}");
    assert!(field(&text, "note").is_string(), "{text}");
    let (_, text) = tools
        .call("memory_search", json!({"query": "British English"}))
        .await;
    assert_eq!(memory_ids(&text, "results"), [own.as_str()]);
    let (_, text) = tools
        .call(
            "memory_search",
            json!({"session_id": sid, "query": "British"}),
        )
        .await;
    assert!(memory_ids(&text, "results").is_empty(), "{text}");
    // Listed newest first, filtered by category, a page at a time.
    let (_, text) = tools
        .call("memory_list", json!({"session_id": sid, "limit": 2}))
        .await;
    assert_eq!(memory_ids(&text, "memories").len(), 2, "{text}");
    let cursor = field(&text, "next_cursor");
    let (_, text) = tools
        .call(
            "memory_list",
            json!({"session_id": sid, "limit": 2, "cursor": cursor}),
        )
        .await;
    assert_eq!(memory_ids(&text, "memories"), [port.as_str()], "{text}");
    assert_eq!(field(&text, "next_cursor"), Value::Null, "{text}");
    let (_, text) = tools
        .call(
            "memory_list",
            json!({"session_id": sid, "category": "infra"}),
        )
        .await;
    assert_eq!(memory_ids(&text, "memories"), [port.as_str()], "{text}");

    // Another caller sees none of it.
    let mut bobs = Client::start(InProcess::new(service.clone(), caller("bob"))).await;
    for (tool, args) in [
        ("memory_list", json!({"session_id": sid})),
        ("memory_add", json!({"session_id": sid, "text": "mine now"})),
        ("memory_delete", json!({"memory_id": port})),
        ("memory_delete", json!({"memory_id": own})),
    ] {
        let (failed, text) = bobs.call(tool, args).await;
        assert!(failed && text.starts_with("not_found: "), "{tool}: {text}");
    }

    // Bad arguments are tool errors naming what is wrong, and nothing is stored.
    for (tool, args, says) in [
        ("memory_add", json!({"text": "  "}), "invalid_argument: "),
        (
            "memory_add",
            json!({"text": "x", "category": "Not OK"}),
            "invalid_argument: ",
        ),
        (
            "memory_add",
            json!({"text": "x", "session_id": "nope"}),
            "invalid_argument: ",
        ),
        ("memory_add", json!({}), "invalid_argument: "),
        ("memory_search", json!({"query": ""}), "invalid_argument: "),
        (
            "memory_search",
            json!({"query": "x", "limit": 0}),
            "invalid_argument: ",
        ),
        (
            "memory_delete",
            json!({"memory_id": "mem-x"}),
            "invalid_argument: ",
        ),
        (
            "memory_delete",
            json!({"memory_id": "mem-0123456789abcdef"}),
            "not_found: ",
        ),
    ] {
        let (failed, text) = tools.call(tool, args.clone()).await;
        assert!(failed && text.starts_with(says), "{tool} {args}: {text}");
    }
    let (_, text) = tools.call("memory_list", json!({})).await;
    assert_eq!(memory_ids(&text, "memories"), [own.as_str()], "{text}");

    // Deleted by id, a session's too: gone from search.
    for id in [&port, &own] {
        let (failed, text) = tools.call("memory_delete", json!({"memory_id": id})).await;
        assert!(!failed, "{text}");
        assert_eq!(text, format!("memory {id} deleted"));
    }
    let (_, text) = tools
        .call(
            "memory_search",
            json!({"session_id": sid, "query": "staging"}),
        )
        .await;
    assert!(memory_ids(&text, "results").is_empty(), "{text}");
    let (failed, text) = tools.call("memory_delete", json!({"memory_id": own})).await;
    assert!(failed && text.starts_with("not_found: "), "{text}");
    service.fleet.stop_all("the test is over").await;
}
