//! Previews: a server inside a sandbox reached through the daemon at the path route and the
//! host route, with the API key, a preview token (kept in a cookie on the host route), or
//! nothing once public; refused otherwise; a WebSocket echo through the route; the sandbox's
//! network stays closed; both backends.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use super::daemon::Daemon;

/// A minimal WebSocket echo server in the standard library's Python (no packages needed).
const WS_ECHO: &str = r#"
import base64, hashlib, socket, struct, threading
def serve(c):
    head = b''
    while b'\r\n\r\n' not in head:
        head += c.recv(4096)
    key = [l.split(b':', 1)[1].strip() for l in head.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key')][0]
    acc = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + acc + b'\r\n\r\n')
    def exact(n):
        b = b''
        while len(b) < n:
            got = c.recv(n - len(b))
            if not got:
                raise EOFError
            b += got
        return b
    while True:
        b1, b2 = exact(2)
        n = b2 & 127
        if n == 126: n = struct.unpack('>H', exact(2))[0]
        elif n == 127: n = struct.unpack('>Q', exact(8))[0]
        mask = exact(4)
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(exact(n)))
        if b1 & 15 == 8:
            return
        out = b'echo: ' + data
        c.sendall(bytes([0x81, len(out)]) + out)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8765)); s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Starts `python3 -m http.server 8000` (serving a page) and the WebSocket echo on 8765 in
/// the background, and waits until both answer inside.
fn start_servers(d: &Daemon, id: &str) {
    d.exec(
        id,
        "mkdir -p /workspace/www && echo 'hello from inside' > /workspace/www/index.html",
    );
    d.exec(id, &format!("cat > /workspace/ws.py <<'PY'\n{WS_ECHO}\nPY"));
    for cmd in [
        "cd /workspace/www && exec python3 -m http.server 8000 --bind 127.0.0.1",
        "exec python3 /workspace/ws.py",
    ] {
        let r = d.post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"cmd": cmd}),
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = d.exec(
            id,
            "python3 -c 'import socket; [socket.create_connection((\"127.0.0.1\", p), 1).close() for p in (8000, 8765)]' 2>&1 && echo up",
        );
        if out.stdout.contains("up") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the servers did not start: {}",
            out.stdout
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A raw HTTP/1.1 GET to the daemon with `host` as the Host header; (status, headers, body).
fn get_with_host(d: &Daemon, host: &str, path: &str, extra: &str) -> (u16, String, String) {
    get_raw(&d.url, host, path, extra)
}

/// [`get_with_host`] to the daemon at `url`, from any thread.
pub(super) fn get_raw(url: &str, host: &str, path: &str, extra: &str) -> (u16, String, String) {
    let addr = url.trim_start_matches("http://").to_string();
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

fn check_previews(d: &Daemon, id: &str) {
    start_servers(d, id);
    let page = format!("/v1/sandboxes/{id}/ports/8000/");
    // With the key: the page; the key itself never reaches the server.
    let r = d.get(&page);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, json!("hello from inside\n"));
    let r = d.get(&format!("/v1/sandboxes/{id}/ports/8000/index.html?x=1"));
    assert_eq!(r.status, 200, "{}", r.body);
    // Without: refused.
    let r = d.call_as(None, Method::GET, &page, None);
    r.expect_error(401, "unauthenticated");
    // A token for this port.
    let p = d.post(
        &format!("/v1/sandboxes/{id}/previews/8000"),
        json!({"ttl_secs": 60}),
    );
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["path"], page);
    assert_eq!(p.body["host"], format!("8000-{id}.localhost"));
    let token = p.body["token"].as_str().unwrap().to_string();
    let r = d.call_as(
        None,
        Method::GET,
        &format!("{page}?sandcell_token={token}"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = d.call_as(
        None,
        Method::GET,
        &format!("{page}?sandcell_token={token}x"),
        None,
    );
    r.expect_error(401, "unauthenticated");
    let r = d.call_as(
        None,
        Method::GET,
        &format!("/v1/sandboxes/{id}/ports/8001/?sandcell_token={token}"),
        None,
    );
    r.expect_error(401, "unauthenticated");
    // The host route: the token in the URL, then in the cookie the answer set.
    let host = format!("8000-{id}.localhost");
    let (status, _, _) = get_with_host(d, &host, "/", "");
    assert_eq!(status, 401);
    let (status, head, body) = get_with_host(d, &host, &format!("/?sandcell_token={token}"), "");
    assert_eq!(status, 200, "{head}");
    assert!(body.contains("hello from inside"), "{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("set-cookie: sandcell_token="),
        "{head}"
    );
    let (status, _, body) = get_with_host(
        d,
        &host,
        "/index.html",
        &format!("Cookie: other=1; sandcell_token={token}\r\n"),
    );
    assert_eq!(status, 200);
    assert!(body.contains("hello from inside"), "{body}");
    // Public, then private again.
    let p = d.post(
        &format!("/v1/sandboxes/{id}/previews/8000"),
        json!({"public": true}),
    );
    assert_eq!(p.body["public"], true, "{}", p.body);
    let (status, _, _) = get_with_host(d, &host, "/", "");
    assert_eq!(status, 200);
    d.post(
        &format!("/v1/sandboxes/{id}/previews/8000"),
        json!({"public": false}),
    );
    let (status, _, _) = get_with_host(d, &host, "/", "");
    assert_eq!(status, 401);
    // Nothing on that port: a clear answer.
    let r = d.get(&format!("/v1/sandboxes/{id}/ports/9/"));
    r.expect_error(502, "port_closed");
    // A WebSocket through the path route.
    let ws_url = format!(
        "{}/v1/sandboxes/{id}/ports/8765/socket?sandcell_token={token8765}",
        d.url.replace("http://", "ws://"),
        token8765 = d
            .post(&format!("/v1/sandboxes/{id}/previews/8765"), json!({}))
            .body["token"]
            .as_str()
            .unwrap()
    );
    let (mut ws, _) = tungstenite::connect(&ws_url).unwrap();
    ws.send(tungstenite::Message::text("ping")).unwrap();
    let msg = ws.read().unwrap();
    assert_eq!(msg.into_text().unwrap().as_str(), "echo: ping");
    ws.send(tungstenite::Message::text("again")).unwrap();
    assert_eq!(
        ws.read().unwrap().into_text().unwrap().as_str(),
        "echo: again"
    );
    let _ = ws.close(None);
    // Bad input.
    d.post(&format!("/v1/sandboxes/{id}/previews/0"), json!({}))
        .expect_error(400, "invalid_argument");
    d.post(
        &format!("/v1/sandboxes/{id}/previews/80"),
        json!({"ttl_secs": 0}),
    )
    .expect_error(400, "invalid_argument");
    d.post("/v1/sandboxes/sb-nosuch/previews/80", json!({}))
        .expect_error(404, "not_found");
}

#[test]
fn a_server_inside_is_reached_through_both_routes_with_a_key_a_token_or_publicly() {
    let d = Daemon::start(&[]);
    // The default network: the sandbox reaches nothing, and the preview does not change it.
    let id = d.create_id(json!({}));
    check_previews(&d, &id);
    assert_eq!(
        serde_json::to_value(d.sandbox(&id).network).unwrap(),
        json!("loopback")
    );
    // With the network off nothing inside can listen: said plainly.
    let off = d.create_id(json!({"network": "off"}));
    let r = d.get(&format!("/v1/sandboxes/{off}/ports/8000/"));
    r.expect_error(409, "invalid_state");
    assert!(
        r.body["message"].as_str().unwrap().contains("'off'"),
        "{}",
        r.body
    );
}

#[test]
fn previews_work_on_gvisor() {
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"backend": "gvisor"}));
    check_previews(&d, &id);
}

#[test]
fn a_sandboxs_info_says_where_its_ports_are_reached() {
    let d = Daemon::start(&[]);
    let sb = d.create(json!({}));
    assert_eq!(sb.preview_host, format!("{{port}}-{}.localhost", sb.id));
    assert_eq!(
        sb.preview_path,
        format!("/v1/sandboxes/{}/ports/{{port}}/", sb.id)
    );
}

#[test]
fn a_public_port_stays_public_across_a_restart_of_the_daemon() {
    let mut d = Daemon::start(&["shutdown.sandboxes=keep"]);
    let id = d.create_id(json!({}));
    start_servers(&d, &id);
    let host = format!("8000-{id}.localhost");
    let p = d.post(
        &format!("/v1/sandboxes/{id}/previews/8000"),
        json!({"public": true}),
    );
    assert_eq!(p.body["public"], true, "{}", p.body);
    d.terminate();
    d.restart(&["shutdown.sandboxes=stop"]);
    // Without a key or a token: still public, the same sandbox and server.
    let (status, _, body) = get_with_host(&d, &host, "/index.html", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hello from inside"), "{body}");
    // The other port never was.
    let (status, _, _) = get_with_host(&d, &format!("8765-{id}.localhost"), "/", "");
    assert_eq!(status, 401);
    d.post(
        &format!("/v1/sandboxes/{id}/previews/8000"),
        json!({"public": false}),
    );
    let (status, _, _) = get_with_host(&d, &host, "/", "");
    assert_eq!(status, 401);
}

/// A WebSocket to the echo server on 8765 in `id` through the path route (with a preview
/// token), reads bounded so that a connection left open fails the test instead of hanging it.
fn open_echo(
    d: &Daemon,
    id: &str,
) -> tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>> {
    let token = d.post(&format!("/v1/sandboxes/{id}/previews/8765"), json!({}));
    assert_eq!(token.status, 200, "{}", token.body);
    let url = format!(
        "{}/v1/sandboxes/{id}/ports/8765/socket?sandcell_token={}",
        d.url.replace("http://", "ws://"),
        token.body["token"].as_str().unwrap()
    );
    let (ws, _) = tungstenite::connect(&url)
        .unwrap_or_else(|e| panic!("no WebSocket to {id}: {e}\n{}", d.log()));
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    ws
}

/// Sends `text` on `ws` and returns what came back.
fn echo(
    ws: &mut tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    text: &str,
) -> String {
    ws.send(tungstenite::Message::text(text)).unwrap();
    ws.read().unwrap().into_text().unwrap().to_string()
}

/// Asserts that `ws` was closed by the other side (not merely quiet until the read timed out).
fn assert_closed(
    ws: &mut tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    d: &Daemon,
) {
    match ws.read() {
        Ok(tungstenite::Message::Close(_)) => {}
        Ok(other) => panic!("the WebSocket got {other:?} after the snapshot"),
        Err(tungstenite::Error::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            panic!(
                "the WebSocket was still open 30 s after the snapshot\n{}",
                d.log()
            )
        }
        // The relay ended without a closing handshake (the server's side was closed).
        Err(_) => {}
    }
}

#[test]
fn a_websocket_open_during_a_gvisor_snapshot_is_closed_and_the_sandbox_goes_on() {
    // This runsc cannot checkpoint a TCP socket an epoll set watches (the agent's side of a
    // preview connection), and a failed checkpoint ends the sandbox: the agent closes its
    // preview connections before the checkpoint.
    let d = Daemon::start(&[]);
    let id = d.create_id(json!({"backend": "gvisor"}));
    start_servers(&d, &id);
    let mut held = open_echo(&d, &id);
    assert_eq!(echo(&mut held, "before"), "echo: before");
    let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}\n{}", r.body, d.log());
    assert_eq!(r.body["fidelity"], "process", "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    // The WebSocket held across it was closed; the sandbox runs on, servers and all.
    assert_closed(&mut held, &d);
    let info = d.sandbox(&id);
    assert_eq!(info.state, "running", "{info:?}\n{}", d.log());
    assert_eq!(d.exec(&id, "echo alive").stdout, "alive\n");
    let mut again = open_echo(&d, &id);
    assert_eq!(echo(&mut again, "after"), "echo: after");
    let page = d.get(&format!("/v1/sandboxes/{id}/ports/8000/"));
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(page.body, json!("hello from inside\n"));
    // Again, with that one open: every snapshot closes what is open then.
    let r = d.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}\n{}", r.body, d.log());
    assert_closed(&mut again, &d);
    let mut third = open_echo(&d, &id);
    assert_eq!(echo(&mut third, "third"), "echo: third");
    let _ = third.close(None);
    // A fork of the first snapshot has the servers too (background processes are part of
    // the checkpoint) and serves both routes' connections.
    let r = d.post(&format!("/v1/snapshots/{snap}/fork"), json!({"count": 1}));
    assert_eq!(r.status, 201, "{}\n{}", r.body, d.log());
    let fork = r.body["sandboxes"][0]["sandbox"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let page = d.get(&format!("/v1/sandboxes/{fork}/ports/8000/"));
    assert_eq!(page.status, 200, "{}\n{}", page.body, d.log());
    assert_eq!(page.body, json!("hello from inside\n"));
    let mut forked = open_echo(&d, &fork);
    assert_eq!(echo(&mut forked, "fork"), "echo: fork");
    let _ = forked.close(None);
}
