//! Host calls through the agent: a Python cell asks, the agent forwards the question on the
//! execution's request id, the host (this test) answers, the cell goes on.

use std::time::Duration;

use sandcell_protocol::{
    CodeStatus, GuestMessage, HostCall, HostCallErrorKind, HostCallResult, HostMessage, Language,
    RunCodeRequest,
};

use super::client::Agent;

/// What one execution sent back, the host calls it made included.
#[derive(Debug, Default)]
struct Run {
    stdout: String,
    result: Option<String>,
    errors: Vec<(String, String)>,
    calls: Vec<HostCall>,
    status: Option<CodeStatus>,
}

fn start(agent: &mut Agent, code: &str, timeout_ms: Option<u64>) -> u32 {
    let id = agent.new_id();
    agent.send(
        id,
        &HostMessage::RunCode(RunCodeRequest {
            context: None,
            language: Some(Language::Python),
            code: code.into(),
            timeout_ms: Some(timeout_ms.unwrap_or(60_000)),
        }),
    );
    id
}

/// Reads execution `id` to its end; `answer` decides each host call's reply (`None`: none).
fn follow(
    agent: &mut Agent,
    id: u32,
    mut answer: impl FnMut(&HostCall) -> Option<HostCallResult>,
) -> Run {
    let mut run = Run::default();
    loop {
        match agent.reply(id) {
            GuestMessage::CodeStream { text, .. } => run.stdout.push_str(&text),
            GuestMessage::CodeResult { data, .. } => {
                run.result = data
                    .get("text/plain")
                    .and_then(|v| v.as_str())
                    .map(str::to_string);
            }
            GuestMessage::CodeError(e) => run.errors.push((e.ename, e.evalue)),
            GuestMessage::HostCall(call) => {
                if let Some(result) = answer(&call) {
                    agent.send(
                        id,
                        &HostMessage::HostCallReply {
                            call: call.call,
                            result,
                        },
                    );
                }
                run.calls.push(call);
            }
            GuestMessage::CodeDone(done) => {
                run.status = Some(done.status);
                return run;
            }
            GuestMessage::CodeDisplay { .. } => {}
            other => panic!("unexpected reply to a run: {other:?}"),
        }
    }
}

#[test]
fn a_call_travels_to_the_host_and_its_answer_back_to_the_cell() {
    let mut agent = Agent::start();
    let id = start(
        &mut agent,
        "a = llm_query('2+2?')\nb = llm_query_batched(['x', 'y'])\nFINAL(a)\n(a, b)",
        None,
    );
    let run = follow(&mut agent, id, |call| {
        Some(HostCallResult::Ok(match call.method.as_str() {
            "llm_query" => serde_json::json!("4"),
            "llm_query_batched" => serde_json::json!(["X", "Y"]),
            _ => serde_json::Value::Null,
        }))
    });
    assert_eq!(run.status, Some(CodeStatus::Ok), "{run:?}");
    assert_eq!(run.result.as_deref(), Some("('4', ['X', 'Y'])"));
    let methods: Vec<&str> = run.calls.iter().map(|c| c.method.as_str()).collect();
    assert_eq!(methods, ["llm_query", "llm_query_batched", "final"]);
    assert_eq!(run.calls[0].payload, serde_json::json!({"prompt": "2+2?"}));
    assert_eq!(run.calls[2].payload, serde_json::json!({"answer": "4"}));
}

#[test]
fn an_error_answer_is_an_exception_in_the_cell() {
    let mut agent = Agent::start();
    let id = start(&mut agent, "llm_query('q')", None);
    let run = follow(&mut agent, id, |_| {
        Some(HostCallResult::error(
            HostCallErrorKind::Budget,
            "the run's sub-call budget is spent (budget:sub_calls)",
        ))
    });
    assert_eq!(run.status, Some(CodeStatus::Error));
    assert_eq!(
        run.errors,
        [(
            "SandcellBudgetError".to_string(),
            "llm_query: the run's sub-call budget is spent (budget:sub_calls)".to_string()
        )]
    );
}

#[test]
fn a_host_of_protocol_1_gets_no_host_calls() {
    let mut agent = Agent::raw();
    let hello = agent.call(HostMessage::Hello {
        protocol: 1,
        client: "an older host".into(),
    });
    assert!(
        matches!(hello, GuestMessage::HelloOk { protocol: 1, .. }),
        "{hello:?}"
    );
    let id = start(&mut agent, "llm_query('q')", None);
    let run = follow(&mut agent, id, |c| {
        panic!("a host call reached a v1 host: {c:?}")
    });
    assert_eq!(run.status, Some(CodeStatus::Error));
    let (ename, evalue) = &run.errors[0];
    assert_eq!(ename, "SandcellHostCallError");
    assert!(evalue.contains("unavailable"), "{evalue}");
}

#[test]
fn an_interrupt_breaks_the_wait_and_the_late_answer_is_dropped() {
    let mut agent = Agent::start();
    let id = start(&mut agent, "kept = 1", None);
    assert_eq!(
        follow(&mut agent, id, |_| None).status,
        Some(CodeStatus::Ok)
    );
    let id = start(&mut agent, "llm_query('never answered')", None);
    let GuestMessage::HostCall(call) = agent.reply(id) else {
        panic!("no host call");
    };
    assert_eq!(
        agent.call(HostMessage::Interrupt {
            context: "python".into()
        }),
        GuestMessage::Ok
    );
    let run = follow(&mut agent, id, |_| None);
    assert_eq!(run.status, Some(CodeStatus::Interrupted), "{run:?}");
    assert_eq!(run.errors[0].0, "KeyboardInterrupt");
    // The host's answer after the end: dropped, never answered, never seen by the kernel.
    agent.send(
        id,
        &HostMessage::HostCallReply {
            call: call.call,
            result: HostCallResult::Ok(serde_json::json!("late")),
        },
    );
    assert_eq!(agent.pending_for(id, Duration::from_millis(200)), 0);
    let id = start(&mut agent, "kept + 1", None);
    let run = follow(&mut agent, id, |_| None);
    assert_eq!(run.result.as_deref(), Some("2"), "{run:?}");
}

#[test]
fn waiting_for_the_host_does_not_count_against_the_timeout() {
    let mut agent = Agent::start();
    let id = start(&mut agent, "llm_query('slow')", Some(500));
    let run = follow(&mut agent, id, |_| {
        // The host takes longer than the cell's whole timeout.
        std::thread::sleep(Duration::from_millis(1200));
        Some(HostCallResult::Ok(serde_json::json!("done")))
    });
    assert_eq!(run.status, Some(CodeStatus::Ok), "{run:?}");
    assert_eq!(run.result.as_deref(), Some("'done'"));
    // The code's own time still counts.
    let id = start(&mut agent, "import time\ntime.sleep(3)", Some(500));
    let run = follow(&mut agent, id, |_| None);
    assert_eq!(run.status, Some(CodeStatus::Timeout), "{run:?}");
}
