//! Shared helpers: an engine whose launcher is the freshly built binary.

use sandcell_backend_gvisor::{GvisorBackend, GvisorBackendConfig};
use sandcell_backend_process::{ProcessBackend, ProcessBackendConfig, default_runtime_dir};
use sandcell_engine::{BackendKind, Engine, ExecOutput, Sandbox, SandboxSpec};
use sandcell_protocol::ExecRequest;

pub const BIN: &str = env!("CARGO_BIN_EXE_sandcell");

/// The backend the engine-level suites (exec, files, kernels, limits, processes, attacks)
/// run on: `SANDCELL_TEST_BACKEND`, `process` unless it says `gvisor` (scripts/test.sh runs
/// them once per backend).
pub fn backend() -> BackendKind {
    match std::env::var("SANDCELL_TEST_BACKEND").as_deref() {
        Ok("gvisor") => BackendKind::Gvisor,
        _ => BackendKind::Process,
    }
}

/// Whether the suites run on gVisor: the few checks of what it cannot do (as `GET
/// /v1/system` lists) are skipped there, saying so.
pub fn on_gvisor() -> bool {
    backend() == BackendKind::Gvisor
}

pub fn engine() -> Engine {
    Engine::builder()
        .backend(ProcessBackend::new(ProcessBackendConfig::new(BIN)))
        .backend(GvisorBackend::new(GvisorBackendConfig::new(
            BIN,
            default_runtime_dir(),
        )))
        .build()
}

/// The default spec on the backend under test.
pub fn spec() -> SandboxSpec {
    SandboxSpec {
        backend: backend(),
        ..SandboxSpec::default()
    }
}

pub async fn sandbox() -> Sandbox {
    sandbox_with(SandboxSpec::default()).await
}

pub async fn sandbox_with(mut spec: SandboxSpec) -> Sandbox {
    spec.backend = backend();
    spec.system_root = system_root();
    engine().create(spec).await.expect("create sandbox")
}

/// `SANDCELL_TEST_SYSTEM_ROOT`: the suites' sandboxes take their system from this folder, as
/// sandboxes from an image template do (scripts/test.sh runs the attacks so once).
pub fn system_root() -> Option<String> {
    std::env::var("SANDCELL_TEST_SYSTEM_ROOT")
        .ok()
        .filter(|s| !s.is_empty())
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
