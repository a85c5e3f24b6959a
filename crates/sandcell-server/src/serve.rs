//! Running the service: the store, the first admin key, recovery of the sandboxes a previous
//! run left, the lifecycle loop, the listeners, and a graceful end on SIGTERM/SIGINT.

use axum::serve::ListenerExt;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Duration;

use sandcell_engine::Engine;
use sandcell_engine::fleet::Fleet;
use sandcell_store::Store;
use tokio::sync::watch;

use crate::config::Config;
use crate::ledger::StoreLedger;
use crate::signed_url::UrlSigner;
use crate::state::AppState;
use sandcell_service::caller::new_key;
use sandcell_service::{Service, ServiceError};

/// The owner of the key the first start creates.
pub const ADMIN_OWNER: &str = "admin";

/// Why the service could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The data directory or a file in it.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The store could not be opened.
    #[error("the store: {0}")]
    Store(#[from] sandcell_store::StoreError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Recovering the previous run's sandboxes failed.
    #[error("recovering sandboxes: {0}")]
    Recover(String),
    /// A warm pool setting is wrong.
    #[error("pools.warm {0}")]
    Pool(String),
    /// The first admin key could not be made.
    #[error("creating the admin key: {0}")]
    AdminKey(String),
    /// The agent runtime could not start, or could not settle the runs a previous process
    /// left.
    #[error("the agent runtime: {0}")]
    Agent(String),
}

/// What `serve` runs with.
pub struct ServeOptions {
    /// The settings.
    pub config: Config,
    /// The engine (with its backends).
    pub engine: Engine,
    /// Told the TCP address once the service is listening.
    pub on_ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
}

// The daemon's address and key files are read by clients that do not link the server.
pub use sandcell_api::discovery::{DaemonInfo, admin_key_path, daemon_info_path};

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ServeError + use<> {
    let path = path.to_path_buf();
    move |source| ServeError::Io { what, path, source }
}

/// The service without listeners, for a process that answers API requests itself
/// (`sandcell mcp` with the engine embedded): its router, the admin key, and its loops.
pub struct Embedded {
    /// The whole service, `/mcp` included.
    pub app: axum::Router,
    /// The admin key's secret (from `<home>/admin.key`).
    pub admin_key: String,
    state: AppState,
    stop: watch::Sender<bool>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Embedded {
    /// The service itself, for front ends in this process that call it directly (the MCP
    /// tools over stdio).
    pub fn service(&self) -> Arc<Service> {
        self.state.service.clone()
    }

    /// The agent runs over the service (the same ones `/v1/runs` and `/mcp` reach), for
    /// front ends in this process (`sandcell agent` embedded, the MCP tools over stdio).
    pub fn runner(&self) -> Arc<sandcell_agent::Runner> {
        self.state.runner.clone()
    }

    /// Who the admin key is (`None`: it is unknown or revoked).
    pub fn admin_caller(&self) -> Result<Option<sandcell_service::Caller>, ServiceError> {
        self.state
            .keys
            .authenticate(&self.state.store, &self.admin_key)
    }

    /// Stops the loops and every sandbox.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.loops {
            let _ = task.await;
        }
        self.state.fleet.drain_pools().await;
        self.state
            .fleet
            .stop_all("the embedded service stopped")
            .await;
    }
}

/// Starts the service in this process without listening anywhere (see [`Embedded`]).
pub async fn embedded(config: Config, engine: Engine) -> Result<Embedded, ServeError> {
    // A command's own engine does not take up runs another process left: `sandcell runs
    // resume RUN` does, on purpose.
    let state = prepare(config, engine, false).await?;
    let path = admin_key_path(&state.config.home);
    let admin_key = std::fs::read_to_string(&path)
        .map_err(io("read the admin key", &path))?
        .trim()
        .to_string();
    let (stop, stop_rx) = watch::channel(false);
    let loops = vec![
        tokio::spawn(lifecycle_loop(state.clone(), stop_rx.clone())),
        tokio::spawn(pool_loop(state.fleet.clone(), stop_rx)),
    ];
    Ok(Embedded {
        app: crate::app(state.clone()),
        admin_key,
        state,
        stop,
        loops,
    })
}

/// Runs the service until SIGTERM or SIGINT.
pub async fn serve(opts: ServeOptions) -> Result<(), ServeError> {
    let state = prepare(opts.config, opts.engine, true).await?;
    let config = state.config.clone();
    let fleet = state.fleet.clone();
    let app = crate::app(state.clone());
    listen(state, config, fleet, app, opts.on_ready).await
}

/// Opens the store, makes the first admin key, recovers the last run's sandboxes.
async fn prepare(
    config: Config,
    engine: Engine,
    resume_runs: bool,
) -> Result<AppState, ServeError> {
    std::fs::create_dir_all(&config.home).map_err(io("create", &config.home))?;

    let store = Arc::new(Store::open(&config.database)?);
    // Checkpointed by the lifecycle loop rather than inside a run's commits.
    store.defer_checkpoints()?;
    ensure_admin_key(&store, &config.home)?;

    let fleet = Arc::new(Fleet::new(
        engine,
        Arc::new(StoreLedger::new(store.clone())),
        config.fleet_limits(),
    ));
    // Checked before anything starts; set once the service (which prepares them) exists.
    let pools = pool_specs(&config)?;
    let recovered = fleet
        .recover()
        .await
        .map_err(|e| ServeError::Recover(e.to_string()))?;
    if !recovered.reattached.is_empty() || !recovered.lost.is_empty() {
        tracing::info!(
            reattached = recovered.reattached.len(),
            lost = recovered.lost.len(),
            "sandboxes of the previous run recovered"
        );
    }

    let signer = UrlSigner::load_or_create(&config.home).map_err(io(
        "read or create",
        &crate::signed_url::key_path(&config.home),
    ))?;
    let service = Arc::new(Service::new(fleet.clone(), store, config, signer));
    fleet.set_pools(
        pools
            .into_iter()
            .map(|(mut pool, packages)| {
                if !packages.is_empty() {
                    pool.prepare = Some(Service::pool_prepare(&service, packages));
                }
                pool
            })
            .collect(),
    );
    let runner = Arc::new(
        sandcell_agent::Runner::from_service(service.clone())
            .map_err(|e| ServeError::Agent(e.message))?,
    );
    // Nothing runs yet: a run still `running` was left by a process that is gone. The
    // daemon resumes it from its last committed step (the sandboxes were recovered above);
    // an embedded engine marks it interrupted.
    let (resumed, settled) = if resume_runs {
        runner.resume_interrupted()
    } else {
        runner.settle_interrupted().map(|n| (0, n))
    }
    .map_err(|e| ServeError::Agent(format!("interrupted runs: {}", e.message)))?;
    if resumed + settled > 0 {
        tracing::info!(
            resumed,
            settled,
            "runs a previous process left running: resumed, or marked failed (interrupted)"
        );
    }
    Ok(AppState::new(service, runner))
}

/// Continues [`serve`] once the state is ready: listeners, loops, the end.
async fn listen(
    state: AppState,
    config: Config,
    fleet: Arc<Fleet>,
    app: axum::Router,
    on_ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), ServeError> {
    let tcp = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: config.listen.clone(),
            source,
        })?;
    let addr = tcp.local_addr().map_err(|source| ServeError::Listen {
        addr: config.listen.clone(),
        source,
    })?;
    let unix = if config.unix_socket.is_empty() {
        None
    } else {
        let path = PathBuf::from(&config.unix_socket);
        // A socket file left by a run that died; binding over it would fail.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        }) {
            let _ = std::fs::remove_file(&path);
        }
        let listener =
            tokio::net::UnixListener::bind(&path).map_err(|source| ServeError::Listen {
                addr: path.display().to_string(),
                source,
            })?;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        Some((listener, path))
    };
    let info = DaemonInfo {
        pid: std::process::id(),
        url: format!("http://{addr}"),
        unix_socket: unix.as_ref().map(|(_, p)| p.display().to_string()),
    };
    write_daemon_info(&config.home, &info)?;
    tracing::info!(url = %info.url, unix_socket = ?info.unix_socket, "sandcell is serving");
    if let Some(tx) = on_ready {
        let _ = tx.send(addr);
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let gc = tokio::spawn(lifecycle_loop(state.clone(), stop_rx.clone()));
    let image_gc = tokio::spawn(image_gc_loop(state.clone(), stop_rx.clone()));
    let refill = tokio::spawn(pool_loop(fleet.clone(), stop_rx.clone()));
    let mut servers = Vec::new();
    {
        let mut rx = stop_rx.clone();
        let app = app.clone();
        // Without TCP_NODELAY a small response on a reused connection waits for the
        // client's delayed ACK (~40 ms on Linux) behind the previous one.
        let tcp = tcp.tap_io(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
        });
        servers.push(tokio::spawn(async move {
            axum::serve(tcp, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.wait_for(|v| *v).await;
                })
                .await
        }));
    }
    if let Some((listener, _)) = unix {
        let mut rx = stop_rx.clone();
        servers.push(tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.wait_for(|v| *v).await;
                })
                .await
        }));
    }

    let signal = shutdown_signal().await;
    tracing::info!(
        signal,
        "stopping: no new requests; in-flight ones may finish"
    );
    let _ = stop_tx.send(true);
    let grace = Duration::from_secs(10);
    for server in servers {
        if tokio::time::timeout(grace, server).await.is_err() {
            tracing::warn!("requests still running after {grace:?}; ending them");
        }
    }
    let _ = gc.await;
    let _ = image_gc.await;
    let _ = refill.await;
    fleet.drain_pools().await;
    if config.shutdown.sandboxes == "stop" {
        fleet.stop_all("the service stopped").await;
        tracing::info!("every sandbox stopped");
    } else {
        let kept = fleet.detach_all();
        tracing::info!(kept, "sandboxes left running for the next start");
    }
    let _ = std::fs::remove_file(daemon_info_path(&config.home));
    if let Some(path) = info.unix_socket {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Waits for SIGTERM or SIGINT; returns its name.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // No signal handling: run until killed.
        std::future::pending::<()>().await;
        return "none";
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// The warm pools of the settings, each with the packages its sandboxes get.
fn pool_specs(
    config: &Config,
) -> Result<
    Vec<(
        sandcell_engine::fleet::PoolSpec,
        sandcell_api::sandboxes::Packages,
    )>,
    ServeError,
> {
    let mut specs = Vec::new();
    for entry in &config.pools.warm {
        let pool = crate::config::parse_warm_pool(entry).map_err(ServeError::Pool)?;
        let size: sandcell_api::sandboxes::Size =
            serde_json::from_value(serde_json::Value::String(pool.size.clone())).map_err(|_| {
                ServeError::Pool(format!(
                    "'{entry}': size '{}' is not nano, small, medium or large",
                    pool.size
                ))
            })?;
        // The spec a create asking for the same gets (packages add their paths and home).
        let req = sandcell_api::sandboxes::CreateSandbox {
            template: Some(pool.template.clone()),
            size: Some(size),
            packages: Some(pool.packages.clone()).filter(|p| !p.is_empty()),
            ..Default::default()
        };
        let spec = sandcell_service::images::spec_with_images(&config.home, &req)
            .map_err(|e| ServeError::Pool(format!("'{entry}': {e}")))?;
        specs.push((
            sandcell_engine::fleet::PoolSpec {
                name: pool.name(),
                spec,
                size: pool.count,
                prepare: None,
                seed: None,
            },
            pool.packages,
        ));
    }
    // The templates whose template file asks for a warm pool (`[warm] strategy = "pool"`).
    for pool in sandcell_service::images::template_pools(&config.home) {
        specs.push((pool, Default::default()));
    }
    Ok(specs)
}

/// Keeps the warm pools full: refills at start and after each sandbox taken.
async fn pool_loop(fleet: Arc<Fleet>, mut stop: watch::Receiver<bool>) {
    loop {
        // Never cancelled midway: a pool sandbox being made when the daemon stopped was left
        // running, in no pool and unknown to the next start (found as leftover launchers
        // after the test suite).
        let stopping = stop.clone();
        fleet.refill_pools_until(|| *stopping.borrow()).await;
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = fleet.pool_taken(Duration::from_secs(5)) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
    }
}

/// Collects the image store's garbage every `templates.gc_interval_secs` (0: never).
async fn image_gc_loop(s: AppState, mut stop: watch::Receiver<bool>) {
    let secs = s.config.templates.gc_interval_secs;
    if secs == 0 {
        return;
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(secs)) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        match s.service.collect_image_garbage().await {
            Ok(Some(c)) if c.blobs > 0 || c.roots > 0 => tracing::info!(
                blobs = c.blobs,
                bytes = c.bytes,
                roots = c.roots,
                "image store: removed what no template uses"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e.message, "image store: garbage collection failed"),
        }
    }
}

/// Stops idle and expired sandboxes every `limits.gc_interval_secs`.
async fn lifecycle_loop(s: AppState, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_secs(s.config.limits.gc_interval_secs.max(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        s.service.tick(sandcell_engine::fleet::now_ms()).await;
    }
}

/// Creates the first admin key when there is none, and leaves its secret in
/// `<home>/admin.key` (mode 0600) for the CLI.
fn ensure_admin_key(store: &Store, home: &Path) -> Result<(), ServeError> {
    if store.count_keys()? > 0 {
        return Ok(());
    }
    let (record, secret) = new_key(ADMIN_OWNER, "admin (first start)", true)
        .map_err(|e| ServeError::AdminKey(e.message))?;
    let path = admin_key_path(home);
    write_private(&path, format!("{secret}\n").as_bytes())?;
    store.insert_key(&record)?;
    tracing::info!(path = %path.display(), "created the admin API key");
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), ServeError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("create", &tmp))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("rename", path))
}

fn write_daemon_info(home: &Path, info: &DaemonInfo) -> Result<(), ServeError> {
    let text = serde_json::to_string_pretty(info).unwrap_or_default();
    write_private(&daemon_info_path(home), text.as_bytes())
}
