//! `sandcell code` when the code's error has no traceback (a kernel that died, a Bash cell
//! interrupted by its timeout): the error's name and message are printed and the stream is
//! read to its `done`, whose status sets the exit code.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use super::common::BIN;
use super::daemon::Daemon;

/// Runs `sandcell code --home HOME ARGS…`; returns (exit code, stdout, stderr).
fn code_cli(home: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("code")
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_code_prints_errors_without_traceback_and_reads_to_done() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));

    // A Python kernel that dies: `KernelDied` with the reason, no traceback.
    let (code, out, err) = code_cli(
        d.home(),
        &[&id, "print('before', flush=True)\nimport os\nos._exit(7)"],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert_eq!(out, "before\n", "{err}");
    assert!(
        err.contains("KernelDied: the python kernel died"),
        "the error's name and message: {err:?}"
    );
    // Only a failure of the service itself stops the stream before `done`, and says so
    // with `sandcell:`.
    assert!(!err.contains("sandcell:"), "{err:?}");

    // The kernel restarts on the next run: the stream above ended cleanly.
    let (code, out, err) = code_cli(d.home(), &[&id, "print(6 * 7)"]);
    assert_eq!((code, out.as_str()), (0, "42\n"), "{err}");

    // A Bash cell interrupted by its timeout: the interruption is named, no traceback.
    let (code, out, err) = code_cli(
        d.home(),
        &[&id, "-l", "bash", "--timeout", "1", "echo start; sleep 30"],
    );
    assert_eq!((code, out.as_str()), (1, "start\n"), "{err}");
    assert!(!err.contains("sandcell:"), "{err:?}");
    assert!(
        err.lines().any(|l| l.contains(": ") && !l.starts_with("-")),
        "the interruption's name and message: {err:?}"
    );
    // Its state survives the interrupt.
    let (code, out, err) = code_cli(d.home(), &[&id, "-l", "bash", "echo after"]);
    assert_eq!((code, out.as_str()), (0, "after\n"), "{err}");
}
