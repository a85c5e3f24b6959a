//! Tests that cannot run here end early *and say so*.
//!
//! Stable Rust's test harness has no runtime skip: a test that returns early counts as
//! passed, and what it printed is captured and thrown away. [`skip()`] writes
//! `SKIPPED <test>: <reason>` to the real stderr (past the harness's capture, so it shows in
//! any run) and appends the same line to the file `SANDCELL_SKIP_LOG` names, which
//! `scripts/test.sh` counts and lists at the end of the suite.
//!
//! ```no_run
//! use sandcell_testkit::{require, skip_unless_root};
//!
//! fn mounts_a_tmpfs() {
//!     skip_unless_root!();
//!     require!(std::path::Path::new("/dev/shm").exists(), "no /dev/shm");
//!     // … the test proper
//! }
//! ```

use std::fmt::Display;
use std::io::Write;
use std::path::Path;

/// The environment variable naming the file every skip is appended to.
pub const LOG_ENV: &str = "SANDCELL_SKIP_LOG";

/// Reports the running test as skipped for `reason`; the caller then returns (the macros
/// [`skip!`](crate::skip!), [`require!`](crate::require!) and
/// [`skip_unless_root!`](crate::skip_unless_root!) do both).
pub fn skip(reason: impl Display) {
    let line = format!("{}: {reason}", test_name());
    let log = std::env::var_os(LOG_ENV);
    record(&line, log.as_deref().map(Path::new));
}

/// Prints the line and appends it to `log`.
fn record(line: &str, log: Option<&Path>) {
    // Straight to the descriptor: `eprintln!` inside a test goes to the harness's capture.
    let _ = std::io::stderr().write_all(format!("SKIPPED {line}\n").as_bytes());
    if let Some(log) = log.filter(|p| !p.as_os_str().is_empty()) {
        append(line, log);
    }
}

/// Appends the line to the log (saying so on stderr when it cannot).
fn append(line: &str, log: &Path) {
    // One write of one short line to a file opened for appending: lines of tests running in
    // parallel do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        // The skip must not vanish silently, and failing the test would hide the reason.
        let _ = std::io::stderr()
            .write_all(format!("SKIPPED (not logged: {}: {e}) {line}\n", log.display()).as_bytes());
    }
}

/// The running test as `<test binary>::<test path>`, plus the backend the suite runs on when
/// `SANDCELL_TEST_BACKEND` names one (the CLI suites run once per backend).
pub fn test_name() -> String {
    let thread = std::thread::current();
    // The harness names each test's thread after the test; anything else (a task spawned on
    // a runtime's worker, the main thread) does not know which test it serves.
    let test = match thread.name() {
        Some(name) if name != "main" && !name.starts_with("tokio-") => name.to_string(),
        _ => "<unknown test>".to_string(),
    };
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map(|name| binary_name(&name).to_string());
    let mut name = match binary {
        Some(binary) => format!("{binary}::{test}"),
        None => test,
    };
    if let Ok(backend) = std::env::var("SANDCELL_TEST_BACKEND")
        && !backend.is_empty()
    {
        name.push_str(&format!(" (on {backend})"));
    }
    name
}

/// A test binary's name without the hash cargo appends (`cgroup-0123456789abcdef` → `cgroup`).
fn binary_name(file: &str) -> &str {
    match file.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            stem
        }
        _ => file,
    }
}

/// Whether this process runs as root (effective uid 0), read from `/proc/self/status` so the
/// kit needs no system-call crate.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| effective_uid(&status))
        == Some(0)
}

/// The effective uid of a `/proc/<pid>/status` text (`Uid: real effective saved fs`).
fn effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Reports the running test as skipped (`format!` arguments) and returns from it.
#[macro_export]
macro_rules! skip {
    ($($reason:tt)+) => {{
        $crate::skip::skip(::core::format_args!($($reason)+));
        return;
    }};
}

/// Skips the running test (see [`skip!`](crate::skip!)) unless `condition` holds.
#[macro_export]
macro_rules! require {
    ($condition:expr, $($reason:tt)+) => {
        if !$condition {
            $crate::skip!($($reason)+);
        }
    };
}

/// Skips the running test unless it runs as root.
#[macro_export]
macro_rules! skip_unless_root {
    () => {
        $crate::require!($crate::skip::is_root(), "needs root")
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_appended_to_the_log_one_line_each() {
        let dir = tempfile_dir();
        let log = dir.join("skipped");
        append("a::one: needs root", &log);
        append("a::two: no /dev/shm", &log);
        let text = std::fs::read_to_string(&log).expect("the log");
        assert_eq!(text, "a::one: needs root\na::two: no /dev/shm\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_test_name_is_the_harness_thread_name() {
        let name = test_name();
        assert!(
            name.contains("skip::tests::the_test_name_is_the_harness_thread_name"),
            "{name}"
        );
        assert!(name.starts_with("sandcell_testkit::"), "{name}");
    }

    #[test]
    fn cargo_hash_is_dropped_from_binary_names() {
        assert_eq!(binary_name("cgroup-0123456789abcdef"), "cgroup");
        assert_eq!(binary_name("all-0123456789abcdeg"), "all-0123456789abcdeg");
        assert_eq!(binary_name("routes"), "routes");
    }

    #[test]
    fn effective_uid_is_the_second_field() {
        assert_eq!(effective_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n"), Some(0));
        assert_eq!(effective_uid("Uid:\t0\t1000\t0\t0\n"), Some(1000));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    /// A fresh directory without a dev-dependency (the kit stays dependency-free).
    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sandcell-testkit-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir
    }
}
