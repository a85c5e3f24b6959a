//! The HTTP side: routes, recording, the script's turn, the response.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::post;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::wire::{self, Ctx, Rendered, Step};
use super::{Fault, Protocol, Recorded, Shared, Turn, validate};

/// Requests carry images inline as base64: allow far more than axum's 2 MiB default.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// Serves until `stop` fires (or its sender is dropped).
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: oneshot::Receiver<()>) {
    let app = Router::new()
        .route("/v1/chat/completions", post(openai))
        .route("/v1/messages", post(anthropic))
        .route("/v1/embeddings", post(embeddings))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(shared);
    let shutdown = async {
        let _ = stop.await;
    };
    // Serving ends only when told to; an accept error is retried inside axum.
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
}

async fn openai(
    State(s): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(&s, Protocol::OpenAi, &uri, &headers, &body).await
}

async fn anthropic(
    State(s): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(&s, Protocol::Anthropic, &uri, &headers, &body).await
}

/// `POST /v1/embeddings`: recorded, then the script's fault if one is set, else the
/// deterministic vectors; takes no turn.
async fn embeddings(
    State(s): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed = serde_json::from_slice::<Value>(&body);
    let rec = Recorded {
        protocol: Protocol::OpenAi,
        path: uri.path().to_string(),
        headers: header_map(&headers),
        body: parsed.as_ref().map_or_else(
            |_| Value::String(String::from_utf8_lossy(&body).into_owned()),
            Clone::clone,
        ),
        stream: false,
    };
    s.record(&rec);
    let ctx = Ctx {
        seq: s.next_seq(),
        model: rec
            .body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("scripted")
            .to_string(),
        usage: s.usage,
        chunk_bytes: s.chunk_bytes,
        stream: false,
        include_usage: false,
    };
    let script = super::lock(&s.embeddings).clone();
    if let Some(mut fault) = script.fault.clone() {
        loop {
            match fault {
                Fault::Slow { delay_ms, then } => {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    match *then {
                        Turn::Fault(f) => fault = f,
                        _ => break,
                    }
                }
                f => {
                    return respond(
                        Protocol::OpenAi,
                        &ctx,
                        wire::render(Protocol::OpenAi, &Turn::Fault(f), &ctx),
                    );
                }
            }
        }
    }
    let answer = match &parsed {
        Ok(v) => script.answer(v),
        Err(e) => Err(format!(
            "We could not parse the JSON body of your request: {e}"
        )),
    };
    match answer {
        Ok(v) => json_response(
            StatusCode::OK,
            Some(("x-request-id", ctx.request_id())),
            None,
            &v,
        ),
        Err(message) => respond(
            Protocol::OpenAi,
            &ctx,
            Rendered::Json {
                status: 400,
                body: wire::openai_error(400, &message),
                retry_after: None,
            },
        ),
    }
}

async fn not_found(method: Method, uri: Uri) -> Response {
    let body = serde_json::json!({"error": {
        "message": format!("Unknown request URL: {method} {}", uri.path()),
        "type": "invalid_request_error",
        "param": null,
        "code": "unknown_url",
    }});
    json_response(StatusCode::NOT_FOUND, None, None, &body)
}

async fn handle(
    s: &Shared,
    protocol: Protocol,
    uri: &Uri,
    headers: &HeaderMap,
    raw: &[u8],
) -> Response {
    let parsed = serde_json::from_slice::<Value>(raw);
    let body = match &parsed {
        Ok(v) => v.clone(),
        Err(_) => Value::String(String::from_utf8_lossy(raw).into_owned()),
    };
    let flag = |v: Option<&Value>| v.and_then(Value::as_bool).unwrap_or(false);
    let stream = flag(body.get("stream"));
    let ctx = Ctx {
        seq: s.next_seq(),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("scripted")
            .to_string(),
        usage: s.usage,
        chunk_bytes: s.chunk_bytes,
        stream,
        include_usage: flag(
            body.get("stream_options")
                .and_then(|o| o.get("include_usage")),
        ),
    };
    let rec = Recorded {
        protocol,
        path: uri.path().to_string(),
        headers: header_map(headers),
        body,
        stream,
    };
    s.record(&rec);

    let refused = match &parsed {
        Err(e) => Some(format!(
            "We could not parse the JSON body of your request: {e}"
        )),
        Ok(v) if !v.is_object() => Some("the request body must be a JSON object".to_string()),
        Ok(v) => match protocol {
            Protocol::OpenAi => validate::openai(v).err(),
            Protocol::Anthropic => validate::anthropic(v).err(),
        },
    };
    if let Some(message) = refused {
        let body = match protocol {
            Protocol::OpenAi => wire::openai_error(400, &message),
            Protocol::Anthropic => wire::anthropic_error(400, &message, &ctx),
        };
        return respond(
            protocol,
            &ctx,
            Rendered::Json {
                status: 400,
                body,
                retry_after: None,
            },
        );
    }

    let mut turn = s.next_turn(&rec);
    let turn = loop {
        match turn {
            Turn::Fault(Fault::Slow { delay_ms, then }) => {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                turn = *then;
            }
            t => break t,
        }
    };
    respond(protocol, &ctx, wire::render(protocol, &turn, &ctx))
}

fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        out.entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    out
}

fn respond(protocol: Protocol, ctx: &Ctx, r: Rendered) -> Response {
    let id = (
        match protocol {
            Protocol::OpenAi => "x-request-id",
            Protocol::Anthropic => "request-id",
        },
        ctx.request_id(),
    );
    match r {
        Rendered::Json {
            status,
            body,
            retry_after,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(status, Some(id), retry_after, &body)
        }
        Rendered::Stream(steps) => {
            let built = Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
                .header(header::CACHE_CONTROL, "no-cache")
                .header(id.0, id.1)
                .body(steps_body(steps));
            built.unwrap_or_else(|e| internal(&e))
        }
        // A body that fails before its first byte: the server closes the connection
        // without having sent the response head.
        Rendered::Drop => Response::new(steps_body(vec![Step::Fail])),
    }
}

fn json_response(
    status: StatusCode,
    id: Option<(&str, String)>,
    retry_after: Option<String>,
    body: &Value,
) -> Response {
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some((name, value)) = id {
        b = b.header(name, value);
    }
    if let Some(ra) = retry_after {
        b = b.header(header::RETRY_AFTER, ra);
    }
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    b.body(Body::from(bytes)).unwrap_or_else(|e| internal(&e))
}

/// A response that could not be built (a scripted header value that is not a valid one).
fn internal(e: &dyn std::fmt::Display) -> Response {
    let mut r = Response::new(Body::from(format!(
        "scripted server: cannot build the response: {e}"
    )));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r
}

/// A streamed body that plays `steps`: data, pauses, and a failure that breaks the
/// connection.
fn steps_body(steps: Vec<Step>) -> Body {
    let stream = futures_util::stream::unfold(steps.into_iter(), |mut it| async move {
        loop {
            match it.next()? {
                Step::Data(b) => return Some((Ok::<Bytes, io::Error>(b), it)),
                Step::Pause(d) => tokio::time::sleep(d).await,
                Step::Fail => {
                    let e = io::Error::new(io::ErrorKind::ConnectionAborted, "scripted drop");
                    return Some((Err(e), it));
                }
            }
        }
    });
    Body::from_stream(stream)
}
