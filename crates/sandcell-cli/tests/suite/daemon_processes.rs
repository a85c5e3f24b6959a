//! Background processes over HTTP (start, follow from offsets, stdin, wait) and a terminal
//! over a WebSocket, against the real daemon.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tungstenite::Message;

use super::daemon::{Daemon, read_sse, send};

#[test]
fn daemon_background_processes_start_follow_feed_and_wait() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    let base = format!("/v1/sandboxes/{id}/processes");

    // Started in the background: the answer comes before the process ends.
    let t = Instant::now();
    let r = d.post(
        &base,
        json!({"cmd": "read a; echo got $a; for i in 1 2 3; do echo tick $i; sleep 0.3; done; echo err >&2; exit 5", "stdin": true}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(
        t.elapsed() < Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    let pid = r.body["pid"].as_i64().unwrap();

    // It is listed as a tracked background process.
    let list = d.get(&base);
    let me = list.body["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("{pid} not listed: {}", list.body));
    assert_eq!(
        (me["tracked"].clone(), me["background"].clone()),
        (json!(true), json!(true))
    );

    // Stdin by pid, then closed.
    let r = send(
        d.req(Method::POST, &format!("{base}/{pid}/stdin?close=true"))
            .body("hello\n"),
    );
    assert_eq!(r.status, 204, "{}", r.body);

    // Following: chunks with their offsets, then the exit.
    let start = Instant::now();
    let resp = d
        .req(Method::GET, &format!("{base}/{pid}/stream"))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = read_sse(resp, start);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names.last(), Some(&"exit"), "{names:?}");
    let exit = &events.last().unwrap().data;
    assert_eq!(exit["exit_code"], 5, "{exit}");
    let stdout: String = events
        .iter()
        .filter(|e| e.name == "stdout")
        .map(|e| e.data["data"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(stdout, "got hello\ntick 1\ntick 2\ntick 3\n");
    // Offsets are contiguous: each chunk starts where the previous one ended.
    let mut next = 0;
    for e in events.iter().filter(|e| e.name == "stdout") {
        assert_eq!(e.data["offset"].as_u64(), Some(next), "{:?}", e.data);
        next += e.data["bytes"].as_u64().unwrap();
    }
    assert!(
        events
            .iter()
            .any(|e| e.name == "stderr" && e.data["data"] == "err\n")
    );

    // After the end: reconnect from an offset and wait for the whole output.
    let r = d.get(&format!("{base}/{pid}/output?stdout_from=10"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["stdout"], "tick 1\ntick 2\ntick 3\n", "{}", r.body);
    assert_eq!(
        (r.body["exit_code"].clone(), r.body["ok"].clone()),
        (json!(5), json!(false))
    );

    // Bad input is refused with structured errors.
    d.get(&format!("{base}/{pid}/output?stdout_from=x"))
        .expect_error(400, "invalid_argument");
    d.get(&format!("{base}/99999/output"))
        .expect_error(404, "no_such_process");
    d.post(
        &base,
        json!({"cmd": "true", "pty": {"rows": 0, "cols": 80}}),
    )
    .expect_error(400, "invalid_argument");
    d.post(&base, json!({"cmd": "true", "nope": 1}))
        .expect_error(400, "invalid_argument");
    // A process without stdin takes none.
    let r = d.post(&base, json!({"cmd": "sleep 5"}));
    let quiet = r.body["pid"].as_i64().unwrap();
    send(
        d.req(Method::POST, &format!("{base}/{quiet}/stdin"))
            .body("x"),
    )
    .expect_error(409, "invalid_state");
    let r = d.delete(&format!("{base}/{quiet}"));
    assert_eq!(r.status, 204, "{}", r.body);
}

/// Reads WebSocket frames until the terminal output holds `want` (or the time is up).
fn read_until(
    ws: &mut tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    want: &str,
    seen: &mut String,
) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    // A read waits at most that long too: a missing output fails the test, never hangs it.
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    }
    while Instant::now() < deadline {
        match ws.read() {
            Ok(Message::Binary(b)) => {
                seen.push_str(&String::from_utf8_lossy(&b));
                if seen.contains(want) {
                    return None;
                }
            }
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["type"] == "exit" {
                    return Some(v);
                }
            }
            Ok(_) => {}
            Err(e) => panic!("websocket: {e}; seen so far: {seen:?}"),
        }
    }
    panic!("never saw {want:?} in {seen:?}");
}

#[test]
fn daemon_terminal_over_websocket() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({}));
    let ws_url = format!(
        "{}/v1/sandboxes/{id}/pty?rows=30&cols=100&api_key={}",
        d.url.replace("http://", "ws://"),
        d.key
    );
    let (mut ws, resp) = tungstenite::connect(&ws_url).unwrap();
    assert_eq!(resp.status(), 101);
    // The answer names the terminal's process, to join it again later.
    let pid: i32 = resp.headers()["x-sandcell-pid"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut seen = String::new();
    ws.send(Message::Binary(
        b"stty size; echo T=$TERM; tty; echo shell=$$\n"
            .to_vec()
            .into(),
    ))
    .unwrap();
    // Printed last: everything before it has come too.
    read_until(&mut ws, &format!("shell={pid}"), &mut seen);
    assert!(seen.contains("/dev/pts/"), "{seen:?}");
    assert!(seen.contains("30 100"), "{seen:?}");
    assert!(seen.contains("T=xterm-256color"), "{seen:?}");

    // Resized by a control message.
    ws.send(Message::Text(
        json!({"type": "resize", "rows": 40, "cols": 120})
            .to_string()
            .into(),
    ))
    .unwrap();
    ws.send(Message::Binary(b"stty size\n".to_vec().into()))
        .unwrap();
    read_until(&mut ws, "40 120", &mut seen);

    // Ctrl-C interrupts what runs, the shell stays.
    ws.send(Message::Binary(b"sleep 30\n".to_vec().into()))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    ws.send(Message::Binary(vec![3].into())).unwrap();
    ws.send(Message::Binary(b"echo after-$((6*7))\n".to_vec().into()))
        .unwrap();
    read_until(&mut ws, "after-42", &mut seen);

    // The shell's exit ends the socket with an exit message.
    ws.send(Message::Binary(b"exit 3\n".to_vec().into()))
        .unwrap();
    let exit = read_until(&mut ws, "\u{0}never", &mut seen).expect("an exit message");
    assert_eq!(exit["exit_code"], 3, "{exit}");
    assert_eq!(exit["ok"], false, "{exit}");

    // A terminal process started over HTTP, joined (twice) over the socket: it outlives a
    // dropped connection.
    let r = d.post(
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"cmd": "exec bash --norc -i", "pty": {"rows": 24, "cols": 80}}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let pid = r.body["pid"].as_i64().unwrap();
    let join = format!(
        "{}/v1/sandboxes/{id}/pty?pid={pid}&api_key={}",
        d.url.replace("http://", "ws://"),
        d.key
    );
    let (mut ws, _) = tungstenite::connect(&join).unwrap();
    let mut seen = String::new();
    ws.send(Message::Binary(b"X=first; echo one-$X\n".to_vec().into()))
        .unwrap();
    read_until(&mut ws, "one-first", &mut seen);
    drop(ws);
    let (mut ws, _) = tungstenite::connect(&join).unwrap();
    let mut seen = String::new();
    ws.send(Message::Binary(b"echo two-$X\n".to_vec().into()))
        .unwrap();
    read_until(&mut ws, "two-first", &mut seen);
    ws.send(Message::Binary(b"exit\n".to_vec().into())).unwrap();
    let exit = read_until(&mut ws, "\u{0}never", &mut seen).expect("an exit message");
    assert_eq!(exit["exit_code"], 0, "{exit}");

    // Without a key, or joining a process that is not there: an HTTP error, no socket.
    let bare = format!(
        "{}/v1/sandboxes/{id}/pty",
        d.url.replace("http://", "ws://")
    );
    match tungstenite::connect(&bare) {
        Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("expected 401, got {:?}", other.map(|(_, r)| r.status())),
    }
    let missing = format!(
        "{}/v1/sandboxes/{id}/pty?pid=99999&api_key={}",
        d.url.replace("http://", "ws://"),
        d.key
    );
    match tungstenite::connect(&missing) {
        Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 404),
        other => panic!("expected 404, got {:?}", other.map(|(_, r)| r.status())),
    }
    // The key in the query is for WebSocket upgrades only.
    let plain = d.call_as(
        None,
        Method::GET,
        &format!("/v1/sandboxes/{id}?api_key={}", d.key),
        None,
    );
    plain.expect_error(401, "unauthenticated");
}
