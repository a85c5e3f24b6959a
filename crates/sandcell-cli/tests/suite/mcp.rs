//! The MCP server driven by the official MCP Python SDK (installed by scripts/tools.sh) as a
//! real client: over stdio with the engine embedded, over stdio through a daemon, and over
//! streamable HTTP on the daemon. The scenarios live in tests/mcp/*.py; each prints one JSON
//! line per check and fails on the first one that does not hold. The memory tools and the
//! tools of durable runs (fork, resume) too, the runs asking the test kit's scripted model,
//! and memory_add with infer (the facts from the scripted model, found by hybrid search).

use std::path::PathBuf;
use std::process::{Command, Output};

use sandcell_testkit::llm::{EmbeddingsScript, Script, Turn};

use super::daemon::Daemon;
use super::runs_api::{Model, code_call, slow};

const BIN: &str = env!("CARGO_BIN_EXE_sandcell");

/// The virtualenv's Python with the `mcp` package.
fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let py = root.join("target/tools/venv/bin/python");
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

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .join(name)
}

/// Runs a scenario and asserts it reached its end with every check passing.
fn run(name: &str, args: &[&str]) -> Output {
    run_with(name, args, None)
}

/// Every named check of a scenario ran (and passed: a failing one ends the scenario).
fn assert_ran(stdout: &str, checks: &[&str]) {
    for check in checks {
        assert!(stdout.contains(check), "{check} did not run:\n{stdout}");
    }
}

/// A daemon whose import allow-list is a fresh folder holding one host file (kept while the
/// folder is).
fn daemon_with_a_host_file() -> (Daemon, tempfile::TempDir, PathBuf) {
    let allowed = tempfile::tempdir().unwrap();
    let host_file = allowed.path().join("shared.txt");
    std::fs::write(&host_file, "from the host\n").unwrap();
    let d = Daemon::start(&[&format!(
        "import.allowed_paths={}",
        allowed.path().display()
    )]);
    (d, allowed, host_file)
}

/// As [`run`], telling the scenario a host file it may import (inside the allow-list).
fn run_with(name: &str, args: &[&str], host_file: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new(python());
    if let Some(f) = host_file {
        cmd.env("SANDCELL_TEST_HOST_FILE", f);
        // The daemon of that scenario has the CRIU scripts/tools.sh builds, if it built.
        let criu = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/criu/criu");
        if criu.exists() {
            cmd.env("SANDCELL_TEST_CRIU", "1");
        }
    }
    let out = cmd
        .arg(script(name))
        .args(args)
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(r#"{"done": true}"#),
        "{name} {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        !stdout.contains(r#""ok": false"#),
        "{name}: a check failed:\n{stdout}"
    );
    out
}

#[test]
fn mcp_over_stdio_with_the_engine_embedded() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path().to_str().unwrap();
    let out = run("client.py", &["stdio", BIN, home]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ran(
        &stdout,
        &[
            "plot as image content",
            "state kept",
            "long output truncated",
            "fork has the state",
        ],
    );
}

#[test]
fn mcp_over_stdio_through_a_daemon_and_over_streamable_http() {
    let (d, _allowed, host_file) = daemon_with_a_host_file();
    let mcp_url = format!("{}/mcp", d.url);
    let out = run("client.py", &["stdio-daemon", BIN, &d.url, &d.key]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("reconnect to a session by id"));
    let out = run_with("client.py", &["http", &mcp_url, &d.key], Some(&host_file));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("download link"), "{stdout}");
    assert!(stdout.contains("host file arrived"), "{stdout}");
    if PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/tools/criu/criu")
        .exists()
    {
        assert!(stdout.contains("process-fidelity snapshot"), "{stdout}");
    }
    assert!(stdout.contains("reconnect to a session by id"), "{stdout}");
    // Every session the scenarios made was destroyed by them.
    let left = d.get("/v1/sandboxes");
    assert_eq!(
        left.body["items"].as_array().map(Vec::len),
        Some(0),
        "{:?}",
        left.body
    );
}

#[test]
fn mcp_takes_the_argument_shapes_other_agent_setups_send() {
    let (d, _allowed, host_file) = daemon_with_a_host_file();
    let mcp_url = format!("{}/mcp", d.url);
    let out = run_with("shapes.py", &["http", &mcp_url, &d.key], Some(&host_file));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ran(
        &stdout,
        &[
            "a pinned version that is installed passes",
            "another version fails and is named",
            "node: the pinned version passes in a restored session",
            "import_files with {session_id, path, destination}",
            "import_files with {source, destination}",
            "the newest export arrived",
            "import from an ended session's export",
        ],
    );
    // The exports the scenario asked for stay; the ones made only to copy a live file from
    // one session to another were deleted once imported.
    let exports = d.get("/v1/exports");
    let mut paths: Vec<&str> = exports.body["exports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["path"].as_str())
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "/workspace/data.csv",
            "/workspace/data.csv",
            "/workspace/host.txt"
        ],
        "{:?}",
        exports.body
    );
    let left = d.get("/v1/sandboxes");
    assert_eq!(
        left.body["items"].as_array().map(Vec::len),
        Some(0),
        "{:?}",
        left.body
    );
}

#[test]
fn malformed_json_rpc_gets_errors_and_the_server_keeps_serving() {
    let home = tempfile::tempdir().unwrap();
    run(
        "malformed.py",
        &["stdio", BIN, home.path().to_str().unwrap()],
    );
    let d = Daemon::start(&[]);
    run("malformed.py", &["http", &format!("{}/mcp", d.url), &d.key]);
    // The daemon is unharmed.
    assert_eq!(d.get("/v1/system").status, 200);
}

#[test]
fn mcp_without_a_key_is_refused() {
    let d = Daemon::start(&[]);
    let r = d.call_as(
        None,
        reqwest::Method::POST,
        "/mcp",
        Some(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
    );
    r.expect_error(401, "unauthenticated");
}

/// The checks of tests/mcp/memory.py.
const MEMORY_CHECKS: &[&str] = &[
    "memory tools listed",
    "search ranks the relevant one first",
    "owner memory is separate from session memory (owner side)",
    "owner memory is separate from session memory (session side)",
    "memory_list newest first, a page at a time",
    "a fork remembers its origin's memories",
    "deleted is forgotten",
    "empty text is a tool error",
    "a bad memory id is a tool error",
    "an unknown memory id is a tool error",
    "one owner memory kept",
];

#[test]
fn memory_tools_through_the_official_mcp_client() {
    // With the engine embedded: what the tools kept is in the home's store, where
    // `sandcell memory` (without a daemon) finds it.
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_str().unwrap();
    let out = run("memory.py", &["stdio", BIN, h]);
    assert_ran(&String::from_utf8_lossy(&out.stdout), MEMORY_CHECKS);
    let out = Command::new(BIN)
        .args(["memory", "list", "--json", "--home", h])
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let texts: Vec<&str> = listed["memories"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(texts, ["the kept memory for the test"], "{listed}");

    // On a daemon, over streamable HTTP and through `sandcell mcp --daemon`: the REST API
    // sees the same memories.
    let d = Daemon::start(&[]);
    let mcp_url = format!("{}/mcp", d.url);
    for args in [
        vec!["http", mcp_url.as_str(), d.key.as_str()],
        vec!["stdio-daemon", BIN, d.url.as_str(), d.key.as_str()],
    ] {
        let out = run("memory.py", &args);
        assert_ran(&String::from_utf8_lossy(&out.stdout), MEMORY_CHECKS);
    }
    let found = d.get("/v1/memories/search?q=kept+memory");
    assert_eq!(found.status, 200, "{}", found.body);
    let kept = found.body["memories"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(kept.len(), 2, "one per scenario: {}", found.body);
    assert!(
        kept.iter()
            .all(|m| m["scope"] == "owner" && m["category"] == "e2e"),
        "{}",
        found.body
    );
    // Everything else the scenarios remembered as the owner they deleted.
    let all = d.get("/v1/memories");
    assert_eq!(
        all.body["memories"].as_array().map(Vec::len),
        Some(2),
        "{}",
        all.body
    );
    let left = d.get("/v1/sandboxes");
    assert_eq!(
        left.body["items"].as_array().map(Vec::len),
        Some(0),
        "{:?}",
        left.body
    );
}

/// The checks of tests/mcp/memory_infer.py's `infer` scenario.
const INFER_CHECKS: &[&str] = &[
    "infer tools listed",
    "memory_add with infer answers at once with a queued job",
    "memory_infer_status until succeeded",
    "the facts are the session's memories",
    "memory_search finds an inferred fact, ranked",
    "hybrid ranking finds a fact by meaning alone",
    "an unknown job id is a tool error",
];

/// The checks of tests/mcp/memory_infer.py's `no-model` scenario.
const NO_MODEL_CHECKS: &[&str] = &[
    "infer without a model is a tool error naming the setting (session)",
    "infer without a model is a tool error naming the setting (owner)",
    "nothing was added",
    "the server keeps serving",
];

/// The facts the scripted model extracts, as tests/mcp/memory_infer.py expects them.
const INFERRED: &str = r#"["The user lives in Lisbon", "The user drives an automobile to work"]"#;

#[test]
fn memory_infer_through_the_official_mcp_client() {
    // One infer job per scenario (the daemon's over streamable HTTP, then the embedded
    // engine's over stdio); the embeddings make "vehicle" and "automobile" one word.
    let model = Model::start(
        Script::new()
            .turns([Turn::text(INFERRED), Turn::text(INFERRED)])
            .embeddings(EmbeddingsScript::default().synonyms(["automobile", "car", "vehicle"])),
    );
    let base = model.llm.openai_base();
    let d = Daemon::start(&[
        &format!("agent.openai.base_url={base}"),
        "agent.model=openai/test-model",
        "memory.embedding_model=openai/test-embed",
    ]);
    let mcp_url = format!("{}/mcp", d.url);
    let out = run("memory_infer.py", &["infer", "http", &mcp_url, &d.key]);
    assert_ran(&String::from_utf8_lossy(&out.stdout), INFER_CHECKS);
    // The scenario destroyed the session it made.
    let left = d.get("/v1/sandboxes");
    assert_eq!(
        left.body["items"].as_array().map(Vec::len),
        Some(0),
        "{:?}",
        left.body
    );

    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_str().unwrap();
    let out = run("memory_infer.py", &["infer", "stdio", BIN, h, &base]);
    assert_ran(&String::from_utf8_lossy(&out.stdout), INFER_CHECKS);

    // The model was asked once per job, with the text the client gave.
    let chats: Vec<_> = model
        .llm
        .requests()
        .into_iter()
        .filter(|r| r.path != "/v1/embeddings")
        .collect();
    assert_eq!(chats.len(), 2, "{chats:?}");
    for chat in &chats {
        assert!(
            chat.transcript().contains("I moved to Lisbon last year"),
            "{chat:?}"
        );
        assert_eq!(chat.body["model"], "test-model", "{chat:?}");
    }
    assert_eq!(model.llm.pending_turns(), 0);

    // No model to infer with: a tool error naming the setting, over HTTP and embedded.
    let plain = Daemon::start(&[]);
    let out = run(
        "memory_infer.py",
        &[
            "no-model",
            "http",
            &format!("{}/mcp", plain.url),
            &plain.key,
        ],
    );
    assert_ran(&String::from_utf8_lossy(&out.stdout), NO_MODEL_CHECKS);
    let r = plain.get("/v1/memories/infer");
    assert_eq!(r.body["jobs"], serde_json::json!([]), "{}", r.body);
    let home = tempfile::tempdir().unwrap();
    let out = run(
        "memory_infer.py",
        &["no-model", "stdio", BIN, home.path().to_str().unwrap()],
    );
    assert_ran(&String::from_utf8_lossy(&out.stdout), NO_MODEL_CHECKS);
}

/// The turns of one fork scenario of tests/mcp/durable.py: the original counts x to 3 and
/// answers, then the fork from step 2 prints x and answers.
fn counting_and_a_fork() -> [Turn; 6] {
    [
        code_call("x = 1"),
        code_call("x = 2"),
        code_call("x = 3"),
        Turn::text("original done"),
        code_call("print('X IS', x)"),
        Turn::text("fork done"),
    ]
}

#[test]
fn agent_fork_and_resume_through_the_official_mcp_client() {
    sandcell_testkit::skip_unless_root!();
    let model = Model::start(
        Script::new().turns(
            counting_and_a_fork()
                .into_iter()
                .chain(counting_and_a_fork()),
        ),
    );
    let d = model.daemon();
    let mcp_url = format!("{}/mcp", d.url);
    for (i, args) in [
        vec!["fork", "http", mcp_url.as_str(), d.key.as_str()],
        vec!["fork", "stdio-daemon", BIN, d.url.as_str(), d.key.as_str()],
    ]
    .into_iter()
    .enumerate()
    {
        let out = run("durable.py", &args);
        assert_ran(
            &String::from_utf8_lossy(&out.stdout),
            &[
                "durable run tools listed",
                "agent_run with keep_snapshots",
                "agent_fork answers at once with the new run",
                "the fork goes on from step 2's session",
                "the original is unchanged",
                "agent_fork: a step the run does not have",
                "agent_fork: an unknown run",
                "agent_resume of an ended run",
            ],
        );
        // The fork's first model call saw the original's history up to step 2 (its two
        // code steps, not the third) and the new task.
        let asked = model.llm.requests();
        assert_eq!(asked.len(), 6 * (i + 1), "{args:?}");
        let first = &asked[6 * i + 4];
        let history = first.messages();
        let tool_results = history.iter().filter(|m| m["role"] == "tool").count();
        assert_eq!(tool_results, 2, "steps 1 and 2 only: {history:?}");
        assert!(history.iter().any(|m| m.to_string().contains("x = 2")));
        assert!(!history.iter().any(|m| m.to_string().contains("x = 3")));
        assert!(first.transcript().contains("Print x."));
    }

    // Resume, with the engine embedded: a run the end of its `sandcell mcp` interrupted.
    let model = Model::start(Script::new().turns([
        code_call("x = 21\nprint('SET', x)"),
        // Step 2's first ask: the server goes away while it waits.
        slow(60_000, "never read"),
        code_call("print('DOUBLE', x * 2)"),
        Turn::text("the answer is 42"),
    ]));
    let home = tempfile::tempdir().unwrap();
    let base = model.llm.openai_base();
    let out = run(
        "durable.py",
        &["resume", BIN, home.path().to_str().unwrap(), &base],
    );
    assert_ran(
        &String::from_utf8_lossy(&out.stdout),
        &[
            "in step 2's model call",
            "the stop interrupted it",
            "agent_resume answers at once",
            "the resumed run succeeded",
            "x came back from step 1's snapshot",
            "resuming it again is refused",
        ],
    );
    // Step 2 was asked again with the same conversation; step 1 was not asked again.
    let requests = model.llm.requests();
    assert_eq!(requests.len(), 4, "step 1, step 2 twice, step 3");
    assert_eq!(requests[1].messages().len(), requests[2].messages().len());
}

#[test]
fn a_session_on_an_image_through_the_official_mcp_client() {
    if !std::path::Path::new("/bin/busybox").is_file() {
        sandcell_testkit::skip::skip(
            "/bin/busybox is missing (scripts/setup.sh installs busybox-static)",
        );
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let out = run("image.py", &[BIN, home.path().to_str().unwrap()]);
    assert_ran(
        &String::from_utf8_lossy(&out.stdout),
        &[
            "the image is imported",
            "commands run on the image's system",
            "an image the store lacks is a tool error",
            "template_build builds and waits",
            "template_list shows it",
            "it has the build's files",
            "a failing build says which step",
            "a bad Dockerfile is a tool error naming the line",
            "a session with a volume",
            "the next session reads it, read-only when asked",
            "a host folder the server does not allow is a tool error naming the setting",
        ],
    );
}

#[test]
fn the_tool_list_in_docs_mcp_md_is_current() {
    let out = Command::new(BIN)
        .args(["mcp", "--tools-markdown"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let generated = String::from_utf8(out.stdout).unwrap();
    let doc_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/mcp.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let start = doc
        .find(TOOLS_BEGIN)
        .expect("docs/mcp.md has the tools-begin marker")
        + TOOLS_BEGIN.len();
    let end = doc
        .find(TOOLS_END)
        .expect("docs/mcp.md has the tools-end marker");
    assert!(
        doc[start..end].trim() == generated.trim(),
        "docs/mcp.md's tool list is stale: regenerate it with `sandcell mcp --tools-markdown` (see the comment in the file)"
    );
}

const TOOLS_BEGIN: &str = "<!-- tools:begin (generated by `sandcell mcp --tools-markdown`) -->";
const TOOLS_END: &str = "<!-- tools:end -->";
