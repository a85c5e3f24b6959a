//! The egress proxy end to end on loopback: a sandbox-side client on its Unix socket,
//! upstream servers on 127.0.0.1 reached by names the test pins to that address.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandcell_api::network::NetworkPolicy;
use sandcell_egress::tls::minimal_client_hello;
use sandcell_egress::{
    EgressEvent, EgressProxy, Limits, Outcome, Protocol, Resolution, Resolver, StaticResolver,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

/// A proxy on a Unix socket, and the events it recorded.
struct Setup {
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    proxy: Arc<EgressProxy>,
    events: Arc<Mutex<Vec<EgressEvent>>>,
}

impl Setup {
    async fn start(policy: &str, limits: Limits, resolver: Arc<dyn Resolver>) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("egress.sock");
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let proxy = EgressProxy::new(
            policy.parse().expect("policy"),
            resolver,
            limits,
            Arc::new(move |e| sink.lock().expect("events").push(e)),
        );
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        tokio::spawn(proxy.clone().serve_unix(listener));
        Self {
            _dir: dir,
            socket,
            proxy,
            events,
        }
    }

    async fn client(&self) -> UnixStream {
        UnixStream::connect(&self.socket).await.expect("connect")
    }

    /// The events so far, once `n` are in.
    async fn events(&self, n: usize) -> Vec<EgressEvent> {
        for _ in 0..200 {
            let e = self.events.lock().expect("events").clone();
            if e.len() >= n {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "fewer than {n} events: {:?}",
            self.events.lock().expect("events")
        );
    }
}

/// Names pinned to loopback, as an operator's test resolver maps them.
fn pinned() -> Arc<dyn Resolver> {
    let lo: IpAddr = "127.0.0.1".parse().expect("ip");
    Arc::new(StaticResolver::new([
        ("upstream.test".to_string(), vec![lo]),
        ("other.test".to_string(), vec![lo]),
    ]))
}

/// An echo server on loopback, and what it received per connection.
async fn echo() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 16384];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                record.lock().expect("seen").push(got);
            });
        }
    });
    (addr, seen)
}

async fn read_head(s: &mut UnixStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.expect("read") == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

async fn read_all(s: &mut UnixStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn connect(s: &mut UnixStream, target: &str) -> String {
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    read_head(s).await
}

#[tokio::test]
async fn a_tunnel_to_an_allowed_host_carries_its_tls_and_is_recorded_with_its_bytes() {
    let (addr, seen) = echo().await;
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    let head = connect(&mut c, &format!("upstream.test:{}", addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut hello = minimal_client_hello(Some("upstream.test"));
    hello.extend_from_slice(b"ping");
    c.write_all(&hello).await.expect("write");
    let mut back = vec![0u8; hello.len()];
    c.read_exact(&mut back).await.expect("echo");
    assert_eq!(back, hello);
    drop(c);
    let events = setup.events(1).await;
    let e = &events[0];
    assert_eq!(
        (e.protocol, e.outcome),
        (Protocol::Connect, Outcome::Allowed),
        "{e:?}"
    );
    assert_eq!((e.host.as_str(), e.port), ("upstream.test", addr.port()));
    assert_eq!(e.sni.as_deref(), Some("upstream.test"));
    assert_eq!(
        (e.bytes_up, e.bytes_down),
        (hello.len() as u64, hello.len() as u64)
    );
    assert_eq!(e.address, Some(addr));
    let _ = seen;
}

#[tokio::test]
async fn a_client_hello_for_another_host_cuts_the_tunnel_before_a_byte_goes_up() {
    let (addr, seen) = echo().await;
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    let head = connect(&mut c, &format!("upstream.test:{}", addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    c.write_all(&minimal_client_hello(Some("other.test")))
        .await
        .expect("write");
    assert_eq!(read_all(&mut c).await, "", "cut, nothing echoed");
    let e = &setup.events(1).await[0];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    assert!(
        e.reason
            .as_deref()
            .unwrap_or("")
            .contains("names 'other.test'"),
        "{e:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        seen.lock().expect("seen").iter().all(Vec::is_empty),
        "the upstream got nothing"
    );
}

#[tokio::test]
async fn hosts_outside_the_policy_and_names_that_rebind_to_loopback_are_refused() {
    #[derive(Debug)]
    struct Rebinding;
    impl Resolver for Rebinding {
        fn resolve<'a>(&'a self, _: &'a str) -> sandcell_egress::resolve::ResolveFuture<'a> {
            Box::pin(async {
                Ok(Resolution {
                    addrs: vec!["127.0.0.1".parse().expect("ip")],
                    pinned: false,
                })
            })
        }
    }
    let (addr, _) = echo().await;
    let setup = Setup::start(
        "allow:upstream.test",
        Limits::default(),
        Arc::new(Rebinding),
    )
    .await;
    let mut c = setup.client().await;
    let head = connect(&mut c, &format!("elsewhere.test:{}", addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let mut c = setup.client().await;
    c.write_all(format!("CONNECT upstream.test:{} HTTP/1.1\r\n\r\n", addr.port()).as_bytes())
        .await
        .expect("write");
    let answer = read_all(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("127.0.0.1 (loopback)"), "{answer}");
    // The metadata address, asked for directly.
    let mut c = setup.client().await;
    let head = connect(&mut c, "169.254.169.254:80").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let events = setup.events(3).await;
    assert!(
        events.iter().all(|e| e.outcome == Outcome::Denied),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_plain_request_goes_on_alone_and_the_next_one_on_the_connection_does_not() {
    // An origin server that answers with what it read.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // Reads until the client stops sending (the proxy half-closes after the body).
            while let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await
            {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let body = format!("read {} bytes", got.len());
            let _ = s
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
            record.lock().expect("seen").extend_from_slice(&got);
        }
    });
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    c.write_all(
        format!(
            "POST http://upstream.test:{port}/p?q=1 HTTP/1.1\r\nHost: upstream.test:{port}\r\nProxy-Connection: keep-alive\r\nContent-Length: 5\r\n\r\nhelloGET http://other.test:{port}/ HTTP/1.1\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let answer = read_all(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let sent = String::from_utf8_lossy(&seen.lock().expect("seen")).into_owned();
    assert!(sent.starts_with("POST /p?q=1 HTTP/1.1\r\n"), "{sent}");
    assert!(
        sent.contains("Connection: close\r\n") && !sent.contains("Proxy-Connection"),
        "{sent}"
    );
    assert!(
        sent.ends_with("\r\n\r\nhello"),
        "the body, and nothing after it: {sent}"
    );
    let e = &setup.events(1).await[0];
    assert_eq!(
        (e.protocol, e.outcome),
        (Protocol::Http, Outcome::Allowed),
        "{e:?}"
    );
    // The next request is on a new connection, and decided again.
    setup.proxy.set_policy(NetworkPolicy::Loopback);
    let mut c = setup.client().await;
    c.write_all(format!("GET http://upstream.test:{port}/ HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let answer = read_all(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("'loopback'"), "{answer}");
}

#[tokio::test]
async fn socks5_reaches_an_allowed_name_and_is_refused_the_rest() {
    let (addr, _) = echo().await;
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let socks = |name: &str, port: u16| {
        let mut req = vec![5, 1, 0, 5, 1, 0, 3, name.len() as u8];
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(&port.to_be_bytes());
        req
    };
    let mut c = setup.client().await;
    c.write_all(&socks("upstream.test", addr.port()))
        .await
        .expect("write");
    let mut reply = [0u8; 12];
    c.read_exact(&mut reply).await.expect("reply");
    assert_eq!(&reply[..4], &[5, 0, 5, 0], "no auth, then succeeded");
    c.write_all(b"plain bytes").await.expect("write");
    let mut back = [0u8; 11];
    c.read_exact(&mut back).await.expect("echo");
    assert_eq!(&back, b"plain bytes");
    let mut c = setup.client().await;
    c.write_all(&socks("elsewhere.test", addr.port()))
        .await
        .expect("write");
    let mut reply = [0u8; 12];
    c.read_exact(&mut reply).await.expect("reply");
    assert_eq!(&reply[..4], &[5, 0, 5, 2], "not allowed by the ruleset");
    let events = setup.events(1).await;
    assert!(
        events
            .iter()
            .any(|e| e.protocol == Protocol::Socks5 && e.outcome == Outcome::Denied)
    );
}

#[tokio::test]
async fn the_connection_and_byte_limits_hold() {
    let (addr, _) = echo().await;
    let limits = Limits {
        max_connections: 1,
        max_bytes: Some(4096),
        ..Limits::default()
    };
    let setup = Setup::start("allow:upstream.test", limits, pinned()).await;
    let mut first = setup.client().await;
    let head = connect(&mut first, &format!("upstream.test:{}", addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut second = setup.client().await;
    let head = connect(&mut second, &format!("upstream.test:{}", addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    // 64 KiB through a 4 KiB budget: cut.
    first.write_all(&[b'x'; 1]).await.expect("write");
    let big = vec![b'y'; 64 * 1024];
    let _ = first.write_all(&big).await;
    let echoed = read_all(&mut first).await;
    assert!(echoed.len() < 16 * 1024, "{} bytes came back", echoed.len());
    let e = &setup.events(1).await[0];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    assert!(
        e.reason.as_deref().unwrap_or("").contains("byte limit"),
        "{e:?}"
    );
    assert!(setup.proxy.bytes() >= 4096);
}

#[tokio::test]
async fn a_request_whose_body_could_be_read_two_ways_is_refused() {
    let (addr, seen) = echo().await;
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    c.write_all(
        format!(
            "POST http://upstream.test:{}/ HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET http://elsewhere.test/ HTTP/1.1\r\n\r\n",
            addr.port()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let answer = read_all(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("both Transfer-Encoding and Content-Length"),
        "{answer}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        seen.lock().expect("seen").is_empty(),
        "nothing reached the upstream"
    );
}

/// A SOCKS5 request for `atyp` and its address bytes, after the no-auth greeting.
fn socks_request(command: u8, atyp: u8, addr: &[u8], port: u16) -> Vec<u8> {
    let mut req = vec![5, 1, 0, 5, command, 0, atyp];
    req.extend_from_slice(addr);
    req.extend_from_slice(&port.to_be_bytes());
    req
}

async fn socks_reply(c: &mut UnixStream) -> [u8; 12] {
    let mut reply = [0u8; 12];
    c.read_exact(&mut reply).await.expect("reply");
    reply
}

#[tokio::test]
async fn socks5_addresses_are_decided_as_names_are() {
    let (addr, _) = echo().await;
    let port = addr.port();
    // An IPv4 address a rule names is reached.
    let setup = Setup::start(
        &format!("allow:127.0.0.1:{port}"),
        Limits::default(),
        pinned(),
    )
    .await;
    let mut c = setup.client().await;
    c.write_all(&socks_request(1, 1, &[127, 0, 0, 1], port))
        .await
        .expect("write");
    assert_eq!(&socks_reply(&mut c).await[..4], &[5, 0, 5, 0]);
    c.write_all(b"by address").await.expect("write");
    let mut back = [0u8; 10];
    c.read_exact(&mut back).await.expect("echo");
    assert_eq!(&back, b"by address");
    // IPv6 loopback under `full`: refused, no rule names it.
    let setup = Setup::start("full", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    let mut v6 = [0u8; 16];
    v6[15] = 1;
    c.write_all(&socks_request(1, 4, &v6, port))
        .await
        .expect("write");
    assert_eq!(&socks_reply(&mut c).await[..4], &[5, 0, 5, 2]);
    let e = &setup.events(1).await[0];
    assert!(
        e.reason.as_deref().unwrap_or("").contains("(loopback)"),
        "{e:?}"
    );
    // BIND and UDP ASSOCIATE are not offered.
    let mut c = setup.client().await;
    c.write_all(&socks_request(2, 1, &[8, 8, 8, 8], 53))
        .await
        .expect("write");
    assert_eq!(&socks_reply(&mut c).await[..4], &[5, 0, 5, 7]);
}

#[tokio::test]
async fn a_connect_without_a_port_or_with_credentials_is_a_bad_request() {
    let setup = Setup::start("full", Limits::default(), pinned()).await;
    for target in [
        "upstream.test",
        "user:pw@upstream.test:443",
        "upstream.test:0",
    ] {
        let mut c = setup.client().await;
        let head = connect(&mut c, target).await;
        assert!(head.starts_with("HTTP/1.1 400"), "{target}: {head}");
    }
}

/// `n` bytes of a sequence fixed by `seed`, not starting a TLS record (so a tunnel's
/// first-record check lets them through at once).
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out: Vec<u8> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    if let Some(b) = out.first_mut() {
        *b = b'P';
    }
    out
}

fn digest(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

/// A server on loopback that sends `send` then half-closes, and reads to the end; what it
/// read, per connection.
async fn sender(send: Vec<u8>) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let send = Arc::new(send);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (mut r, mut w) = s.into_split();
            let send = send.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let writer = tokio::spawn(async move {
                    w.write_all(&send).await.expect("send");
                    w.shutdown().await.expect("half-close");
                    w
                });
                let mut got = Vec::new();
                r.read_to_end(&mut got).await.expect("read");
                let _w = writer.await;
                let _ = tx.send(got);
            });
        }
    });
    (addr, rx)
}

/// Writes `up` and half-closes `w` while reading `r` to its end (within `limit`): what came
/// back. Both at once, so neither direction waits for the other's buffers.
async fn send_and_read_back<R, W>(mut r: R, mut w: W, up: Vec<u8>, limit: Duration) -> Vec<u8>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let writer = tokio::spawn(async move {
        w.write_all(&up).await.expect("write");
        w.shutdown().await.expect("half-close");
        w
    });
    let mut back = Vec::new();
    tokio::time::timeout(limit, r.read_to_end(&mut back))
        .await
        .expect("in time")
        .expect("read");
    let _w = writer.await.expect("writer");
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_relays_ten_megabytes_each_way_intact_and_counts_them() {
    const SIZE: usize = 10 << 20;
    let down = pattern(SIZE, 2);
    let (addr, mut received) = sender(down.clone()).await;
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    let head = connect(&mut c, &format!("upstream.test:{}", addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let up = pattern(SIZE, 1);
    let (r, w) = c.into_split();
    let back = send_and_read_back(r, w, up.clone(), Duration::from_secs(60)).await;
    assert_eq!(back.len(), SIZE);
    assert_eq!(digest(&back), digest(&down), "what came down");
    let got = tokio::time::timeout(Duration::from_secs(10), received.recv())
        .await
        .expect("in time")
        .expect("the server's bytes");
    assert_eq!(got.len(), SIZE);
    assert_eq!(digest(&got), digest(&up), "what went up");
    let e = &setup.events(1).await[0];
    assert_eq!(
        (e.outcome, e.reason.as_deref()),
        (Outcome::Allowed, None),
        "{e:?}"
    );
    assert_eq!((e.bytes_up, e.bytes_down), (SIZE as u64, SIZE as u64));
    assert_eq!(setup.proxy.bytes(), 2 * SIZE as u64);
}

#[tokio::test]
async fn a_tunnel_carries_a_half_close_each_way() {
    // The sandbox ends its side first: the server reads to the end, then answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let answers = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.expect("read");
            s.write_all(format!("read {} bytes", got.len()).as_bytes())
                .await
                .expect("answer");
        }
    });
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    let head = connect(&mut c, &format!("upstream.test:{}", answers.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    c.write_all(b"PING 12 bytes").await.expect("write");
    c.shutdown().await.expect("half-close");
    assert_eq!(read_all(&mut c).await, "read 13 bytes");

    // The server ends its side first: the sandbox still sends after reading its end.
    let (greets, mut received) = sender(b"hello".to_vec()).await;
    let mut c = setup.client().await;
    let head = connect(&mut c, &format!("upstream.test:{}", greets.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut greeting = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut greeting))
        .await
        .expect("the server's end comes through")
        .expect("read");
    assert_eq!(greeting, b"hello");
    c.write_all(b"PS: after your end").await.expect("write");
    c.shutdown().await.expect("half-close");
    let got = tokio::time::timeout(Duration::from_secs(5), received.recv())
        .await
        .expect("in time")
        .expect("the server's bytes");
    assert_eq!(got, b"PS: after your end");
    let events = setup.events(2).await;
    assert!(
        events
            .iter()
            .all(|e| e.outcome == Outcome::Allowed && e.reason.is_none()),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| (e.bytes_up, e.bytes_down) == (18, 5)),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_large_tunnel_is_cut_at_the_byte_limit_and_counted_to_it() {
    const LIMIT: u64 = 1 << 20;
    let (addr, _) = echo().await;
    let limits = Limits {
        max_bytes: Some(LIMIT),
        ..Limits::default()
    };
    let setup = Setup::start("allow:upstream.test", limits, pinned()).await;
    let mut c = setup.client().await;
    let head = connect(&mut c, &format!("upstream.test:{}", addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (mut r, mut w) = c.into_split();
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&pattern(16 << 20, 3)).await;
        w
    });
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut back)).await;
    assert!(
        (back.len() as u64) < LIMIT,
        "{} bytes came back through a {LIMIT}-byte budget",
        back.len()
    );
    let e = &setup.events(1).await[0];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    assert!(
        e.reason.as_deref().unwrap_or("").contains("byte limit"),
        "{e:?}"
    );
    // Each take is held to what is left of the budget: the count stops at the limit.
    assert_eq!(e.bytes_up + e.bytes_down, LIMIT, "{e:?}");
    assert_eq!(setup.proxy.bytes(), LIMIT);
    writer.abort();
}

#[tokio::test]
async fn a_plain_request_gets_a_large_answer_whole_and_counted() {
    const SIZE: usize = 4 << 20;
    let body = pattern(SIZE, 4);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let served = body.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n");
            s.write_all(reply.as_bytes()).await.expect("head");
            s.write_all(&served).await.expect("body");
        }
    });
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let mut c = setup.client().await;
    c.write_all(format!("GET http://upstream.test:{port}/big HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut answer))
        .await
        .expect("in time")
        .expect("read");
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    assert!(answer.starts_with(b"HTTP/1.1 200 OK"));
    assert_eq!(digest(&answer[split..]), digest(&body));
    let e = &setup.events(1).await[0];
    assert_eq!(
        (e.protocol, e.outcome),
        (Protocol::Http, Outcome::Allowed),
        "{e:?}"
    );
    assert_eq!(e.bytes_down, answer.len() as u64);
}

/// A `CONNECT` to `upstream.test` at `addr`'s port sent to `setup`'s proxy over an
/// in-memory stream (not a socket, so never spliced); the client's halves.
async fn connect_in_memory(
    setup: &Setup,
    addr: SocketAddr,
) -> (
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
) {
    let (client, served) = tokio::io::duplex(64 * 1024);
    tokio::spawn(setup.proxy.clone().handle(served));
    let (r, mut w) = tokio::io::split(client);
    let target = format!("upstream.test:{}", addr.port());
    w.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    (r, w)
}

#[tokio::test]
async fn a_stream_that_is_not_a_socket_is_relayed_through_a_buffer_with_its_limits() {
    const SIZE: usize = 1 << 20;
    let down = pattern(SIZE, 6);
    let (addr, mut received) = sender(down.clone()).await;
    let setup = Setup::start("allow:upstream.test", Limits::default(), pinned()).await;
    let (mut r, w) = connect_in_memory(&setup, addr).await;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(r.read(&mut byte).await.expect("read"), 1, "the head ends");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));
    let up = pattern(SIZE, 5);
    let back = send_and_read_back(r, w, up.clone(), Duration::from_secs(30)).await;
    assert_eq!(digest(&back), digest(&down));
    let got = received.recv().await.expect("the server's bytes");
    assert_eq!(digest(&got), digest(&up));
    let e = &setup.events(1).await[0];
    assert_eq!(
        (e.bytes_up, e.bytes_down),
        (SIZE as u64, SIZE as u64),
        "{e:?}"
    );

    // And its byte limit still cuts it.
    let limits = Limits {
        max_bytes: Some(64 * 1024),
        ..Limits::default()
    };
    let (addr, _) = echo().await;
    let setup = Setup::start("allow:upstream.test", limits, pinned()).await;
    let (mut r, mut w) = connect_in_memory(&setup, addr).await;
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&pattern(4 << 20, 7)).await;
        w
    });
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut back)).await;
    assert!(back.len() < 1 << 20, "{} bytes came back", back.len());
    let e = &setup.events(1).await[0];
    assert!(
        e.reason.as_deref().unwrap_or("").contains("byte limit"),
        "{e:?}"
    );
    writer.abort();
}
