//! The real `sandcell` binary, as a user runs it.

use std::process::Command;

use super::common::BIN;

fn sandcell(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_python_code_prints_output_status_and_timings() {
    let (code, out, err) = sandcell(&["run", "--lang", "python", "print(6*7)"]);
    assert_eq!((code, out.as_str()), (0, "42\n"), "{err}");
    assert!(
        err.contains("ok · python") && err.contains("create") && err.contains("ms"),
        "{err}"
    );
    // The last expression's value is printed, an error sets the exit status.
    let (code, out, _) = sandcell(&["run", "-q", "6*7"]);
    assert_eq!((code, out.as_str()), (0, "42\n"));
    let (code, _, err) = sandcell(&["run", "-q", "1/0"]);
    assert_eq!(code, 1);
    assert!(err.contains("ZeroDivisionError"), "{err}");
}

/// `run` is parsed on its own (start-up); its help and errors must read as the full tree's.
#[test]
fn run_help_and_bad_arguments_read_as_a_subcommand() {
    let (code, out, _) = sandcell(&["run", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("Run code or a command in a fresh sandbox")
            && out.contains("Usage: sandcell run [OPTIONS]"),
        "{out}"
    );
    let (code, _, err) = sandcell(&["run", "--no-such-flag"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unexpected argument '--no-such-flag'") && err.contains("sandcell run"),
        "{err}"
    );
    let (_, top, _) = sandcell(&["--help"]);
    assert!(top.contains("run ") && top.contains("serve "), "{top}");
}

#[test]
fn run_node_and_bash() {
    assert_eq!(
        sandcell(&["run", "-q", "--lang", "node", "console.log(1+1)"]).1,
        "2\n"
    );
    assert_eq!(
        sandcell(&["run", "-q", "--lang", "bash", "echo $((2+3))"]).1,
        "5\n"
    );
}

#[test]
fn run_command_propagates_exit_status() {
    let (code, out, _) = sandcell(&["run", "-q", "--", "id", "-u"]);
    assert_eq!((code, out.as_str()), (0, "65532\n"));
    assert_eq!(sandcell(&["run", "-q", "--", "sh", "-c", "exit 3"]).0, 3);
    assert_eq!(
        sandcell(&["run", "-q", "--timeout", "0.5", "--", "sleep", "10"]).0,
        124
    );
}

#[test]
fn run_json_reports_the_cause() {
    let (code, out, err) = sandcell(&[
        "run",
        "--json",
        "--memory",
        "64m",
        "--",
        "/usr/bin/python3",
        "-c",
        "a=bytearray(400*2**20)",
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    let cause = v["result"]["cause"].as_str().unwrap();
    let rootless = v["isolation"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["name"] == "memory_limit" && f["state"] == "degraded");
    assert!(cause == "oom_killed" || rootless, "{v}");
    assert_ne!(code, 0);
    assert!(v["timings"]["create_ms"].as_f64().unwrap() > 0.0);
    assert!(v["sandbox_id"].as_str().unwrap().starts_with("sb-"));
}

#[test]
fn stdin_is_forwarded_on_request() {
    let mut child = Command::new(BIN)
        .args(["run", "-q", "-i", "--", "tr", "a-z", "A-Z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"shout\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SHOUT\n");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let (code, _, err) = sandcell(&["run", "--memory", "1k", "--", "true"]);
    assert_eq!(code, 125);
    assert!(err.contains("memory limit"), "{err}");
    let (code, _, err) = sandcell(&["run"]);
    assert_eq!(code, 125);
    assert!(err.contains("nothing to run"), "{err}");
    let (code, _, err) = sandcell(&["run", "--memory", "lots", "--", "true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a size"), "{err}");
    let (code, _, err) = sandcell(&["run", "-q", "--", "/no/such/thing"]);
    assert_eq!(code, 125);
    assert!(err.contains("/no/such/thing"), "{err}");
}

#[test]
fn doctor_reports_features() {
    let (code, out, err) = sandcell(&["doctor"]);
    assert_eq!(code, 0, "{out}{err}");
    for word in [
        "backend process: available",
        "user_ns",
        "seccomp",
        "landlock",
        "cgroups",
        "runs as uid 65532",
        "pause yes",
        "snapshots language",
        // Whether a working CRIU is here, one way or the other.
        "criu",
    ] {
        assert!(out.contains(word), "doctor output lacks {word}: {out}");
    }
    let (_, out, _) = sandcell(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["sandbox"]["ok"], true);
    assert!(
        v["seccomp_denied"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "ptrace")
    );
}

#[test]
fn no_inherited_descriptors_and_no_controlling_terminal() {
    // The shell leaks fd 7 into sandcell on purpose; nothing of it may reach the sandbox.
    let script = format!(
        "exec 7</etc/hostname; exec {BIN} run -q -- sh -c 'ls /proc/self/fd; cat /dev/tty 2>&1 || echo no-tty'"
    );
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let fds: Vec<&str> = text
        .lines()
        .filter(|l| l.chars().all(|c| c.is_ascii_digit()))
        .collect();
    // 0, 1, 2 and the directory ls is reading.
    assert!(fds.len() <= 4 && !fds.contains(&"7"), "{text}");
    assert!(text.contains("no-tty"), "{text}");
}

#[test]
fn run_json_returns_plots_as_png() {
    let (code, out, err) = sandcell(&[
        "run",
        "--json",
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let png = v["outputs"][0]["data"]["image/png"].as_str().unwrap();
    assert!(
        png.starts_with("iVBORw0KGgo"),
        "not a PNG: {}",
        &png[..20.min(png.len())]
    );
    assert_eq!(v["done"]["status"], "ok");
}

fn repl(lang: &str, input: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args(["repl", "--lang", lang])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn repl_keeps_state_in_every_language() {
    let (code, out, err) = repl(
        "python",
        "x = 41\nx + 1\nfor i in range(2):\n    print(i)\n\nprint('end')\n",
    );
    assert_eq!((code, out.as_str()), (0, "42\n0\n1\nend\n"), "{err}");
    let (_, out, err) = repl("node", "let a = 20\nconst f = (v) => v * 2\nf(a) + 2\n");
    assert!(out.contains("42"), "{out} {err}");
    let (_, out, err) = repl("bash", "cd /tmp\nexport K=4\nf() { echo \"$K$1\"; }\nf 2\n");
    assert!(out.contains("42"), "{out} {err}");
    let (_, out, err) = repl("r", "x <- 21\nx * 2\n");
    assert!(out.contains("42"), "{out} {err}");
}

#[test]
fn repl_saves_images_and_prints_their_paths() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["repl", "--image-dir"])
        .arg(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    let path = dir.path().join("image-1.png");
    assert!(out.contains(&path.display().to_string()), "{out}");
    assert!(std::fs::read(&path).unwrap().starts_with(b"\x89PNG"));
}

/// Drives `sandcell repl` on a real terminal (a pty from Python's `pty.fork`, whose Ctrl-C
/// reaches the repl as a terminal's does), key by key: each step sends keys and waits for a
/// text to appear a number of times in all. Prints the transcript; exits 1 on a timeout.
const TERMINAL_DRIVER: &str = r#"
import json, os, pty, select, sys, time
binary, home, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(TERM="xterm", SANDCELL_HOME=home)
    os.execv(binary, [binary, "repl", "--lang", "python"])
out = b""
for keys, text, count in steps:
    # Line editing switches the terminal mode after showing its prompt, dropping keys that
    # came before: give it a moment, as a person would.
    time.sleep(0.2)
    os.write(fd, keys.encode())
    deadline = time.time() + 30
    while out.count(text.encode()) < count:
        if time.time() > deadline:
            print(out.decode(errors="replace"))
            print("TIMEOUT waiting for %r x%d" % (text, count))
            sys.exit(1)
        if select.select([fd], [], [], 0.05)[0]:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
deadline = time.time() + 30
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.time() > deadline:
        os.kill(pid, 9)
        print(out.decode(errors="replace"))
        print("TIMEOUT waiting for the repl to exit")
        sys.exit(1)
    time.sleep(0.05)
print(out.decode(errors="replace"))
print("EXIT %d" % os.waitstatus_to_exitcode(status))
"#;

fn terminal(home: &std::path::Path, steps: serde_json::Value) -> String {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", TERMINAL_DRIVER, BIN])
        .arg(home)
        .arg(steps.to_string())
        .output()
        .unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{transcript}");
    transcript
}

#[test]
fn repl_on_a_terminal_interrupts_with_ctrl_c_and_keeps_history() {
    let home = tempfile::tempdir().unwrap();
    let t = terminal(
        home.path(),
        serde_json::json!([
            ["", ">>> ", 1],
            ["x = 41\r", ">>> ", 2],
            ["while True:\r", "... ", 1],
            [
                "    print('spinning', flush=True) or __import__('time').sleep(0.05)\r",
                "... ",
                2
            ],
            ["\r", "spinning", 2],
            // Ctrl-C interrupts the running cell; the state stays.
            ["\u{3}", "KeyboardInterrupt", 1],
            ["", ">>> ", 3],
            ["x + 1\r", "42", 1],
            ["", ">>> ", 4],
            ["\u{4}", "", 0],
        ]),
    );
    assert!(t.contains("EXIT 0"), "{t}");
    let history = std::fs::read_to_string(home.path().join("repl-history-python")).unwrap();
    assert!(
        history.contains("x = 41") && history.contains("x + 1"),
        "{history}"
    );
    // The next session starts with that history: two up-arrows recall `x + 1` (the newest
    // entry is this session's `x = 1`).
    let t = terminal(
        home.path(),
        serde_json::json!([
            ["", ">>> ", 1],
            ["x = 1\r", ">>> ", 2],
            ["\u{1b}[A", "x = 1", 2],
            ["\u{1b}[A", "x + 1", 1],
            ["\r", "2\r\n", 1],
            ["", ">>> ", 3],
            ["\u{4}", "", 0],
        ]),
    );
    assert!(t.contains("EXIT 0"), "{t}");
}
