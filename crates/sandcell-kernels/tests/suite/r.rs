//! r kernel tests (written with the kernel).

use std::time::{Duration, Instant};

use sandcell_protocol::Language;
use serde_json::{Value, json};

use crate::common::{Kernel, assert_png, done, of_type, result_text, stream};

fn start() -> Kernel {
    Kernel::start(Language::R)
}

fn status(events: &[Value]) -> &str {
    done(events)["status"].as_str().unwrap()
}

/// Executes and checks that the cell succeeded.
fn ok(k: &mut Kernel, code: &str) -> Vec<Value> {
    let events = k.execute(code);
    assert_eq!(status(&events), "ok", "{code}: {events:?}");
    events
}

#[test]
fn the_program_is_not_left_in_the_environment() {
    // The program travels in SANDCELL_KERNEL_SOURCE (Rscript drops long `-e` programs); user
    // code and its children must not see it, nor the protocol descriptors' variables.
    let mut k = start();
    let events = ok(
        &mut k,
        "c(Sys.getenv('SANDCELL_KERNEL_SOURCE'), Sys.getenv('SANDCELL_KERNEL_CTL_FD'), system('env | grep -c -e SANDCELL_KERNEL_SOURCE -e SANDCELL_KERNEL_CTL || true', intern = TRUE))",
    );
    let text = result_text(&events).unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words, ["[1]", r#""""#, r#""""#, r#""0""#], "{text}");
    assert!(k.close().success());
}

#[test]
fn ready_then_clean_exit() {
    let t = Instant::now();
    let k = start();
    eprintln!("r: ready after {:?}", t.elapsed());
    assert_eq!(k.ready["language"], "r");
    assert_eq!(k.ready["pid"], k.child.id());
    let version = k.ready["version"].as_str().unwrap();
    assert!(version.starts_with("4."), "{version}");
    let status = k.close();
    assert!(status.success(), "{status:?}");
}

#[test]
fn acceptance_state_and_results() {
    let mut k = start();
    let events = ok(&mut k, "x <- 21");
    assert!(result_text(&events).is_none(), "{events:?}");
    let events = ok(&mut k, "x * 2");
    assert!(result_text(&events).unwrap().contains("42"), "{events:?}");
    assert_eq!(done(&events)["execution_count"], 2);
    // Invisible values give no result; visible values before the last one are printed.
    let events = ok(&mut k, "invisible(5)");
    assert!(result_text(&events).is_none(), "{events:?}");
    let events = ok(&mut k, "1:3\ny <- x + 1\ny");
    assert_eq!(stream(&events, "stdout"), "[1] 1 2 3\n");
    assert_eq!(result_text(&events).unwrap(), "[1] 22");
    assert_eq!(done(&events)["dropped"], json!({"stdout": 0, "stderr": 0}));
    assert!(k.close().success());
}

#[test]
fn output_messages_and_warnings_keep_their_order() {
    let mut k = start();
    let events = ok(
        &mut k,
        "cat(\"a\\n\"); message(\"b\"); print(\"c\"); warning(\"w\"); cat(\"no newline\"); 7",
    );
    let texts: Vec<(String, String)> = of_type(&events, "stream")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("stdout", "a\n"),
        ("stderr", "b\n"),
        ("stdout", "[1] \"c\"\n"),
        ("stderr", "Warning message:\nw\n"),
        ("stdout", "no newline"),
    ];
    let got: Vec<(&str, &str)> = texts
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    assert_eq!(got, expected, "{events:?}");
    assert_eq!(result_text(&events).unwrap(), "[1] 7");
    // The result comes after everything printed.
    assert_eq!(events[events.len() - 2]["type"], "result");
    // Output at the fd level goes to fd 1, not into stream events.
    let events = ok(&mut k, "invisible(system(\"echo from-a-child\"))");
    assert!(stream(&events, "stdout").is_empty(), "{events:?}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !k.stdout_text().contains("from-a-child") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(k.stdout_text().contains("from-a-child"));
    assert!(k.close().success());
}

#[test]
fn errors_keep_state() {
    let mut k = start();
    ok(&mut k, "x <- 21");
    let events = k.execute("f <- function() g()\ng <- function() stop(\"boom\")\ncat(\"before\\n\")\nf()\ncat(\"not reached\\n\")");
    assert_eq!(status(&events), "error");
    assert_eq!(stream(&events, "stdout"), "before\n");
    let errors = of_type(&events, "error");
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["ename"], "simpleError");
    assert_eq!(errors[0]["evalue"], "boom");
    let tb: Vec<&str> = errors[0]["traceback"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(tb[0], "Error in g() : boom", "{tb:?}");
    assert!(tb.contains(&"Calls: f -> g"), "{tb:?}");
    assert!(
        tb.iter().any(|l| l.contains("<cell 2>, line 4: f()")),
        "{tb:?}"
    );
    // State is kept, and later cells work.
    let events = ok(&mut k, "x");
    assert_eq!(result_text(&events).unwrap(), "[1] 21");
    // Another condition class.
    let events = k.execute("stop(structure(class = c(\"myError\", \"error\", \"condition\"), list(message = \"custom\", call = NULL)))");
    assert_eq!(of_type(&events, "error")[0]["ename"], "myError");
    assert!(k.close().success());
}

#[test]
fn parse_errors() {
    let mut k = start();
    let events = k.execute("x <- 1\ny y");
    assert_eq!(status(&events), "error");
    let errors = of_type(&events, "error");
    assert_eq!(errors[0]["ename"], "ParseError");
    let evalue = errors[0]["evalue"].as_str().unwrap();
    assert!(evalue.contains("unexpected symbol"), "{evalue}");
    // Nothing of the cell ran.
    let events = k.execute("exists(\"x\")");
    assert_eq!(result_text(&events).unwrap(), "[1] FALSE");
    assert!(k.close().success());
}

#[test]
fn unicode_round_trips() {
    let mut k = start();
    let events = ok(&mut k, "cat(\"é漢字\\n\")");
    assert_eq!(stream(&events, "stdout"), "é漢字\n");
    let text = "q\"uo\\te\ttab é漢字😀 \u{1}\u{1f} $x";
    let code = format!(
        "s <- {}\ncat(s)\nnchar(s)",
        serde_json::to_string(text).unwrap()
    );
    let events = ok(&mut k, &code);
    assert_eq!(stream(&events, "stdout"), text);
    assert_eq!(
        result_text(&events).unwrap(),
        format!("[1] {}", text.chars().count())
    );
    assert!(k.close().success());
}

#[test]
fn a_base_plot_is_one_png_display() {
    let mut k = start();
    let events = ok(&mut k, "plot(1:10)");
    let displays = of_type(&events, "display");
    assert_eq!(displays.len(), 1, "{events:?}");
    assert_png(displays[0]["data"]["image/png"].as_str().unwrap());
    assert_eq!(displays[0]["data"]["text/plain"], "<plot>");
    assert!(of_type(&events, "result").is_empty(), "{events:?}");
    // Several expressions draw on one page; a new page is another display.
    let events = ok(&mut k, "plot(1:3)\nabline(h = 2)\nhist(c(1, 2, 2, 3))");
    assert_eq!(of_type(&events, "display").len(), 2, "{events:?}");
    // No plot, no display.
    let events = ok(&mut k, "1 + 1");
    assert!(of_type(&events, "display").is_empty(), "{events:?}");
    assert!(k.close().success());
}

#[test]
fn a_ggplot_value_is_drawn() {
    let mut k = start();
    let events = ok(
        &mut k,
        "isTRUE(requireNamespace(\"ggplot2\", quietly = TRUE))",
    );
    sandcell_testkit::require!(
        result_text(&events).as_deref() == Some("[1] TRUE"),
        "ggplot2 is not installed ({events:?})"
    );
    let events = ok(
        &mut k,
        "library(ggplot2)\nggplot(data.frame(x = 1:10, y = (1:10)^2), aes(x, y)) + geom_point()",
    );
    let displays = of_type(&events, "display");
    assert_eq!(displays.len(), 1, "{events:?}");
    assert_png(displays[0]["data"]["image/png"].as_str().unwrap());
    assert!(of_type(&events, "result").is_empty(), "{events:?}");
    assert!(k.close().success());
}

#[test]
fn interrupt_keeps_state() {
    let mut k = start();
    ok(&mut k, "x <- 21");
    // The first expression's output arrives before the loop starts.
    let id = k.send(json!({"op": "execute", "code": "cat(\"spinning\\n\"); while (TRUE) {}"}));
    let first = k.next_event();
    assert_eq!(first["text"], "spinning\n", "{first}");
    let t = Instant::now();
    k.interrupt();
    let events = k.collect(id);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(status(&events), "interrupted", "{events:?}");
    let errors = of_type(&events, "error");
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["ename"], "Interrupted");
    let events = ok(&mut k, "x * 2");
    assert_eq!(result_text(&events).unwrap(), "[1] 42");
    // Sys.sleep is interruptible too.
    let id = k.send(json!({"op": "execute", "code": "cat(\"sleeping\"); Sys.sleep(100)"}));
    assert_eq!(k.next_event()["text"], "sleeping");
    k.interrupt();
    assert_eq!(status(&k.collect(id)), "interrupted");
    assert!(k.close().success());
}

#[test]
fn sigint_while_idle_is_ignored() {
    let mut k = start();
    ok(&mut k, "x <- 5");
    k.interrupt();
    std::thread::sleep(Duration::from_millis(300));
    let events = ok(&mut k, "x");
    assert_eq!(result_text(&events).unwrap(), "[1] 5");
    k.interrupt();
    std::thread::sleep(Duration::from_millis(300));
    let reply = k.call(json!({"op": "is_complete", "code": "x"}));
    assert_eq!(reply["status"], "complete");
    ok(&mut k, "x");
    assert!(k.close().success());
}

#[test]
fn stream_limit_truncates_with_a_marker() {
    let mut k = Kernel::start_with(Language::R, &[("SANDCELL_STREAM_LIMIT", "100")]);
    let events = ok(
        &mut k,
        "cat(strrep(\"x\", 250))\nfor (i in 1:3) message(strrep(\"e\", 40))\ncat(\"more\")",
    );
    let out = stream(&events, "stdout");
    assert_eq!(
        out,
        format!(
            "{}\n[sandcell: output truncated after 100 bytes]\n",
            "x".repeat(100)
        )
    );
    let err = stream(&events, "stderr");
    assert!(
        err.ends_with("\n[sandcell: output truncated after 100 bytes]\n"),
        "{err:?}"
    );
    assert_eq!(err.matches("truncated").count(), 1);
    let d = done(&events);
    assert_eq!(d["dropped"]["stdout"], 150 + 4);
    assert_eq!(d["dropped"]["stderr"], 3 * 41 - 100);
    // The limit is per execution.
    let events = ok(&mut k, "cat(\"fresh\")");
    assert_eq!(stream(&events, "stdout"), "fresh");
    assert_eq!(done(&events)["dropped"]["stdout"], 0);
    assert!(k.close().success());
}

#[test]
fn is_complete_uses_the_parser() {
    let mut k = start();
    for (code, want) in [
        ("f <- function(", "incomplete"),
        ("x <- \"abc", "incomplete"),
        ("1 +", "incomplete"),
        ("if (TRUE) {", "incomplete"),
        ("x )", "invalid"),
        ("x <- 1", "complete"),
        ("", "complete"),
    ] {
        let reply = k.call(json!({"op": "is_complete", "code": code}));
        assert_eq!(reply["status"], want, "{code:?}: {reply}");
    }
    assert!(k.close().success());
}

#[test]
fn variables_are_not_supported() {
    let mut k = start();
    for req in [
        json!({"op": "get_vars", "names": ["x"]}),
        json!({"op": "set_vars", "values": {"x": [1, 2], "y": {"a": null}}}),
        json!({"op": "clear_vars", "names": null}),
        json!({"op": "list_vars"}),
    ] {
        let reply = k.call(req);
        assert_eq!(
            reply["error"], "variables are not supported for r",
            "{reply}"
        );
    }
    let reply = k.call(json!({"op": "bogus"}));
    assert!(
        reply["error"].as_str().unwrap().contains("unknown op"),
        "{reply}"
    );
    ok(&mut k, "1");
    assert!(k.close().success());
}

#[test]
fn big_cells_and_round_trip_timing() {
    let mut k = start();
    let line = "x <- \"a\\tb é漢字 \\\"q\\\"\"; y <- 1 + 2 # ' \\\\ /\n";
    let mut code = line.repeat(200_000 / line.len() + 1);
    code.push_str("nchar(x)");
    let t = Instant::now();
    let events = ok(&mut k, &code);
    eprintln!("r: 200 KB cell in {:?}", t.elapsed());
    assert_eq!(result_text(&events).unwrap(), "[1] 11");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    ok(&mut k, "1");
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        k.execute("1");
    }
    let per = t.elapsed() / n;
    eprintln!("r: trivial execute round trip {per:?}");
    assert!(per < Duration::from_millis(200), "{per:?}");
    assert!(k.close().success());
}
