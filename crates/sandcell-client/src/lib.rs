//! A typed client of Sandcell's REST API.
//!
//! [`Client::discover`] finds a running daemon the way the CLI does (a URL and key given, or
//! `$SANDCELL_API_URL`/`$SANDCELL_API_KEY`, else the `daemon.json` and `admin.key` in the
//! home); [`Client::builder`] takes them explicitly. Every route whose types are in
//! `sandcell-api` has a typed call; streams of server-sent events come typed through one
//! parser ([`sse`]); file contents stream both ways without being held in memory.

#![forbid(unsafe_code)]

mod error;
pub mod events;
mod files;
mod memories;
mod processes;
mod runs;
mod sandboxes;
mod snapshots;
pub mod sse;
mod templates;
mod volumes;

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use sandcell_api::discovery::{DaemonInfo, admin_key_path, daemon_info_path, default_home};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::{ClientError, ErrorBody, parse_error_body};
pub use events::{EventStream, FromEvent};
pub use reqwest::{Body, Method, StatusCode};
pub use sandboxes::ListSandboxes;
pub use sse::{SseEvent, SseParser};

/// The header that carries the API key.
pub const API_KEY_HEADER: &str = "X-API-Key";

/// A connection to one daemon with one key. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: String,
    key: Option<String>,
    timeout: Option<Duration>,
}

impl ClientBuilder {
    /// The API key.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// A limit on every request's whole time (none by default: streams and transfers last
    /// as long as they need).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client, ClientError> {
        // The daemon is on loopback: a proxy from the environment would only be in the way.
        let mut http = reqwest::Client::builder().no_proxy();
        if let Some(t) = self.timeout {
            http = http.timeout(t);
        }
        let http = http.build().map_err(|source| ClientError::Transport {
            what: "build the HTTP client",
            source,
        })?;
        Ok(Client {
            base: self.base.trim_end_matches('/').to_string(),
            key: self.key,
            http,
        })
    }
}

/// Where to find the daemon and the key; what is not given comes from the environment, then
/// from the home.
#[derive(Debug, Clone, Default)]
pub struct Discover {
    /// The daemon's URL (else `$SANDCELL_API_URL`, else the home's `daemon.json`).
    pub url: Option<String>,
    /// The API key (else `$SANDCELL_API_KEY`, else the home's `admin.key`).
    pub api_key: Option<String>,
    /// Sandcell's home (else `$SANDCELL_HOME`, else the default one).
    pub home: Option<PathBuf>,
}

impl Discover {
    /// The home this looks in.
    pub fn home(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(default_home)
    }

    /// The daemon's base URL.
    pub fn url(&self) -> Result<String, ClientError> {
        match self
            .url
            .clone()
            .or_else(|| non_empty_env("SANDCELL_API_URL"))
        {
            Some(url) => Ok(url),
            None => running_daemon(&self.home()).map(|info| info.url),
        }
    }

    /// The API key.
    pub fn api_key(&self) -> Result<String, ClientError> {
        if let Some(k) = self
            .api_key
            .clone()
            .or_else(|| non_empty_env("SANDCELL_API_KEY"))
        {
            return Ok(k);
        }
        let path = admin_key_path(&self.home());
        std::fs::read_to_string(&path)
            .map(|k| k.trim().to_string())
            .map_err(|e| {
                ClientError::Discovery(format!(
                    "no API key: pass --api-key, set SANDCELL_API_KEY, or run as the user who can read {}: {e}",
                    path.display()
                ))
            })
    }

    /// A client of the daemon found (it is not asked anything yet: see [`Client::health`]).
    pub fn client(&self) -> Result<Client, ClientError> {
        let url = self.url()?;
        let key = self.api_key()?;
        Client::builder(url).api_key(key).build()
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The daemon running with `home`, from its `daemon.json`, if its process is alive.
pub fn running_daemon(home: &Path) -> Result<DaemonInfo, ClientError> {
    let path = daemon_info_path(home);
    let text = std::fs::read_to_string(&path).map_err(|_| {
        ClientError::Discovery(format!(
            "no Sandcell daemon is running (no {}): start one with `sandcell serve`, or point to one with --url or SANDCELL_API_URL",
            path.display()
        ))
    })?;
    let info: DaemonInfo = serde_json::from_str(&text)
        .map_err(|e| ClientError::Discovery(format!("read {}: {e}", path.display())))?;
    if !Path::new(&format!("/proc/{}", info.pid)).exists() {
        return Err(ClientError::Discovery(format!(
            "the Sandcell daemon that wrote {} (pid {}) is not running: start one with `sandcell serve`",
            path.display(),
            info.pid
        )));
    }
    Ok(info)
}

impl Client {
    /// A client of the daemon at `base_url` (`http://127.0.0.1:8080`).
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base: base_url.into(),
            key: None,
            timeout: None,
        }
    }

    /// The daemon running on `home` with its admin key, unless `$SANDCELL_API_URL` and
    /// `$SANDCELL_API_KEY` say otherwise (see [`Discover`] for flags over both).
    pub fn discover(home: &Path) -> Result<Self, ClientError> {
        Discover {
            home: Some(home.to_path_buf()),
            ..Discover::default()
        }
        .client()
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The same daemon with another key.
    pub fn with_api_key(&self, key: impl Into<String>) -> Self {
        Self {
            key: Some(key.into()),
            ..self.clone()
        }
    }

    /// `GET /healthz`: the status the daemon answers (a transport error when none does).
    pub async fn health(&self) -> Result<reqwest::StatusCode, ClientError> {
        let resp = self
            .http
            .get(format!("{}/healthz", self.base))
            .send()
            .await
            .map_err(|source| ClientError::Transport {
                what: "reach the daemon",
                source,
            })?;
        let status = resp.status();
        // Read to the end, so the connection goes back to the pool for the next request.
        resp.bytes()
            .await
            .map_err(|source| ClientError::Transport {
                what: "read the answer to /healthz",
                source,
            })?;
        Ok(status)
    }

    /// A request to `path` (which starts with `/`), the key attached.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => req.header(API_KEY_HEADER, k),
            None => req,
        }
    }

    /// Sends `req`; the answer when it is a success, else its error body.
    pub async fn send(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let resp = req.send().await.map_err(|source| ClientError::Transport {
            what: "send the request",
            source,
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|source| ClientError::Transport {
                what: "read the answer",
                source,
            })?;
        Err(ClientError::Api {
            status,
            body: parse_error_body(&bytes),
        })
    }

    /// A call whose answer is JSON of type `T`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T, ClientError> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        decode(self.send(req).await?, path).await
    }

    /// A call whose answer has no body worth reading (204).
    pub async fn call_empty(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<(), ClientError> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req).await.map(drop)
    }

    /// POSTs `body` to a streaming route; its events come typed as `T`.
    pub async fn stream<T: FromEvent>(
        &self,
        path: &str,
        body: &(impl Serialize + ?Sized),
    ) -> Result<EventStream<T>, ClientError> {
        let resp = self
            .send(self.request(Method::POST, path).json(body))
            .await?;
        Ok(EventStream::new(resp))
    }

    /// Uploads `body` (bytes, or a stream: [`Client::file_body`]) to a route taking raw
    /// bytes; its JSON answer as `T`.
    pub async fn upload<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<T, ClientError> {
        let req = self
            .request(method, path)
            .header("content-type", "application/octet-stream")
            .body(body);
        decode(self.send(req).await?, path).await
    }

    /// A local file as an upload body, read as it is sent.
    pub async fn file_body(path: &Path) -> Result<Body, ClientError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|source| ClientError::Io {
                what: "open",
                path: path.display().to_string(),
                source,
            })?;
        Ok(Body::wrap_stream(tokio_util::io::ReaderStream::new(file)))
    }

    /// Downloads from a route answering raw bytes, handing each chunk to `sink` as it
    /// arrives; the byte count.
    pub async fn download(
        &self,
        path: &str,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<u64, ClientError> {
        let resp = self.send(self.request(Method::GET, path)).await?;
        let mut stream = resp.bytes_stream();
        let mut total = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| ClientError::Transport {
                what: "read the download",
                source,
            })?;
            sink(&chunk).map_err(|source| ClientError::Io {
                what: "write",
                path: path.to_string(),
                source,
            })?;
            total += chunk.len() as u64;
        }
        Ok(total)
    }
}

/// `value` as one path segment (ids are plain, but a context or file name may not be).
pub fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `pairs` as a query string, with its `?` (empty for none).
pub fn query<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_ref(), v.as_ref()))
        .collect();
    // Strings always encode.
    format!(
        "?{}",
        serde_urlencoded::to_string(pairs).unwrap_or_default()
    )
}

/// Reads a whole answer and decodes it as `T`; an empty answer (204) reads as JSON null, so
/// `()` and `Option` take it.
async fn decode<T: DeserializeOwned>(
    resp: reqwest::Response,
    path: &str,
) -> Result<T, ClientError> {
    let bytes = resp
        .bytes()
        .await
        .map_err(|source| ClientError::Transport {
            what: "read the answer",
            source,
        })?;
    let bytes: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
    serde_json::from_slice(bytes).map_err(|e| ClientError::Decode {
        route: path.split('?').next().unwrap_or(path).to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_queries_encode() {
        assert_eq!(segment("sb-0123abcd"), "sb-0123abcd");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
        assert_eq!(query::<&str, &str>(&[]), "");
        assert_eq!(
            query(&[("path", "/workspace/a b"), ("state", "all")]),
            "?path=%2Fworkspace%2Fa+b&state=all"
        );
    }

    #[test]
    fn discovery_errors_name_the_file() {
        let home = std::env::temp_dir().join("sandcell-client-test-no-home");
        let d = Discover {
            url: None,
            api_key: Some("k".into()),
            home: Some(home.clone()),
        };
        // The environment may name a URL; only check the file case when it does not.
        if non_empty_env("SANDCELL_API_URL").is_none() {
            let err = d.url().expect_err("no daemon.json");
            assert!(err.to_string().contains("daemon.json"), "{err}");
        }
        let d = Discover {
            url: Some("http://127.0.0.1:1/".into()),
            api_key: Some("k".into()),
            home: Some(home),
        };
        let c = d.client().expect("a client");
        assert_eq!(c.base_url(), "http://127.0.0.1:1");
    }
}
