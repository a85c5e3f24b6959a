//! [`sandcell_mcp::http_service`] as the server mounts it: each tool call acts as the
//! [`Caller`] the mount's authentication left in that HTTP request's extensions (here a stand-in
//! for the server's key check: the owner named by a header), and without one a tool answers
//! `unauthenticated`.

mod common;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use common::{caller, service};
use serde_json::{Value, json};
use tower::ServiceExt;

/// Puts the caller named by `x-test-owner` (if any) in the request's extensions, as the
/// server's key check puts the one its key authenticated.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let owner = req
        .headers()
        .get("x-test-owner")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(owner) = owner {
        req.extensions_mut().insert(caller(&owner));
    }
    next.run(req).await
}

/// An MCP client of `/mcp` on `app`, as `owner` (none: unauthenticated).
struct Session {
    app: Router,
    owner: Option<&'static str>,
    id: Option<String>,
    next_id: u64,
}

impl Session {
    async fn start(app: &Router, owner: Option<&'static str>) -> Self {
        let mut s = Self {
            app: app.clone(),
            owner,
            id: None,
            next_id: 1,
        };
        let init = s
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"}}),
            )
            .await;
        assert_eq!(init["result"]["serverInfo"]["name"], "sandcell", "{init}");
        s.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        s
    }

    /// POSTs one message; the JSON-RPC messages of the answer (SSE or JSON).
    async fn post(&mut self, message: Value) -> Vec<Value> {
        let mut req = axum::http::Request::post("/mcp")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(owner) = self.owner {
            req = req.header("x-test-owner", owner);
        }
        if let Some(id) = &self.id {
            req = req.header("mcp-session-id", id);
        }
        let req = req.body(Body::from(message.to_string())).expect("request");
        let resp = self.app.clone().oneshot(req).await.expect("an answer");
        let status = resp.status();
        if !status.is_success() {
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await;
            panic!("{message}: {status}: {body:?}");
        }
        if let Some(id) = resp.headers().get("mcp-session-id") {
            self.id = Some(id.to_str().expect("session id").to_string());
        }
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("the answer");
        let text = String::from_utf8_lossy(&body);
        if let Ok(one) = serde_json::from_str::<Value>(&text) {
            return vec![one];
        }
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let answers = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        answers
            .into_iter()
            .find(|m| m["id"] == json!(id))
            .unwrap_or_else(|| panic!("no answer to {method}"))
    }

    /// Calls a tool: whether it failed, and its text.
    async fn call(&mut self, tool: &str, arguments: Value) -> (bool, String) {
        let answer = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        let result = &answer["result"];
        let text = result["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        (result["isError"] == true, text)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_http_request_acts_as_its_own_caller() {
    let home = tempfile::tempdir().expect("home");
    let service = service(home.path());
    let app = Router::new()
        .nest_service(
            "/mcp",
            sandcell_mcp::http_service(service.clone(), common::runner(&service)),
        )
        .layer(middleware::from_fn(authenticate));

    let mut alice = Session::start(&app, Some("alice")).await;
    let (failed, text) = alice
        .call("create_session", json!({"runtime": "bash"}))
        .await;
    assert!(!failed, "{text}");
    let id = text
        .strip_prefix("session_id: ")
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_else(|| panic!("no session id in {text:?}"))
        .to_string();
    assert!(
        service
            .get_sandbox(&caller("alice"), &id.parse().expect("a sandbox id"))
            .is_ok()
    );

    // The same MCP session, a request authenticated as someone else: that one's view.
    alice.owner = Some("bob");
    let (failed, text) = alice.call("list_sessions", json!({})).await;
    assert_eq!((failed, text.as_str()), (false, "no active sessions"));
    alice.owner = Some("alice");
    let (_, text) = alice.call("list_sessions", json!({})).await;
    assert!(text.starts_with(&id), "{text}");

    // No caller in the request: nothing is done.
    let mut nobody = Session::start(&app, None).await;
    let (failed, text) = nobody.call("list_sessions", json!({})).await;
    assert!(failed);
    assert!(text.starts_with("unauthenticated: "), "{text}");

    let (failed, text) = alice
        .call("destroy_session", json!({"session_id": id}))
        .await;
    assert!(!failed, "{text}");
}
