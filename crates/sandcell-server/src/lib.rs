//! Sandcell as a service: the REST API (`/v1`, with SSE and WebSocket streams), its OpenAPI
//! document and docs page, API keys and owners, the lifecycle loop, Prometheus metrics.
//!
//! [`app`] builds the router over an [`AppState`] (tests drive it with `oneshot`); [`serve`]
//! runs it on TCP and optionally a UNIX socket until SIGTERM/SIGINT.

#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod error;
mod openapi;
mod serve;
pub mod state;

pub use sandcell_service::{config, ledger, metrics, signed_url};

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, Response};
use axum::routing::{any, get};
use utoipa::OpenApi;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use serve::{
    ADMIN_OWNER, DaemonInfo, Embedded, ServeError, ServeOptions, admin_key_path, daemon_info_path,
    embedded, serve,
};
pub use state::AppState;

use crate::api::{
    background, code, exec, files, keys, memories, network, previews, processes, runs, sandboxes,
    snapshots, system, templates, threads, transfer, usage, volumes,
};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorTag};

/// The OpenAPI document's fixed part; the paths come from the handlers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sandcell",
        description = "Stateful, isolated sandboxes for AI agents: shell commands, live code kernels, files.",
    ),
    modifiers(&Security),
    tags(
        (name = "sandboxes", description = "Create, find and end sandboxes"),
        (name = "network", description = "What a sandbox's network reaches, changed live, and its egress events"),
        (name = "exec", description = "Shell commands"),
        (name = "processes", description = "Background processes and terminals"),
        (name = "code", description = "Code in live kernels (contexts)"),
        (name = "files", description = "Files in a sandbox"),
        (name = "snapshots", description = "Snapshots: take, list, fork, restore, automatic"),
        (name = "runs", description = "Agent runs: start, follow, cancel, resume, fork"),
        (name = "threads", description = "Threads: conversations that persist across agent runs"),
        (name = "memories", description = "Memories of a sandbox or of its owner: add, search, list, delete"),
        (name = "templates", description = "Templates: build from a Dockerfile, follow the build, list, delete"),
        (name = "volumes", description = "Named volumes: folders that outlive the sandboxes mounting them"),
        (name = "keys", description = "API keys"),
        (name = "system", description = "The service itself"),
    )
)]
struct ApiDoc;

struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The documented routes, with their OpenAPI description.
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(sandboxes::create, sandboxes::list))
        .routes(routes!(sandboxes::get, sandboxes::delete))
        .routes(routes!(sandboxes::set_timeout))
        .routes(routes!(sandboxes::pause))
        .routes(routes!(sandboxes::resume))
        .routes(routes!(network::get_network, network::set_network))
        .routes(routes!(network::egress_events))
        .routes(routes!(network::get_secrets, network::set_secrets))
        .routes(routes!(network::git_clone))
        .routes(routes!(previews::create))
        .routes(routes!(usage::usage))
        .routes(routes!(exec::exec))
        .routes(routes!(exec::exec_stream))
        .routes(routes!(code::run))
        .routes(routes!(code::run_stream))
        .routes(routes!(code::create_context, code::list_contexts))
        .routes(routes!(code::delete_context))
        .routes(routes!(code::interrupt))
        .routes(routes!(code::restart))
        .routes(routes!(
            code::get_variables,
            code::set_variables,
            code::clear_variables
        ))
        .routes(routes!(processes::list, background::start))
        .routes(routes!(background::stream))
        .routes(routes!(background::output))
        .routes(routes!(background::stdin))
        .routes(routes!(background::resize))
        .routes(routes!(background::pty))
        .routes(routes!(processes::signal))
        .routes(routes!(files::list, files::remove))
        .routes(routes!(files::stat))
        .routes(routes!(files::mkdir))
        .routes(routes!(files::rename))
        .routes(routes!(files::download, files::upload))
        .routes(routes!(transfer::import))
        .routes(routes!(transfer::artifacts))
        .routes(routes!(transfer::create_export))
        .routes(routes!(transfer::list_exports))
        .routes(routes!(transfer::get_export, transfer::delete_export))
        .routes(routes!(transfer::download_export))
        .routes(routes!(keys::create, keys::list))
        .routes(routes!(keys::revoke))
        .routes(routes!(snapshots::create))
        .routes(routes!(snapshots::list))
        .routes(routes!(snapshots::get, snapshots::delete))
        .routes(routes!(snapshots::fork))
        .routes(routes!(snapshots::get_auto, snapshots::set_auto))
        .routes(routes!(runs::start, runs::list))
        .routes(routes!(runs::get))
        .routes(routes!(runs::cancel))
        .routes(routes!(runs::resume))
        .routes(routes!(runs::fork))
        .routes(routes!(runs::step_sandbox))
        .routes(routes!(threads::create, threads::list))
        .routes(routes!(threads::get, threads::rename, threads::delete))
        .routes(routes!(runs::events))
        .routes(routes!(memories::add_sandbox, memories::list_sandbox))
        .routes(routes!(memories::search_sandbox))
        .routes(routes!(memories::get_sandbox, memories::delete_sandbox))
        .routes(routes!(memories::add, memories::list))
        .routes(routes!(memories::search))
        .routes(routes!(memories::get, memories::delete))
        .routes(routes!(
            memories::infer_sandbox,
            memories::list_infer_sandbox
        ))
        .routes(routes!(memories::get_infer_sandbox))
        .routes(routes!(memories::infer, memories::list_infer))
        .routes(routes!(memories::get_infer))
        .routes(routes!(templates::build, templates::list))
        .routes(routes!(templates::get, templates::delete))
        .routes(routes!(templates::list_builds))
        .routes(routes!(templates::get_build))
        .routes(routes!(templates::cancel_build))
        .routes(routes!(templates::logs))
        .routes(routes!(volumes::create, volumes::list))
        .routes(routes!(volumes::get, volumes::delete))
        .routes(routes!(system::system))
}

/// The OpenAPI 3.1 document of the API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_routes().into_openapi();
    openapi::complete(&mut doc);
    doc
}

/// The whole service as a router over `state`: the REST API and, at `/mcp`, the same
/// capabilities as MCP tools over streamable HTTP (with the same API keys; the tools call the
/// service directly, as the caller the request's key authenticated).
pub fn app(state: AppState) -> Router {
    let rest = rest_app(state.clone());
    let mcp = Router::new()
        .nest_service(
            "/mcp",
            sandcell_mcp::http_service(state.service.clone(), state.runner.clone()),
        )
        .layer(middleware::from_fn(sandcell_mcp::screen_http))
        .layer(middleware::from_fn_with_state(state.clone(), require_key));
    // Outermost, so `/mcp` requests get a request id (their tools' audit events carry it),
    // a log line and their place in the metrics, as REST requests do.
    rest.merge(mcp)
        .layer(middleware::from_fn_with_state(state.clone(), host_previews))
        .layer(middleware::from_fn_with_state(state, observe))
}

/// Requests for `{port}-{id}.localhost` go to that sandbox's port (the host route of
/// previews), whatever their path; the rest to the API.
async fn host_previews(State(s): State<AppState>, req: Request, next: Next) -> Response {
    match previews::host_route(s, req).await {
        Ok(resp) => resp,
        Err(req) => next.run(req).await,
    }
}

/// Lets a request through only with a valid API key; the extractor leaves its [`Caller`] in
/// the request's extensions, where the tools find it and act as it.
async fn require_key(_caller: Caller, req: Request, next: Next) -> Response {
    next.run(req).await
}

/// The REST API, docs and metrics.
fn rest_app(state: AppState) -> Router {
    let (api, mut doc) = api_routes().split_for_parts();
    openapi::complete(&mut doc);
    let doc_json: Arc<str> = doc.to_json().unwrap_or_else(|_| "{}".into()).into();
    let max_request = usize::try_from(state.config.limits.max_request_bytes).unwrap_or(usize::MAX);
    api.route(
        "/openapi.json",
        get(move || {
            let doc = doc_json.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    doc.to_string(),
                )
            }
        }),
    )
    .route("/docs", get(|| async { Html(DOCS_PAGE) }))
    .route("/metrics", get(system::metrics))
    .route("/healthz", get(|| async { "ok\n" }))
    .route("/v1/sandboxes/{id}/ports/{port}", any(previews::path_route))
    .route(
        "/v1/sandboxes/{id}/ports/{port}/",
        any(previews::path_route),
    )
    .route(
        "/v1/sandboxes/{id}/ports/{port}/{*rest}",
        any(previews::path_route),
    )
    .fallback(|| async {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route (the API is under /v1; see /docs)",
        )
    })
    .method_not_allowed_fallback(|| async {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method (see /docs)",
        )
    })
    .layer(DefaultBodyLimit::max(max_request))
    .with_state(state)
}

/// The id of one request (echoed as `X-Request-Id`, in logs and in audit events).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Gives each request an id, logs it, counts its response and error code.
async fn observe(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| (1..=128).contains(&v.len()) && v.chars().all(|c| c.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| format!("req-{:016x}", s.next_request_id()));
    req.extensions_mut().insert(RequestId(id.clone()));
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let start = Instant::now();
    let mut resp = next.run(req).await;
    let status = resp.status().as_u16();
    s.metrics.response(status);
    let code = resp.extensions().get::<ErrorTag>().map(|t| t.0.clone());
    if let Some(code) = &code {
        s.metrics.error(code);
    }
    let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    if status >= 500 {
        tracing::warn!(request_id = %id, %method, %path, status, micros, error = code.as_deref(), "request failed");
    } else {
        tracing::info!(request_id = %id, %method, %path, status, micros, error = code.as_deref(), "request");
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The `/docs` page: the OpenAPI document rendered in the browser by a few lines of script
/// served from the binary (nothing is fetched from elsewhere).
const DOCS_PAGE: &str = include_str!("docs.html");
