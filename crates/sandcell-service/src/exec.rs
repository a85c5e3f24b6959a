//! Exec: run a command and collect its result, or follow it as a stream of typed events;
//! and what every stream shares (its error event, the sandbox it runs in).

use std::time::Instant;

use futures_util::StreamExt;
use sandcell_api::exec::{
    ExecChunk, ExecInput, ExecOutput, ExecStreamEvent, ExitEvent, ExitInfo, StreamError,
};
use sandcell_api::{SandboxId, Timeout};
use sandcell_engine::{ExecEvent, Sandbox};
use sandcell_protocol::ExecRequest;

use crate::{Caller, Service, ServiceError, ServiceResult};

/// A stream of typed events an operation follows (its last event ends it).
pub type Events<T> = futures_util::stream::BoxStream<'static, T>;

/// The engine request an exec input asks for (exactly one of `cmd` and `argv`, a timeout in
/// range), checked.
pub fn exec_request(input: &ExecInput) -> ServiceResult<ExecRequest> {
    let mut req = match (&input.cmd, &input.argv) {
        (Some(cmd), None) => {
            if cmd.trim().is_empty() {
                return Err(ServiceError::invalid("cmd is empty"));
            }
            ExecRequest::shell(cmd.clone())
        }
        (None, Some(argv)) => {
            if argv.first().is_none_or(String::is_empty) {
                return Err(ServiceError::invalid("argv needs at least a program"));
            }
            ExecRequest::argv(argv.clone())
        }
        _ => return Err(ServiceError::invalid("give exactly one of cmd and argv")),
    };
    req.env = input.env.clone();
    req.cwd = input.cwd.clone();
    req.stdin = input.stdin.is_some();
    req.timeout_ms = input.timeout_secs.map(Timeout::as_ms);
    Ok(req)
}

/// The `error` event that ends a stream: the error as every error body carries it.
impl From<ServiceError> for StreamError {
    fn from(e: ServiceError) -> Self {
        Self {
            code: e.code().to_string(),
            message: e.message,
            details: e.details,
        }
    }
}

/// An engine error as a stream's last event.
pub(crate) fn stream_error(e: sandcell_engine::EngineError) -> StreamError {
    ServiceError::from(e).into()
}

impl Service {
    /// The caller's running sandbox `id` (a paused one wakes), its id checked first.
    pub(crate) fn running_sandbox(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<Sandbox> {
        Ok(self.fleet.sandbox(&caller.owner, id)?)
    }

    /// Runs a command in the caller's sandbox `id` and returns when it ends.
    pub async fn exec(
        &self,
        caller: &Caller,
        id: &SandboxId,
        input: ExecInput,
    ) -> ServiceResult<ExecOutput> {
        let req = exec_request(&input)?;
        let sandbox = self.running_sandbox(caller, id)?;
        let start = Instant::now();
        let out = match &input.stdin {
            Some(text) => sandbox.exec_with_stdin(req, text.as_bytes()).await?,
            None => sandbox.exec(req).await?,
        };
        self.metrics.exec_latency.observe(start.elapsed());
        Ok(ExecOutput {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            exit_code: out.result.exit_code,
            ok: out.result.exit_code == Some(0),
            result: ExitInfo::from(&out.result),
        })
    }

    /// Runs a command in the caller's sandbox `id` and follows it: `stdout` and `stderr`
    /// events, then one `exit` (or an `error`). The command has started when this returns
    /// (with its stdin written and closed, when the input has one).
    pub async fn exec_stream(
        &self,
        caller: &Caller,
        id: &SandboxId,
        input: ExecInput,
    ) -> ServiceResult<Events<ExecStreamEvent>> {
        let req = exec_request(&input)?;
        let sandbox = self.running_sandbox(caller, id)?;
        let mut stream = sandbox.exec_stream(req).await?;
        if let Some(text) = &input.stdin {
            stream.write_stdin(text.as_bytes()).await?;
            stream.close_stdin().await?;
        }
        Ok(
            futures_util::stream::unfold(Some(stream), |state| async move {
                let mut stream = state?;
                let chunk = |b: Vec<u8>| ExecChunk {
                    data: String::from_utf8_lossy(&b).into_owned(),
                };
                let event = match stream.next().await? {
                    Ok(ExecEvent::Stdout(b)) => ExecStreamEvent::Stdout(chunk(b)),
                    Ok(ExecEvent::Stderr(b)) => ExecStreamEvent::Stderr(chunk(b)),
                    // As the collected answer, without the output; the last event.
                    Ok(ExecEvent::Exit(result)) => {
                        return Some((ExecStreamEvent::Exit(ExitEvent::from(&result)), None));
                    }
                    Err(e) => return Some((ExecStreamEvent::Error(stream_error(e)), None)),
                };
                Some((event, Some(stream)))
            })
            .boxed(),
        )
    }
}

/// A service over an engine without backends and an in-memory store: enough for what
/// fails before any sandbox is reached.
#[cfg(test)]
pub(crate) mod testing {
    use std::future::Future;
    use std::sync::Arc;

    use sandcell_engine::Engine;
    use sandcell_engine::fleet::{Fleet, FleetLimits};
    use sandcell_store::Store;

    use crate::ledger::StoreLedger;
    use crate::signed_url::UrlSigner;
    use crate::{Caller, Service};

    /// A sandbox id for a test.
    pub fn sid(id: &str) -> sandcell_api::SandboxId {
        sandcell_api::SandboxId::parse(id).expect("a test's sandbox id")
    }

    /// The service (its home in the returned folder) and a caller.
    pub fn service() -> (Arc<Service>, Caller, tempfile::TempDir) {
        let home = tempfile::tempdir().expect("temp home");
        let (config, _) = crate::config::load(home.path(), None, &[], &[]).expect("config");
        let store = Arc::new(Store::open_in_memory().expect("store"));
        let fleet = Arc::new(Fleet::new(
            Engine::builder().build(),
            Arc::new(StoreLedger::new(store.clone())),
            FleetLimits::default(),
        ));
        let service = Service::new(fleet, store, config, UrlSigner::with_key([7; 32]));
        let caller = Caller {
            owner: "alice".into(),
            key_id: "k1".into(),
            admin: false,
            request_id: None,
        };
        (Arc::new(service), caller, home)
    }

    /// Runs a future to its end.
    pub fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_become_requests_or_clear_errors() {
        let input = ExecInput {
            cmd: Some("echo hi".into()),
            timeout_secs: Some(Timeout::from_secs(1.5).unwrap()),
            ..ExecInput::default()
        };
        let req = exec_request(&input).unwrap();
        assert_eq!(req.timeout_ms, Some(1500));
        for bad in [
            ExecInput::default(),
            ExecInput {
                cmd: Some("x".into()),
                argv: Some(vec!["y".into()]),
                ..ExecInput::default()
            },
            ExecInput {
                argv: Some(vec![]),
                ..ExecInput::default()
            },
            ExecInput {
                argv: Some(vec![String::new()]),
                ..ExecInput::default()
            },
            ExecInput {
                cmd: Some("  ".into()),
                ..ExecInput::default()
            },
        ] {
            assert_eq!(
                exec_request(&bad).unwrap_err().code(),
                "invalid_argument",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn requests_fail_on_their_shape_before_any_sandbox() {
        let (service, caller, _home) = testing::service();
        let echo = || ExecInput {
            cmd: Some("echo hi".into()),
            ..ExecInput::default()
        };
        testing::block_on(async {
            let e = service
                .exec(&caller, &testing::sid("sb-1a2b"), echo())
                .await
                .unwrap_err();
            assert_eq!(e.code(), "not_found", "{}", e.message);
            // The input is checked before the sandbox is looked for.
            let e = service
                .exec(&caller, &testing::sid("sb-1a2b"), ExecInput::default())
                .await
                .unwrap_err();
            assert_eq!(e.code(), "invalid_argument", "{}", e.message);
            let e = service
                .exec_stream(&caller, &testing::sid("sb-1a2b"), echo())
                .await
                .err()
                .unwrap();
            assert_eq!(e.code(), "not_found", "{}", e.message);
        });
    }

    #[test]
    fn stream_errors_carry_the_kind_and_message() {
        let e: StreamError = ServiceError::invalid("bad").into();
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("invalid_argument", "bad")
        );
        assert!(e.details.is_null());
    }
}
