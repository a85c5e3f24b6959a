//! Secrets through the egress proxy, end to end on loopback: fake HTTPS and HTTP servers
//! (sandcell-testkit's registries, whose `/echo` answers the request's headers) named
//! `api.test` and `other.test`, pinned to 127.0.0.1; a proxy on a Unix socket holding one
//! secret `TOKEN` for `api.test`; a sandbox-side client that trusts the proxy's CA.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, ServerName};
use sandcell_egress::tls::minimal_client_hello;
use sandcell_egress::{
    EgressEvent, EgressProxy, InterceptCa, Interception, Limits, Outcome, Secret, Secrets,
    StaticResolver, UpstreamTrust,
};
use sandcell_testkit::registries::FakeRegistries;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The real value: it must reach `api.test` and nothing else, and never come back from the
/// proxy itself.
const VALUE: &str = "sk-live-7f3a9c51e2d84b60";

struct Setup {
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    proxy: Arc<EgressProxy>,
    events: Arc<Mutex<Vec<EgressEvent>>>,
    fake: FakeRegistries,
    ca: Arc<InterceptCa>,
    placeholder: String,
}

impl Setup {
    /// The fake servers, a proxy allowing both names, the secret, and upstream roots: the
    /// fake servers' CA when `trust_fake`, none otherwise.
    async fn start(trust_fake: bool) -> Self {
        let fake = FakeRegistries::start(&["api.test", "other.test"])
            .await
            .expect("fake registries");
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("egress.sock");
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        let resolver = Arc::new(StaticResolver::new([
            ("api.test".to_string(), vec![lo]),
            ("other.test".to_string(), vec![lo]),
        ]));
        let proxy = EgressProxy::new(
            "allow:api.test,other.test".parse().expect("policy"),
            resolver,
            Limits::default(),
            Arc::new(move |e| sink.lock().expect("events").push(e)),
        );
        let ca = Arc::new(InterceptCa::generate().expect("ca"));
        let trust = if trust_fake {
            UpstreamTrust::empty()
                .with_pem(fake.ca().cert_pem())
                .expect("fake CA")
        } else {
            UpstreamTrust::empty()
        };
        proxy.set_interception(Some(
            Interception::new(ca.clone(), &trust).expect("interception"),
        ));
        let secret =
            Secret::new("TOKEN", VALUE, vec!["api.test".parse().expect("rule")]).expect("secret");
        let placeholder = secret.placeholder().to_string();
        proxy.set_secrets(Secrets::new(vec![secret]).expect("secrets"));
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        tokio::spawn(proxy.clone().serve_unix(listener));
        Self {
            _dir: dir,
            socket,
            proxy,
            events,
            fake,
            ca,
            placeholder,
        }
    }

    fn https_port(&self) -> u16 {
        self.fake.https_addr().port()
    }

    fn http_port(&self) -> u16 {
        self.fake.http_addr().port()
    }

    async fn client(&self) -> UnixStream {
        UnixStream::connect(&self.socket).await.expect("connect")
    }

    /// A `CONNECT host:port` tunnel, answered `200`.
    async fn tunnel(&self, host: &str, port: u16) -> UnixStream {
        let mut s = self.client().await;
        s.write_all(
            format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let head = read_head(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s
    }

    /// A tunnel to `host` at the HTTPS port, TLS over it trusting `root` and naming `sni`.
    async fn tls_with(
        &self,
        host: &str,
        sni: &str,
        root: &[u8],
    ) -> std::io::Result<TlsStream<UnixStream>> {
        let s = self.tunnel(host, self.https_port()).await;
        connector(root)
            .connect(ServerName::try_from(sni.to_string()).expect("name"), s)
            .await
    }

    /// A tunnel to `host` with TLS as a sandbox that trusts the proxy's CA makes it.
    async fn tls(&self, host: &str) -> TlsStream<UnixStream> {
        self.tls_with(host, host, self.ca.cert_der())
            .await
            .expect("TLS through the proxy")
    }

    /// The events so far, once `n` are in.
    async fn events(&self, n: usize) -> Vec<EgressEvent> {
        for _ in 0..500 {
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

    /// No request the fake servers saw carries the value where it does not belong: only
    /// requests to `api.test` may.
    fn assert_value_only_reached_api(&self) {
        for r in self.fake.requests() {
            let host = r.host.clone().unwrap_or_default();
            if !host.starts_with("api.test") {
                let q = r.query.clone().unwrap_or_default();
                assert!(!q.contains(VALUE) && !r.path.contains(VALUE), "{r:?}");
            }
        }
    }
}

fn connector(root: &[u8]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(root.to_vec()))
        .expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// Reads a head to its empty line, or to the end of the stream; a read error fails the test
/// with its text (rather than passing on a cut head that fails later, somewhere else).
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(0) => break,
            Ok(_) => head.push(byte[0]),
            Err(e) => panic!(
                "reading a head: {e} after {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// One response: its head, its body (by Content-Length, else to the end).
struct Answer {
    head: String,
    body: String,
}

impl Answer {
    fn status(&self) -> u16 {
        self.head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The whole answer as text, for checks that the value is not in it.
    fn text(&self) -> String {
        format!("{}{}", self.head, self.body)
    }
}

async fn read_answer<S: AsyncRead + Unpin>(s: &mut S) -> Answer {
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(s))
        .await
        .expect("an answer in time");
    assert!(!head.is_empty(), "no answer: the connection was closed");
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            s.read_exact(&mut body).await.expect("body");
        }
        None => {
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut body)).await;
        }
    }
    Answer {
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn ask<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, request: &str) -> Answer {
    s.write_all(request.as_bytes()).await.expect("write");
    s.flush().await.expect("flush");
    read_answer(s).await
}

/// Whether the stream is at its end (the proxy closed it).
async fn closed<S: AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

fn assert_no_value(text: &str) {
    assert!(!text.contains(VALUE), "the value came back: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_replaces_the_placeholder_in_headers_and_query_for_its_host() {
    let setup = Setup::start(true).await;
    let p = setup.placeholder.clone();
    let mut tls = setup.tls("api.test").await;
    let a = ask(
        &mut tls,
        &format!(
            "GET /echo?key={p}&x=1 HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {p}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(a.status(), 200, "{}", a.text());
    let echo = a.json();
    assert_eq!(echo["headers"]["authorization"], format!("Bearer {VALUE}"));
    assert_eq!(echo["path"], format!("/echo?key={VALUE}&x=1"));

    // The same connection, kept alive: the next request is read and replaced too, the
    // password of a Basic header inside its encoding.
    let b64 = base64::engine::general_purpose::STANDARD;
    let creds = b64.encode(format!("me:{p}"));
    let a = ask(
        &mut tls,
        &format!(
            "GET /echo HTTP/1.1\r\nHost: api.test\r\nX-Key: {p}\r\nAuthorization: Basic {creds}\r\n\r\n"
        ),
    )
    .await;
    let echo = a.json();
    assert_eq!(echo["headers"]["x-key"], VALUE);
    assert_eq!(
        echo["headers"]["authorization"],
        format!("Basic {}", b64.encode(format!("me:{VALUE}")))
    );

    // A request without placeholders passes as it was sent, its body too.
    let a = ask(
        &mut tls,
        "POST /echo?plain=yes HTTP/1.1\r\nHost: api.test\r\nX-Plain: hello\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    let echo = a.json();
    assert_eq!(echo["path"], "/echo?plain=yes");
    assert_eq!(echo["headers"]["x-plain"], "hello");
    assert_eq!(echo["body_len"], 5);
    // A chunked body, then the connection closed by the client's wish.
    let a = ask(
        &mut tls,
        "POST /echo HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(a.json()["body_len"], 9);
    assert!(closed(&mut tls).await, "closed after Connection: close");

    let events = setup.events(1).await;
    let e = &events[0];
    assert_eq!(e.outcome, Outcome::Allowed, "{e:?}");
    assert!(e.intercepted, "{e:?}");
    assert_eq!(e.secrets, vec!["TOKEN".to_string()]);
    assert_eq!(e.sni.as_deref(), Some("api.test"));
    assert!(e.bytes_up > 0 && e.bytes_down > 0, "{e:?}");
    assert_no_value(&format!("{e:?}"));
    let seen = setup.fake.requests();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0].query.as_deref(), Some(&*format!("key={VALUE}&x=1")));
    assert!(
        seen.iter()
            .all(|r| r.tls && r.host.as_deref() == Some("api.test"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_on_its_way_to_another_host_is_refused_and_never_sent() {
    let setup = Setup::start(true).await;
    let p = setup.placeholder.clone();
    let mut tls = setup.tls("other.test").await;
    let a = ask(
        &mut tls,
        &format!(
            "GET /echo?key={p} HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer {p}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(a.status(), 403, "{}", a.text());
    assert!(
        a.body.contains("'TOKEN'") && a.body.contains("api.test"),
        "{}",
        a.body
    );
    assert!(a.head.contains("X-Sandcell-Egress: denied"), "{}", a.head);
    assert_no_value(&a.text());
    assert!(closed(&mut tls).await, "closed after the refusal");
    let e = &setup.events(1).await[0];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    assert!(e.intercepted, "{e:?}");
    assert!(
        e.reason.as_deref().unwrap_or("").contains("'TOKEN'"),
        "{e:?}"
    );
    assert_no_value(&format!("{e:?}"));
    assert!(setup.fake.requests().is_empty(), "nothing reached the host");

    // Kept alive: a first request without a placeholder goes, the second is checked too.
    let mut tls = setup.tls("other.test").await;
    let a = ask(
        &mut tls,
        "GET /echo?n=1 HTTP/1.1\r\nHost: other.test\r\n\r\n",
    )
    .await;
    assert_eq!(a.status(), 200, "{}", a.text());
    let a = ask(
        &mut tls,
        &format!("GET /echo?n=2 HTTP/1.1\r\nHost: other.test\r\nX-Key: {p}\r\n\r\n"),
    )
    .await;
    assert_eq!(a.status(), 403, "{}", a.text());
    assert_no_value(&a.text());
    let events = setup.events(2).await;
    assert_eq!(events[1].outcome, Outcome::Denied, "{:?}", events[1]);
    let seen = setup.fake.requests();
    assert_eq!(seen.len(), 1, "only the first request went: {seen:?}");
    assert_eq!(seen[0].query.as_deref(), Some("n=1"));
    setup.assert_value_only_reached_api();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_goes_only_to_the_host_the_tunnel_was_opened_to() {
    let setup = Setup::start(true).await;
    let p = setup.placeholder.clone();
    // A Host header naming another site behind the same front end.
    let mut tls = setup.tls("api.test").await;
    let a = ask(
        &mut tls,
        &format!("GET /echo HTTP/1.1\r\nHost: other.test\r\nX-Key: {p}\r\n\r\n"),
    )
    .await;
    assert_eq!(a.status(), 403, "{}", a.text());
    assert!(a.body.contains("'other.test'"), "{}", a.body);
    // The placeholder as the Host itself: refused, and the refusal quotes no value.
    let mut tls = setup.tls("api.test").await;
    let a = ask(
        &mut tls,
        &format!("GET /echo HTTP/1.1\r\nHost: {p}\r\n\r\n"),
    )
    .await;
    assert_eq!(a.status(), 403, "{}", a.text());
    assert_no_value(&a.text());
    // In the path: never replaced, refused.
    let mut tls = setup.tls("api.test").await;
    let a = ask(
        &mut tls,
        &format!("GET /echo/{p} HTTP/1.1\r\nHost: api.test\r\n\r\n"),
    )
    .await;
    assert_eq!(a.status(), 403, "{}", a.text());
    assert!(a.body.contains("path"), "{}", a.body);
    assert_no_value(&a.text());
    assert!(
        setup.fake.requests().is_empty(),
        "{:?}",
        setup.fake.requests()
    );
    for e in setup.events(3).await {
        assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
        assert_no_value(&format!("{e:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_requests_get_the_value_for_its_host_only() {
    let setup = Setup::start(true).await;
    let p = setup.placeholder.clone();
    let port = setup.http_port();
    let mut c = setup.client().await;
    let a = ask(
        &mut c,
        &format!(
            "GET http://api.test:{port}/echo?key={p} HTTP/1.1\r\nHost: api.test:{port}\r\nAuthorization: Bearer {p}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(a.status(), 200, "{}", a.text());
    let echo = a.json();
    assert_eq!(echo["headers"]["authorization"], format!("Bearer {VALUE}"));
    assert_eq!(echo["path"], format!("/echo?key={VALUE}"));
    let e = &setup.events(1).await[0];
    assert_eq!(e.secrets, vec!["TOKEN".to_string()], "{e:?}");
    assert!(!e.intercepted, "plain HTTP needs no interception: {e:?}");

    let mut c = setup.client().await;
    let a = ask(
        &mut c,
        &format!(
            "GET http://other.test:{port}/echo?key={p} HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(a.status(), 403, "{}", a.text());
    assert!(a.body.contains("'TOKEN'"), "{}", a.body);
    assert_no_value(&a.text());
    let e = &setup.events(2).await[1];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    let seen = setup.fake.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(!seen[0].tls);
    setup.assert_value_only_reached_api();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hello_for_another_host_is_still_cut() {
    let setup = Setup::start(true).await;
    let mut s = setup.tunnel("api.test", setup.https_port()).await;
    s.write_all(&minimal_client_hello(Some("other.test")))
        .await
        .expect("write");
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut back)).await;
    assert!(back.is_empty(), "cut, nothing answered: {back:?}");
    let e = &setup.events(1).await[0];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    assert!(
        e.reason
            .as_deref()
            .unwrap_or("")
            .contains("names 'other.test'"),
        "{e:?}"
    );
    // A real client naming another host than the tunnel's: cut as well.
    let tls = setup
        .tls_with("api.test", "other.test", setup.ca.cert_der())
        .await;
    assert!(tls.is_err(), "the handshake must fail");
    let e = &setup.events(2).await[1];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    assert!(setup.fake.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_the_roots_do_not_vouch_for_gets_no_request() {
    let setup = Setup::start(false).await;
    let p = setup.placeholder.clone();
    let mut tls = setup.tls("api.test").await;
    let a = ask(
        &mut tls,
        &format!("GET /echo?key={p} HTTP/1.1\r\nHost: api.test\r\n\r\n"),
    )
    .await;
    assert_eq!(a.status(), 502, "{}", a.text());
    assert!(a.body.contains("could not be verified"), "{}", a.body);
    assert_no_value(&a.text());
    let e = &setup.events(1).await[0];
    assert_eq!(e.outcome, Outcome::Denied, "{e:?}");
    assert!(setup.fake.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_secrets_a_tunnel_is_relayed_as_it_is() {
    let setup = Setup::start(true).await;
    setup.proxy.set_secrets(Secrets::default());
    // The proxy's CA does not vouch for the real server: a client trusting only it fails.
    assert!(
        setup
            .tls_with("api.test", "api.test", setup.ca.cert_der())
            .await
            .is_err()
    );
    // A client trusting the server's own CA talks to the server itself.
    let mut tls = setup
        .tls_with("api.test", "api.test", setup.fake.ca().cert_der())
        .await
        .expect("the server's own TLS");
    let a = ask(
        &mut tls,
        "GET /echo HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(a.status(), 200, "{}", a.text());
    drop(tls);
    let events = setup.events(2).await;
    assert!(
        events
            .iter()
            .all(|e| !e.intercepted && e.secrets.is_empty()),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_that_is_not_tls_is_read_when_it_carries_http() {
    let setup = Setup::start(true).await;
    let p = setup.placeholder.clone();
    // Plain HTTP inside a CONNECT tunnel to the HTTP port: read and replaced as well.
    let mut s = setup.tunnel("api.test", setup.http_port()).await;
    let a = ask(
        &mut s,
        &format!("GET /echo?key={p} HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!(a.json()["path"], format!("/echo?key={VALUE}"));
    let e = &setup.events(1).await[0];
    assert!(e.intercepted && e.secrets == ["TOKEN"], "{e:?}");
    // And refused on its way to another host.
    let mut s = setup.tunnel("other.test", setup.http_port()).await;
    let a = ask(
        &mut s,
        &format!("GET /echo?key={p} HTTP/1.1\r\nHost: other.test\r\n\r\n"),
    )
    .await;
    assert_eq!(a.status(), 403, "{}", a.text());
    assert_no_value(&a.text());
    setup.assert_value_only_reached_api();
}

/// A TCP server on loopback that greets with `greeting` (if any), then echoes.
async fn greeter(greeting: &'static [u8]) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                if s.write_all(greeting).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_protocols_in_a_tunnel_pass_as_they_are_while_secrets_are_set() {
    let setup = Setup::start(true).await;
    // A server that speaks first (SMTP-like).
    let port = greeter(b"220 hello\r\n").await;
    let mut s = setup.tunnel("api.test", port).await;
    let mut greeting = [0u8; 11];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut greeting))
        .await
        .expect("in time")
        .expect("greeting");
    assert_eq!(&greeting, b"220 hello\r\n");
    s.write_all(b"EHLO x\r\n").await.expect("write");
    let mut back = [0u8; 8];
    s.read_exact(&mut back).await.expect("echo");
    assert_eq!(&back, b"EHLO x\r\n");
    drop(s);
    // A client that speaks first, not HTTP (an SSH banner).
    let port = greeter(b"").await;
    let mut s = setup.tunnel("api.test", port).await;
    s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n")
        .await
        .expect("write");
    let mut back = [0u8; 21];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
        .await
        .expect("in time")
        .expect("echo");
    assert_eq!(&back, b"SSH-2.0-OpenSSH_9.6\r\n");
    drop(s);
    let events = setup.events(2).await;
    assert!(
        events
            .iter()
            .all(|e| e.outcome == Outcome::Allowed && !e.intercepted),
        "{events:?}"
    );
}
