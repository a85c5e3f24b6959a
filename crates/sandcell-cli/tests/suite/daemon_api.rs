//! The daemon's service-wide behaviour over HTTP: API keys and owners, caps, bad input,
//! the OpenAPI document, the docs page, metrics and system information.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::common::BIN;
use super::daemon::{Daemon, Resp, ids, send, wait_for};

#[test]
fn daemon_auth_keys_and_owners() {
    let d = Daemon::start(&[]);
    let mine = d.create_id(json!({}));
    let path = format!("/v1/sandboxes/{mine}");

    // No key, a bad key: 401 with a structured body, on every /v1 route.
    for (m, p) in [
        (Method::GET, "/v1/sandboxes".to_string()),
        (Method::GET, path.clone()),
        (Method::POST, format!("{path}/exec")),
        (Method::GET, "/v1/system".into()),
        (Method::GET, "/v1/keys".into()),
    ] {
        let r = send(d.req_as(None, m.clone(), &p));
        r.expect_error(401, "unauthenticated");
        assert!(
            r.body["message"].as_str().unwrap().contains("X-API-Key"),
            "{}",
            r.body
        );
        send(d.req_as(Some("sc_nope_0123"), m.clone(), &p)).expect_error(401, "unauthenticated");
        send(
            d.req_as(None, m, &p)
                .header("Authorization", format!("Basic {}", d.key)),
        )
        .expect_error(401, "unauthenticated");
    }
    // A wrong key with the right prefix is still wrong.
    let forged = format!("{}x", &d.key[..d.key.len() - 1]);
    send(d.req_as(Some(&forged), Method::GET, &path)).expect_error(401, "unauthenticated");
    // Bearer works like X-API-Key.
    let r = send(
        d.req_as(None, Method::GET, &path)
            .header("Authorization", format!("Bearer {}", d.key)),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["id"], mine.as_str());
    let r = send(
        d.req_as(None, Method::GET, "/v1/system")
            .header("authorization", format!("bearer {}", d.key)),
    );
    assert_eq!(r.body["caller"]["owner"], "admin", "{}", r.body);
    assert_eq!(r.body["caller"]["admin"], true);
    // The unauthenticated routes stay open.
    assert_eq!(send(d.req_as(None, Method::GET, "/healthz")).status, 200);

    // Another owner sees nothing of admin's sandbox: 404 everywhere, absent from lists.
    // bob's key is made with the CLI, straight in the store (revoked the same way below).
    let (bob, bob_id) = cli_key(&d, "bob");
    let as_bob = |m: Method, p: &str, body: Option<Value>| d.call_as(Some(&bob), m, p, body);
    let r = as_bob(Method::GET, "/v1/system", None);
    assert_eq!(
        (
            r.body["caller"]["owner"].clone(),
            r.body["caller"]["admin"].clone()
        ),
        (json!("bob"), json!(false))
    );
    as_bob(Method::GET, &path, None).expect_error(404, "not_found");
    as_bob(
        Method::POST,
        &format!("{path}/exec"),
        Some(json!({"cmd": "true"})),
    )
    .expect_error(404, "not_found");
    as_bob(
        Method::POST,
        &format!("{path}/exec/stream"),
        Some(json!({"cmd": "true"})),
    )
    .expect_error(404, "not_found");
    as_bob(
        Method::POST,
        &format!("{path}/code"),
        Some(json!({"code": "1"})),
    )
    .expect_error(404, "not_found");
    as_bob(Method::GET, &format!("{path}/files"), None).expect_error(404, "not_found");
    as_bob(
        Method::GET,
        &format!("{path}/files/content?path=/workspace/x"),
        None,
    )
    .expect_error(404, "not_found");
    send(
        d.req_as(
            Some(&bob),
            Method::PUT,
            &format!("{path}/files/content?path=/workspace/x"),
        )
        .body("pwned"),
    )
    .expect_error(404, "not_found");
    as_bob(Method::GET, &format!("{path}/processes"), None).expect_error(404, "not_found");
    as_bob(Method::GET, &format!("{path}/contexts"), None).expect_error(404, "not_found");
    as_bob(
        Method::POST,
        &format!("{path}/timeout"),
        Some(json!({"timeout_secs": 1})),
    )
    .expect_error(404, "not_found");
    as_bob(Method::DELETE, &path, None).expect_error(404, "not_found");
    // The 404 says the same as for a sandbox that does not exist (no existence oracle).
    let missing = as_bob(Method::GET, "/v1/sandboxes/sb-000000000000", None);
    let theirs = as_bob(Method::GET, &path, None);
    assert_eq!(
        theirs.body["message"]
            .as_str()
            .unwrap()
            .replace(&mine, "ID"),
        missing.body["message"]
            .as_str()
            .unwrap()
            .replace("sb-000000000000", "ID")
    );
    // Nothing bob did touched it.
    let r = d.sandbox(&mine);
    assert_eq!(r.state, "running");
    assert_eq!(
        d.exec(&mine, "ls /workspace; cat /workspace/x 2>&1 | head -c 0")
            .stdout,
        ""
    );
    let theirs = as_bob(Method::POST, "/v1/sandboxes", Some(json!({})));
    assert_eq!(theirs.status, 201, "{}", theirs.body);
    let bobs = theirs.body["id"].as_str().unwrap().to_string();
    let r = as_bob(Method::GET, "/v1/sandboxes?state=all", None);
    assert_eq!(ids(&r.body), [bobs.as_str()]);
    assert!(!ids(&d.get("/v1/sandboxes?state=all").body).contains(&bobs));
    d.get(&format!("/v1/sandboxes/{bobs}"))
        .expect_error(404, "not_found");

    // /v1/keys: the admin makes keys for anyone; a key lists its owner's keys only.
    let r = d.post("/v1/keys", json!({"name": "carol's", "owner": "carol"}));
    assert_eq!(r.status, 201, "{}", r.body);
    let carol = r.body["key"].as_str().unwrap().to_string();
    let carol_id = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(
        (r.body["owner"].clone(), r.body["admin"].clone()),
        (json!("carol"), json!(false))
    );
    assert!(carol.starts_with(r.body["prefix"].as_str().unwrap()));
    let r = d.call_as(Some(&carol), Method::GET, "/v1/system", None);
    assert_eq!(r.body["caller"]["owner"], "carol", "{}", r.body);
    let r = as_bob(Method::GET, "/v1/keys", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let owners: BTreeSet<&str> = r.body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["owner"].as_str().unwrap())
        .collect();
    assert_eq!(owners, BTreeSet::from(["bob"]), "{}", r.body);
    assert!(
        !r.body.to_string().contains(&bob),
        "a listing shows a secret"
    );
    let r = d.get("/v1/keys");
    let all: BTreeSet<&str> = r.body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["owner"].as_str().unwrap())
        .collect();
    assert_eq!(all, BTreeSet::from(["admin", "bob", "carol"]), "{}", r.body);
    let r = d.get("/v1/keys?owner=carol");
    assert_eq!(r.body["keys"].as_array().unwrap().len(), 1, "{}", r.body);
    // A non-admin key cannot make keys for another owner, nor admin keys; it can make its own.
    as_bob(
        Method::POST,
        "/v1/keys",
        Some(json!({"name": "x", "owner": "carol"})),
    )
    .expect_error(403, "permission_denied");
    as_bob(
        Method::POST,
        "/v1/keys",
        Some(json!({"name": "x", "admin": true})),
    )
    .expect_error(403, "permission_denied");
    let r = as_bob(Method::POST, "/v1/keys", Some(json!({"name": "second"})));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["owner"], "bob");
    let bob2 = r.body["key"].as_str().unwrap().to_string();
    let bob2_id = r.body["id"].as_str().unwrap().to_string();
    // bob's second key sees bob's sandbox.
    let r = d.call_as(
        Some(&bob2),
        Method::GET,
        &format!("/v1/sandboxes/{bobs}"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Revoking through the API: another owner's key is "missing"; one's own works at once.
    as_bob(Method::DELETE, &format!("/v1/keys/{carol_id}"), None).expect_error(404, "not_found");
    let r = as_bob(Method::DELETE, &format!("/v1/keys/{bob2_id}"), None);
    assert_eq!(r.status, 204, "{}", r.body);
    d.call_as(Some(&bob2), Method::GET, "/v1/sandboxes", None)
        .expect_error(401, "unauthenticated");
    let r = d.get("/v1/keys?owner=bob");
    let revoked = r.body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == bob2_id.as_str())
        .unwrap()
        .clone();
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    // The admin revokes carol's.
    assert_eq!(d.delete(&format!("/v1/keys/{carol_id}")).status, 204);
    d.call_as(Some(&carol), Method::GET, "/v1/sandboxes", None)
        .expect_error(401, "unauthenticated");
    d.delete("/v1/keys/zzzz")
        .expect_error(400, "invalid_argument");
    d.delete("/v1/keys/abcdef123456")
        .expect_error(404, "not_found");

    // Revoked with the CLI (straight in the store): refused within ~3 s.
    assert_eq!(as_bob(Method::GET, "/v1/sandboxes", None).status, 200);
    let out = Command::new(BIN)
        .args(["key", "revoke", "--home"])
        .arg(d.home())
        .arg(&bob_id)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = wait_for(Duration::from_secs(4), || {
        let r = as_bob(Method::GET, "/v1/sandboxes", None);
        (r.status == 401).then_some(r)
    });
    let r = refused.expect("a revoked key still works after 4 s");
    r.expect_error(401, "unauthenticated");
    // The admin key still works.
    assert_eq!(d.get("/v1/sandboxes").status, 200);
}

/// A key for `owner` made with `sandcell key create` (not an admin key): its secret and id.
fn cli_key(d: &Daemon, owner: &str) -> (String, String) {
    let out = Command::new(BIN)
        .args(["key", "create", "--home"])
        .arg(d.home())
        .args(["--owner", owner, "--name", "t", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["owner"], owner);
    assert_eq!(v["admin"], false);
    (
        v["key"].as_str().unwrap().to_string(),
        v["id"].as_str().unwrap().to_string(),
    )
}

#[test]
fn daemon_caps_per_owner_and_in_all() {
    let d = Daemon::start(&["limits.max_per_owner=2", "limits.max_sandboxes=3"]);
    let (bob, _) = d.key_for("bob");
    let a1 = d.create_id(json!({}));
    let _a2 = d.create_id(json!({}));
    // The third of one owner: 429 limit_exceeded, and no record of it.
    let r = d.post("/v1/sandboxes", json!({}));
    r.expect_error(429, "limit_exceeded");
    assert!(
        r.body["message"].as_str().unwrap().contains("per owner"),
        "{}",
        r.body
    );
    assert_eq!(ids(&d.get("/v1/sandboxes?state=all").body).len(), 2);
    // Another owner still gets one: three in all.
    let r = d.call_as(Some(&bob), Method::POST, "/v1/sandboxes", Some(json!({})));
    assert_eq!(r.status, 201, "{}", r.body);
    // Then the service's cap: bob has room under his own, not under the total.
    let r = d.call_as(Some(&bob), Method::POST, "/v1/sandboxes", Some(json!({})));
    r.expect_error(429, "limit_exceeded");
    assert!(
        r.body["message"].as_str().unwrap().contains("maximum (3)"),
        "{}",
        r.body
    );
    // Deleting one lets one more in, for either owner.
    assert_eq!(d.delete(&format!("/v1/sandboxes/{a1}")).status, 204);
    let r = d.call_as(Some(&bob), Method::POST, "/v1/sandboxes", Some(json!({})));
    assert_eq!(r.status, 201, "{}", r.body);
    d.post("/v1/sandboxes", json!({}))
        .expect_error(429, "limit_exceeded");
    // Stopped sandboxes do not count; the metrics counted the refusals.
    let metrics = send(d.req_as(Some(&d.key), Method::GET, "/metrics")).body;
    let text = metrics.as_str().unwrap();
    assert!(
        text.contains("sandcell_errors_total{code=\"limit_exceeded\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("sandcell_sandboxes{state=\"running\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("sandcell_sandboxes{state=\"stopped\"} 1"),
        "{text}"
    );
}

/// Sends a raw body with a content type.
fn raw(d: &Daemon, m: Method, path: &str, ctype: Option<&str>, body: &str) -> Resp {
    let mut r = d.req(m, path).body(body.to_string());
    if let Some(c) = ctype {
        r = r.header("content-type", c);
    }
    send(r)
}

#[test]
fn daemon_bad_input_gets_structured_errors_and_the_daemon_keeps_serving() {
    let d = Daemon::start(&["limits.max_request_bytes=65536"]);
    let id = d.create_id(json!({}));
    let json_ct = Some("application/json");
    let bad = |what: &str, r: Resp, status: u16, code: &str| {
        assert_eq!(
            (r.status, r.error_code()),
            (status, code),
            "{what}: {}",
            r.body
        );
        assert!(
            r.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{what}"
        );
        r
    };

    // Bodies.
    bad(
        "malformed JSON",
        raw(
            &d,
            Method::POST,
            "/v1/sandboxes",
            json_ct,
            "{\"template\": ",
        ),
        400,
        "invalid_argument",
    );
    bad(
        "not an object",
        raw(&d, Method::POST, "/v1/sandboxes", json_ct, "[1, 2]"),
        400,
        "invalid_argument",
    );
    let r = bad(
        "wrong type",
        raw(
            &d,
            Method::POST,
            "/v1/sandboxes",
            json_ct,
            r#"{"timeout_secs": "soon"}"#,
        ),
        400,
        "invalid_argument",
    );
    assert!(
        r.body["message"].as_str().unwrap().contains("timeout_secs"),
        "{}",
        r.body
    );
    let r = bad(
        "unknown field",
        raw(
            &d,
            Method::POST,
            "/v1/sandboxes",
            json_ct,
            r#"{"sise": "nano"}"#,
        ),
        400,
        "invalid_argument",
    );
    assert!(
        r.body["message"].as_str().unwrap().contains("sise"),
        "{}",
        r.body
    );
    bad(
        "unknown nested field",
        d.post("/v1/sandboxes", json!({"limits": {"memory": 5}})),
        400,
        "invalid_argument",
    );
    bad(
        "unknown size",
        d.post("/v1/sandboxes", json!({"size": "huge"})),
        400,
        "invalid_argument",
    );
    bad(
        "negative number",
        d.post("/v1/sandboxes", json!({"timeout_secs": -1})),
        400,
        "invalid_argument",
    );
    bad(
        "zero lifetime",
        d.post("/v1/sandboxes", json!({"timeout_secs": 0})),
        400,
        "invalid_argument",
    );
    bad(
        "zero idle timeout",
        d.post("/v1/sandboxes", json!({"idle_timeout_secs": 0})),
        400,
        "invalid_argument",
    );
    bad(
        "tiny memory",
        d.post("/v1/sandboxes", json!({"limits": {"memory_mb": 1}})),
        400,
        "invalid_argument",
    );
    bad(
        "unknown template",
        d.post("/v1/sandboxes", json!({"template": "gpu"})),
        404,
        "not_found",
    );
    bad(
        "a label key with a control character",
        d.post("/v1/sandboxes", json!({"labels": {"a\nb": "c"}})),
        400,
        "invalid_argument",
    );
    bad(
        "no content type",
        raw(&d, Method::POST, "/v1/sandboxes", None, "{}"),
        415,
        "unsupported_media_type",
    );
    bad(
        "text content type",
        raw(&d, Method::POST, "/v1/sandboxes", Some("text/plain"), "{}"),
        415,
        "unsupported_media_type",
    );
    let exec = format!("/v1/sandboxes/{id}/exec");
    for (what, body) in [
        ("cmd of the wrong type", json!({"cmd": 5})),
        ("cmd and argv", json!({"cmd": "x", "argv": ["y"]})),
        ("neither cmd nor argv", json!({})),
        ("empty argv", json!({"argv": []})),
        ("empty cmd", json!({"cmd": "  "})),
        (
            "negative timeout",
            json!({"cmd": "true", "timeout_secs": -1}),
        ),
        (
            "env of the wrong type",
            json!({"cmd": "true", "env": ["A=b"]}),
        ),
        (
            "unknown exec field",
            json!({"cmd": "true", "shell": "bash"}),
        ),
    ] {
        bad(what, d.post(&exec, body), 400, "invalid_argument");
    }
    bad(
        "code of the wrong type",
        d.post(&format!("/v1/sandboxes/{id}/code"), json!({"code": ["x"]})),
        400,
        "invalid_argument",
    );
    bad(
        "unknown language",
        d.post(
            &format!("/v1/sandboxes/{id}/code"),
            json!({"code": "1", "language": "cobol"}),
        ),
        400,
        "invalid_argument",
    );
    // Over limits.max_request_bytes.
    let big = json!({"cmd": "true", "env": {"BIG": "x".repeat(100_000)}});
    bad(
        "a body over the cap",
        d.post(&exec, big),
        413,
        "body_too_large",
    );
    // Just under it is fine.
    let ok = d.post(
        &exec,
        json!({"cmd": "echo ${#BIG}", "env": {"BIG": "x".repeat(60_000)}}),
    );
    assert_eq!(ok.body["stdout"], "60000\n", "{}", ok.body);

    // Sandbox ids.
    for p in [
        "/v1/sandboxes/..%2f..",
        "/v1/sandboxes/..%2F..%2Fetc%2Fpasswd",
        "/v1/sandboxes/sb-UPPER",
        "/v1/sandboxes/sb-",
        "/v1/sandboxes/nope",
        "/v1/sandboxes/sb-a%20b",
        "/v1/sandboxes/sb-%00",
    ] {
        bad(p, d.get(p), 400, "invalid_argument");
        bad(p, d.delete(p), 400, "invalid_argument");
        bad(
            p,
            d.post(&format!("{p}/exec"), json!({"cmd": "true"})),
            400,
            "invalid_argument",
        );
    }
    let long = format!("/v1/sandboxes/sb-{}", "a".repeat(65));
    bad("a long id", d.get(&long), 400, "invalid_argument");
    bad(
        "a pid that is no number",
        d.delete(&format!("/v1/sandboxes/{id}/processes/abc")),
        400,
        "invalid_argument",
    );

    // Routes and methods.
    for p in [
        "/v1/nope",
        "/nope",
        "/v1",
        "/v2/sandboxes",
        "/v1/sandboxes/{id}/nope",
    ] {
        let p = p.replace("{id}", &id);
        let r = bad(&p, d.get(&p), 404, "not_found");
        assert!(
            r.body["message"].as_str().unwrap().contains("/docs"),
            "{}",
            r.body
        );
        // Without a key too: an unknown route is not a 401.
        bad(&p, send(d.req_as(None, Method::GET, &p)), 404, "not_found");
    }
    for (m, p) in [
        (Method::PATCH, "/v1/sandboxes".to_string()),
        (Method::PUT, format!("/v1/sandboxes/{id}")),
        (Method::GET, format!("/v1/sandboxes/{id}/exec")),
        (Method::DELETE, "/v1/system".into()),
        (Method::POST, "/healthz".into()),
    ] {
        bad(
            &format!("{m} {p}"),
            d.call(m.clone(), &p, None),
            405,
            "method_not_allowed",
        );
    }

    // Query parameters.
    for q in [
        "?bogus=1",
        "?label=nocolon",
        "?label=:v",
        "?metadata=x",
        "?state=bogus",
        "?limit=0",
        "?limit=1001",
        "?limit=ten",
    ] {
        bad(
            q,
            d.get(&format!("/v1/sandboxes{q}")),
            400,
            "invalid_argument",
        );
    }
    for p in [
        format!("/v1/sandboxes/{id}/files?path=/workspace&bogus=1"),
        format!("/v1/sandboxes/{id}/files/stat"),
        format!("/v1/sandboxes/{id}/files/content"),
        format!("/v1/sandboxes/{id}/contexts/python/variables?x=1"),
        "/v1/keys?bogus=1".into(),
        "/v1/keys?owner=a%20b".into(),
    ] {
        bad(&p, d.get(&p), 400, "invalid_argument");
    }
    bad(
        "recursive=maybe",
        d.delete(&format!(
            "/v1/sandboxes/{id}/files?path=/workspace/x&recursive=maybe"
        )),
        400,
        "invalid_argument",
    );
    bad(
        "mode=999",
        send(
            d.req(
                Method::PUT,
                &format!("/v1/sandboxes/{id}/files/content?path=/workspace/x&mode=999"),
            )
            .body("x"),
        ),
        400,
        "invalid_argument",
    );
    bad(
        "signal=NOPE",
        d.delete(&format!(
            "/v1/sandboxes/{id}/processes/5?signal=NOPE&tree=1"
        )),
        400,
        "invalid_argument",
    );

    // Every answer carries a request id; a good one sent is echoed.
    let r = send(
        d.req(Method::GET, "/v1/nope")
            .header("x-request-id", "trace-123"),
    );
    assert_eq!(r.headers["x-request-id"], "trace-123");
    let r = d.get("/v1/sandboxes");
    assert!(
        r.headers["x-request-id"]
            .to_str()
            .unwrap()
            .starts_with("req-")
    );

    // After all that the daemon serves as before.
    assert_eq!(send(d.req_as(None, Method::GET, "/healthz")).status, 200);
    assert_eq!(d.exec(&id, "echo still").stdout, "still\n");
    let again = d.create_id(json!({}));
    assert_eq!(d.sandbox(&again).state, "running");
    // Nothing the bad requests asked for was created.
    assert_eq!(ids(&d.get("/v1/sandboxes?state=all").body).len(), 2);
}

#[test]
fn daemon_a_junk_list_cursor_is_a_client_error() {
    // A cursor the client made up (or mangled) is the client's mistake: 400, not a 500 that
    // says the service's records "could not be saved".
    let d = Daemon::start(&[]);
    d.create_id(json!({}));
    for cursor in ["%25%25%25", "not-a-cursor", "eyJ4IjoxfQ"] {
        let r = d.get(&format!("/v1/sandboxes?cursor={cursor}"));
        r.expect_error(400, "invalid_argument");
    }
    assert_eq!(d.get("/v1/sandboxes").status, 200);
}

/// Every (method, path) the router in crates/sandcell-server/src/lib.rs serves under /v1.
const V1_ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/sandboxes"),
    ("get", "/v1/sandboxes"),
    ("get", "/v1/sandboxes/{id}"),
    ("delete", "/v1/sandboxes/{id}"),
    ("post", "/v1/sandboxes/{id}/timeout"),
    ("post", "/v1/sandboxes/{id}/exec"),
    ("post", "/v1/sandboxes/{id}/exec/stream"),
    ("post", "/v1/sandboxes/{id}/code"),
    ("post", "/v1/sandboxes/{id}/code/stream"),
    ("post", "/v1/sandboxes/{id}/contexts"),
    ("get", "/v1/sandboxes/{id}/contexts"),
    ("delete", "/v1/sandboxes/{id}/contexts/{context}"),
    ("post", "/v1/sandboxes/{id}/contexts/{context}/interrupt"),
    ("post", "/v1/sandboxes/{id}/contexts/{context}/restart"),
    ("get", "/v1/sandboxes/{id}/contexts/{context}/variables"),
    ("put", "/v1/sandboxes/{id}/contexts/{context}/variables"),
    ("delete", "/v1/sandboxes/{id}/contexts/{context}/variables"),
    ("get", "/v1/sandboxes/{id}/processes"),
    ("delete", "/v1/sandboxes/{id}/processes/{pid}"),
    ("get", "/v1/sandboxes/{id}/files"),
    ("delete", "/v1/sandboxes/{id}/files"),
    ("get", "/v1/sandboxes/{id}/files/stat"),
    ("post", "/v1/sandboxes/{id}/files/mkdir"),
    ("post", "/v1/sandboxes/{id}/files/rename"),
    ("get", "/v1/sandboxes/{id}/files/content"),
    ("put", "/v1/sandboxes/{id}/files/content"),
    ("get", "/v1/sandboxes/{id}/metrics"),
    ("post", "/v1/sandboxes/{id}/import"),
    ("get", "/v1/sandboxes/{id}/artifacts"),
    ("post", "/v1/sandboxes/{id}/exports"),
    ("get", "/v1/exports"),
    ("get", "/v1/exports/{export_id}"),
    ("delete", "/v1/exports/{export_id}"),
    ("get", "/v1/exports/{export_id}/content"),
    ("post", "/v1/keys"),
    ("get", "/v1/keys"),
    ("delete", "/v1/keys/{key_id}"),
    ("get", "/v1/system"),
    ("post", "/v1/sandboxes/{id}/pause"),
    ("post", "/v1/sandboxes/{id}/resume"),
    ("post", "/v1/sandboxes/{id}/snapshots"),
    ("get", "/v1/snapshots"),
    ("get", "/v1/snapshots/{snapshot_id}"),
    ("delete", "/v1/snapshots/{snapshot_id}"),
    ("post", "/v1/snapshots/{snapshot_id}/fork"),
    ("get", "/v1/sandboxes/{id}/auto-snapshot"),
    ("put", "/v1/sandboxes/{id}/auto-snapshot"),
];

#[test]
fn daemon_openapi_docs_metrics_and_system() {
    let d = Daemon::start(&[]);

    // The OpenAPI document: 3.1, every route the router serves, each documented route served.
    let r = send(d.req_as(None, Method::GET, "/openapi.json"));
    assert_eq!(r.status, 200);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let doc = r.body;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    assert!(doc["info"]["version"].is_string());
    let paths = doc["paths"].as_object().unwrap();
    let mut documented = BTreeSet::new();
    for (path, item) in paths {
        for method in ["get", "post", "put", "delete", "patch"] {
            if let Some(op) = item.get(method) {
                documented.insert((method.to_string(), path.clone()));
                assert!(
                    op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                    "{method} {path} documents no response"
                );
                if path.starts_with("/v1/") {
                    assert!(
                        op["security"].as_array().is_some_and(|s| !s.is_empty()),
                        "{method} {path} documents no security"
                    );
                }
            }
        }
    }
    for (m, p) in V1_ROUTES {
        assert!(
            documented.contains(&(m.to_string(), p.to_string())),
            "{m} {p} is served but not in /openapi.json"
        );
    }
    for scheme in ["api_key", "bearer"] {
        assert!(
            doc["components"]["securitySchemes"][scheme].is_object(),
            "no {scheme} scheme"
        );
    }
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    // Each documented route is served: a request to it (with a sandbox that does not exist)
    // reaches its handler, not the router's "no such route" or "method not allowed".
    for (m, p) in &documented {
        let path = p
            .replace("{id}", "sb-000000000000")
            .replace("{context}", "python")
            .replace("{pid}", "4242")
            .replace("{key_id}", "abcdef123456")
            .replace("{export_id}", "ex-000000000000")
            .replace("{snapshot_id}", "sn-0000000000000000");
        let method = Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
        let r = send(
            d.req(method, &path)
                .header("content-type", "application/json")
                .body("{\"nope\": 1}"),
        );
        assert_ne!(
            r.status, 405,
            "{m} {p} is documented, not served: {}",
            r.body
        );
        assert!(
            !r.body["message"]
                .as_str()
                .is_some_and(|msg| msg.contains("no such route")),
            "{m} {p} is documented, not served: {}",
            r.body
        );
    }

    // The docs page renders that document.
    let r = send(d.req_as(None, Method::GET, "/docs"));
    assert_eq!(r.status, 200);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"),
        "{:?}",
        r.headers
    );
    let html = r.body.as_str().unwrap();
    assert!(html.to_ascii_lowercase().contains("<html"), "{html}");
    assert!(html.contains("/openapi.json"), "{html}");

    // /v1/system: version and the process backend.
    let r = d.get("/v1/system");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let backends = r.body["backends"].as_array().unwrap();
    let process = backends
        .iter()
        .find(|b| b["kind"] == "process")
        .unwrap_or_else(|| panic!("no process backend in {}", r.body));
    assert_eq!(process["available"], true, "{process}");
    // This host has cgroups with a freezer (v1) or cgroup.freeze (v2).
    assert_eq!(process["supports_pause"], true, "{process}");
    assert_eq!(r.body["running"], 0);
    assert!(r.body["uptime_secs"].as_u64().is_some());

    // /metrics needs a key (Bearer too, as scrapers send it) unless opened by a setting.
    send(d.req_as(None, Method::GET, "/metrics")).expect_error(401, "unauthenticated");
    send(d.req_as(Some("sc_nope"), Method::GET, "/metrics")).expect_error(401, "unauthenticated");
    let bearer = d.req_as(None, Method::GET, "/metrics").bearer_auth(&d.key);
    assert_eq!(send(bearer).status, 200);
    // /metrics: sandboxes by state, and the exec latency histogram once an exec ran.
    let metrics = || {
        let r = send(d.req_as(Some(&d.key), Method::GET, "/metrics"));
        assert_eq!(r.status, 200);
        assert!(
            r.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        r.body.as_str().unwrap().to_string()
    };
    let m = metrics();
    assert!(m.contains("sandcell_sandboxes{state=\"running\"} 0"), "{m}");
    assert!(
        m.contains("sandcell_operation_duration_seconds_count{operation=\"exec\"} 0"),
        "{m}"
    );
    let id = d.create_id(json!({}));
    d.exec(&id, "true");
    d.exec(&id, "sleep 0.03");
    let m = metrics();
    assert!(m.contains("sandcell_sandboxes{state=\"running\"} 1"), "{m}");
    assert!(
        m.contains("# TYPE sandcell_operation_duration_seconds histogram"),
        "{m}"
    );
    assert!(
        m.contains("sandcell_operation_duration_seconds_count{operation=\"exec\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("sandcell_operation_duration_seconds_bucket{operation=\"exec\",le=\"+Inf\"} 2"),
        "{m}"
    );
    // The 30 ms exec is above the 25 ms bucket.
    let bucket = |le: &str| -> u64 {
        let key = format!(
            "sandcell_operation_duration_seconds_bucket{{operation=\"exec\",le=\"{le}\"}} "
        );
        m.lines()
            .find_map(|l| l.strip_prefix(&key))
            .unwrap_or_else(|| panic!("no {key} in {m}"))
            .parse()
            .unwrap()
    };
    assert!(bucket("0.025") <= 1, "{m}");
    assert!(
        m.contains("sandcell_sandbox_creates_total{result=\"ok\"} 1"),
        "{m}"
    );
    assert_eq!(d.get("/v1/system").body["running"], 1);
    // Every sample line belongs to the family declared above it.
    let mut family = String::new();
    for line in m.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split_whitespace().next().unwrap().to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            assert!(line.starts_with(&family), "{line} after {family}");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}

#[test]
fn daemon_metrics_open_without_a_key_only_when_the_setting_says_so() {
    let d = Daemon::start(&["metrics.public=true"]);
    let r = send(d.req_as(None, Method::GET, "/metrics"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body
            .as_str()
            .unwrap()
            .contains("sandcell_sandboxes{state=\"running\"} 0")
    );
    // Only /metrics: the API still needs a key.
    send(d.req_as(None, Method::GET, "/v1/sandboxes")).expect_error(401, "unauthenticated");
    // A value that is not a boolean is refused at start, naming the key.
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcell"))
        .args(["config", "show", "--set", "metrics.public=yes", "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("metrics.public"),
        "{err}"
    );
}
