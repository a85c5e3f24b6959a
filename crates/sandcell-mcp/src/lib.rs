//! Sandcell's sandboxes as MCP tools (`sandcell mcp` over stdio; `/mcp` on the daemon over
//! streamable HTTP). The tools call the REST API through an [`api::Api`], in-process or over
//! HTTP, so they share its validation, ownership, limits and errors.

pub mod api;
pub mod docs;
pub mod output;
pub mod tools;

pub use api::{Api, HttpApi, RouterApi};
pub use tools::SandcellMcp;

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

/// The streamable HTTP service to mount at `/mcp`, its tools calling `api` with each request's
/// own API key. `allowed_hosts` empty: any Host header (the daemon's own auth guards it).
pub fn http_service(api: Arc<dyn Api>) -> StreamableHttpService<SandcellMcp, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts = Vec::new();
    config.sse_keep_alive = Some(std::time::Duration::from_secs(15));
    StreamableHttpService::new(
        move || Ok(SandcellMcp::new(api.clone())),
        Arc::default(),
        config,
    )
}

/// Serves MCP over this process's stdin and stdout until the client closes them.
pub async fn serve_stdio(api: Arc<dyn Api>) -> Result<(), std::io::Error> {
    use rmcp::ServiceExt;
    let service = SandcellMcp::new(api)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(std::io::Error::other)?;
    service.waiting().await.map_err(std::io::Error::other)?;
    Ok(())
}
