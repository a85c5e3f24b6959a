//! `sandcell run --workspace`: a small Python project's tests run in a template built from its
//! dependency files (pytest from the Python index, through the build's proxy), with the
//! network off and the folder unchanged; the second run finds the template built.

use std::path::Path;
use std::process::{Command, Output};

use super::template_builds::{debian_base, skip_unless_root};

fn project(dir: &Path) {
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    std::fs::write(
        dir.join("pyproject.toml"),
        "[project]\nname = \"calc\"\nversion = \"0.1\"\ndependencies = []\n\
         [project.optional-dependencies]\ntest = [\"pytest\"]\n",
    )
    .unwrap();
    std::fs::write(dir.join("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
    std::fs::write(
        dir.join("tests/test_calc.py"),
        "import socket\nfrom calc import add\n\n\
         def test_add():\n    assert add(2, 3) == 5\n\n\
         def test_wrong():\n    assert add(2, 2) == 5\n\n\
         def test_network_is_off():\n    try:\n        socket.create_connection(('127.0.0.1', 9), timeout=1)\n\
         \x20   except OSError:\n        return\n    raise AssertionError('connected')\n\n\
         def test_writes_stay_in_the_sandbox():\n    open('scratch.txt', 'w').write('x')\n",
    )
    .unwrap();
}

fn run(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sandcell"))
        .env("SANDCELL_HOME", home)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn workspace_mode_runs_a_projects_failing_and_passing_tests_offline_in_its_own_template() {
    if skip_unless_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    if !debian_base(home.path()) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("calc");
    project(&dir);
    let ws = dir.display().to_string();

    let out = run(
        home.path(),
        &[
            "run",
            "--workspace",
            &ws,
            "--",
            "python3",
            "-m",
            "pytest",
            "-q",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 failed, 3 passed"), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("FAILED tests/test_calc.py::test_wrong"),
        "{stdout}"
    );
    assert!(
        stderr.contains("workspace: building template workspace-"),
        "{stderr}"
    );
    assert!(stderr.contains("test dependencies from test"), "{stderr}");
    // The folder is as it was: no cache folders, no scratch file.
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["calc.py", "pyproject.toml", "tests"]);

    // Again: the template is found, not rebuilt; the passing test alone exits 0.
    let out = run(
        home.path(),
        &[
            "run",
            "--workspace",
            &ws,
            "--",
            "python3",
            "-m",
            "pytest",
            "-q",
            "tests/test_calc.py::test_add",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("built before from the same files"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));

    // A changed dependency file is a new template; a bad one fails before anything runs.
    std::fs::write(dir.join("pyproject.toml"), "[project\n").unwrap();
    let out = run(home.path(), &["run", "--workspace", &ws, "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pyproject.toml"),
        "{out:?}"
    );
    let out = run(home.path(), &["run", "--setup", "dev", "--", "true"]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "--setup without --workspace: {out:?}"
    );
}
