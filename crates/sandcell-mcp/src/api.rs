//! How the tools reach Sandcell: its REST API, either in-process (the daemon's own router,
//! or an embedded one) or over HTTP (`sandcell mcp --daemon URL`). One path for both, so the
//! tools get the API's validation, ownership and errors unchanged.

use async_trait::async_trait;
use serde_json::Value;

/// One answer of the REST API.
#[derive(Debug, Clone)]
pub struct ApiReply {
    /// HTTP status.
    pub status: u16,
    /// The JSON body (`Value::Null` when empty or not JSON).
    pub body: Value,
    /// The raw body, for file contents.
    pub bytes: Vec<u8>,
}

impl ApiReply {
    /// Whether the status is 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Why a call did not get an answer at all.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The daemon could not be reached.
    #[error("the sandcell daemon could not be reached: {0}")]
    Unreachable(String),
    /// The request could not be built.
    #[error("bad request to the API: {0}")]
    Request(String),
}

/// A request to the REST API.
#[derive(Debug, Clone)]
pub struct ApiRequest<'a> {
    /// `GET`, `POST`, …
    pub method: http::Method,
    /// Path and query, starting with `/v1/`.
    pub path: String,
    /// A JSON body.
    pub json: Option<Value>,
    /// The API key to act as (else the transport's own).
    pub key: Option<&'a str>,
}

/// Something that answers REST API requests.
#[async_trait]
pub trait Api: Send + Sync {
    /// Sends one request.
    async fn call(&self, req: ApiRequest<'_>) -> Result<ApiReply, ApiError>;
    /// The base URL clients outside this process can reach (for download links), if any.
    fn public_base(&self) -> Option<String>;
}

/// The API served by a router in this process.
#[derive(Clone)]
pub struct RouterApi {
    router: axum::Router,
    key: Option<String>,
}

impl RouterApi {
    /// Requests go to `router` with `key` unless a call names its own.
    pub fn new(router: axum::Router, key: Option<String>) -> Self {
        Self { router, key }
    }
}

#[async_trait]
impl Api for RouterApi {
    async fn call(&self, req: ApiRequest<'_>) -> Result<ApiReply, ApiError> {
        use tower::ServiceExt;
        let mut builder = http::Request::builder().method(req.method).uri(&req.path);
        if let Some(key) = req.key.or(self.key.as_deref()) {
            builder = builder.header("x-api-key", key);
        }
        let body = match req.json {
            Some(v) => {
                builder = builder.header("content-type", "application/json");
                axum::body::Body::from(v.to_string())
            }
            None => axum::body::Body::empty(),
        };
        let request = builder
            .body(body)
            .map_err(|e| ApiError::Request(e.to_string()))?;
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| ApiError::Unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .map_err(|e| ApiError::Unreachable(e.to_string()))?
            .to_vec();
        Ok(reply(status, bytes))
    }

    /// None: links are made from the MCP request's own Host when it came over HTTP.
    fn public_base(&self) -> Option<String> {
        None
    }
}

/// The API of a daemon reached over HTTP.
#[derive(Clone)]
pub struct HttpApi {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl HttpApi {
    /// A client of the daemon at `base` (`http://127.0.0.1:7070`) acting with `key`.
    pub fn new(base: &str, key: Option<String>) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            key,
            http: reqwest::Client::new(),
        }
    }
}

#[async_trait]
impl Api for HttpApi {
    async fn call(&self, req: ApiRequest<'_>) -> Result<ApiReply, ApiError> {
        let method = reqwest::Method::from_bytes(req.method.as_str().as_bytes())
            .map_err(|e| ApiError::Request(e.to_string()))?;
        let mut builder = self
            .http
            .request(method, format!("{}{}", self.base, req.path));
        if let Some(key) = req.key.or(self.key.as_deref()) {
            builder = builder.header("x-api-key", key);
        }
        if let Some(v) = req.json {
            builder = builder.json(&v);
        }
        let response = builder
            .send()
            .await
            .map_err(|e| ApiError::Unreachable(format!("{}: {e}", self.base)))?;
        let status = response.status().as_u16();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| ApiError::Unreachable(e.to_string()))?
            .to_vec();
        Ok(reply(status, bytes))
    }

    fn public_base(&self) -> Option<String> {
        Some(self.base.clone())
    }
}

fn reply(status: u16, bytes: Vec<u8>) -> ApiReply {
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    ApiReply {
        status,
        body,
        bytes,
    }
}
