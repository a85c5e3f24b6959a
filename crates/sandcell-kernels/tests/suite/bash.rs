//! bash kernel tests (written with the kernel).

use std::time::{Duration, Instant};

use sandcell_protocol::Language;
use serde_json::json;

use crate::common::{Kernel, done, of_type};

fn start() -> Kernel {
    Kernel::start(Language::Bash)
}

/// Runs `code` and returns its `done` event and what it wrote to fd 1, which must end with
/// `marker` (the cell's last command echoes it).
fn run_capture(k: &mut Kernel, code: &str, marker: &str) -> (serde_json::Value, String) {
    let before = k.stdout_text().len();
    let events = k.execute(code);
    // fd 1 is read apart from the protocol: wait for the marker's whole line, not just the
    // marker (a cell's last `echo` can arrive in two reads).
    let deadline = Instant::now() + Duration::from_secs(2);
    let out = loop {
        let out = k.stdout_text()[before..].to_string();
        let complete = out.find(marker).is_some_and(|at| out[at..].contains('\n'));
        if complete || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        out.contains(marker),
        "no {marker:?} in {out:?}; events {events:?}"
    );
    (done(&events).clone(), out)
}

fn assert_done(events: &[serde_json::Value], status: &str, exit_code: i64) {
    let d = done(events);
    assert_eq!(d["status"], status, "{events:?}");
    assert_eq!(d["exit_code"], exit_code, "{events:?}");
    assert_eq!(d["dropped"], json!({"stdout": 0, "stderr": 0}), "{d}");
}

/// The kernel's descendants (children, grandchildren...), from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if let Some(ppid) = after.split(' ').nth(1).and_then(|s| s.parse().ok()) {
            parents.push((p, ppid));
        }
    }
    let mut out = vec![];
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, ppid) in &parents {
            if ppid == parent && !out.contains(&p) {
                out.push(p);
                frontier.push(p);
            }
        }
    }
    out
}

/// What the agent does: SIGINT to the kernel's process group. The harness does not make the
/// kernel a group leader, so signal the kernel and then its descendants (the shell must have
/// the signal before it sees its child die of it, as with a signal to the group).
fn interrupt_group(k: &Kernel) {
    k.interrupt();
    for p in descendants(k.child.id()) {
        if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
    }
}

/// Sends an execute request for `code`, which must print `started` first, waits until that
/// shows on fd 1, then calls `interrupt` and returns the events.
fn execute_and_interrupt(
    k: &mut Kernel,
    code: &str,
    interrupt: fn(&Kernel),
) -> Vec<serde_json::Value> {
    let before = k.stdout_text().matches("started").count();
    let id = k.send(json!({"op": "execute", "code": code}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while k.stdout_text().matches("started").count() == before {
        assert!(Instant::now() < deadline, "the cell did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    interrupt(k);
    k.collect(id)
}

#[test]
fn ready_names_bash_and_its_pid() {
    let t = Instant::now();
    let k = start();
    eprintln!("bash: ready after {:?}", t.elapsed());
    assert_eq!(k.ready["language"], "bash");
    assert_eq!(k.ready["pid"], k.child.id());
    let version = k.ready["version"].as_str().unwrap();
    assert!(
        version.starts_with(|c: char| c.is_ascii_digit()),
        "{version}"
    );
    let status = k.close();
    assert!(status.success(), "{status:?}");
}

#[test]
fn acceptance_state_persists_across_cells() {
    let mut k = start();
    for code in ["cd /tmp", "export K=4", "f() { echo \"$K$1\"; }"] {
        let events = k.execute(code);
        assert_done(&events, "ok", 0);
        assert_eq!(events.len(), 1, "no stream events for bash: {events:?}");
    }
    let (_, out) = run_capture(&mut k, "f 2", "42");
    assert_eq!(out, "42\n");
    let (_, out) = run_capture(&mut k, "pwd", "/tmp");
    assert_eq!(out, "/tmp\n");
    // Exported to children too.
    let (_, out) = run_capture(&mut k, "bash -c 'echo child:$K'", "child:4");
    assert_eq!(out, "child:4\n");
    // `declare` at the top of a cell makes globals, as in a script.
    k.execute("declare -A m=([a]=1); declare -i n=41; n+=1");
    let (_, out) = run_capture(&mut k, "echo \"${m[a]} $n\"", "1 42");
    assert_eq!(out, "1 42\n");
    assert!(k.close().success());
}

#[test]
fn exit_codes_and_execution_count() {
    let mut k = start();
    let events = k.execute("false");
    assert_done(&events, "error", 1);
    assert!(of_type(&events, "error").is_empty(), "{events:?}");
    assert_eq!(done(&events)["execution_count"], 1);
    let events = k.execute("true");
    assert_done(&events, "ok", 0);
    assert_eq!(done(&events)["execution_count"], 2);
    assert_done(
        &k.execute("exit_with() { return $1; }; exit_with 7"),
        "error",
        7,
    );
    // `return` at the top of a cell ends the cell.
    assert_done(&k.execute("return 3; echo unreachable"), "error", 3);
    assert_done(&k.execute("no-such-command-here"), "error", 127);
    // $? starts as the previous cell's status.
    let (d, out) = run_capture(&mut k, "echo \"status:$?\"", "status:127");
    assert_eq!(out, "status:127\n");
    assert_eq!(d["execution_count"], 6);
    // A syntax error fails the cell, not the kernel.
    assert_done(&k.execute("fi"), "error", 2);
    assert_done(&k.execute("true"), "ok", 0);
    assert!(k.close().success());
}

#[test]
fn text_round_trips_exactly() {
    let mut k = start();
    let text = "quotes ' \" `back` $HOME ${x} $(nope)\nback\\slash \\\\ \\n \\u0041 \\\"\n\ttab\tand trailing spaces  \nunicode é 漢字 😀 \u{202e}\ncontrol \u{1}\u{1e}\u{1f}\u{7f} end";
    let code = format!("cat <<'SANDCELL_EOF'\n{text}\nSANDCELL_EOF\necho '<end>'");
    let (d, out) = run_capture(&mut k, &code, "<end>");
    assert_eq!(d["status"], "ok");
    assert_eq!(out, format!("{text}\n<end>\n"));
    // Through a variable and printf as well.
    let code = "v=$'a\\tb\\\\c \"d\" é漢字😀 $'\"'\"'x'\nprintf '[%s]\\n' \"$v\"";
    let (_, out) = run_capture(&mut k, code, "]");
    assert_eq!(out, "[a\tb\\c \"d\" é漢字😀 $'x]\n");
    assert!(k.close().success());
}

#[test]
fn a_200_kb_cell_decodes_and_runs_quickly() {
    let mut k = start();
    let line = "x=\"a\\tb \\\"q\\\" é漢字 $((1 + 2))\"; : \"${x}\" # ' \\\\ /\n";
    let mut code = line.repeat(200_000 / line.len() + 1);
    code.push_str("echo \"big:${#x}:$x\"\n");
    assert!(code.len() > 200_000);
    let t = Instant::now();
    let (d, out) = run_capture(&mut k, &code, "big:");
    let took = t.elapsed();
    assert_eq!(d["status"], "ok");
    assert_eq!(out, "big:14:a\\tb \"q\" é漢字 3\n");
    assert!(took < Duration::from_secs(5), "200 KB cell took {took:?}");
    eprintln!("bash: 200 KB cell in {took:?}");
    assert!(k.close().success());
}

#[test]
fn interrupt_stops_an_external_command_and_keeps_state() {
    let mut k = start();
    k.execute("cd /tmp; kept=yes");
    let t = Instant::now();
    let events = execute_and_interrupt(
        &mut k,
        "echo started; sleep 100; echo not-reached",
        interrupt_group,
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_done(&events, "interrupted", 130);
    let errors = of_type(&events, "error");
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["ename"], "Interrupted");
    let (d, out) = run_capture(&mut k, "echo \"$kept $PWD $?\"", "yes");
    assert_eq!(out, "yes /tmp 130\n");
    assert_eq!(d["status"], "ok");
    assert!(!k.stdout_text().contains("not-reached"));
    assert!(k.close().success());
}

#[test]
fn interrupt_stops_a_builtin_loop_even_inside_functions() {
    let mut k = start();
    k.execute("kept=1");
    // Only the kernel gets the signal: its INT trap stops the loop between two commands.
    let events = execute_and_interrupt(
        &mut k,
        "echo started; while :; do :; done",
        Kernel::interrupt,
    );
    assert_done(&events, "interrupted", 130);
    // Nested functions unwind all the way (no "after" output).
    let code = "spin() { while :; do :; done; echo after-spin; }\nouter() { spin; echo after-outer; }\necho started\nouter\necho after-cell";
    let events = execute_and_interrupt(&mut k, code, Kernel::interrupt);
    assert_done(&events, "interrupted", 130);
    let (_, out) = run_capture(&mut k, "echo \"kept=$kept\"", "kept=1");
    assert!(!out.contains("after"), "{out:?}");
    assert!(!k.stdout_text().contains("after"), "{}", k.stdout_text());
    // Loops and options still work normally afterwards.
    let (d, out) = run_capture(&mut k, "for i in 1 2 3; do echo -n $i; done; echo", "123");
    assert_eq!(out, "123\n");
    assert_eq!(d["status"], "ok");
    let (_, out) = run_capture(&mut k, "shopt -q extdebug && echo on || echo off", "o");
    assert_eq!(out, "off\n");
    assert!(k.close().success());
}

#[test]
fn sigint_while_idle_is_ignored() {
    let mut k = start();
    k.execute("x=5");
    k.interrupt();
    std::thread::sleep(Duration::from_millis(200));
    k.interrupt();
    let (d, out) = run_capture(&mut k, "echo \"x=$x\"", "x=5");
    assert_eq!(out, "x=5\n");
    assert_eq!(d["status"], "ok");
    assert!(k.close().success());
}

#[test]
fn set_e_stops_the_cell_not_the_kernel() {
    let mut k = start();
    assert_done(&k.execute("set -e; false; echo not-reached"), "error", 1);
    assert_done(
        &k.execute("f() { false; echo not-reached; }; f; echo not-reached"),
        "error",
        1,
    );
    // Still on, and conditionals are exempt as usual.
    let (d, out) = run_capture(&mut k, "if false; then :; fi; false || echo ok:$-", "ok:");
    assert!(out.starts_with("ok:") && out.contains('e'), "{out:?}");
    assert_eq!(d["status"], "ok");
    // A subshell exits as errexit says.
    assert_done(&k.execute("(false; echo not-reached)"), "error", 1);
    let (_, out) = run_capture(&mut k, "set +e; false; echo off:$?", "off:1");
    assert_eq!(out, "off:1\n");
    // The user's ERR trap runs (once per failure), and `set -e` still spares the kernel.
    k.execute("trap 'echo \"trapped:$?:$LINENO\"' ERR; set -e");
    let (d, out) = run_capture(&mut k, "true\n(exit 4)\necho not-reached", "trapped:");
    assert_eq!(out, "trapped:4:2\n");
    assert_eq!(d["exit_code"], 4);
    let (_, out) = run_capture(&mut k, "trap - ERR; set +e; echo alive", "alive");
    assert_eq!(out, "alive\n");
    assert!(!k.stdout_text().contains("not-reached"));
    assert!(k.close().success());
}

#[test]
fn the_protocol_pipes_are_closed_for_user_code() {
    let mut k = start();
    let pid = k.child.id();
    // The kernel keeps them on fds 250 and 251.
    let kernel_pipes: Vec<String> = [250, 251]
        .iter()
        .map(|fd| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap())
        .map(|l| l.to_string_lossy().into_owned())
        .collect();
    assert!(
        kernel_pipes.iter().all(|p| p.starts_with("pipe:")),
        "{kernel_pipes:?}"
    );
    let (_, out) = run_capture(
        &mut k,
        "for f in /proc/self/fd/*; do readlink \"$f\"; done; echo '<end>'",
        "<end>",
    );
    for p in &kernel_pipes {
        assert!(!out.contains(p.as_str()), "{p} visible to a child: {out}");
    }
    assert!(k.close().success());
}

#[test]
fn is_complete_uses_bash_n() {
    let mut k = start();
    for (code, status) in [
        ("if true; then", "incomplete"),
        ("echo hi", "complete"),
        ("for i in 1 2; do", "incomplete"),
        ("echo \"open", "incomplete"),
        ("cat <<EOF\nx", "incomplete"),
        ("echo a \\", "incomplete"),
        ("f() {", "incomplete"),
        ("echo a |", "incomplete"),
        ("fi", "invalid"),
        ("echo )", "invalid"),
        ("", "complete"),
    ] {
        let reply = k.call(json!({"op": "is_complete", "code": code}));
        assert_eq!(reply["status"], status, "{code:?}: {reply}");
    }
    assert!(k.close().success());
}

#[test]
fn variables_are_not_supported() {
    let mut k = start();
    for req in [
        json!({"op": "get_vars", "names": ["x"]}),
        json!({"op": "set_vars", "values": {"x": 1}}),
        json!({"op": "clear_vars", "names": null}),
        json!({"op": "list_vars"}),
    ] {
        let reply = k.call(req);
        assert_eq!(
            reply["error"], "variables are not supported for bash",
            "{reply}"
        );
    }
    let reply = k.call(json!({"op": "no_such_op"}));
    assert!(
        reply["error"].as_str().unwrap().contains("unknown op"),
        "{reply}"
    );
    // Still serving.
    assert_done(&k.execute("true"), "ok", 0);
    assert!(k.close().success());
}

#[test]
fn exit_in_user_code_ends_the_kernel() {
    let mut k = start();
    let id = k.send(json!({"op": "execute", "code": "exit 3"}));
    assert!(id > 0);
    let status = k.child.wait().unwrap();
    assert_eq!(status.code(), Some(3));
}

#[test]
fn trivial_round_trip_timing() {
    let mut k = start();
    k.execute("true");
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        k.execute(":");
    }
    let per = t.elapsed() / n;
    eprintln!("bash: trivial execute round trip {per:?}");
    assert!(per < Duration::from_millis(200), "{per:?}");
    assert!(k.close().success());
}
