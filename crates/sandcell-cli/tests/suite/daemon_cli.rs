//! The `sandcell` CLI as a client of a running daemon (found through `--home`): `sandbox …`,
//! `exec`, `code`, `files …`, `ps`, their output and exit statuses; and without a daemon.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::common::BIN;
use super::daemon::Daemon;

/// Runs `sandcell COMMAND --home HOME REST…`; returns (exit code, stdout, stderr).
fn cli(home: &Path, args: &[&str]) -> (i32, String, String) {
    cli_stdin(home, args, None)
}

fn cli_stdin(home: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .arg(args[0])
        .arg("--home")
        .arg(home)
        .args(&args[1..])
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a command that must succeed and print JSON.
fn cli_json(home: &Path, args: &[&str]) -> Value {
    let (code, out, err) = cli(home, args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[test]
fn daemon_cli_client_commands() {
    let d = Daemon::start(&[]);
    let h = d.home();

    // sandbox create: the id alone, or the record as JSON.
    let (code, out, err) = cli(
        h,
        &[
            "sandbox",
            "create",
            "-t",
            "python",
            "-l",
            "team=ml",
            "--meta",
            "run=7",
            "-e",
            "FOO=bar baz",
            "--timeout",
            "600",
            "--idle-timeout",
            "300",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_string();
    assert!(id.starts_with("sb-") && out.lines().count() == 1, "{out}");
    let s = d.sandbox(&id);
    assert_eq!(s.template, "python");
    assert_eq!(json!(s.labels), json!({"team": "ml"}));
    assert_eq!(json!(s.metadata), json!({"run": "7"}));
    assert_eq!(s.idle_timeout_secs, Some(300));
    let other = cli_json(
        h,
        &[
            "sandbox",
            "create",
            "--json",
            "--size",
            "nano",
            "--ephemeral",
        ],
    );
    assert_eq!(other["ephemeral"], true, "{other}");
    assert_eq!(other["limits"]["pids"], 64);
    let other = other["id"].as_str().unwrap().to_string();

    // ls: a table with both, or JSON; filtered by label.
    let (code, out, _) = cli(h, &["sandbox", "ls"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("ID"), "{out}");
    assert!(out.contains(&id) && out.contains(&other), "{out}");
    assert!(out.contains("team=ml"), "{out}");
    let v = cli_json(h, &["sandbox", "ls", "-l", "team=ml", "--json"]);
    let listed: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [id.as_str()]);

    // get.
    let v = cli_json(h, &["sandbox", "get", &id, "--json"]);
    assert_eq!(
        (v["id"].as_str(), v["state"].as_str()),
        (Some(id.as_str()), Some("running"))
    );
    let (code, out, _) = cli(h, &["sandbox", "get", &id]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&id) && out.contains("running") && out.contains("expires:"),
        "{out}"
    );

    // exec: output streamed to stdout and stderr, the exit status passed on.
    let (code, out, err) = cli(h, &["exec", &id, "--", "echo out; echo err >&2; exit 7"]);
    assert_eq!((code, out.as_str()), (7, "out\n"), "{err}");
    assert!(err.contains("err"), "{err}");
    // Several words are an argv; the sandbox's env is there.
    let (code, out, err) = cli(h, &["exec", &id, "--", "sh", "-c", "echo \"$FOO\"; pwd"]);
    assert_eq!((code, out.as_str()), (0, "bar baz\n/workspace\n"), "{err}");
    let (code, out, _) = cli(
        h,
        &["exec", &id, "-w", "/tmp", "-e", "A=1", "--", "echo $A; pwd"],
    );
    assert_eq!((code, out.as_str()), (0, "1\n/tmp\n"));
    let (code, out, err) = cli(h, &["exec", "--json", &id, "--", "echo j; exit 5"]);
    assert_eq!(code, 5, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["stdout"].as_str(), v["exit_code"].as_i64()),
        (Some("j\n"), Some(5))
    );

    // code: state kept between calls; an error sets the exit status.
    let (code, out, err) = cli(h, &["code", &id, "x = 20\nprint('set')"]);
    assert_eq!((code, out.as_str()), (0, "set\n"), "{err}");
    let (code, out, _) = cli(h, &["code", &id, "x * 2"]);
    assert_eq!((code, out.as_str()), (0, "40\n"));
    let (code, _, err) = cli(h, &["code", &id, "1/0"]);
    assert_eq!(code, 1);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    let (code, out, _) = cli_stdin(h, &["code", &id, "-"], Some("print(x + 1)\n"));
    assert_eq!((code, out.as_str()), (0, "21\n"));
    let (code, out, _) = cli(h, &["code", &id, "-l", "bash", "echo $((6*7))"]);
    assert_eq!((code, out.as_str()), (0, "42\n"));

    // files: put, ls, get to stdout and to a file.
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("in.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(&src, &bytes).unwrap();
    let (code, out, err) = cli(
        h,
        &[
            "files",
            "put",
            &id,
            src.to_str().unwrap(),
            "/workspace/up.bin",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("/workspace/up.bin") && out.contains("100000"),
        "{out}"
    );
    let (code, out, _) = cli_stdin(
        h,
        &["files", "put", &id, "-", "/workspace/t.txt"],
        Some("typed"),
    );
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = cli(h, &["files", "ls", &id]);
    assert_eq!(code, 0);
    assert!(
        out.contains("up.bin") && out.contains("t.txt") && out.contains("100000"),
        "{out}"
    );
    let v = cli_json(h, &["files", "ls", &id, "/workspace", "--json"]);
    let sizes: Vec<(&str, u64)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "file")
        .map(|e| (e["name"].as_str().unwrap(), e["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(sizes, [("t.txt", 5), ("up.bin", 100_000)], "{v}");
    let (code, out, _) = cli(h, &["files", "get", &id, "/workspace/t.txt"]);
    assert_eq!((code, out.as_str()), (0, "typed"));
    let dst = local.path().join("out.bin");
    let (code, _, err) = cli(
        h,
        &[
            "files",
            "get",
            &id,
            "/workspace/up.bin",
            dst.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&dst).unwrap() == bytes);
    let (code, _, err) = cli(h, &["files", "get", &id, "/etc/passwd"]);
    assert_ne!(code, 0);
    assert!(err.contains("path_outside_sandbox"), "{err}");

    // ps.
    cli(h, &["exec", &id, "--", "sleep 100 > /dev/null 2>&1 &"]);
    let (code, out, _) = cli(h, &["ps", &id]);
    assert_eq!(code, 0);
    assert!(out.starts_with("PID") && out.contains("sleep 100"), "{out}");
    let v = cli_json(h, &["ps", &id, "--json"]);
    assert!(
        v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["cmdline"] == "sleep 100"),
        "{v}"
    );

    // timeout.
    let (code, out, _) = cli(h, &["sandbox", "timeout", &id, "120"]);
    assert_eq!(code, 0);
    assert!(out.contains(&id) && out.contains("now ends at"), "{out}");
    let v = cli_json(h, &["sandbox", "timeout", &id, "240", "--json"]);
    assert_eq!(
        v["expires_at"].as_str(),
        d.sandbox(&id).expires_at.as_deref()
    );

    // pause and resume.
    let (code, out, err) = cli(h, &["sandbox", "pause", &id]);
    assert_eq!(
        (code, out.trim()),
        (0, format!("{id} paused").as_str()),
        "{err}"
    );
    assert_eq!(d.sandbox(&id).state, "paused");
    let v = cli_json(h, &["sandbox", "resume", &id, "--json"]);
    assert_eq!(v[0]["state"], "running", "{v}");
    let (code, out, err) = cli(h, &["sandbox", "pause", &id, "sb-000000000000"]);
    assert_eq!(code, 1, "one of two failed: {out}");
    assert!(out.contains(&format!("{id} paused")), "{out}");
    assert!(
        err.contains("sb-000000000000") && err.contains("not_found"),
        "{err}"
    );
    assert_eq!(cli(h, &["sandbox", "resume", &id]).0, 0);

    // snapshot create, ls, fork, get, rm.
    d.exec(&id, "echo kept > /workspace/kept");
    let (code, out, err) = cli(h, &["snapshot", "create", &id, "-n", "first", "-t", "k=v"]);
    assert_eq!(code, 0, "{err}");
    let snap = out.trim().to_string();
    assert!(
        snap.starts_with("sn-") && err.contains(" fidelity, "),
        "{out} {err}"
    );
    let (code, out, _) = cli(h, &["snapshot", "ls", "--sandbox", &id]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("ID") && out.contains(&snap) && out.contains("first"),
        "{out}"
    );
    let (code, out, err) = cli(h, &["snapshot", "fork", &snap, "-n", "2"]);
    assert_eq!(code, 0, "{err}");
    let forks: Vec<&str> = out.lines().collect();
    assert_eq!(forks.len(), 2, "{out}");
    for f in &forks {
        assert_eq!(d.exec(f, "cat /workspace/kept").stdout, "kept\n");
    }
    // One fork is a restore: --json is that sandbox, with what came back.
    let v = cli_json(h, &["snapshot", "fork", &snap, "--json"]);
    assert!(v["id"].as_str().unwrap().starts_with("sb-"), "{v}");
    assert!(v["restore"]["fidelity"].is_string(), "{v}");
    let v = cli_json(h, &["snapshot", "get", &snap]);
    assert_eq!(v["sandboxes"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(cli(h, &["snapshot", "rm", &snap]).0, 0);
    let (code, _, err) = cli(h, &["snapshot", "rm", &snap]);
    assert_eq!(code, 1);
    assert!(err.contains("not_found"), "{err}");

    // Errors: a missing sandbox, a bad id; exit non-zero with the daemon's code.
    let (code, _, err) = cli(h, &["exec", "sb-000000000000", "--", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("not_found"), "{err}");
    let (code, _, err) = cli(h, &["sandbox", "get", "sb-BAD"]);
    assert_ne!(code, 0);
    assert!(err.contains("invalid_argument"), "{err}");

    // rm: stops; the record stays, stopped; a missing one fails the command.
    let (code, out, _) = cli(h, &["sandbox", "rm", &id, &other]);
    assert_eq!(
        (code, out.as_str()),
        (0, format!("{id}\n{other}\n").as_str())
    );
    assert_eq!(d.sandbox(&id).state, "stopped");
    let (code, out, err) = cli(h, &["sandbox", "rm", "sb-000000000000", &id]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("sb-000000000000") && err.contains("not_found"),
        "{err}"
    );
    let (code, out, _) = cli(h, &["sandbox", "ls"]);
    assert_eq!(code, 0);
    assert!(!out.contains(&id), "{out}");
    let (_, out, _) = cli(h, &["sandbox", "ls", "--all"]);
    assert!(out.contains(&id) && out.contains("stopped"), "{out}");

    // Another key through --api-key: it sees none of admin's.
    let (bob, _) = d.key_for("bob");
    let (code, out, _) = cli(h, &["sandbox", "ls", "--all", "--json", "--api-key", &bob]);
    assert_eq!((code, out.trim()), (0, "[]"));
    let (code, _, err) = cli(h, &["sandbox", "ls", "--api-key", "sc_wrong"]);
    assert_ne!(code, 0);
    assert!(err.contains("unauthenticated"), "{err}");
}

#[test]
fn daemon_cli_exec_exit_status_of_a_timeout_or_a_signal() {
    // `sandcell exec` exits 124 for a command that ran out of time and 128 + N for one
    // ended by signal N, streamed or with --json (as `sandcell run` does).
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    let h = d.home();
    let mut got = Vec::new();
    for json in [false, true] {
        let mut args = vec!["exec", id.as_str(), "--timeout", "1", "--", "sleep 30"];
        if json {
            args.insert(1, "--json");
        }
        got.push((json, "timeout", cli(h, &args).0, 124));
        let mut args = vec!["exec", id.as_str(), "--", "kill -TERM $$"];
        if json {
            args.insert(1, "--json");
        }
        got.push((json, "SIGTERM", cli(h, &args).0, 128 + 15));
    }
    let wrong: Vec<_> = got
        .iter()
        .filter(|(_, _, code, want)| code != want)
        .collect();
    assert!(
        wrong.is_empty(),
        "(json, case, exit status, expected): {wrong:?}"
    );
}

#[test]
fn daemon_cli_code_json_exit_status_follows_the_run() {
    // `sandcell code --json` exits 0 when the code ran fine and 1 when it raised.
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    let (code, out, err) = cli(d.home(), &["code", "--json", &id, "1 + 1"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    assert_eq!(v["done"]["status"], "ok", "{v}");
    assert_eq!(v["result"]["text/plain"], "2");
    let (bad, _, _) = cli(d.home(), &["code", "--json", &id, "1/0"]);
    assert_eq!(bad, 1);
    assert_eq!(code, 0, "exit status of a successful `code --json`");
}

#[test]
fn daemon_cli_ps_shows_memory_use() {
    // `sandcell ps` has an RSS column: it must show a number, not "-".
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    d.exec(&id, "sleep 100 > /dev/null 2>&1 &");
    let (code, out, err) = cli(d.home(), &["ps", &id]);
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    let col = header
        .iter()
        .position(|c| c.starts_with("RSS"))
        .unwrap_or_else(|| panic!("no RSS column: {out}"));
    let line = out
        .lines()
        .find(|l| l.contains("sleep 100"))
        .unwrap_or_else(|| panic!("{out}"));
    let rss = line.split_whitespace().nth(col).unwrap();
    assert!(
        rss.parse::<u64>().is_ok_and(|n| n > 0),
        "RSS {rss:?} in:\n{out}"
    );
}

#[test]
fn daemon_cli_without_a_daemon_says_none_is_running() {
    let home = tempfile::tempdir().unwrap();
    for args in [
        vec!["sandbox", "ls"],
        vec!["exec", "sb-000000000000", "--", "true"],
        vec!["code", "sb-000000000000", "1"],
        vec!["files", "ls", "sb-000000000000"],
        vec!["ps", "sb-000000000000"],
    ] {
        let (code, out, err) = cli(home.path(), &args);
        assert_ne!(code, 0, "{args:?}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(
            err.contains("no Sandcell daemon is running") && err.contains("sandcell serve"),
            "{args:?}: {err}"
        );
    }
    // A daemon.json left by a daemon that died (kill -9): its pid runs no more.
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    std::fs::write(
        home.path().join("daemon.json"),
        json!({"pid": pid, "url": "http://127.0.0.1:9", "unix_socket": null}).to_string(),
    )
    .unwrap();
    std::fs::write(home.path().join("admin.key"), "sc_x_y\n").unwrap();
    let (code, _, err) = cli(home.path(), &["sandbox", "ls"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("is not running") && err.contains("sandcell serve"),
        "{err}"
    );
    // A daemon.json whose daemon runs but does not answer there.
    std::fs::write(
        home.path().join("daemon.json"),
        json!({"pid": std::process::id(), "url": "http://127.0.0.1:9", "unix_socket": null})
            .to_string(),
    )
    .unwrap();
    let (code, _, err) = cli(home.path(), &["sandbox", "ls"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("127.0.0.1:9") && err.contains("sandcell serve"),
        "{err}"
    );
}
