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

use sandcell_api::network::{HostRule, NetworkPolicy};
use sandcell_api::sandboxes::SecretRef;
use sandcell_egress::{
    EgressEvent, EgressProxy, InterceptCa, Interception, Limits, Resolver, Secret, Secrets,
    SystemResolver, UpstreamTrust,
};

use crate::error::EngineError;

/// Where a sandbox sees its egress folder.
pub use sandcell_protocol::EGRESS_DIR as SANDBOX_EGRESS_DIR;
/// The proxy's socket in that folder.
pub const SOCKET_NAME: &str = "egress.sock";
/// The CA bundle a sandbox with secrets trusts (the host's roots and the proxy's CA), in
/// that folder.
pub const CA_BUNDLE_NAME: &str = "ca.pem";
/// Where a sandbox sees it.
pub const SANDBOX_CA_BUNDLE: &str = "/run/sandcell/ca.pem";

/// What a sandbox's record keeps of `secrets`: everything but the values.
pub fn secret_refs(secrets: &Secrets) -> Vec<SecretRef> {
    secrets
        .iter()
        .map(|s| SecretRef {
            name: s.name().to_string(),
            placeholder: s.placeholder().to_string(),
            hosts: s.hosts().iter().map(ToString::to_string).collect(),
        })
        .collect()
}

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
    /// More CAs upstreams may be verified against when the proxy terminates TLS (an
    /// operator's private CA; the test registries').
    upstream_ca: Option<PathBuf>,
    /// The proxy's own CA and the upstream roots, made on first need (secrets).
    interception: std::sync::OnceLock<Result<Interception, String>>,
    /// Secret values by placeholder, for as long as this process runs: a sandbox restored
    /// or forked from a snapshot, holding the same placeholders, gets them from here.
    vault: std::sync::Mutex<std::collections::HashMap<String, String>>,
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
            upstream_ca: None,
            interception: std::sync::OnceLock::new(),
            vault: std::sync::Mutex::default(),
        }
    }

    /// Keeps the values of `secrets` (those it has) for later sandboxes with their
    /// placeholders.
    pub fn hold(&self, secrets: &Secrets) {
        let mut vault = self.vault.lock().unwrap_or_else(PoisonError::into_inner);
        for s in secrets.iter() {
            if let Some(value) = s.value() {
                vault.insert(s.placeholder().to_string(), value.to_string());
            }
        }
    }

    /// Whether the value behind `placeholder` is held here.
    pub fn holds(&self, placeholder: &str) -> bool {
        self.vault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(placeholder)
    }

    /// The proxy's secrets for `refs`: with the values held here, the others unheld (their
    /// placeholders refused until given again).
    pub fn secrets_of(&self, refs: &[SecretRef]) -> Result<Secrets, EngineError> {
        let vault = self.vault.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list = Vec::with_capacity(refs.len());
        for r in refs {
            let hosts = r
                .hosts
                .iter()
                .map(|h| h.parse::<HostRule>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| EngineError::InvalidSpec(format!("secret '{}': {e}", r.name)))?;
            let secret = match vault.get(&r.placeholder) {
                Some(value) => Secret::with_placeholder(&r.name, value, &r.placeholder, hosts),
                None => Secret::unheld(&r.name, &r.placeholder, hosts),
            };
            list.push(secret.map_err(|e| EngineError::InvalidSpec(e.to_string()))?);
        }
        Secrets::new(list).map_err(|e| EngineError::InvalidSpec(e.to_string()))
    }

    /// Also trusts the CAs in the PEM file `path` for upstreams of terminated TLS.
    pub fn with_upstream_ca(mut self, path: Option<PathBuf>) -> Self {
        self.upstream_ca = path;
        self
    }

    /// The proxy's CA and upstream roots (made once).
    fn interception(&self) -> Result<Interception, EngineError> {
        self.interception
            .get_or_init(|| {
                let mut trust = UpstreamTrust::system().map_err(|e| e.to_string())?;
                if let Some(path) = &self.upstream_ca {
                    trust = trust.with_pem_file(path).map_err(|e| e.to_string())?;
                }
                let ca = InterceptCa::generate().map_err(|e| e.to_string())?;
                Interception::new(Arc::new(ca), &trust).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| EngineError::InvalidRequest(format!("secrets cannot be used here: {e}")))
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
        secrets: &[SecretRef],
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
        let handle = EgressHandle {
            proxy,
            task,
            dir: Some(dir.to_path_buf()),
            hub: self.clone(),
        };
        // A failure drops the handle, which stops its proxy.
        if !secrets.is_empty() {
            handle.set_secrets(self.secrets_of(secrets)?)?;
        }
        Ok(handle)
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
                hub: self.clone(),
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
    hub: Arc<EgressHub>,
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

    /// Gives the proxy `secrets` (their placeholders are replaced for their hosts only, over
    /// TLS it terminates) and writes the CA bundle the sandbox must trust for it
    /// ([`SANDBOX_CA_BUNDLE`]: the host's roots and the proxy's CA). Empty: tunnels are blind
    /// again.
    pub fn set_secrets(&self, secrets: Secrets) -> Result<(), EngineError> {
        if secrets.is_empty() {
            self.proxy.set_secrets(secrets);
            self.proxy.set_interception(None);
            return Ok(());
        }
        let Some(dir) = &self.dir else {
            return Err(EngineError::InvalidRequest(
                "a loopback proxy carries no secrets".into(),
            ));
        };
        let interception = self.hub.interception()?;
        let roots = std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt"));
        let mut bundle = std::fs::read_to_string(&roots).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(interception.ca().cert_pem());
        let path = dir.join(CA_BUNDLE_NAME);
        let tmp = dir.join(format!(".{CA_BUNDLE_NAME}.tmp"));
        std::fs::write(&tmp, bundle)
            .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| EngineError::io(format!("write {}", path.display()), e))?;
        self.proxy.set_interception(Some(interception));
        self.hub.hold(&secrets);
        self.proxy.set_secrets(secrets);
        Ok(())
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
        let handle = hub
            .open("sb-1", &dir, NetworkPolicy::Loopback, &[])
            .unwrap();
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
