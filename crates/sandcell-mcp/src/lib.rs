//! Sandcell's sandboxes as MCP tools (`sandcell mcp` over stdio; `/mcp` on the daemon over
//! streamable HTTP). The tools call Sandcell's typed operations through a [`Sandcell`]: the
//! service in this process ([`InProcess`]), or a daemon through the typed client ([`Remote`],
//! `sandcell mcp --daemon`); either way they share its validation, ownership, limits and
//! errors.

#![forbid(unsafe_code)]

pub mod args;
pub mod docs;
pub mod frames;
pub mod output;
pub mod sandcell;
pub mod tools;

pub use sandcell::{CallError, CallResult, FileHead, InProcess, Remote, Sandcell};
pub use tools::SandcellMcp;

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

/// The streamable HTTP service to mount at `/mcp`, its tools calling `service` (and the agent
/// runs of `runner`) in this process as the caller each request authenticated as (the
/// [`sandcell_service::Caller`] the mount's authentication put in the request's extensions;
/// without one a tool answers `unauthenticated`). `allowed_hosts` empty: any Host header (the
/// daemon's own auth guards it).
pub fn http_service(
    service: Arc<sandcell_service::Service>,
    runner: Arc<sandcell_agent::Runner>,
) -> StreamableHttpService<SandcellMcp, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts = Vec::new();
    config.sse_keep_alive = Some(std::time::Duration::from_secs(15));
    StreamableHttpService::new(
        move || {
            Ok(SandcellMcp::as_request_caller(
                service.clone(),
                runner.clone(),
            ))
        },
        Arc::default(),
        config,
    )
}

/// Serves MCP over this process's stdin and stdout until the client closes them.
pub async fn serve_stdio(sandcell: Arc<dyn Sandcell>) -> Result<(), std::io::Error> {
    serve_lines(sandcell, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Longest frame read on stdio.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// Serves MCP as newline-delimited JSON-RPC on `input`/`output`, answering malformed frames
/// itself (see [`frames::screen`]).
pub async fn serve_lines<R, W>(
    sandcell: Arc<dyn Sandcell>,
    input: R,
    output: W,
) -> Result<(), std::io::Error>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use rmcp::ServiceExt;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let (server_side, pump_side) = tokio::io::duplex(1 << 20);
    let (mut from_server, mut to_server) = tokio::io::split(pump_side);
    let (lines_tx, mut lines_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    // One writer: the server's answers and our own error answers never interleave.
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = lines_rx.recv().await {
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    let server_out = {
        let tx = lines_tx.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(&mut from_server);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).await.is_err() {
                            break;
                        }
                    }
                }
            }
        })
    };
    let client_in = tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(input);
        loop {
            let mut line = Vec::new();
            // Take over a buffered reader reads no further than the newline it stops at.
            let mut limited = (&mut reader).take(MAX_FRAME_BYTES as u64 + 1);
            match limited.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let frame = line.strip_suffix(b"\n").unwrap_or(&line);
            if frame.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let answer = if line.len() > MAX_FRAME_BYTES {
                // Skip the rest of the oversized line.
                let mut rest = Vec::new();
                let _ = reader.read_until(b'\n', &mut rest).await;
                Some(serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {
                    "code": frames::INVALID_REQUEST,
                    "message": format!("invalid request: a frame is over {MAX_FRAME_BYTES} bytes"),
                }}))
            } else {
                frames::screen(frame)
            };
            match answer {
                Some(error) => {
                    let mut text = error.to_string().into_bytes();
                    text.push(b'\n');
                    if lines_tx.send(text).await.is_err() {
                        break;
                    }
                }
                None => {
                    if to_server.write_all(&line).await.is_err() {
                        break;
                    }
                    if !line.ends_with(b"\n") && to_server.write_all(b"\n").await.is_err() {
                        break;
                    }
                }
            }
        }
        // The client is gone: the server sees the end of its input and stops.
        let _ = to_server.shutdown().await;
    });
    let (read, write) = tokio::io::split(server_side);
    let served = match SandcellMcp::new(sandcell).serve((read, write)).await {
        Ok(service) => service
            .waiting()
            .await
            .map(|_| ())
            .map_err(std::io::Error::other),
        Err(e) => Err(std::io::Error::other(e)),
    };
    client_in.abort();
    let _ = server_out.await;
    let _ = writer.await;
    served
}

/// Axum middleware for `/mcp`: answers a POST whose body is not a valid JSON-RPC message
/// with `400` and a JSON-RPC error, instead of letting it reach the MCP layer.
pub async fn screen_http(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if req.method() != http::Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_FRAME_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let error = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {
                "code": frames::INVALID_REQUEST, "message": format!("invalid request: {e}")}});
            return (http::StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
        }
    };
    if let Some(error) = frames::screen(&bytes) {
        return (http::StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}
