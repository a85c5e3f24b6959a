//! Previews: a server inside a sandbox reached through the daemon. The connection is made by
//! the sandbox's agent on the sandbox's own loopback (`Sandbox::connect_port`), never by
//! opening the sandbox's network. Who may: the owner's API key, a signed token for that
//! sandbox and port (expiring), or anyone when the owner made the port public (until the
//! owner says otherwise or the sandbox's record is deleted; kept in the store, so across
//! restarts of the daemon).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use sandcell_api::SandboxId;
use sandcell_api::previews::{CreatePreview, PreviewInfo};
use sandcell_api::time::rfc3339;

use crate::{Caller, ErrorKind, Service, ServiceError, ServiceResult};

/// The signing scope of preview tokens (never valid as an export link's signature).
const SCOPE: &str = "preview";

/// Ports their owners made public: (sandbox, port) → owner. The store's copy, read on every
/// preview request without a query.
#[derive(Debug, Default)]
pub struct PublicPorts(Mutex<HashMap<(String, u16), String>>);

impl PublicPorts {
    /// The ports the store holds (at start).
    pub fn load(store: &sandcell_store::Store) -> Result<Self, sandcell_store::StoreError> {
        let map = store
            .public_ports()?
            .into_iter()
            .map(|(id, port, owner)| ((id, port), owner))
            .collect();
        Ok(Self(Mutex::new(map)))
    }

    fn set(&self, id: &str, port: u16, owner: Option<&str>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match owner {
            Some(o) => {
                map.insert((id.to_string(), port), o.to_string());
            }
            None => {
                map.remove(&(id.to_string(), port));
            }
        }
    }

    fn owner(&self, id: &str, port: u16) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(id.to_string(), port))
            .cloned()
    }
}

fn subject(id: &str, port: u16) -> String {
    format!("{id}\n{port}")
}

fn denied(message: &str) -> ServiceError {
    ServiceError::unauthenticated(message.to_string())
}

impl Service {
    /// A token and the routes for port `port` of the caller's sandbox `id`; with `public`,
    /// the port is reachable without either (or, `false`, no longer).
    pub fn create_preview(
        &self,
        caller: &Caller,
        id: &SandboxId,
        port: u16,
        req: CreatePreview,
    ) -> ServiceResult<PreviewInfo> {
        let ttl = req.ttl()?;
        // Only a running sandbox of the caller's.
        self.fleet.sandbox_as_is(&caller.owner, id)?;
        if let Some(public) = req.public {
            let owner = public.then_some(caller.owner.as_str());
            self.store.set_public_port(id, port, owner)?;
            self.public_ports.set(id, port, owner);
        }
        let now = sandcell_engine::fleet::now_ms() / 1000;
        let expires = now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX));
        let signature = self.signer.sign_scoped(SCOPE, &subject(id, port), expires);
        self.audit(
            caller,
            "sandbox.preview",
            Some(id),
            serde_json::json!({"port": port, "ttl_secs": ttl, "public": req.public}),
        );
        Ok(PreviewInfo {
            port,
            path: format!("/v1/sandboxes/{id}/ports/{port}/"),
            host: format!("{port}-{id}.localhost"),
            token: format!("{expires}.{signature}"),
            expires_at: rfc3339(expires.saturating_mul(1000)),
            public: self.public_ports.owner(id, port).is_some(),
        })
    }

    /// Whose sandbox `id` is, when `token` opens its port `port`, or the port is public.
    pub fn preview_owner(&self, id: &str, port: u16, token: Option<&str>) -> ServiceResult<String> {
        if let Some(owner) = self.public_ports.owner(id, port) {
            return Ok(owner);
        }
        let token = token.ok_or_else(|| denied("this port needs an API key or a preview token"))?;
        let (expires, signature) = token
            .split_once('.')
            .and_then(|(e, s)| Some((e.parse::<i64>().ok()?, s)))
            .ok_or_else(|| denied("the preview token is malformed"))?;
        let now = sandcell_engine::fleet::now_ms() / 1000;
        self.signer
            .verify_scoped(SCOPE, &subject(id, port), expires, signature, now)
            .map_err(|e| denied(&format!("the preview token is not valid here: {e}")))?;
        self.fleet
            .owner_of(id)
            .ok_or_else(|| ServiceError::not_found("sandbox", id))
    }

    /// A connection to port `port` inside `owner`'s sandbox `id`.
    pub async fn connect_preview(
        &self,
        owner: &str,
        id: &str,
        port: u16,
    ) -> ServiceResult<tokio::io::DuplexStream> {
        let sandbox = self.fleet.sandbox(owner, id)?;
        if sandbox.network() == sandcell_api::network::NetworkPolicy::Off {
            return Err(ServiceError::new(
                ErrorKind::InvalidState,
                format!(
                    "sandbox {id} has network 'off': nothing in it can listen on a TCP port \
                     (make it with 'loopback', the default, to preview a server)"
                ),
            ));
        }
        sandbox.connect_port(port).await.map_err(|e| {
            let e = ServiceError::from(e);
            if e.kind == ErrorKind::NotFound {
                ServiceError::new(
                    ErrorKind::NotFound,
                    format!("nothing listens on port {port} in sandbox {id}"),
                )
            } else {
                e
            }
        })
    }
}
