//! `sandcell mcp`: the MCP server over stdio, with the engine in this process, or as a client
//! of a running daemon (`--daemon URL`, or the daemon found running on the same home).

use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use crate::daemon::ConfigArgs;

/// `sandcell mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Use the daemon at this URL instead of running sandboxes in this process (default: the
    /// daemon running on the same home, if any).
    #[arg(long, value_name = "URL")]
    pub daemon: Option<String>,
    /// The API key for the daemon (default: $SANDCELL_API_KEY, else <home>/admin.key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Print the tools as Markdown (the list in docs/mcp.md) and exit.
    #[arg(long)]
    pub tools_markdown: bool,
}

/// Serves MCP on stdin/stdout until the client closes them.
pub fn mcp(args: McpArgs) -> anyhow::Result<()> {
    if args.tools_markdown {
        print!("{}", sandcell_mcp::docs::tools_markdown());
        return Ok(());
    }
    let (config, _) = args.config.load(Vec::new())?;
    // stdout carries the protocol: logs go to stderr, warnings only unless asked.
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDCELL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let home = args.config.home();
    let key = args
        .api_key
        .clone()
        .or_else(|| std::env::var("SANDCELL_API_KEY").ok())
        .or_else(|| {
            std::fs::read_to_string(sandcell_api::discovery::admin_key_path(&home))
                .ok()
                .map(|k| k.trim().to_string())
        });
    let daemon = args.daemon.clone().or_else(|| running_daemon(&home));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    rt.block_on(async move {
        if let Some(url) = daemon {
            eprintln!("sandcell mcp: using the daemon at {url}");
            let mut client = sandcell_client::Client::builder(url.as_str());
            if let Some(key) = key {
                client = client.api_key(key);
            }
            let client = client.build().context("make the daemon's client")?;
            return sandcell_mcp::serve_stdio(Arc::new(sandcell_mcp::Remote::new(client)))
                .await
                .context("serve MCP on stdio");
        }
        let engine = crate::cli::service_engine(crate::cli::backend_config()?, &config)?;
        let embedded = sandcell_server::embedded(config, engine)
            .await
            .context("start the embedded engine")?;
        // The tools call the service directly, as the admin.
        let served = match embedded.admin_caller() {
            Ok(Some(admin)) => {
                let tools = sandcell_mcp::InProcess::with_runner(
                    embedded.service(),
                    embedded.runner(),
                    admin,
                );
                sandcell_mcp::serve_stdio(Arc::new(tools))
                    .await
                    .context("serve MCP on stdio")
            }
            Ok(None) => Err(anyhow::anyhow!(
                "the admin key in the home is unknown or revoked"
            )),
            Err(e) => Err(anyhow::Error::new(e).context("look up the admin key")),
        };
        // Sessions end with this process: nothing else could reach them.
        embedded.shutdown().await;
        served
    })
}

/// The URL of a daemon running on `home`, if its process is alive.
fn running_daemon(home: &std::path::Path) -> Option<String> {
    sandcell_client::running_daemon(home)
        .ok()
        .map(|info| info.url)
}
