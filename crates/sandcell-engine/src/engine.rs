//! The engine: backends in, sandboxes out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::backend::{Backend, BackendCapabilities};
use crate::client::GuestClient;
use crate::error::EngineError;
use crate::sandbox::{Sandbox, Timings};
use crate::spec::SandboxSpec;

/// How long a fresh agent may take to answer the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// Builds an [`Engine`] from the backends it may use.
#[derive(Default)]
pub struct EngineBuilder {
    backends: Vec<Arc<dyn Backend>>,
}

impl EngineBuilder {
    /// Grants the engine a backend.
    pub fn backend(mut self, backend: impl Backend + 'static) -> Self {
        self.backends.push(Arc::new(backend));
        self
    }

    /// Builds the engine.
    pub fn build(self) -> Engine {
        let backends = self.backends.into_iter().map(|b| (b.kind(), b)).collect();
        Engine { backends }
    }
}

/// Creates and runs sandboxes.
pub struct Engine {
    backends: HashMap<crate::spec::BackendKind, Arc<dyn Backend>>,
}

impl Engine {
    /// Starts building an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// What each backend offers on this host.
    pub fn capabilities(&self) -> Vec<BackendCapabilities> {
        let mut caps: Vec<_> = self.backends.values().map(|b| b.capabilities()).collect();
        caps.sort_by_key(|c| c.kind.as_str());
        caps
    }

    /// Creates a sandbox and waits until its agent answers.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Sandbox, EngineError> {
        self.create_with_id(new_sandbox_id(), spec).await
    }

    /// Creates a sandbox with an id the caller chose (from [`new_sandbox_id`], e.g. to
    /// prepare a backend for it ahead of time).
    pub async fn create_with_id(
        &self,
        id: String,
        spec: SandboxSpec,
    ) -> Result<Sandbox, EngineError> {
        validate_id(&id)?;
        spec.validate()?;
        let backend = self
            .backends
            .get(&spec.backend)
            .ok_or_else(|| EngineError::BackendUnavailable(spec.backend.as_str().into()))?;
        let start = Instant::now();
        let launched = backend.launch(&id, &spec).await?;
        let launched_at = start.elapsed();
        let (client, hello) = match GuestClient::connect(launched.stream, HANDSHAKE_TIMEOUT).await {
            Ok(ok) => ok,
            Err(e) => {
                let _ = launched.instance.destroy().await;
                return Err(e);
            }
        };
        let mut isolation = launched.isolation;
        isolation.merge(&hello.isolation);
        let timings = Timings {
            launch_ms: ms(launched_at),
            handshake_ms: ms(start.elapsed() - launched_at),
            create_ms: ms(start.elapsed()),
        };
        Ok(Sandbox::new(
            id,
            spec,
            client,
            launched.instance,
            isolation,
            hello.agent_version,
            timings,
        ))
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Checks a caller-chosen sandbox id: `sb-` then 1 to 64 of `[a-z0-9-]`.
fn validate_id(id: &str) -> Result<(), EngineError> {
    let rest = id.strip_prefix("sb-").unwrap_or("");
    let ok = (1..=64).contains(&rest.len())
        && rest
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(EngineError::InvalidRequest(format!(
            "sandbox id '{id}' must be 'sb-' followed by 1 to 64 of a-z, 0-9 and '-'"
        )))
    }
}

/// A new unique sandbox id: `sb-` and 12 hex digits from the clock, the pid and a counter.
pub fn new_sandbox_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("sb-{:012x}", h.finish() & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(validate_id(&new_sandbox_id()).is_ok());
        assert!(validate_id("sb-abc-123").is_ok());
        for bad in ["", "sb-", "abc", "sb-../x", "sb-A", "sb-a/b"] {
            assert!(validate_id(bad).is_err(), "{bad}");
        }
        assert_ne!(new_sandbox_id(), new_sandbox_id());
    }
}
