//! The fake registries, end to end: raw HTTP(S) from Rust for every route, then the real
//! `curl`, `pip`, `npm` and `git` of this machine (each skipped when missing), each run with
//! a cleared environment so no host proxy, index or CA setting takes part.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, ServerName};
use sandcell_testkit::registries::{
    DEV_FILE, FakeRegistries, README_TEXT, SeenRequest, TARBALL_FILE, TestCa, WHEEL_FILE,
};
use sandcell_testkit::skip;
use serde_json::Value;
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const NAMES: [&str; 3] = ["pypi.test", "npm.test", "git.test"];
/// The most one external tool may take before the test fails instead of hanging.
const TOOL_TIMEOUT: Duration = Duration::from_secs(180);

async fn start() -> FakeRegistries {
    FakeRegistries::start(&NAMES)
        .await
        .expect("the fake registries start")
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// How to reach a listener: plain, or TLS trusting only `ca` with `server_name` as SNI.
#[derive(Clone, Copy)]
enum Via<'a> {
    Plain,
    Tls(&'a TestCa, &'a str),
}

fn client_config(ca: &TestCa) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca.cert_der().to_vec()))
        .expect("the CA is a valid root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("default versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// Connects over TLS; the handshake's error when the certificate does not fit.
async fn tls_connect(
    addr: SocketAddr,
    ca: &TestCa,
    server_name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_string()).expect("a valid server name");
    tokio_rustls::TlsConnector::from(client_config(ca))
        .connect(name, tcp)
        .await
}

/// One request on a fresh connection (`Connection: close`), the whole response read.
async fn request(
    addr: SocketAddr,
    via: Via<'_>,
    method: &str,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let raw = match via {
        Via::Plain => {
            let stream = TcpStream::connect(addr).await.expect("connect");
            exchange(stream, head.as_bytes(), body).await
        }
        Via::Tls(ca, name) => {
            let stream = tls_connect(addr, ca, name).await.expect("TLS handshake");
            exchange(stream, head.as_bytes(), body).await
        }
    };
    parse(&raw)
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    head: &[u8],
    body: &[u8],
) -> Vec<u8> {
    s.write_all(head).await.expect("write the request");
    s.write_all(body).await.expect("write the body");
    s.flush().await.expect("flush");
    let mut raw = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw)).await;
    match read {
        Ok(Ok(_)) => {}
        // rustls reports a peer that closed without close_notify; the bytes are all there.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Ok(Err(e)) => panic!("read the response: {e}"),
        Err(_) => panic!("no complete response within 30 s"),
    }
    raw
}

fn parse(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("a status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status in {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect::<BTreeMap<_, _>>();
    let body = raw[split + 4..].to_vec();
    assert!(
        !headers.contains_key("transfer-encoding"),
        "every response here has a Content-Length: {headers:?}"
    );
    if let Some(len) = headers.get("content-length") {
        assert_eq!(
            len.parse::<usize>().ok(),
            Some(body.len()),
            "a body cut short"
        );
    }
    Reply {
        status,
        headers,
        body,
    }
}

async fn get(addr: SocketAddr, via: Via<'_>, host: &str, path: &str) -> Reply {
    request(addr, via, "GET", host, path, &[], b"").await
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn seen(fake: &FakeRegistries, tls: bool, method: &str, path: &str) -> bool {
    fake.requests()
        .iter()
        .any(|r| r.tls == tls && r.method == method && r.path == path)
}

// ---- Rust-only checks: run everywhere ----

#[tokio::test]
async fn https_serves_every_name_of_the_certificate_and_no_other() {
    let fake = start().await;
    let addr = fake.https_addr();
    assert_eq!(fake.names(), NAMES);
    for name in NAMES.iter().chain(&["127.0.0.1"]) {
        let host = format!("{name}:{}", addr.port());
        let reply = get(addr, Via::Tls(fake.ca(), name), &host, "/echo").await;
        assert_eq!(reply.status, 200, "{name}: {}", reply.text());
        assert_eq!(reply.json()["headers"]["host"], host.as_str());
    }
    let refused = tls_connect(addr, fake.ca(), "other.test").await;
    let err = refused.expect_err("a name the certificate lacks is refused");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    // Another CA's clients do not trust it (same name, other key: the signature fails).
    let stranger = TestCa::generate().expect("a CA");
    let err = tls_connect(addr, &stranger, "pypi.test")
        .await
        .expect_err("another CA's certificate is refused");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn the_ca_file_holds_the_ca_certificate_and_can_issue_more() {
    let fake = start().await;
    let pem = std::fs::read_to_string(fake.ca_pem_path()).expect("the CA file");
    assert_eq!(pem, fake.ca().cert_pem());
    assert!(fake.ca().key_pem().contains("PRIVATE KEY"));
    let leaf = sandcell_testkit::registries::issue_leaf(fake.ca(), "later.test").expect("a leaf");
    // A server presenting the new certificate is trusted by a client of the same CA.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor =
        tokio_rustls::TlsAcceptor::from(leaf.rustls_server_config().expect("a server config"));
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut tls = acceptor.accept(tcp).await.expect("server handshake");
        tls.write_all(b"hi").await.expect("write");
        tls.shutdown().await.expect("close");
    });
    let mut client = tls_connect(addr, fake.ca(), "later.test")
        .await
        .expect("the issued certificate is trusted");
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.expect("read");
    assert_eq!(got, b"hi");
    server.await.expect("the server task");
}

#[tokio::test]
async fn the_simple_index_links_the_wheel_with_its_sha256() {
    let fake = start().await;
    let addr = fake.http_addr();
    let root = get(addr, Via::Plain, "pypi.test", "/simple/").await;
    assert_eq!(root.status, 200);
    assert!(
        root.text().contains("href=\"/simple/sandcell-fake/\""),
        "{}",
        root.text()
    );
    // Any spelling that normalizes to the project's name, with or without the slash.
    for path in ["/simple/sandcell-fake/", "/simple/Sandcell_Fake"] {
        let page = get(addr, Via::Plain, "pypi.test", path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(page.headers["content-type"].starts_with("text/html"));
    }
    let page = get(addr, Via::Plain, "pypi.test", "/simple/sandcell-fake/")
        .await
        .text();
    let href_start = page.find("href=\"").expect("an anchor") + 6;
    let href = &page[href_start..href_start + page[href_start..].find('"').expect("closed")];
    let (url, fragment) = href.split_once("#sha256=").expect("a sha256 fragment");
    assert_eq!(url, format!("/files/{WHEEL_FILE}"));
    let wheel = get(addr, Via::Plain, "pypi.test", url).await;
    assert_eq!(wheel.status, 200);
    assert_eq!(hex(&Sha256::digest(&wheel.body)), fragment);
    assert_eq!(&wheel.body[..4], b"PK\x03\x04", "a zip");
    assert_eq!(
        get(addr, Via::Plain, "pypi.test", "/simple/other/")
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn the_packument_points_at_the_tarball_as_the_client_named_the_server() {
    let fake = start().await;
    // Plain HTTP, a host that is not even resolvable: the URL follows the request.
    let reply = get(
        fake.http_addr(),
        Via::Plain,
        "npm.test:1234",
        "/sandcell-fake",
    )
    .await;
    assert_eq!(reply.status, 200);
    let doc = reply.json();
    assert_eq!(doc["name"], "sandcell-fake");
    assert_eq!(doc["dist-tags"]["latest"], "1.0.0");
    let dist = &doc["versions"]["1.0.0"]["dist"];
    assert_eq!(
        dist["tarball"],
        format!("http://npm.test:1234/sandcell-fake/-/{TARBALL_FILE}")
    );
    // Over TLS, the scheme is https.
    let addr = fake.https_addr();
    let host = format!("npm.test:{}", addr.port());
    let doc = get(
        addr,
        Via::Tls(fake.ca(), "npm.test"),
        &host,
        "/sandcell-fake",
    )
    .await
    .json();
    let dist = &doc["versions"]["1.0.0"]["dist"];
    let tarball_url = dist["tarball"].as_str().expect("a tarball URL");
    let prefix = format!("https://{host}");
    assert!(tarball_url.starts_with(&prefix), "{tarball_url}");
    let tarball = get(
        addr,
        Via::Tls(fake.ca(), "npm.test"),
        &host,
        &tarball_url[prefix.len()..],
    )
    .await;
    assert_eq!(tarball.status, 200);
    assert_eq!(&tarball.body[..2], &[0x1f, 0x8b], "gzip");
    assert_eq!(dist["shasum"], hex(&Sha1::digest(&tarball.body)));
    let integrity = base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&tarball.body));
    assert_eq!(dist["integrity"], format!("sha512-{integrity}"));
}

#[tokio::test]
async fn echo_answers_method_path_headers_and_body_length() {
    let fake = start().await;
    let reply = request(
        fake.http_addr(),
        Via::Plain,
        "POST",
        "echo.test",
        "/echo?a=1&b=two",
        &[("X-Probe", "yes"), ("X-Many", "one"), ("X-Many", "two")],
        b"hello",
    )
    .await;
    assert_eq!(reply.status, 200);
    let doc = reply.json();
    assert_eq!(doc["method"], "POST");
    assert_eq!(doc["path"], "/echo?a=1&b=two");
    assert_eq!(doc["headers"]["host"], "echo.test");
    assert_eq!(doc["headers"]["x-probe"], "yes");
    assert_eq!(doc["headers"]["x-many"], "one, two");
    assert_eq!(doc["headers"]["content-length"], "5");
    assert_eq!(doc["body_len"], 5);
    let put = request(fake.http_addr(), Via::Plain, "PUT", "h", "/echo", &[], b"").await;
    assert_eq!(put.json()["method"], "PUT");
}

#[tokio::test]
async fn bytes_sends_exactly_n_bytes_of_the_pattern() {
    let fake = start().await;
    let addr = fake.https_addr();
    for n in [0_usize, 1, 251 * 256 + 7, 300_000] {
        let reply = get(
            addr,
            Via::Tls(fake.ca(), "pypi.test"),
            "pypi.test",
            &format!("/bytes/{n}"),
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.headers["content-length"], n.to_string());
        assert_eq!(reply.body.len(), n);
        assert!(
            reply
                .body
                .iter()
                .enumerate()
                .all(|(i, b)| usize::from(*b) == i % 251),
            "the pattern breaks somewhere in {n} bytes"
        );
    }
    let bad = get(fake.http_addr(), Via::Plain, "h", "/bytes/lots").await;
    assert_eq!(bad.status, 404);
}

#[tokio::test]
async fn unknown_paths_are_404_and_every_request_is_recorded() {
    let fake = start().await;
    assert!(fake.requests().is_empty());
    assert_eq!(
        get(fake.http_addr(), Via::Plain, "a.test", "/nope?x=1")
            .await
            .status,
        404
    );
    let post = request(
        fake.http_addr(),
        Via::Plain,
        "POST",
        "a.test",
        "/simple/",
        &[],
        b"",
    )
    .await;
    assert_eq!(post.status, 404, "the index takes only GET");
    let host = format!("git.test:{}", fake.https_addr().port());
    let tls = get(
        fake.https_addr(),
        Via::Tls(fake.ca(), "git.test"),
        &host,
        "/simple/",
    )
    .await;
    assert_eq!(tls.status, 200);
    assert_eq!(
        fake.requests(),
        vec![
            SeenRequest {
                tls: false,
                method: "GET".into(),
                host: Some("a.test".into()),
                path: "/nope".into(),
                query: Some("x=1".into()),
            },
            SeenRequest {
                tls: false,
                method: "POST".into(),
                host: Some("a.test".into()),
                path: "/simple/".into(),
                query: None,
            },
            SeenRequest {
                tls: true,
                method: "GET".into(),
                host: Some(host),
                path: "/simple/".into(),
                query: None,
            },
        ]
    );
    fake.clear_requests();
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn the_git_repository_is_served_as_dumb_http_files() {
    let fake = start().await;
    if !fake.has_git_repo() {
        skip!("git not installed");
    }
    let refs = get(
        fake.http_addr(),
        Via::Plain,
        "git.test",
        "/repo.git/info/refs",
    )
    .await;
    assert_eq!(refs.status, 200);
    assert!(
        refs.text().contains("\trefs/heads/main\n"),
        "{}",
        refs.text()
    );
    assert!(
        refs.text().contains("\trefs/heads/dev\n"),
        "{}",
        refs.text()
    );
    // Not the smart protocol's type, or git would expect a smart server.
    assert!(!refs.headers["content-type"].contains("git-upload-pack"));
    let head = get(fake.http_addr(), Via::Plain, "git.test", "/repo.git/HEAD").await;
    assert_eq!(head.text(), "ref: refs/heads/main\n");
    for escape in [
        "/repo.git/../ca.pem",
        "/repo.git//HEAD",
        "/repo.git/objects",
    ] {
        assert_eq!(
            get(fake.http_addr(), Via::Plain, "g", escape).await.status,
            404,
            "{escape}"
        );
    }
}

/// Waits (bounded) until nothing accepts connections at `addr` any more.
async fn refused_soon(addr: SocketAddr) -> bool {
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_err() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn dropping_stops_both_listeners_and_removes_the_files() {
    let fake = start().await;
    let (https, http) = (fake.https_addr(), fake.http_addr());
    let ca = fake.ca_pem_path().to_path_buf();
    assert!(ca.exists());
    drop(fake);
    assert!(!ca.exists(), "the CA file is removed with the registries");
    assert!(refused_soon(http).await, "the HTTP listener still accepts");
    assert!(
        refused_soon(https).await,
        "the HTTPS listener still accepts"
    );
}

#[tokio::test]
async fn shutdown_closes_the_listeners_before_it_returns() {
    let fake = start().await;
    let (https, http) = (fake.https_addr(), fake.http_addr());
    let ca = fake.ca_pem_path().to_path_buf();
    // An idle keep-alive connection must not hold the shutdown up.
    let idle = TcpStream::connect(http).await.expect("connect");
    fake.shutdown().await;
    assert!(!ca.exists());
    assert!(TcpStream::connect(http).await.is_err());
    assert!(TcpStream::connect(https).await.is_err());
    drop(idle);
}

#[tokio::test]
async fn the_binary_prints_its_addresses_and_cleans_up_on_sigterm() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let log = dir.path().join("requests.jsonl");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-registries"))
        .args(["--name", "pypi.test", "--name", "npm.test", "--log"])
        .arg(&log)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("the ready line within 60 s")
    .expect("read the ready line");
    let ready: Value = serde_json::from_str(&line).expect("one JSON line");
    let https: SocketAddr = ready["https"]
        .as_str()
        .expect("https")
        .parse()
        .expect("an address");
    let http: SocketAddr = ready["http"]
        .as_str()
        .expect("http")
        .parse()
        .expect("an address");
    let ca_path = ready["ca"].as_str().expect("ca").to_string();
    assert!(line.starts_with("{\"https\":"), "{line}");
    let pem = std::fs::read_to_string(&ca_path).expect("the CA file exists");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(
        get(http, Via::Plain, "pypi.test", "/echo").await.status,
        200
    );
    // The HTTPS side presents a certificate for the names given.
    let reply = tls_get_trusting_pem(https, &pem, "npm.test").await;
    assert_eq!(reply.status, 200);
    let logged = std::fs::read_to_string(&log).expect("the log");
    let lines: Vec<Value> = logged
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{logged}");
    assert_eq!(lines[0]["path"], "/echo");
    assert_eq!(lines[0]["tls"], false);
    assert_eq!(lines[1]["path"], "/bytes/3");
    assert_eq!(lines[1]["tls"], true);

    let pid = child.id().expect("a pid").to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await;
    match killed {
        Ok(status) if status.success() => {}
        _ => skip!("cannot send SIGTERM with kill(1)"),
    }
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("exits within 30 s of SIGTERM")
        .expect("wait");
    assert!(status.success(), "{status}");
    assert!(
        !Path::new(&ca_path).exists(),
        "the CA file is removed on SIGTERM"
    );
}

/// `GET /bytes/3` over TLS, trusting only the CA in `pem` (read from the file the binary
/// named, as any client would).
async fn tls_get_trusting_pem(addr: SocketAddr, pem: &str, name: &str) -> Reply {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("PEM base64");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(der)).expect("a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(name.to_string()).expect("name"), tcp)
        .await
        .expect("the certificate covers the name");
    let head = format!("GET /bytes/3 HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    parse(&exchange(tls, head.as_bytes(), b"").await)
}

// ---- The real clients of this machine ----

/// The executable `tool` on PATH, if any.
fn which(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// A command with nothing of the host's environment but PATH, and HOME in `home`.
fn clean(program: impl AsRef<std::ffi::OsStr>, home: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs `cmd` (bounded in time) and returns its stdout, failing with its output otherwise.
async fn run_ok(what: &str, cmd: &mut tokio::process::Command) -> String {
    let out = tokio::time::timeout(TOOL_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} took over {TOOL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn curl_fetches_echo_over_https_trusting_only_the_ca_file() {
    if which("curl").is_none() {
        skip!("curl not installed");
    }
    let fake = start().await;
    let home = tempfile::tempdir().expect("a temp dir");
    let port = fake.https_addr().port();
    let url = format!("https://pypi.test:{port}/echo?via=curl");
    let resolve = format!("pypi.test:{port}:127.0.0.1");
    let body = run_ok(
        "curl",
        clean("curl", home.path())
            .args(["-q", "--silent", "--show-error", "--fail", "--cacert"])
            .arg(fake.ca_pem_path())
            .args(["--resolve", &resolve, "-H", "X-Probe: curl", &url]),
    )
    .await;
    let doc: Value = serde_json::from_str(&body).expect("JSON from /echo");
    assert_eq!(doc["path"], "/echo?via=curl");
    assert_eq!(doc["headers"]["host"], format!("pypi.test:{port}"));
    assert_eq!(doc["headers"]["x-probe"], "curl");
    // Without the CA file the server is not trusted: the file is what makes it work.
    let out = clean("curl", home.path())
        .args(["-q", "--silent", "--resolve", &resolve, &url])
        .output()
        .await
        .expect("run curl");
    assert_eq!(out.status.code(), Some(60), "curl trusted an unknown CA");
    // CURL_CA_BUNDLE names the file as well as --cacert does.
    let via_env = run_ok(
        "curl with CURL_CA_BUNDLE",
        clean("curl", home.path())
            .env("CURL_CA_BUNDLE", fake.ca_pem_path())
            .args([
                "-q",
                "--silent",
                "--show-error",
                "--fail",
                "--resolve",
                &resolve,
                &url,
            ]),
    )
    .await;
    let doc: Value = serde_json::from_str(&via_env).expect("JSON from /echo");
    assert_eq!(doc["path"], "/echo?via=curl");
}

/// The real Python interpreter with pip (not a version manager's shim, which needs the
/// host's HOME), if there is one.
async fn python_with_pip() -> Option<String> {
    which("python3")?;
    let out = tokio::process::Command::new("python3")
        .args(["-c", "import sys, pip; print(sys.executable)"])
        .output()
        .await
        .ok()?;
    let exe = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !exe.is_empty()).then_some(exe)
}

#[tokio::test]
async fn pip_installs_the_wheel_from_the_simple_index() {
    let Some(python) = python_with_pip().await else {
        skip!("pip not installed");
    };
    let fake = start().await;
    let tmp = tempfile::tempdir().expect("a temp dir");
    let site = tmp.path().join("site");
    let index = format!("https://127.0.0.1:{}/simple/", fake.https_addr().port());
    run_ok(
        "pip install",
        clean(&python, tmp.path())
            // No configuration file (this host's sets a CA bundle and find-links).
            .env("PIP_CONFIG_FILE", "/dev/null")
            .env("PIP_CERT", fake.ca_pem_path())
            .args([
                "-m",
                "pip",
                "install",
                "--no-cache-dir",
                "--disable-pip-version-check",
            ])
            .args(["--no-input", "--target"])
            .arg(&site)
            .args(["--index-url", &index, "sandcell-fake"]),
    )
    .await;
    let value = run_ok(
        "python3 -c import",
        clean(&python, tmp.path())
            .env("PYTHONPATH", &site)
            .args(["-c", "import sandcell_fake; print(sandcell_fake.VALUE)"]),
    )
    .await;
    assert_eq!(value.trim(), "42");
    assert!(seen(&fake, true, "GET", "/simple/sandcell-fake/"));
    assert!(seen(&fake, true, "GET", &format!("/files/{WHEEL_FILE}")));
}

#[tokio::test]
async fn npm_installs_the_tarball_from_the_registry() {
    if which("npm").is_none() || which("node").is_none() {
        skip!("npm not installed");
    }
    let fake = start().await;
    let tmp = tempfile::tempdir().expect("a temp dir");
    let project = tmp.path().join("project");
    std::fs::create_dir(&project).expect("the project dir");
    std::fs::write(
        project.join("package.json"),
        r#"{"name": "registries-test", "version": "1.0.0", "private": true}"#,
    )
    .expect("package.json");
    let registry = format!("https://127.0.0.1:{}/", fake.https_addr().port());
    let npm = |home: &Path| {
        let mut cmd = clean("npm", home);
        cmd.current_dir(&project)
            .env("NODE_EXTRA_CA_CERTS", fake.ca_pem_path())
            .env("npm_config_cafile", fake.ca_pem_path())
            // Neither this host's global npmrc (a CA bundle) nor a user one.
            .env("npm_config_globalconfig", home.join("no-global-npmrc"))
            .env("npm_config_userconfig", home.join("no-user-npmrc"))
            .env("npm_config_cache", home.join("npm-cache"))
            .env("npm_config_update_notifier", "false");
        cmd
    };
    run_ok(
        "npm install",
        npm(tmp.path()).args([
            "install",
            "--registry",
            &registry,
            "--no-audit",
            "--no-fund",
            "sandcell-fake",
        ]),
    )
    .await;
    let value = run_ok(
        "node -e require",
        clean("node", tmp.path())
            .current_dir(&project)
            .args(["-e", "console.log(require('sandcell-fake'))"]),
    )
    .await;
    assert_eq!(value.trim(), "42");
    assert!(seen(&fake, true, "GET", "/sandcell-fake"));
    assert!(seen(
        &fake,
        true,
        "GET",
        &format!("/sandcell-fake/-/{TARBALL_FILE}")
    ));
}

#[tokio::test]
async fn git_clones_both_branches_over_dumb_https() {
    if which("git").is_none() {
        skip!("git not installed");
    }
    let fake = start().await;
    assert!(fake.has_git_repo());
    let tmp = tempfile::tempdir().expect("a temp dir");
    let url = format!("https://127.0.0.1:{}/repo.git", fake.https_addr().port());
    let git = || {
        let mut cmd = clean("git", tmp.path());
        cmd.env("GIT_SSL_CAINFO", fake.ca_pem_path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0");
        cmd
    };
    let main = tmp.path().join("main");
    run_ok(
        "git clone",
        git().args(["clone", "--quiet", &url]).arg(&main),
    )
    .await;
    let readme = std::fs::read_to_string(main.join("README.md")).expect("README.md");
    assert_eq!(readme, README_TEXT);
    assert!(
        !main.join(DEV_FILE.0).exists(),
        "main has no {}",
        DEV_FILE.0
    );
    let branch = run_ok(
        "git rev-parse",
        git()
            .arg("-C")
            .arg(&main)
            .args(["rev-parse", "--abbrev-ref", "HEAD"]),
    )
    .await;
    assert_eq!(branch.trim(), "main");
    let dev = tmp.path().join("dev");
    run_ok(
        "git clone --branch dev",
        git()
            .args(["clone", "--quiet", "--branch", "dev", &url])
            .arg(&dev),
    )
    .await;
    let dev_text = std::fs::read_to_string(dev.join(DEV_FILE.0)).expect("the dev file");
    assert_eq!(dev_text, DEV_FILE.1);
    assert!(seen(&fake, true, "GET", "/repo.git/info/refs"));
}
