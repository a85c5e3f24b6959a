//! Each sandbox's egress proxy (the `sandcell-egress` crate), run by the engine.
//!
//! A backend that can give its sandboxes egress names a host folder per sandbox
//! ([`crate::Backend::egress_dir`]) and binds it at [`SANDBOX_EGRESS_DIR`] inside. The engine
//! listens on [`SOCKET_NAME`] in that folder before the sandbox starts; the guest agent
//! relays `127.0.0.1:3128` and `:1080` to it. The sandbox's network namespace keeps only
//! `lo`: the proxy is the one way out, and it decides by the sandbox's policy.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use sandcell_api::network::NetworkPolicy;
use sandcell_egress::{EgressEvent, EgressProxy, Limits, Resolver, SystemResolver};

use crate::error::EngineError;

/// Where a sandbox sees its egress folder.
pub use sandcell_protocol::EGRESS_DIR as SANDBOX_EGRESS_DIR;
/// The proxy's socket in that folder.
pub const SOCKET_NAME: &str = "egress.sock";

/// The folder of sandbox `id` under a backend's runtime folder (`<runtime>/egress/<id>`).
pub fn sandbox_dir(runtime_dir: &Path, id: &str) -> PathBuf {
    runtime_dir.join("egress").join(id)
}

/// Creates sandbox `id`'s egress folder under `runtime_dir` (idempotent) and returns it. The
/// parent is root's (or the service user's) alone; the folder itself is traversable, since the
/// sandbox's user connects to the socket in it.
pub fn make_sandbox_dir(runtime_dir: &Path, id: &str) -> Result<PathBuf, EngineError> {
    let parent = runtime_dir.join("egress");
    let dir = sandbox_dir(runtime_dir, id);
    let mkdir = |path: &Path, mode: u32| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
            .map_err(|e| EngineError::io(format!("create {}", path.display()), e))
    };
    mkdir(&parent, 0o711)?;
    mkdir(&dir, 0o755)?;
    Ok(dir)
}

/// Where every sandbox's egress events go: `(sandbox id, event)`.
pub type EventSink = Arc<dyn Fn(&str, EgressEvent) + Send + Sync>;

/// The engine's egress settings and the sink of its events.
pub struct EgressHub {
    resolver: Arc<dyn Resolver>,
    limits: Limits,
    sink: RwLock<Option<EventSink>>,
}

impl std::fmt::Debug for EgressHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressHub")
            .field("resolver", &self.resolver)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Default for EgressHub {
    fn default() -> Self {
        Self::new(Arc::new(SystemResolver), Limits::default())
    }
}

impl EgressHub {
    /// Proxies that resolve names with `resolver` and enforce `limits`.
    pub fn new(resolver: Arc<dyn Resolver>, limits: Limits) -> Self {
        Self {
            resolver,
            limits,
            sink: RwLock::new(None),
        }
    }

    /// Sends every later event to `sink` (before one is set, events are only logged).
    pub fn set_sink(&self, sink: EventSink) {
        *self.sink.write().unwrap_or_else(PoisonError::into_inner) = Some(sink);
    }

    fn emit(&self, id: &str, event: EgressEvent) {
        tracing::debug!(
            sandbox = id,
            host = %event.host,
            port = event.port,
            outcome = ?event.outcome,
            reason = event.reason.as_deref().unwrap_or(""),
            "egress"
        );
        let sink = self
            .sink
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(sink) = sink {
            sink(id, event);
        }
    }

    /// Starts sandbox `id`'s proxy under `policy`, listening in `dir` (made by
    /// [`make_sandbox_dir`]); a socket left there by an earlier process is replaced. The
    /// proxy runs until the handle is dropped.
    pub fn open(
        self: &Arc<Self>,
        id: &str,
        dir: &Path,
        policy: NetworkPolicy,
    ) -> Result<EgressHandle, EngineError> {
        let path = dir.join(SOCKET_NAME);
        let io = |what: &str, e| EngineError::io(format!("{what} {}", path.display()), e);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove", e)),
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(&path).map_err(|e| io("listen on", e))?;
        // The sandbox's user connects; only this sandbox sees the folder.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| io("set the mode of", e))?;
        let proxy = self.proxy(id, policy, self.limits.clone());
        let task = tokio::spawn(proxy.clone().serve_unix(listener));
        Ok(EgressHandle {
            proxy,
            task,
            dir: Some(dir.to_path_buf()),
        })
    }

    /// A proxy on the host's loopback for work the service does on sandbox `id`'s behalf
    /// (a git clone), under `policy` and `limits`; its events are the sandbox's. Any local
    /// process could connect while it lives: give it a policy as narrow as the work.
    pub async fn open_tcp(
        self: &Arc<Self>,
        id: &str,
        policy: NetworkPolicy,
        limits: Limits,
    ) -> Result<(std::net::SocketAddr, EgressHandle), EngineError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| EngineError::io("listen on the host's loopback for a proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| EngineError::io("read a proxy's address", e))?;
        let proxy = self.proxy(id, policy, limits);
        let serving = proxy.clone();
        let task = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                tokio::spawn(serving.clone().handle(stream));
            }
        });
        Ok((
            addr,
            EgressHandle {
                proxy,
                task,
                dir: None,
            },
        ))
    }

    fn proxy(
        self: &Arc<Self>,
        id: &str,
        policy: NetworkPolicy,
        limits: Limits,
    ) -> Arc<EgressProxy> {
        let hub = Arc::downgrade(self);
        let sandbox = id.to_string();
        EgressProxy::new(
            policy,
            self.resolver.clone(),
            limits,
            Arc::new(move |event| {
                if let Some(hub) = hub.upgrade() {
                    hub.emit(&sandbox, event);
                }
            }),
        )
    }
}

/// One sandbox's running proxy; dropping it stops the proxy (open tunnels end with it).
#[derive(Debug)]
pub struct EgressHandle {
    proxy: Arc<EgressProxy>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The sandbox's folder (none for a loopback proxy).
    dir: Option<PathBuf>,
}

impl EgressHandle {
    /// The policy now.
    pub fn policy(&self) -> NetworkPolicy {
        (*self.proxy.policy()).clone()
    }

    /// Decides the next connections under `policy`.
    pub fn set_policy(&self, policy: NetworkPolicy) {
        self.proxy.set_policy(policy);
    }

    /// Bytes carried so far, both directions.
    pub fn bytes(&self) -> u64 {
        self.proxy.bytes()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> u32 {
        self.proxy.open_connections()
    }

    /// Stops the proxy and removes the sandbox's folder (the sandbox is gone).
    pub fn remove(&self) {
        self.task.abort();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for EgressHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_sandbox_proxy_listens_in_its_folder_and_reports_what_it_refuses() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = make_sandbox_dir(tmp.path(), "sb-1").unwrap();
        assert_eq!(dir, tmp.path().join("egress/sb-1"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hub = Arc::new(EgressHub::default());
        let s = seen.clone();
        hub.set_sink(Arc::new(move |id, e| {
            s.lock().unwrap().push((id.to_string(), e))
        }));
        // A stale socket from an earlier process is replaced.
        std::fs::write(dir.join(SOCKET_NAME), b"stale").unwrap();
        let handle = hub.open("sb-1", &dir, NetworkPolicy::Loopback).unwrap();
        let mode = std::fs::metadata(dir.join(SOCKET_NAME))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o666);
        let mut c = tokio::net::UnixStream::connect(dir.join(SOCKET_NAME))
            .await
            .unwrap();
        c.write_all(b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        let events = seen.lock().unwrap().clone();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, "sb-1");
        assert_eq!(events[0].1.host, "example.org");
        handle.set_policy(NetworkPolicy::Full);
        assert_eq!(handle.policy(), NetworkPolicy::Full);
        handle.remove();
        assert!(!dir.exists());
    }
}
