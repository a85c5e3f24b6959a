//! The HTTP side: one handler for both listeners, the TLS accept loop, and the request log.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fs::File;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::SeenRequest;
use super::packages::{self, PACKAGE, Packages, TARBALL_FILE, WHEEL_FILE};

/// What both listeners serve from.
pub(crate) struct Content {
    pub(crate) packages: Packages,
    /// The bare repository's files by path inside it (`info/refs`, `objects/…`), read at
    /// start; `None` when `git` was not there to make it.
    pub(crate) git_files: Option<BTreeMap<String, Vec<u8>>>,
}

/// Every request seen, and the optional file each is appended to as a JSON line.
pub(crate) struct Log {
    seen: Mutex<Vec<SeenRequest>>,
    file: Option<Mutex<File>>,
}

impl Log {
    pub(crate) fn new(file: Option<File>) -> Self {
        Log {
            seen: Mutex::new(Vec::new()),
            file: file.map(Mutex::new),
        }
    }

    fn record(&self, seen: SeenRequest) {
        if let Some(file) = &self.file {
            match serde_json::to_string(&seen) {
                Ok(line) => {
                    let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
                    // A lost log line would make a "did not arrive" assertion lie: say so.
                    if let Err(e) = writeln!(f, "{line}").and_then(|()| f.flush()) {
                        eprintln!("fake-registries: cannot append to the request log: {e}");
                    }
                }
                Err(e) => eprintln!("fake-registries: cannot encode a request for the log: {e}"),
            }
        }
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(seen);
    }

    pub(crate) fn snapshot(&self) -> Vec<SeenRequest> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn clear(&self) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// One listener's view: its scheme (for the URLs it hands out) and what it serves.
pub(crate) struct Site {
    pub(crate) tls: bool,
    /// Its own address, for a request that names no host (HTTP/1.0).
    pub(crate) addr: SocketAddr,
    pub(crate) content: Arc<Content>,
    pub(crate) log: Arc<Log>,
}

/// The most of a body `/echo` reads (it reports the length, not the bytes).
const ECHO_BODY_LIMIT: usize = 16 * 1024 * 1024;
/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The pattern `/bytes/<n>` repeats: byte `i` of the body is `i % 251`. Its length is a
/// multiple of 251, so chunk after chunk continues the pattern.
const PATTERN_LEN: usize = 251 * 256;
static PATTERN: LazyLock<Bytes> =
    LazyLock::new(|| (0..PATTERN_LEN).map(|i| (i % 251) as u8).collect());

/// Serves `router` on `listener` until `stop` turns true (or its sender goes away).
pub(crate) async fn serve<L>(listener: L, router: axum::Router, mut stop: watch::Receiver<bool>)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let shutdown = async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
    };
    // Serving ends only when told to; accept errors are retried inside axum.
    let _ = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await;
}

/// The router of one listener: everything goes through [`handle`].
pub(crate) fn router(site: Site) -> axum::Router {
    axum::Router::new()
        .fallback(handle)
        .with_state(Arc::new(site))
}

/// Connections that finished their TLS handshake, handed to axum as a listener.
pub(crate) struct TlsIncoming {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsIncoming {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop ended (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Accepts TCP connections on `listener` and runs each TLS handshake on its own task (a
/// slow or silent client holds up no one), passing finished ones to the returned listener.
pub(crate) fn tls_incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<(TlsIncoming, tokio::task::JoinHandle<()>)> {
    let local = listener.local_addr()?;
    let (tx, rx) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|stopped| *stopped) => return,
            };
            let (tcp, peer) = match accepted {
                Ok(conn) => conn,
                Err(_) => {
                    // Out of descriptors, most likely: back off rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(Ok(tls)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    let _ = tx.send((tls, peer)).await;
                }
            });
        }
    });
    Ok((TlsIncoming { rx, local }, task))
}

/// Every request: recorded, then routed by path whatever the Host header says.
async fn handle(State(site): State<Arc<Site>>, req: Request) -> Response {
    let host = host_of(req.headers(), req.uri());
    let path = req.uri().path().to_string();
    site.log.record(SeenRequest {
        tls: site.tls,
        method: req.method().as_str().to_string(),
        host: host.clone(),
        path: path.clone(),
        query: req.uri().query().map(str::to_string),
    });
    if path == "/echo" {
        return echo(req).await;
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return not_found();
    }
    let content = &site.content;
    let p = &content.packages;
    if path == "/simple" || path == "/simple/" {
        return html(p.simple_index());
    }
    if let Some(project) = path.strip_prefix("/simple/") {
        let project = project.strip_suffix('/').unwrap_or(project);
        if !project.contains('/') && packages::normalize(project) == PACKAGE {
            return html(p.simple_project());
        }
        return not_found();
    }
    if path == format!("/files/{WHEEL_FILE}") {
        return octets(p.wheel.clone());
    }
    if path == format!("/{PACKAGE}") {
        let host = host.unwrap_or_else(|| site.addr.to_string());
        let scheme = if site.tls { "https" } else { "http" };
        let doc = p.packument(&format!("{scheme}://{host}"));
        return (
            [(header::CONTENT_TYPE, "application/json")],
            doc.to_string(),
        )
            .into_response();
    }
    if path == format!("/{PACKAGE}/-/{TARBALL_FILE}") {
        return octets(p.tarball.clone());
    }
    if let Some(rest) = path.strip_prefix("/repo.git/") {
        return match &content.git_files {
            Some(files) => git_file(files, rest),
            None => not_found(),
        };
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        return match n.parse::<u64>() {
            Ok(n) => bytes(n),
            Err(_) => not_found(),
        };
    }
    not_found()
}

/// The host the client named: the Host header, else the URI's authority (HTTP/2, or a
/// request in absolute form as a proxy would send it).
fn host_of(headers: &HeaderMap, uri: &axum::http::Uri) -> Option<String> {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| uri.authority().map(|a| a.as_str().to_string()))
}

/// `/echo`: the method, the path with its query, every header (repeated ones joined with
/// ", "), and the body's length, as JSON.
async fn echo(req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    let body = match axum::body::to_bytes(body, ECHO_BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("cannot read the body: {e}\n"),
            )
                .into_response();
        }
    };
    let path = parts.uri.path_and_query().map_or_else(
        || parts.uri.path().to_string(),
        |pq| pq.as_str().to_string(),
    );
    let doc = serde_json::json!({
        "method": parts.method.as_str(),
        "path": path,
        "headers": headers,
        "body_len": body.len(),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        doc.to_string(),
    )
        .into_response()
}

/// `/bytes/<n>`: `n` bytes of the pattern, streamed, with their Content-Length.
fn bytes(n: u64) -> Response {
    let stream = futures_util::stream::unfold(n, |left| async move {
        if left == 0 {
            return None;
        }
        let take = usize::try_from(left).map_or(PATTERN_LEN, |l| l.min(PATTERN_LEN));
        Some((
            Ok::<_, Infallible>(PATTERN.slice(..take)),
            left - take as u64,
        ))
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

/// A file of the bare repository, for git's dumb HTTP client.
fn git_file(files: &BTreeMap<String, Vec<u8>>, rest: &str) -> Response {
    match files.get(rest) {
        // Not git's smart-protocol type: the client then reads info/refs as dumb HTTP.
        Some(data) if rest == "info/refs" => {
            ([(header::CONTENT_TYPE, "text/plain")], data.clone()).into_response()
        }
        Some(data) => octets(data.clone()),
        None => not_found(),
    }
}

fn html(text: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], text).into_response()
}

fn octets(data: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}
