//! Previews: HTTP (WebSocket included) to a port inside a sandbox, at the path route
//! `/v1/sandboxes/{id}/ports/{port}/…` and at the host route `{port}-{id}.localhost`. The
//! connection is the sandbox agent's (`Service::connect_preview`); these handlers only
//! authenticate, forward one request over it with hyper's client and relay the answer (or
//! both upgraded streams).

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use sandcell_api::SandboxId;
use sandcell_api::previews::{CreatePreview, PreviewInfo, check_port, parse_preview_host};

use super::extract::{ApiJson, ApiPath};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

/// The query parameter and cookie a preview token travels in.
const TOKEN_PARAM: &str = "sandcell_token";
/// The header a preview token may travel in.
const TOKEN_HEADER: &str = "x-sandcell-token";

/// A token for a port of the sandbox (and, with `public`, opens or closes it to anyone).
#[utoipa::path(
    post, path = "/v1/sandboxes/{id}/previews/{port}", tag = "network",
    params(
        ("id" = String, Path, description = "Sandbox id", pattern = "^sb-[a-z0-9-]{1,64}$"),
        ("port" = u16, Path, description = "The port inside the sandbox", minimum = 1, maximum = 65535),
    ),
    request_body = CreatePreview,
    responses(
        (status = 200, body = PreviewInfo),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((id, port)): ApiPath<(SandboxId, u32)>,
    ApiJson(req): ApiJson<CreatePreview>,
) -> ApiResult<Json<PreviewInfo>> {
    let port = check_port(port)?;
    Ok(Json(s.service.create_preview(&caller, &id, port, req)?))
}

/// The path route: `/v1/sandboxes/{id}/ports/{port}` and everything below it.
pub async fn path_route(
    State(s): State<AppState>,
    Path(params): Path<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (Some(id), Some(port)) = (get("id"), get("port")) else {
        return ApiError::invalid("a preview route names a sandbox and a port").into_response();
    };
    let port = match port
        .parse::<u32>()
        .map_err(|_| ())
        .and_then(|p| check_port(p).map_err(|_| ()))
    {
        Ok(p) => p,
        Err(()) => {
            return ApiError::invalid(format!("port '{port}' must be 1 to 65535")).into_response();
        }
    };
    let prefix = format!("/v1/sandboxes/{id}/ports/{port}");
    let rest = req
        .uri()
        .path()
        .strip_prefix(&prefix)
        .unwrap_or("/")
        .to_string();
    serve(s, id, port, rest, req, false).await
}

/// The host route: a request whose `Host` is `{port}-{id}.localhost[:…]`, whatever its path;
/// `None` for every other request.
pub async fn host_route(s: AppState, req: Request) -> Result<Response, Request> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().host())
        .map(str::to_string);
    let Some((id, port)) = host.as_deref().and_then(parse_preview_host) else {
        return Err(req);
    };
    let path = req.uri().path().to_string();
    Ok(serve(s, id, port, path, req, true).await)
}

/// The token a request carries (query, header or, on the host route, cookie).
fn token_of(req: &Request) -> (Option<String>, bool) {
    let from_query = req.uri().query().and_then(|q| {
        serde_urlencoded::from_str::<Vec<(String, String)>>(q)
            .ok()?
            .into_iter()
            .find(|(k, _)| k == TOKEN_PARAM)
            .map(|(_, v)| v)
    });
    if from_query.is_some() {
        return (from_query, true);
    }
    let headers = req.headers();
    if let Some(t) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return (Some(t.trim().to_string()), false);
    }
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == TOKEN_PARAM)
        .map(|(_, v)| v.to_string());
    (cookie, false)
}

/// The request's query without the token.
fn query_without_token(query: Option<&str>) -> String {
    let Some(q) = query else {
        return String::new();
    };
    let kept: Vec<&str> = q
        .split('&')
        .filter(|kv| kv.split('=').next() != Some(TOKEN_PARAM))
        .collect();
    if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    }
}

/// Who may reach the port: the key's owner, else the token's (or a public port's).
async fn owner_of(
    s: &AppState,
    id: &str,
    port: u16,
    req: &mut Request,
) -> Result<String, ApiError> {
    let (mut parts, body) = std::mem::replace(req, Request::new(Body::empty())).into_parts();
    let keyed = if crate::auth::presented_key(&parts).is_some() {
        use axum::extract::FromRequestParts;
        Some(Caller::from_request_parts(&mut parts, s).await)
    } else {
        None
    };
    *req = Request::from_parts(parts, body);
    match keyed {
        Some(Ok(caller)) => {
            // The key's owner must own it: another owner's sandbox is missing, as everywhere.
            s.service.fleet.get(&caller.owner, id)?;
            Ok(caller.owner)
        }
        Some(Err(e)) => Err(e),
        None => {
            let (token, _) = token_of(req);
            Ok(s.service.preview_owner(id, port, token.as_deref())?)
        }
    }
}

async fn serve(
    s: AppState,
    id: String,
    port: u16,
    path: String,
    mut req: Request,
    host_route: bool,
) -> Response {
    let owner = match owner_of(&s, &id, port, &mut req).await {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let (token, token_in_query) = token_of(&req);
    let stream = match s.service.connect_preview(&owner, &id, port).await {
        Ok(stream) => stream,
        Err(e)
            if e.kind == sandcell_service::ErrorKind::NotFound
                && e.message.starts_with("nothing listens") =>
        {
            return ApiError::new(StatusCode::BAD_GATEWAY, "port_closed", e.message)
                .into_response();
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let target = format!(
        "{}{}",
        if path.is_empty() { "/" } else { &path },
        query_without_token(req.uri().query())
    );
    let mut resp = match forward(stream, req, &target, port).await {
        Ok(r) => r,
        Err(message) => {
            return ApiError::new(StatusCode::BAD_GATEWAY, "bad_gateway", message).into_response();
        }
    };
    // On the host route a token given in the URL is kept in a cookie for the page's assets.
    if host_route
        && token_in_query
        && let Some(t) = token
        && let Ok(v) = HeaderValue::from_str(&format!(
            "{TOKEN_PARAM}={t}; Path=/; HttpOnly; SameSite=Lax"
        ))
    {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

/// Headers that belong to one hop, or to Sandcell, and are not passed to the server.
fn forwardable(name: &str) -> bool {
    !matches!(
        name,
        "host"
            | "x-api-key"
            | "authorization"
            | TOKEN_HEADER
            | "proxy-connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
    )
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
}

/// Sends `req` to the server on `stream` as `target`, and answers what it answers; an
/// upgrade (WebSocket) is relayed both ways once both sides switched.
async fn forward(
    stream: tokio::io::DuplexStream,
    mut req: Request,
    target: &str,
    port: u16,
) -> Result<Response, String> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("the server on port {port} did not take the connection: {e}"))?;
    tokio::spawn(conn.with_upgrades());
    let upgrade = is_upgrade(req.headers());
    let downstream = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut builder = hyper::Request::builder()
        .method(parts.method)
        .uri(target)
        .header(header::HOST, format!("localhost:{port}"));
    for (name, value) in &parts.headers {
        let n = name.as_str();
        // The browser's cookie with the token stays here; its other cookies go on.
        if n == "cookie" {
            let kept: Vec<&str> = value
                .to_str()
                .unwrap_or("")
                .split(';')
                .map(str::trim)
                .filter(|c| !c.starts_with(&format!("{TOKEN_PARAM}=")) && !c.is_empty())
                .collect();
            if !kept.is_empty() {
                builder = builder.header(header::COOKIE, kept.join("; "));
            }
            continue;
        }
        if forwardable(n) && (upgrade || !matches!(n, "connection" | "upgrade")) {
            builder = builder.header(name, value);
        }
    }
    let upstream_req = builder
        .body(body)
        .map_err(|e| format!("the request cannot be forwarded: {e}"))?;
    let mut upstream = sender
        .send_request(upstream_req)
        .await
        .map_err(|e| format!("the server on port {port} did not answer: {e}"))?;
    if upstream.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(downstream) = downstream
    {
        let up = hyper::upgrade::on(&mut upstream);
        tokio::spawn(async move {
            if let (Ok(down), Ok(up)) = (downstream.await, up.await) {
                let mut down = TokioIo::new(down);
                let mut up = TokioIo::new(up);
                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
            }
        });
    }
    let (parts, body) = upstream.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}
