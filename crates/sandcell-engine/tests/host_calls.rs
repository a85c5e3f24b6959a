//! Host calls through the engine (`Sandbox::run_code_with`) on the test backend: the real
//! guest agent and a real Python kernel, the handler a closure of the test.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sandcell_engine::client::GuestClient;
use sandcell_engine::host_call::{HostCallError, HostCallErrorKind};
use sandcell_engine::{
    CodeEvent, Engine, HostCallFuture, HostCallHandler, HostCallRequest, Sandbox, SandboxSpec,
};
use sandcell_protocol::{
    CodeStatus, ErrorCode, FrameDecoder, GuestMessage, HostMessage, IsolationReport, Language,
    RunCodeRequest, WireError, encode_message,
};
use sandcell_testkit::local::LocalBackend;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn sandbox() -> (Sandbox, LocalBackend) {
    let backend = LocalBackend::new();
    let engine = Engine::builder().backend(backend.clone()).build();
    let sandbox = engine.create(SandboxSpec::default()).await.unwrap();
    (sandbox, backend)
}

fn python(code: &str, timeout_ms: u64) -> RunCodeRequest {
    RunCodeRequest {
        context: None,
        language: Some(Language::Python),
        code: code.into(),
        timeout_ms: Some(timeout_ms),
    }
}

/// A handler that upper-cases prompts (one at a time, or a batch), counting the calls.
fn shouting(calls: Arc<AtomicUsize>) -> Arc<dyn HostCallHandler> {
    Arc::new(move |req: HostCallRequest| -> HostCallFuture {
        calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match req.method.as_str() {
                "llm_query" => Ok(json!(
                    req.payload["prompt"]
                        .as_str()
                        .unwrap_or_default()
                        .to_uppercase()
                )),
                "llm_query_batched" => Ok(Value::Array(
                    req.payload["prompts"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| json!(p.as_str().unwrap().to_uppercase()))
                        .collect(),
                )),
                "slow" => {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Ok(json!("late but fine"))
                }
                other => Err(HostCallError::new(
                    HostCallErrorKind::UnknownMethod,
                    format!("no method {other}"),
                )),
            }
        })
    })
}

#[tokio::test]
async fn a_handler_answers_the_code_and_the_answers_come_back() {
    let (sandbox, _backend) = sandbox().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let run = sandbox
        .run_code_with(
            python(
                "one = llm_query('hello')\nmany = llm_query_batched(['a', 'b', 'c'])\n(one, many)",
                30_000,
            ),
            shouting(calls.clone()),
        )
        .await
        .unwrap();
    assert!(run.ok(), "{run:?}");
    assert_eq!(run.result_text(), Some("('HELLO', ['A', 'B', 'C'])"));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "a batch is one host call");
    // A method the handler does not serve is the code's exception.
    let run = sandbox
        .run_code_with(
            python("llm_query.__globals__['_host_call']('nope', {})", 30_000),
            shouting(calls.clone()),
        )
        .await
        .unwrap();
    let err = run.error.expect("an error");
    assert_eq!(
        (err.ename.as_str(), err.evalue.as_str()),
        ("SandcellHostCallError", "nope: no method nope")
    );
}

#[tokio::test]
async fn without_a_handler_host_calls_are_unavailable() {
    let (sandbox, _backend) = sandbox().await;
    let run = sandbox
        .run(Language::Python, "llm_query('anyone there?')")
        .await
        .unwrap();
    assert_eq!(run.done.status, CodeStatus::Error);
    let err = run.error.expect("an error");
    assert_eq!(err.ename, "SandcellHostCallError");
    assert!(
        err.evalue.contains("unavailable") && err.evalue.contains("host-call handler"),
        "{}",
        err.evalue
    );
    // The kernel goes on as before.
    let run = sandbox.run(Language::Python, "1 + 1").await.unwrap();
    assert_eq!(run.result_text(), Some("2"));
}

/// Sets a flag when dropped: tells whether a handler's work was abandoned.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn an_interrupt_breaks_the_wait_and_abandons_the_answer() {
    let (sandbox, _backend) = sandbox().await;
    sandbox.run(Language::Python, "kept = 41").await.unwrap();
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let dropped = Arc::new(AtomicUsize::new(0));
    let seen = dropped.clone();
    let handler: Arc<dyn HostCallHandler> =
        Arc::new(move |_req: HostCallRequest| -> HostCallFuture {
            if let Some(tx) = started_tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            let guard = Dropped(seen.clone());
            Box::pin(async move {
                let _guard = guard;
                // Never answers.
                std::future::pending::<()>().await;
                Ok(Value::Null)
            })
        });
    let mut stream = sandbox
        .run_code_stream_with(python("llm_query('forever')", 60_000), Some(handler))
        .await
        .unwrap();
    let interrupter = {
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            started.await.unwrap();
            sandbox.interrupt("python").await.unwrap();
        })
    };
    let begun = Instant::now();
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.unwrap());
    }
    interrupter.await.unwrap();
    assert!(begun.elapsed() < Duration::from_secs(20));
    let Some(CodeEvent::Done(done)) = events.last() else {
        panic!("no done: {events:?}");
    };
    assert_eq!(done.status, CodeStatus::Interrupted, "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, CodeEvent::Error(e) if e.ename == "KeyboardInterrupt"))
    );
    // The handler's work is abandoned once the execution is over (its task aborted: dropped
    // at the runtime's next turn).
    let abandoned = tokio::time::timeout(Duration::from_secs(5), async {
        while dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(abandoned.is_ok(), "the handler's future was never dropped");
    let run = sandbox.run(Language::Python, "kept + 1").await.unwrap();
    assert_eq!(run.result_text(), Some("42"), "the kernel's state is kept");
}

#[tokio::test]
async fn a_slow_answer_does_not_time_the_cell_out() {
    let (sandbox, _backend) = sandbox().await;
    let calls = Arc::new(AtomicUsize::new(0));
    // The handler takes 1.5 s; the cell may run 0.5 s: waiting for the host does not count.
    let started = Instant::now();
    let run = sandbox
        .run_code_with(
            python("llm_query.__globals__['_host_call']('slow', {})", 500),
            shouting(calls),
        )
        .await
        .unwrap();
    assert!(run.ok(), "{run:?}");
    assert_eq!(run.result_text(), Some("'late but fine'"));
    assert!(started.elapsed() >= Duration::from_millis(1500));
}

/// Plays an agent that speaks only protocol 1 (one an older build started) for the
/// handshake: refuses 2, accepts 1.
async fn old_agent(mut stream: tokio::net::UnixStream) -> Vec<u32> {
    let mut decoder = FrameDecoder::default();
    let mut proposed = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        if n == 0 {
            return proposed;
        }
        decoder.feed(&buf[..n]);
        while let Some(frame) = decoder.next_frame::<HostMessage>() {
            let sandcell_protocol::Frame::Message { id, msg } = frame.unwrap() else {
                continue;
            };
            let reply = match msg {
                HostMessage::Hello { protocol: 1, .. } => {
                    proposed.push(1);
                    GuestMessage::HelloOk {
                        protocol: 1,
                        agent_version: "0.old".into(),
                        isolation: IsolationReport::default(),
                    }
                }
                HostMessage::Hello { protocol, .. } => {
                    proposed.push(protocol);
                    GuestMessage::Error(WireError::new(
                        ErrorCode::UnsupportedVersion,
                        format!(
                            "protocol version {protocol} is not supported; this agent speaks 1"
                        ),
                    ))
                }
                _ => return proposed,
            };
            stream.write_all(&encode_message(id, &reply)).await.unwrap();
        }
    }
}

#[tokio::test]
async fn an_agent_of_protocol_1_is_greeted_with_1() {
    let (host, guest) = tokio::net::UnixStream::pair().unwrap();
    let agent = tokio::spawn(old_agent(guest));
    let (client, hello) = GuestClient::connect(Box::new(host), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(hello.protocol, 1);
    assert_eq!(hello.agent_version, "0.old");
    drop(client);
    assert_eq!(agent.await.unwrap(), [2, 1]);
}

#[tokio::test]
async fn the_host_going_away_fails_the_pending_calls_and_the_cell_goes_on() {
    let backend = LocalBackend::new();
    let first = Engine::builder().backend(backend.clone()).build();
    let sandbox = first.create(SandboxSpec::default()).await.unwrap();
    let (id, spec, runtime) = (
        sandbox.id().to_string(),
        sandbox.spec().clone(),
        sandbox.runtime(),
    );
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let handler: Arc<dyn HostCallHandler> =
        Arc::new(move |_req: HostCallRequest| -> HostCallFuture {
            if let Some(tx) = started_tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            Box::pin(std::future::pending())
        });
    let code = "try:\n    llm_query('anyone?')\n    after = 'answered'\n\
                except SandcellCancelledError as e:\n    after = str(e)";
    let mut stream = sandbox
        .run_code_stream_with(python(code, 60_000), Some(handler))
        .await
        .unwrap();
    let reader = tokio::spawn(async move { while stream.next().await.is_some() {} });
    started.await.unwrap();
    // The host goes away (a daemon stopping) while the cell waits, leaving the sandbox.
    sandbox.detach();
    reader.abort();
    let _ = reader.await;
    drop(sandbox);
    drop(first);
    // A host that comes back finds the cell ended and the kernel as it left it.
    let second = Engine::builder().backend(backend.clone()).build();
    let sandbox = second.reattach(id, spec, &runtime).await.unwrap();
    let after = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match sandbox
                .get_variables("python", Some(vec!["after".into()]))
                .await
            {
                Ok(v) if v.values.contains_key("after") => return v.values["after"].clone(),
                // Busy, or not set yet.
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the cell ended once its host was gone");
    assert_eq!(
        after,
        json!("llm_query: the host's connection ended before it answered")
    );
    sandbox.destroy().await.unwrap();
}
