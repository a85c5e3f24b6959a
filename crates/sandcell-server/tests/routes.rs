//! Every route of the REST API driven in-process with `oneshot`: the real router over a real
//! store (SQLite in a temporary folder) and a real fleet whose sandboxes run the real guest
//! agent without isolation (sandcell-testkit's local backend), so these run on any machine.
//!
//! For every route: no key (or an unknown one) is a 401; a malformed id, a bad JSON body, an
//! unknown field or a wrong type is a 400 naming it; another owner's resource is a 404, never
//! a 403; a cap of the fleet is a 429. [`ROUTES`] must list every operation of the OpenAPI
//! document, so a new route without its checks fails here.
//!
//! The local backend has no pause, snapshots, kernels or `/workspace` mapping, so the happy
//! paths of those routes are left to the CLI suite's daemon tests (here pause and snapshot
//! must answer 409 `unsupported`); the pty route goes over a real connection, since a
//! WebSocket upgrade needs one.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use sandcell_agent::Runner;
use sandcell_engine::Engine;
use sandcell_engine::fleet::Fleet;
use sandcell_server::AppState;
use sandcell_server::config;
use sandcell_server::ledger::StoreLedger;
use sandcell_server::signed_url::UrlSigner;
use sandcell_service::Service;
use sandcell_service::caller::new_key;
use sandcell_store::Store;
use sandcell_testkit::local::LocalBackend;
use serde_json::{Value, json};
use tower::ServiceExt;

/// What a route takes in its body.
#[derive(Debug, Clone, Copy)]
enum Payload {
    None,
    /// Raw bytes (file uploads, a process's stdin).
    Raw(&'static str),
    /// A JSON object: one that passes validation, and one with a field of the wrong type.
    Json {
        valid: &'static str,
        wrong_type: &'static str,
    },
}

/// One operation of the API.
#[derive(Debug, Clone, Copy)]
struct Route {
    method: &'static str,
    /// As in the OpenAPI document, with `{id}`, `{pid}`, `{context}`, `{snapshot_id}`,
    /// `{export_id}`, `{key_id}`, `{run_id}` and `{memory_id}` to fill in.
    path: &'static str,
    /// A query the route needs to get past its own checks (e.g. a file's `path`).
    query: &'static str,
    body: Payload,
}

const fn route(method: &'static str, path: &'static str) -> Route {
    Route {
        method,
        path,
        query: "",
        body: Payload::None,
    }
}

const fn with_query(mut r: Route, query: &'static str) -> Route {
    r.query = query;
    r
}

const fn json(mut r: Route, valid: &'static str, wrong_type: &'static str) -> Route {
    r.body = Payload::Json { valid, wrong_type };
    r
}

const fn raw(mut r: Route, bytes: &'static str) -> Route {
    r.body = Payload::Raw(bytes);
    r
}

/// Every operation, with what gets it past validation.
const ROUTES: &[Route] = &[
    json(
        route("POST", "/v1/sandboxes"),
        "{}",
        r#"{"timeout_secs": "soon"}"#,
    ),
    route("GET", "/v1/sandboxes"),
    route("GET", "/v1/sandboxes/{id}"),
    route("DELETE", "/v1/sandboxes/{id}"),
    json(
        route("POST", "/v1/sandboxes/{id}/timeout"),
        r#"{"timeout_secs": 600}"#,
        r#"{"timeout_secs": "long"}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/network"),
    json(
        route("PUT", "/v1/sandboxes/{id}/network"),
        r#"{"network": "loopback"}"#,
        r#"{"network": 5}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/network/events"),
    route("GET", "/v1/sandboxes/{id}/secrets"),
    json(
        route("PUT", "/v1/sandboxes/{id}/secrets"),
        r#"{"secrets": []}"#,
        r#"{"secrets": "all"}"#,
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/git/clone"),
        r#"{"url": "https://git.example/team/repo.git"}"#,
        r#"{"url": 5}"#,
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/previews/{port}"),
        "{}",
        r#"{"ttl_secs": "soon"}"#,
    ),
    route("POST", "/v1/sandboxes/{id}/pause"),
    route("POST", "/v1/sandboxes/{id}/resume"),
    route("GET", "/v1/sandboxes/{id}/metrics"),
    json(
        route("POST", "/v1/sandboxes/{id}/exec"),
        r#"{"cmd": "true"}"#,
        r#"{"cmd": 1}"#,
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/exec/stream"),
        r#"{"cmd": "true"}"#,
        r#"{"argv": "true"}"#,
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/code"),
        r#"{"code": "1"}"#,
        r#"{"code": 1}"#,
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/code/stream"),
        r#"{"code": "1"}"#,
        r#"{"code": "1", "timeout_secs": "1s"}"#,
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/contexts"),
        r#"{"language": "python"}"#,
        r#"{"language": 3}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/contexts"),
    route("DELETE", "/v1/sandboxes/{id}/contexts/{context}"),
    route("POST", "/v1/sandboxes/{id}/contexts/{context}/interrupt"),
    route("POST", "/v1/sandboxes/{id}/contexts/{context}/restart"),
    route("GET", "/v1/sandboxes/{id}/contexts/{context}/variables"),
    json(
        route("PUT", "/v1/sandboxes/{id}/contexts/{context}/variables"),
        r#"{"values": {"x": 1}}"#,
        r#"{"values": [1]}"#,
    ),
    route("DELETE", "/v1/sandboxes/{id}/contexts/{context}/variables"),
    route("GET", "/v1/sandboxes/{id}/processes"),
    json(
        route("POST", "/v1/sandboxes/{id}/processes"),
        r#"{"cmd": "true"}"#,
        r#"{"cmd": "true", "stdin": "yes"}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/processes/{pid}/stream"),
    route("GET", "/v1/sandboxes/{id}/processes/{pid}/output"),
    raw(
        route("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin"),
        "hi\n",
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/processes/{pid}/resize"),
        r#"{"rows": 24, "cols": 80}"#,
        r#"{"rows": -1, "cols": 80}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/pty"),
    route("DELETE", "/v1/sandboxes/{id}/processes/{pid}"),
    with_query(route("GET", "/v1/sandboxes/{id}/files"), "path=."),
    with_query(route("DELETE", "/v1/sandboxes/{id}/files"), "path=gone.txt"),
    with_query(route("GET", "/v1/sandboxes/{id}/files/stat"), "path=."),
    json(
        route("POST", "/v1/sandboxes/{id}/files/mkdir"),
        r#"{"path": "made"}"#,
        r#"{"path": ["made"]}"#,
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/files/rename"),
        r#"{"from": "a.txt", "to": "b.txt"}"#,
        r#"{"from": 1, "to": "b.txt"}"#,
    ),
    with_query(
        route("GET", "/v1/sandboxes/{id}/files/content"),
        "path=a.txt",
    ),
    raw(
        with_query(
            route("PUT", "/v1/sandboxes/{id}/files/content"),
            "path=a.txt",
        ),
        "hello\n",
    ),
    json(
        route("POST", "/v1/sandboxes/{id}/import"),
        r#"{"path": "imported.txt", "text": "hi"}"#,
        r#"{"path": "imported.txt", "text": "hi", "mode": "rw"}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/artifacts"),
    json(
        route("POST", "/v1/sandboxes/{id}/exports"),
        r#"{"path": "a.txt"}"#,
        r#"{"path": 7}"#,
    ),
    route("GET", "/v1/exports"),
    route("GET", "/v1/exports/{export_id}"),
    route("DELETE", "/v1/exports/{export_id}"),
    route("GET", "/v1/exports/{export_id}/content"),
    json(
        route("POST", "/v1/keys"),
        r#"{"name": "second"}"#,
        r#"{"name": "second", "admin": "yes"}"#,
    ),
    route("GET", "/v1/keys"),
    route("DELETE", "/v1/keys/{key_id}"),
    json(
        route("POST", "/v1/sandboxes/{id}/snapshots"),
        "{}",
        r#"{"tags": ["a"]}"#,
    ),
    route("GET", "/v1/snapshots"),
    route("GET", "/v1/snapshots/{snapshot_id}"),
    route("DELETE", "/v1/snapshots/{snapshot_id}"),
    json(
        route("POST", "/v1/snapshots/{snapshot_id}/fork"),
        "{}",
        r#"{"count": "two"}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/auto-snapshot"),
    json(
        route("PUT", "/v1/sandboxes/{id}/auto-snapshot"),
        r#"{"before_reclaim": true}"#,
        r#"{"keep": "all"}"#,
    ),
    route("GET", "/v1/system"),
    json(
        route("POST", "/v1/runs"),
        r#"{"task": "say hi", "model": "openai/test-model"}"#,
        r#"{"task": 1}"#,
    ),
    route("GET", "/v1/runs"),
    route("GET", "/v1/runs/{run_id}"),
    route("POST", "/v1/runs/{run_id}/cancel"),
    route("POST", "/v1/runs/{run_id}/resume"),
    json(
        route("POST", "/v1/runs/{run_id}/fork"),
        r#"{"from_step": 1}"#,
        r#"{"from_step": "one"}"#,
    ),
    route("POST", "/v1/runs/{run_id}/steps/{step}/sandbox"),
    route("GET", "/v1/runs/{run_id}/events"),
    json(
        route("POST", "/v1/templates"),
        r#"{"name": "tpl", "dockerfile": "FROM tpl-base\nRUN true\n"}"#,
        r#"{"name": 1, "dockerfile": "FROM x"}"#,
    ),
    route("GET", "/v1/templates"),
    route("GET", "/v1/templates/{name}"),
    route("DELETE", "/v1/templates/{name}"),
    route("GET", "/v1/builds"),
    route("GET", "/v1/builds/{build_id}"),
    route("POST", "/v1/builds/{build_id}/cancel"),
    route("GET", "/v1/builds/{build_id}/logs"),
    json(
        route("POST", "/v1/volumes"),
        r#"{"name": "data"}"#,
        r#"{"name": 1}"#,
    ),
    route("GET", "/v1/volumes"),
    route("GET", "/v1/volumes/{volume}"),
    route("DELETE", "/v1/volumes/{volume}"),
    json(
        route("POST", "/v1/threads"),
        r#"{"name": "work"}"#,
        r#"{"name": 1}"#,
    ),
    route("GET", "/v1/threads"),
    route("GET", "/v1/threads/{thread_id}"),
    json(
        route("PATCH", "/v1/threads/{thread_id}"),
        r#"{"name": "renamed"}"#,
        r#"{"name": ["renamed"]}"#,
    ),
    route("DELETE", "/v1/threads/{thread_id}"),
    json(
        route("POST", "/v1/sandboxes/{id}/memories"),
        r#"{"text": "the answer is 42"}"#,
        r#"{"text": 42}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/memories"),
    with_query(
        route("GET", "/v1/sandboxes/{id}/memories/search"),
        "q=answer",
    ),
    route("GET", "/v1/sandboxes/{id}/memories/{memory_id}"),
    route("DELETE", "/v1/sandboxes/{id}/memories/{memory_id}"),
    json(
        route("POST", "/v1/memories"),
        r#"{"text": "the answer is 42", "category": "facts"}"#,
        r#"{"text": "a", "metadata": ["k"]}"#,
    ),
    route("GET", "/v1/memories"),
    with_query(route("GET", "/v1/memories/search"), "q=answer"),
    route("GET", "/v1/memories/{memory_id}"),
    route("DELETE", "/v1/memories/{memory_id}"),
    json(
        route("POST", "/v1/sandboxes/{id}/memories/infer"),
        r#"{"text": "I moved to Lisbon"}"#,
        r#"{"text": 1}"#,
    ),
    route("GET", "/v1/sandboxes/{id}/memories/infer"),
    route("GET", "/v1/sandboxes/{id}/memories/infer/{job_id}"),
    json(
        route("POST", "/v1/memories/infer"),
        r#"{"text": "I moved to Lisbon", "category": "facts"}"#,
        r#"{"text": "a", "category": 5}"#,
    ),
    route("GET", "/v1/memories/infer"),
    route("GET", "/v1/memories/infer/{job_id}"),
];

/// The values path parameters are filled with.
#[derive(Debug, Clone)]
struct Ids {
    id: String,
    pid: String,
    context: String,
    snapshot_id: String,
    export_id: String,
    key_id: String,
    run_id: String,
    memory_id: String,
    job_id: String,
    thread_id: String,
    step: String,
    build_id: String,
    name: String,
    volume: String,
}

impl Ids {
    /// Well-formed ids of nothing that exists.
    fn missing() -> Self {
        Self {
            id: "sb-0000000000000000".into(),
            pid: "4242".into(),
            context: "nothing-here".into(),
            snapshot_id: "sn-0000000000000000".into(),
            export_id: "ex-0000000000000000".into(),
            key_id: "0000000000ff".into(),
            run_id: "run-0000000000000000".into(),
            memory_id: "mem-0000000000000000".into(),
            job_id: "inf-0000000000000000".into(),
            thread_id: "th-0000000000000000".into(),
            step: "1".into(),
            build_id: "bld-000000000000".into(),
            name: "no-such-template".into(),
            volume: "no-such-volume".into(),
        }
    }

    fn fill(&self, route: &Route) -> String {
        let path = route
            .path
            .replace("{id}", &self.id)
            .replace("{pid}", &self.pid)
            .replace("{context}", &self.context)
            .replace("{snapshot_id}", &self.snapshot_id)
            .replace("{export_id}", &self.export_id)
            .replace("{key_id}", &self.key_id)
            .replace("{run_id}", &self.run_id)
            .replace("{memory_id}", &self.memory_id)
            .replace("{job_id}", &self.job_id)
            .replace("{thread_id}", &self.thread_id)
            .replace("{step}", &self.step)
            .replace("{build_id}", &self.build_id)
            .replace("{name}", &self.name)
            .replace("{volume}", &self.volume)
            .replace("{port}", "8000");
        if route.query.is_empty() {
            path
        } else {
            format!("{path}?{}", route.query)
        }
    }
}

/// The service as `serve` builds it, minus the listeners and loops.
struct Harness {
    app: Router,
    state: AppState,
    store: Arc<Store>,
    /// Keys of two ordinary owners, and their key ids.
    alice: Key,
    bob: Key,
    home: tempfile::TempDir,
}

#[derive(Debug, Clone)]
struct Key {
    secret: String,
    id: String,
}

impl Harness {
    /// A service over a local backend, with these settings (`limits.max_per_owner`, …).
    async fn new(settings: &[(&str, &str)]) -> Self {
        let home = tempfile::tempdir().expect("a home folder");
        let flags: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (config, _) = config::load(home.path(), None, &[], &flags).expect("the settings");
        let store = Arc::new(Store::open(&config.database).expect("the store"));
        let engine = Engine::builder().backend(LocalBackend::new()).build();
        let fleet = Arc::new(Fleet::new(
            engine,
            Arc::new(StoreLedger::new(store.clone())),
            config.fleet_limits(),
        ));
        let signer = UrlSigner::load_or_create(&config.home).expect("the signing key");
        let service = Arc::new(Service::new(fleet, store.clone(), config, signer));
        let runner = Arc::new(Runner::from_service(service.clone()).expect("the runner"));
        let state = AppState::new(service, runner);
        let key = |owner: &str| {
            let (record, secret) = new_key(owner, owner, false).expect("a key");
            store.insert_key(&record).expect("store the key");
            Key {
                secret,
                id: record.id,
            }
        };
        let (alice, bob) = (key("alice"), key("bob"));
        Self {
            app: sandcell_server::app(state.clone()),
            state,
            store,
            alice,
            bob,
            home,
        }
    }

    /// Sends one request; the status and the body (JSON, or the text as a JSON string).
    async fn send(&self, req: Request<Body>) -> (StatusCode, Value) {
        let resp = self
            .app
            .clone()
            .oneshot(req)
            .await
            .expect("the router answers");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20)
            .await
            .expect("the whole body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, body)
    }

    /// `route` at `uri` with `key` and `body` (JSON bodies with their content type).
    async fn call(
        &self,
        route: &Route,
        uri: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        if route.path.ends_with("/pty") {
            return self.handshake(uri, key).await;
        }
        let mut req = Request::builder()
            .method(Method::from_bytes(route.method.as_bytes()).expect("a method"))
            .uri(uri);
        if let Some(key) = key {
            req = req.header("x-api-key", key);
        }
        if matches!(route.body, Payload::Json { .. }) {
            req = req.header("content-type", "application/json");
        }
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
        self.send(req.body(body).expect("a request")).await
    }

    /// A WebSocket handshake at `uri` over a real connection (the upgrade needs hyper's
    /// connection, which `oneshot` has not): the status, and the body of a refusal.
    async fn handshake(&self, uri: &str, key: Option<&str>) -> (StatusCode, Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let server = tokio::spawn(axum::serve(listener, self.app.clone()).into_future());
        let mut conn = tokio::net::TcpStream::connect(addr)
            .await
            .expect("a connection");
        let key = key
            .map(|k| format!("x-api-key: {k}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "GET {uri} HTTP/1.1\r\nhost: {addr}\r\nconnection: upgrade\r\nupgrade: websocket\r\n\
             sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n{key}\r\n"
        );
        conn.write_all(request.as_bytes()).await.expect("send");
        let read = async {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = conn.read(&mut buf).await.expect("read");
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).into_owned();
                let Some((head, body)) = text.split_once("\r\n\r\n") else {
                    assert!(n > 0, "the connection ended in the headers: {text}");
                    continue;
                };
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= length || n == 0 {
                    let status = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse::<u16>().ok())
                        .and_then(|s| StatusCode::from_u16(s).ok())
                        .expect("a status line");
                    let body = serde_json::from_str(body)
                        .unwrap_or_else(|_| Value::String(body.to_string()));
                    return (status, body);
                }
            }
        };
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("an answer to the handshake");
        server.abort();
        answer
    }

    /// `route` as `key` with its valid body.
    async fn valid(&self, route: &Route, ids: &Ids, key: &str) -> (StatusCode, Value) {
        let body = match route.body {
            Payload::None => None,
            Payload::Raw(b) => Some(b),
            Payload::Json { valid, .. } => Some(valid),
        };
        self.call(route, &ids.fill(route), Some(key), body).await
    }

    /// A JSON request as alice; the status and the body.
    async fn alice(&self, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("a method"))
            .uri(uri)
            .header("x-api-key", &self.alice.secret);
        let body = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        self.send(req.body(body).expect("a request")).await
    }

    /// A sandbox of alice's.
    async fn alice_sandbox(&self) -> String {
        let (status, body) = self.alice("POST", "/v1/sandboxes", Some(json!({}))).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().expect("an id").to_string()
    }

    async fn shutdown(self) {
        self.state.fleet.stop_all("the test is over").await;
    }
}

/// `answer`'s body; a mismatch noted when its status is not `want`.
fn ok(
    mismatches: &mut Vec<String>,
    what: &str,
    answer: (StatusCode, Value),
    want: StatusCode,
) -> Value {
    if answer.0 != want {
        mismatches.push(format!(
            "{what}: want {want}, got {} {}",
            answer.0, answer.1
        ));
    }
    answer.1
}

/// Fails with every mismatch at once: the route, what was expected and what came.
fn check_all(mismatches: Vec<String>) {
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

fn expect(
    mismatches: &mut Vec<String>,
    what: &str,
    (status, body): &(StatusCode, Value),
    want: StatusCode,
    code: &str,
) {
    if *status != want || body["code"] != code {
        mismatches.push(format!("{what}: want {want} {code}, got {status} {body}"));
    }
}

#[test]
fn the_table_covers_every_documented_route() {
    let doc = serde_json::to_value(sandcell_server::openapi()).expect("the document as JSON");
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            ["get", "put", "post", "delete", "patch"]
                .into_iter()
                .filter(|m| item.get(*m).is_some())
                .map(|m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let tested: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect();
    assert_eq!(tested.len(), ROUTES.len(), "a route is listed twice");
    let untested: Vec<_> = documented.difference(&tested).collect();
    let unknown: Vec<_> = tested.difference(&documented).collect();
    assert!(
        untested.is_empty() && unknown.is_empty(),
        "routes without a row in ROUTES: {untested:?}; rows of no documented route: {unknown:?}"
    );
}

#[tokio::test]
async fn every_route_wants_a_valid_key() {
    let h = Harness::new(&[]).await;
    let ids = Ids::missing();
    let mut mismatches = Vec::new();
    for route in ROUTES {
        let uri = ids.fill(route);
        let what = format!("{} {uri}", route.method);
        let body = match route.body {
            Payload::Json { valid, .. } => Some(valid),
            Payload::Raw(b) => Some(b),
            Payload::None => None,
        };
        let none = h.call(route, &uri, None, body).await;
        expect(
            &mut mismatches,
            &format!("{what} without a key"),
            &none,
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
        );
        let unknown = h
            .call(
                route,
                &uri,
                Some("sc_000000000000_0000000000000000000000000000000000000000000000"),
                body,
            )
            .await;
        expect(
            &mut mismatches,
            &format!("{what} with an unknown key"),
            &unknown,
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
        );
    }
    check_all(mismatches);
    h.shutdown().await;
}

#[tokio::test]
async fn a_malformed_id_in_the_path_is_a_400() {
    let h = Harness::new(&[]).await;
    let good = Ids::missing();
    let mut mismatches = Vec::new();
    type Field = fn(&mut Ids) -> &mut String;
    let malformed: [(&str, Field, &str); 13] = [
        ("{id}", |i| &mut i.id, "SB-Not-An-Id"),
        ("{pid}", |i| &mut i.pid, "forty-two"),
        ("{snapshot_id}", |i| &mut i.snapshot_id, "sn-xyz"),
        ("{export_id}", |i| &mut i.export_id, "ex-123"),
        ("{key_id}", |i| &mut i.key_id, "not-hex"),
        ("{run_id}", |i| &mut i.run_id, "run-xyz"),
        ("{memory_id}", |i| &mut i.memory_id, "mem-xyz"),
        ("{job_id}", |i| &mut i.job_id, "inf-xyz"),
        ("{thread_id}", |i| &mut i.thread_id, "th-xyz"),
        ("{step}", |i| &mut i.step, "one"),
        ("{build_id}", |i| &mut i.build_id, "bld-xyz"),
        ("{name}", |i| &mut i.name, "Not_A_Name"),
        ("{volume}", |i| &mut i.volume, "Not_A_Volume"),
    ];
    for route in ROUTES {
        for (param, field, bad) in &malformed {
            if !route.path.contains(param) {
                continue;
            }
            let mut ids = good.clone();
            *field(&mut ids) = bad.to_string();
            let answer = h.valid(route, &ids, &h.alice.secret).await;
            expect(
                &mut mismatches,
                &format!("{} {}", route.method, ids.fill(route)),
                &answer,
                StatusCode::BAD_REQUEST,
                "invalid_argument",
            );
        }
    }
    check_all(mismatches);
    h.shutdown().await;
}

/// The rules carried by the API's value types (sandbox id, tags, code size, timeouts) are
/// checked as the request is read, and the answer names the field and the rule.
#[tokio::test]
async fn a_value_breaking_its_rule_is_a_400_naming_the_field_and_the_rule() {
    let h = Harness::new(&[]).await;
    let sb = "/v1/sandboxes/sb-0123456789abcdef";
    let too_many: serde_json::Map<String, Value> =
        (0..=64).map(|i| (format!("k{i}"), json!(""))).collect();
    let cases = [
        (
            "GET",
            "/v1/sandboxes/SB-x".to_string(),
            None,
            "is not a sandbox id",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            Some(json!({"labels": {"team": "a\u{7}b"}})),
            "labels: tag value",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            Some(json!({"metadata": too_many.clone()})),
            "metadata: at most 64 tag entries",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            Some(json!({"timeout_secs": u64::MAX})),
            "timeout_secs",
        ),
        (
            "POST",
            format!("{sb}/exec"),
            Some(json!({"cmd": "true", "timeout_secs": 0})),
            "timeout_secs: timeout_secs 0 must be positive",
        ),
        (
            "POST",
            format!("{sb}/code"),
            Some(json!({"code": "x".repeat(sandcell_api::rules::MAX_CODE_BYTES + 1)})),
            "code: code of 8388609 bytes is over the 8 MiB limit",
        ),
        (
            "POST",
            format!("{sb}/snapshots"),
            Some(json!({"tags": {"": "x"}})),
            "tags: tag key",
        ),
        (
            "GET",
            "/v1/snapshots?sandbox=../x".into(),
            None,
            "is not a sandbox id",
        ),
        (
            "POST",
            format!("{sb}/memories"),
            Some(json!({"text": " "})),
            "text: text must not be empty",
        ),
        (
            "POST",
            "/v1/memories".into(),
            Some(json!({"text": "x".repeat(sandcell_api::rules::MAX_MEMORY_TEXT + 1)})),
            "text: text of 65537 bytes is over the 64 KiB limit",
        ),
        (
            "POST",
            "/v1/memories".into(),
            Some(json!({"text": "a", "category": "Not OK"})),
            "category: category \"Not OK\" must be",
        ),
        (
            "POST",
            "/v1/memories".into(),
            Some(json!({"text": "a", "metadata": too_many.clone()})),
            "metadata: at most 64 tag entries",
        ),
        (
            "GET",
            "/v1/memories/search?q=%20".into(),
            None,
            "q: query must not be empty",
        ),
        (
            "GET",
            "/v1/memories?category=a%2Fb".into(),
            None,
            "category \"a/b\" must be",
        ),
    ];
    for (method, uri, body, wanted) in cases {
        let (status, answer) = h.alice(method, &uri, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {answer}");
        assert_eq!(answer["code"], "invalid_argument", "{method} {uri}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains(wanted), "{method} {uri}: {message}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_bad_json_body_is_a_400_and_one_without_its_type_a_415() {
    let h = Harness::new(&[]).await;
    let ids = Ids::missing();
    let key = h.alice.secret.clone();
    let mut mismatches = Vec::new();
    for route in ROUTES {
        let Payload::Json { valid, wrong_type } = route.body else {
            continue;
        };
        let uri = ids.fill(route);
        let mut unknown_field: Value = serde_json::from_str(valid).expect("a valid body");
        unknown_field["no_such_field"] = json!(1);
        let unknown_field = unknown_field.to_string();
        for (what, body) in [
            ("malformed JSON", "{\"cut"),
            ("an unknown field", unknown_field.as_str()),
            ("a field of the wrong type", wrong_type),
            ("an array for an object", "[]"),
        ] {
            let answer = h.call(route, &uri, Some(&key), Some(body)).await;
            expect(
                &mut mismatches,
                &format!("{} {uri} with {what}", route.method),
                &answer,
                StatusCode::BAD_REQUEST,
                "invalid_argument",
            );
            let message = answer.1["message"].as_str().unwrap_or_default();
            if what == "an unknown field" && !message.contains("no_such_field") {
                mismatches.push(format!(
                    "{} {uri}: the message does not name the field: {message}",
                    route.method
                ));
            }
        }
        let req = Request::builder()
            .method(Method::from_bytes(route.method.as_bytes()).expect("a method"))
            .uri(&uri)
            .header("x-api-key", &key)
            .body(Body::from(valid))
            .expect("a request");
        let answer = h.send(req).await;
        expect(
            &mut mismatches,
            &format!("{} {uri} without a content type", route.method),
            &answer,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );
    }
    check_all(mismatches);
    h.shutdown().await;
}

#[tokio::test]
async fn a_bad_query_is_a_400() {
    let h = Harness::new(&[]).await;
    let id = h.alice_sandbox().await;
    let mut mismatches = Vec::new();
    for (method, uri) in [
        (
            "GET",
            format!("/v1/sandboxes/{id}/files?path=.&no_such_parameter=1"),
        ),
        ("GET", format!("/v1/sandboxes/{id}/files/stat")),
        ("GET", format!("/v1/sandboxes/{id}/files/content")),
        ("DELETE", format!("/v1/sandboxes/{id}/files")),
        ("PUT", format!("/v1/sandboxes/{id}/files/content")),
        ("GET", "/v1/sandboxes?limit=many".to_string()),
        ("GET", "/v1/sandboxes?no_such_parameter=1".to_string()),
        ("GET", "/v1/snapshots?limit=-1".to_string()),
        ("GET", "/v1/exports?no_such_parameter=1".to_string()),
        ("GET", "/v1/keys?no_such_parameter=1".to_string()),
        ("GET", "/v1/runs?limit=many".to_string()),
        ("GET", "/v1/runs?limit=0".to_string()),
        ("GET", "/v1/runs?no_such_parameter=1".to_string()),
        ("GET", "/v1/memories/search".to_string()),
        ("GET", "/v1/memories/search?q=a&limit=many".to_string()),
        ("GET", "/v1/memories/search?q=a&limit=0".to_string()),
        ("GET", "/v1/memories/search?q=a&limit=101".to_string()),
        (
            "GET",
            "/v1/memories/search?q=a&no_such_parameter=1".to_string(),
        ),
        ("GET", "/v1/memories?cursor=abc".to_string()),
        ("GET", "/v1/memories?limit=1001".to_string()),
        ("GET", "/v1/memories?no_such_parameter=1".to_string()),
        ("GET", format!("/v1/sandboxes/{id}/memories/search")),
        (
            "GET",
            format!("/v1/sandboxes/{id}/memories?no_such_parameter=1"),
        ),
        (
            "GET",
            "/v1/runs/run-0000000000000000/events?after=soon".to_string(),
        ),
        (
            "GET",
            "/v1/runs/run-0000000000000000/events?format=xml".to_string(),
        ),
        (
            "GET",
            "/v1/exports/ex-0000000000000000/content?expires=soon&signature=00".to_string(),
        ),
    ] {
        let answer = h.alice(method, &uri, None).await;
        expect(
            &mut mismatches,
            &format!("{method} {uri}"),
            &answer,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        );
    }
    check_all(mismatches);
    h.shutdown().await;
}

#[tokio::test]
async fn what_does_not_exist_is_a_404() {
    let h = Harness::new(&[]).await;
    let ids = Ids::missing();
    let mut mismatches = Vec::new();
    for route in ROUTES.iter().filter(|r| r.path.contains('{')) {
        let answer = h.valid(route, &ids, &h.alice.secret).await;
        expect(
            &mut mismatches,
            &format!("{} {}", route.method, ids.fill(route)),
            &answer,
            StatusCode::NOT_FOUND,
            "not_found",
        );
    }
    check_all(mismatches);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_owners_resources_are_a_404() {
    let h = Harness::new(&[]).await;
    let id = h.alice_sandbox().await;
    let (status, body) = h
        .alice(
            "PUT",
            &format!("/v1/sandboxes/{id}/files/content?path=a.txt"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, export) = h
        .alice(
            "POST",
            &format!("/v1/sandboxes/{id}/exports"),
            Some(json!({"path": "a.txt"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{export}");
    // The local backend takes no snapshots; a record of alice's stands in for one (ownership
    // is checked before its files are read).
    let snapshot_id = "sn-00000000000000a1";
    h.store
        .insert_snapshot(&sandcell_store::SnapshotRecord {
            id: snapshot_id.into(),
            owner: "alice".into(),
            sandbox_id: id.clone(),
            parent_id: None,
            name: "alice's".into(),
            description: String::new(),
            tags: Default::default(),
            fidelity: "files".into(),
            created_at: sandcell_engine::fleet::now_ms(),
            size: 0,
            manifest: json!({}),
            path: h.home.path().join("snapshots/none").display().to_string(),
        })
        .expect("a snapshot record");
    // A run of alice's, ended (its record and a first event), as the runner leaves one.
    let run_id = "run-00000000000000a1";
    h.store
        .insert_run(&alices_run(run_id, &id))
        .expect("a run record");
    // A memory of alice's sandbox, and one of her own.
    let (status, memory) = h
        .alice(
            "POST",
            &format!("/v1/sandboxes/{id}/memories"),
            Some(json!({"text": "alice's secret plan"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{memory}");
    let (status, own_memory) = h
        .alice(
            "POST",
            "/v1/memories",
            Some(json!({"text": "alice's own secret"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{own_memory}");
    let own_memory_id = own_memory["id"].as_str().expect("a memory id").to_string();
    // An infer job of alice's sandbox, ended (the harness has no model to start one).
    let job_id = "inf-00000000000000a1";
    h.store
        .insert_memory_job(&sandcell_store::MemoryJobRecord {
            seq: 0,
            id: job_id.into(),
            owner: "alice".into(),
            sandbox_id: Some(id.clone()),
            status: "succeeded".into(),
            model: "openai/m".into(),
            text: "t".into(),
            category: "general".into(),
            metadata: Default::default(),
            memories: Vec::new(),
            error: None,
            worker: "0:0".into(),
            created_at: 1,
            updated_at: 1,
        })
        .expect("a job record");
    let (status, thread) = h
        .alice("POST", "/v1/threads", Some(json!({"name": "alice's"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{thread}");
    let (status, volume) = h
        .alice("POST", "/v1/volumes", Some(json!({"name": "alices"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{volume}");
    let alices = Ids {
        id: id.clone(),
        pid: "4242".into(),
        context: "default".into(),
        snapshot_id: snapshot_id.into(),
        export_id: export["id"].as_str().expect("an export id").into(),
        key_id: h.alice.id.clone(),
        run_id: run_id.into(),
        memory_id: memory["id"].as_str().expect("a memory id").into(),
        job_id: job_id.into(),
        thread_id: thread["id"].as_str().expect("a thread id").into(),
        step: "1".into(),
        // Templates and builds belong to the daemon, not to an owner: none here.
        build_id: "bld-000000000000".into(),
        name: "no-such-template".into(),
        volume: "alices".into(),
    };
    let mut mismatches = Vec::new();
    for route in ROUTES.iter().filter(|r| r.path.contains('{')) {
        let answer = h.valid(route, &alices, &h.bob.secret).await;
        expect(
            &mut mismatches,
            &format!("bob: {} {}", route.method, alices.fill(route)),
            &answer,
            StatusCode::NOT_FOUND,
            "not_found",
        );
    }
    // Alice's own memory is missing for bob too.
    for method in ["GET", "DELETE"] {
        let uri = format!("/v1/memories/{own_memory_id}");
        let req = Request::builder()
            .method(method)
            .uri(&uri)
            .header("x-api-key", &h.bob.secret)
            .body(Body::empty())
            .expect("a request");
        expect(
            &mut mismatches,
            &format!("bob: {method} {uri}"),
            &h.send(req).await,
            StatusCode::NOT_FOUND,
            "not_found",
        );
    }
    // Nor do bob's lists show them.
    for list in [
        "/v1/sandboxes",
        "/v1/exports",
        "/v1/snapshots",
        "/v1/keys",
        "/v1/runs",
        "/v1/memories",
        "/v1/memories/search?q=alice%27s+secret",
    ] {
        let req = Request::builder()
            .uri(list)
            .header("x-api-key", &h.bob.secret)
            .body(Body::empty())
            .expect("a request");
        let (status, body) = h.send(req).await;
        let text = body.to_string();
        if status != StatusCode::OK
            || text.contains(&alices.id)
            || text.contains(&alices.export_id)
            || text.contains(snapshot_id)
            || text.contains(&alices.key_id)
            || text.contains(run_id)
            || text.contains(&alices.memory_id)
            || text.contains(&own_memory_id)
            || text.contains("secret")
        {
            mismatches.push(format!("bob: GET {list}: {status} {body}"));
        }
    }
    check_all(mismatches);
    // Alice's things are all still there.
    let (status, body) = h.alice("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = h.alice("GET", &format!("/v1/runs/{run_id}"), None).await;
    assert_eq!(
        (status, &body["status"]),
        (StatusCode::OK, &json!("succeeded")),
        "{body}"
    );
    let (status, body) = h
        .alice("GET", &format!("/v1/memories/{own_memory_id}"), None)
        .await;
    assert_eq!(
        (status, &body["text"]),
        (StatusCode::OK, &json!("alice's own secret")),
        "{body}"
    );
    let (status, body) = h
        .alice(
            "GET",
            &format!("/v1/sandboxes/{id}/memories/{}", alices.memory_id),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleets_caps_are_a_429() {
    let h = Harness::new(&[("limits.max_per_owner", "1"), ("limits.max_sandboxes", "2")]).await;
    let create = json(route("POST", "/v1/sandboxes"), "{}", "");
    let ask = async |key: &str| h.call(&create, create.path, Some(key), Some("{}")).await;
    let (status, body) = ask(&h.alice.secret).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut mismatches = Vec::new();
    expect(
        &mut mismatches,
        "alice's second sandbox (max_per_owner = 1)",
        &ask(&h.alice.secret).await,
        StatusCode::TOO_MANY_REQUESTS,
        "limit_exceeded",
    );
    let (status, body) = ask(&h.bob.secret).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (record, carol) = new_key("carol", "carol", false).expect("a key");
    h.store.insert_key(&record).expect("store the key");
    expect(
        &mut mismatches,
        "carol's first sandbox (max_sandboxes = 2)",
        &ask(&carol).await,
        StatusCode::TOO_MANY_REQUESTS,
        "limit_exceeded",
    );
    check_all(mismatches);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sandbox_answers_its_routes() {
    let h = Harness::new(&[]).await;
    let id = h.alice_sandbox().await;
    let s = |path: &str| format!("/v1/sandboxes/{id}{path}");
    let mut mismatches = Vec::new();
    let m = &mut mismatches;
    ok(m, "get", h.alice("GET", &s(""), None).await, StatusCode::OK);
    let list = ok(
        m,
        "list",
        h.alice("GET", "/v1/sandboxes", None).await,
        StatusCode::OK,
    );
    assert!(list.to_string().contains(&id), "{list}");
    let out = ok(
        m,
        "exec",
        h.alice("POST", &s("/exec"), Some(json!({"cmd": "echo hi"})))
            .await,
        StatusCode::OK,
    );
    assert_eq!(out["stdout"], "hi\n", "{out}");
    ok(
        m,
        "exec stream",
        h.alice("POST", &s("/exec/stream"), Some(json!({"cmd": "echo hi"})))
            .await,
        StatusCode::OK,
    );
    ok(
        m,
        "timeout",
        h.alice("POST", &s("/timeout"), Some(json!({"timeout_secs": 600})))
            .await,
        StatusCode::OK,
    );
    ok(
        m,
        "metrics",
        h.alice("GET", &s("/metrics"), None).await,
        StatusCode::OK,
    );
    // Files.
    let upload = Request::builder()
        .method(Method::PUT)
        .uri(s("/files/content?path=a.txt"))
        .header("x-api-key", &h.alice.secret)
        .body(Body::from("hello\n"))
        .expect("a request");
    ok(m, "upload", h.send(upload).await, StatusCode::CREATED);
    let (status, text) = h.alice("GET", &s("/files/content?path=a.txt"), None).await;
    ok(m, "download", (status, text.clone()), StatusCode::OK);
    assert_eq!(text, "hello\n");
    ok(
        m,
        "stat",
        h.alice("GET", &s("/files/stat?path=a.txt"), None).await,
        StatusCode::OK,
    );
    ok(
        m,
        "list files",
        h.alice("GET", &s("/files?path=."), None).await,
        StatusCode::OK,
    );
    ok(
        m,
        "mkdir",
        h.alice("POST", &s("/files/mkdir"), Some(json!({"path": "made"})))
            .await,
        StatusCode::CREATED,
    );
    ok(
        m,
        "rename",
        h.alice(
            "POST",
            &s("/files/rename"),
            Some(json!({"from": "a.txt", "to": "made/b.txt"})),
        )
        .await,
        StatusCode::OK,
    );
    ok(
        m,
        "import",
        h.alice(
            "POST",
            &s("/import"),
            Some(json!({"path": "i.txt", "text": "hi"})),
        )
        .await,
        StatusCode::CREATED,
    );
    // Not `/artifacts`: it lists `/workspace/outputs`, an absolute path, which the local
    // backend does not map (absolute paths name the host's files there).
    let export = ok(
        m,
        "export",
        h.alice("POST", &s("/exports"), Some(json!({"path": "i.txt"})))
            .await,
        StatusCode::CREATED,
    );
    let export_id = export["id"].as_str().unwrap_or_default().to_string();
    ok(
        m,
        "exports",
        h.alice("GET", "/v1/exports", None).await,
        StatusCode::OK,
    );
    ok(
        m,
        "export",
        h.alice("GET", &format!("/v1/exports/{export_id}"), None)
            .await,
        StatusCode::OK,
    );
    let (status, bytes) = h
        .alice("GET", &format!("/v1/exports/{export_id}/content"), None)
        .await;
    ok(m, "export content", (status, bytes.clone()), StatusCode::OK);
    assert_eq!(bytes, "hi");
    ok(
        m,
        "delete export",
        h.alice("DELETE", &format!("/v1/exports/{export_id}"), None)
            .await,
        StatusCode::NO_CONTENT,
    );
    ok(
        m,
        "remove",
        h.alice("DELETE", &s("/files?path=i.txt"), None).await,
        StatusCode::NO_CONTENT,
    );
    // Processes.
    let started = ok(
        m,
        "start",
        h.alice("POST", &s("/processes"), Some(json!({"cmd": "sleep 30"})))
            .await,
        StatusCode::CREATED,
    );
    let pid = started["pid"].as_i64().unwrap_or_default();
    ok(
        m,
        "processes",
        h.alice("GET", &s("/processes"), None).await,
        StatusCode::OK,
    );
    ok(
        m,
        "signal",
        h.alice("DELETE", &s(&format!("/processes/{pid}")), None)
            .await,
        StatusCode::NO_CONTENT,
    );
    // The output waits for the end, which the signal brought.
    let output = ok(
        m,
        "output",
        h.alice("GET", &s(&format!("/processes/{pid}/output")), None)
            .await,
        StatusCode::OK,
    );
    assert_eq!(output["ok"], false, "{output}");
    let (status, body) = h.handshake(&s("/pty"), Some(&h.alice.secret)).await;
    ok(m, "pty", (status, body), StatusCode::SWITCHING_PROTOCOLS);
    // A context that is not there (context names have no shape rule: any name is looked up).
    let live = Ids {
        id: id.clone(),
        ..Ids::missing()
    };
    for route in ROUTES.iter().filter(|r| r.path.contains("{context}")) {
        let answer = h.valid(route, &live, &h.alice.secret).await;
        expect(
            m,
            &format!("{} {}", route.method, live.fill(route)),
            &answer,
            StatusCode::NOT_FOUND,
            "not_found",
        );
    }
    // Settings, keys, the system.
    ok(
        m,
        "auto-snapshot",
        h.alice("GET", &s("/auto-snapshot"), None).await,
        StatusCode::OK,
    );
    ok(
        m,
        "set auto-snapshot",
        h.alice(
            "PUT",
            &s("/auto-snapshot"),
            Some(json!({"before_reclaim": true})),
        )
        .await,
        StatusCode::OK,
    );
    ok(
        m,
        "snapshots",
        h.alice("GET", "/v1/snapshots", None).await,
        StatusCode::OK,
    );
    let key = ok(
        m,
        "new key",
        h.alice("POST", "/v1/keys", Some(json!({"name": "second"})))
            .await,
        StatusCode::CREATED,
    );
    ok(
        m,
        "keys",
        h.alice("GET", "/v1/keys", None).await,
        StatusCode::OK,
    );
    let key_id = key["id"].as_str().unwrap_or_default();
    ok(
        m,
        "revoke",
        h.alice("DELETE", &format!("/v1/keys/{key_id}"), None).await,
        StatusCode::NO_CONTENT,
    );
    ok(
        m,
        "system",
        h.alice("GET", "/v1/system", None).await,
        StatusCode::OK,
    );
    // Memories: the sandbox's, then alice's own.
    let mem = ok(
        m,
        "add memory",
        h.alice(
            "POST",
            &s("/memories"),
            Some(json!({"text": "the build uses cargo", "category": "tools", "metadata": {"k": "v"}})),
        )
        .await,
        StatusCode::CREATED,
    );
    assert_eq!(
        (&mem["scope"], &mem["sandbox_id"], &mem["metadata"]["k"]),
        (&json!("sandbox"), &json!(id), &json!("v")),
        "{mem}"
    );
    let mem_id = mem["id"].as_str().unwrap_or_default().to_string();
    let list = ok(
        m,
        "memories",
        h.alice("GET", &s("/memories?category=tools"), None).await,
        StatusCode::OK,
    );
    assert_eq!(list["memories"][0]["id"], mem_id.as_str(), "{list}");
    let found = ok(
        m,
        "search memories",
        h.alice("GET", &s("/memories/search?q=which+build+tool%3F"), None)
            .await,
        StatusCode::OK,
    );
    assert_eq!(found["memories"][0]["id"], mem_id.as_str(), "{found}");
    assert!(found["memories"][0]["score"].as_f64().is_some(), "{found}");
    ok(
        m,
        "memory",
        h.alice("GET", &s(&format!("/memories/{mem_id}")), None)
            .await,
        StatusCode::OK,
    );
    ok(
        m,
        "delete memory",
        h.alice("DELETE", &s(&format!("/memories/{mem_id}")), None)
            .await,
        StatusCode::NO_CONTENT,
    );
    ok(
        m,
        "deleted memory",
        h.alice("GET", &s(&format!("/memories/{mem_id}")), None)
            .await,
        StatusCode::NOT_FOUND,
    );
    let own = ok(
        m,
        "add own memory",
        h.alice(
            "POST",
            "/v1/memories",
            Some(json!({"text": "alice likes tea"})),
        )
        .await,
        StatusCode::CREATED,
    );
    assert_eq!(
        (&own["scope"], &own["category"]),
        (&json!("owner"), &json!("general"))
    );
    let own_id = own["id"].as_str().unwrap_or_default().to_string();
    let found = ok(
        m,
        "search own memories",
        h.alice("GET", "/v1/memories/search?q=tea&limit=5", None)
            .await,
        StatusCode::OK,
    );
    assert_eq!(found["memories"][0]["id"], own_id.as_str(), "{found}");
    ok(
        m,
        "own memories",
        h.alice("GET", "/v1/memories", None).await,
        StatusCode::OK,
    );
    ok(
        m,
        "own memory",
        h.alice("GET", &format!("/v1/memories/{own_id}"), None)
            .await,
        StatusCode::OK,
    );
    // Not the sandbox's: missing under it.
    ok(
        m,
        "own memory under the sandbox",
        h.alice("GET", &s(&format!("/memories/{own_id}")), None)
            .await,
        StatusCode::NOT_FOUND,
    );
    ok(
        m,
        "delete own memory",
        h.alice("DELETE", &format!("/v1/memories/{own_id}"), None)
            .await,
        StatusCode::NO_CONTENT,
    );
    // What the local backend cannot do is refused as unsupported, not failed.
    for what in ["/pause", "/snapshots"] {
        let body = (what == "/snapshots").then(|| json!({}));
        let answer = h.alice("POST", &s(what), body).await;
        if (answer.0, answer.1["code"].as_str()) != (StatusCode::CONFLICT, Some("unsupported")) {
            m.push(format!("{what}: want 409 unsupported, got {answer:?}"));
        }
    }
    // The end.
    ok(
        m,
        "delete",
        h.alice("DELETE", &s(""), None).await,
        StatusCode::NO_CONTENT,
    );
    // Its record stays, stopped, saying why.
    let gone = ok(
        m,
        "gone",
        h.alice("GET", &s(""), None).await,
        StatusCode::OK,
    );
    assert_eq!(
        (&gone["state"], &gone["reason"]),
        (&json!("stopped"), &json!("deleted"))
    );
    check_all(mismatches);
    h.shutdown().await;
}

#[tokio::test]
async fn mcp_requests_are_observed_like_rest_ones() {
    // A request id, a log line and the metrics for `/mcp` too (its tools' audit events carry
    // the id): the observing layer wraps the MCP service as well as the REST routes.
    let h = Harness::new(&[]).await;
    for uri in ["/mcp", "/v1/sandboxes"] {
        let req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("x-request-id", "req-from-the-test")
            .body(Body::empty())
            .expect("a request");
        let resp = h
            .app
            .clone()
            .oneshot(req)
            .await
            .expect("the router answers");
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(
            resp.headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok()),
            Some("req-from-the-test"),
            "{uri}"
        );
    }
}

/// A run of alice's that has ended, as the runner records one.
fn alices_run(id: &str, sandbox_id: &str) -> sandcell_store::RunRecord {
    let now = sandcell_engine::fleet::now_ms();
    sandcell_store::RunRecord {
        id: id.into(),
        owner: "alice".into(),
        root_id: id.into(),
        parent_id: None,
        depth: 0,
        mode: "tools".into(),
        model: "openai/test-model".into(),
        task: "alice's task".into(),
        sandbox_id: Some(sandbox_id.into()),
        status: "succeeded".into(),
        reason: Some("text".into()),
        answer: Some("alice's answer".into()),
        settings: json!({}),
        totals: json!({}),
        created_at: now,
        updated_at: now,
        ended_at: Some(now),
    }
}

/// One server-sent event: its `id`, its name and its data as JSON.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: Option<u64>,
    name: String,
    data: Value,
}

/// The events of a whole `text/event-stream` body.
fn parse_sse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter_map(|block| {
            let (mut id, mut name, mut data) = (None, String::from("message"), None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = serde_json::from_str(v.trim()).ok();
                }
            }
            Some(Sse {
                id,
                name,
                data: data?,
            })
        })
        .collect()
}

impl Harness {
    /// `GET uri` as alice with these headers, read to the end of its body (a stream ends when
    /// the server ends it): the status, the content type and the text.
    async fn alice_text(
        &self,
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, String, String) {
        let mut req = Request::builder()
            .uri(uri)
            .header("x-api-key", &self.alice.secret);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .app
            .clone()
            .oneshot(req.body(Body::empty()).expect("a request"))
            .await
            .expect("the router answers");
        let status = resp.status();
        let kind = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            axum::body::to_bytes(resp.into_body(), 16 << 20),
        )
        .await
        .expect("the stream ends within a minute")
        .expect("the whole body");
        (status, kind, String::from_utf8_lossy(&body).into_owned())
    }

    /// Waits until run `id` has written an event of type `kind`.
    async fn wait_for_event(&self, id: &str, kind: &str) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let (_, body) = self
                .alice("GET", &format!("/v1/runs/{id}/events?format=json"), None)
                .await;
            let seen = body["events"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["type"] == kind));
            if seen {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {kind} in {body}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Asserts `events` are numbered without gaps from `first`, each named after its type, the
/// last one `run_finished`; their data.
fn contiguous(events: &[Sse], first: u64) -> Vec<Value> {
    assert!(!events.is_empty(), "no events");
    for (i, e) in events.iter().enumerate() {
        let seq = first + i as u64;
        assert_eq!(e.id, Some(seq), "{events:?}");
        assert_eq!(e.data["seq"], seq, "{events:?}");
        assert_eq!(e.data["type"], e.name.as_str(), "{events:?}");
    }
    assert_eq!(
        events.last().map(|e| e.name.as_str()),
        Some("run_finished"),
        "{events:?}"
    );
    events.iter().map(|e| e.data.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_start_stream_their_events_and_cancel() {
    use sandcell_testkit::llm::{Fault, Script, ScriptedLlm, Turn};
    let slow = |ms: u64, text: &str| {
        Turn::Fault(Fault::Slow {
            delay_ms: ms,
            then: Box::new(Turn::text(text)),
        })
    };
    let llm = ScriptedLlm::start(Script::new().turns([
        slow(300, "the answer is 42"),
        Turn::text("waited: 42"),
        slow(30_000, "too late"),
    ]))
    .await
    .expect("the scripted model");
    let base = llm.openai_base();
    let h = Harness::new(&[("agent.openai.base_url", base.as_str())]).await;
    let start = |wait: bool| json!({"task": "What is 6 times 7?", "model": "openai/test-model", "wait": wait});

    // Started: 202, running.
    let (status, run) = h.alice("POST", "/v1/runs", Some(start(false))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    assert_eq!(run["status"], "running", "{run}");
    let id = run["id"].as_str().expect("a run id").to_string();

    // Followed while it runs: every event once, in order, then the stream ends.
    let (status, kind, text) = h.alice_text(&format!("/v1/runs/{id}/events"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    let all = contiguous(&parse_sse(&text), 1);
    assert!(all.len() >= 5, "{all:?}");
    assert_eq!(all.last().expect("an event")["answer"], "the answer is 42");

    // Resumed: after Last-Event-ID 3 (or ?after=3) comes 4.
    for (uri, headers) in [
        (
            format!("/v1/runs/{id}/events"),
            vec![("last-event-id", "3")],
        ),
        (format!("/v1/runs/{id}/events?after=3"), vec![]),
    ] {
        let (_, _, text) = h.alice_text(&uri, &headers).await;
        assert_eq!(contiguous(&parse_sse(&text), 4), all[3..].to_vec(), "{uri}");
    }
    // As one JSON list, by query or by Accept.
    for (uri, headers) in [
        (format!("/v1/runs/{id}/events?format=json"), vec![]),
        (
            format!("/v1/runs/{id}/events"),
            vec![("accept", "application/json")],
        ),
    ] {
        let (status, kind, text) = h.alice_text(&uri, &headers).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(kind.starts_with("application/json"), "{kind}");
        let list: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(list["events"], json!(all), "{uri}");
    }
    let (_, page) = h
        .alice(
            "GET",
            &format!("/v1/runs/{id}/events?format=json&after=1&limit=2"),
            None,
        )
        .await;
    assert_eq!(page["events"], json!(all[1..3]), "{page}");

    // Its record, and the list.
    let (status, info) = h.alice("GET", &format!("/v1/runs/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!(
        (&info["status"], &info["reason"], &info["answer"]),
        (
            &json!("succeeded"),
            &json!("text"),
            &json!("the answer is 42")
        )
    );
    let (_, list) = h.alice("GET", "/v1/runs?limit=5", None).await;
    assert_eq!(list["runs"][0]["id"], id.as_str(), "{list}");
    // Cancelling a run that has ended answers it as it is.
    let (status, again) = h
        .alice("POST", &format!("/v1/runs/{id}/cancel"), None)
        .await;
    assert_eq!(
        (status, &again["status"]),
        (StatusCode::OK, &json!("succeeded"))
    );

    // Waited for: 200, ended, with its answer.
    let (status, waited) = h.alice("POST", "/v1/runs", Some(start(true))).await;
    assert_eq!(status, StatusCode::OK, "{waited}");
    assert_eq!(
        (&waited["status"], &waited["answer"]),
        (&json!("succeeded"), &json!("waited: 42")),
        "{waited}"
    );
    assert!(waited["ended_at"].is_string(), "{waited}");

    // Cancelled in a slow model call: ends at once, and a follower sees its end.
    let (status, run) = h.alice("POST", "/v1/runs", Some(start(false))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    let slow_id = run["id"].as_str().expect("a run id").to_string();
    h.wait_for_event(&slow_id, "llm_request").await;
    let follower = {
        let app = h.app.clone();
        let key = h.alice.secret.clone();
        let uri = format!("/v1/runs/{slow_id}/events");
        tokio::spawn(async move {
            let req = Request::builder()
                .uri(uri)
                .header("x-api-key", key)
                .body(Body::empty())
                .expect("a request");
            let resp = app.oneshot(req).await.expect("the router answers");
            let body = axum::body::to_bytes(resp.into_body(), 16 << 20)
                .await
                .expect("the whole stream");
            String::from_utf8_lossy(&body).into_owned()
        })
    };
    let asked = std::time::Instant::now();
    let (status, ended) = h
        .alice("POST", &format!("/v1/runs/{slow_id}/cancel"), None)
        .await;
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert_eq!(
        (&ended["status"], &ended["reason"]),
        (&json!("cancelled"), &json!("cancelled")),
        "{ended}"
    );
    let text = tokio::time::timeout(std::time::Duration::from_secs(10), follower)
        .await
        .expect("the follower's stream ends")
        .expect("the follower");
    let events = contiguous(&parse_sse(&text), 1);
    assert_eq!(events.last().expect("an event")["status"], "cancelled");
    h.shutdown().await;
}
