//! What the scenarios ask for: the `python` sandbox over HTTP and the same sandbox for the
//! embedded engine, code for the daemon and for the engine. It uses no other module of
//! `bench daemon`.

use anyhow::anyhow;
use sandcell_api::code::CodeInput;
use sandcell_api::sandboxes::CreateSandbox;
use sandcell_engine::SandboxSpec;
use sandcell_protocol::{Language, RunCodeRequest};

/// The spec the daemon's `{"template": "python", "env": env}` stands for, for the embedded
/// engine, so both sides run the same sandbox.
pub(super) fn python_spec(env: &[(&str, &str)]) -> anyhow::Result<SandboxSpec> {
    let req = CreateSandbox {
        template: Some("python".into()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..CreateSandbox::default()
    };
    sandcell_service::sandboxes::spec_of(&req).map_err(|e| anyhow!("the python template: {e}"))
}

/// A `python` sandbox with `env` (and on `backend`, checkpointable when asked).
pub(super) fn python_sandbox(
    env: &[(&str, &str)],
    backend: Option<&str>,
    checkpointable: bool,
) -> CreateSandbox {
    CreateSandbox {
        template: Some("python".into()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        backend: backend.map(str::to_string),
        checkpointable,
        ..CreateSandbox::default()
    }
}

/// Python code in the default context.
pub(super) fn python(code: &str) -> CodeInput {
    CodeInput {
        // The bench's own snippets, far under the size limit.
        code: sandcell_api::Code::new(code).expect("a bench snippet is small"),
        ..CodeInput::default()
    }
}

pub(super) fn x_equals_1(code: &str) -> RunCodeRequest {
    RunCodeRequest {
        context: None,
        language: Some(Language::Python),
        code: code.into(),
        timeout_ms: None,
    }
}
