//! Shared helpers: an engine whose launcher is the freshly built binary.

use sandcell_backend_process::{ProcessBackend, ProcessBackendConfig};
use sandcell_engine::{Engine, ExecOutput, Sandbox, SandboxSpec};
use sandcell_protocol::ExecRequest;

pub const BIN: &str = env!("CARGO_BIN_EXE_sandcell");

pub fn engine() -> Engine {
    Engine::builder()
        .backend(ProcessBackend::new(ProcessBackendConfig::new(BIN)))
        .build()
}

pub async fn sandbox() -> Sandbox {
    sandbox_with(SandboxSpec::default()).await
}

pub async fn sandbox_with(spec: SandboxSpec) -> Sandbox {
    engine().create(spec).await.expect("create sandbox")
}

/// Runs `sh -c LINE` and returns the output.
pub async fn sh(sb: &Sandbox, line: &str) -> ExecOutput {
    sb.exec(ExecRequest::shell(line)).await.expect("exec")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether this host gives sandboxes cgroups (root with a writable hierarchy).
pub fn cgroups_active(sb: &Sandbox) -> bool {
    sb.isolation().is_active("memory_limit")
}

/// Runs Python code with the system interpreter and returns the output.
pub async fn py(sb: &Sandbox, code: &str) -> ExecOutput {
    sb.exec(ExecRequest::argv(["/usr/bin/python3", "-c", code]))
        .await
        .expect("exec python")
}
