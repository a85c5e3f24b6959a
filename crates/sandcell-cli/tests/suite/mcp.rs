//! The MCP server driven by the official MCP Python SDK (installed by scripts/tools.sh) as a
//! real client: over stdio with the engine embedded, over stdio through a daemon, and over
//! streamable HTTP on the daemon. The scenarios live in tests/mcp/*.py; each prints one JSON
//! line per check and fails on the first one that does not hold.

use std::path::PathBuf;
use std::process::{Command, Output};

use super::daemon::Daemon;

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
