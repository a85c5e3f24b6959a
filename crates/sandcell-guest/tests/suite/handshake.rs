//! Handshake, frame errors, request ids and the end of the connection.

use std::time::{Duration, Instant};

use sandcell_protocol::{
    ErrorCode, ExecRequest, FeatureState, GuestMessage, HostMessage, MAX_FRAME_LEN,
    PROTOCOL_VERSION,
};

use super::client::{Agent, alive, expect_code, wait_dead};

#[test]
fn hello_is_answered_with_version_and_isolation() {
    let mut agent = Agent::raw_with(|c| {
        c.isolation
            .set("seccomp", FeatureState::Active, "deny-list loaded")
    });
    match agent.hello() {
        GuestMessage::HelloOk {
            protocol,
            agent_version,
            isolation,
        } => {
            assert_eq!(protocol, PROTOCOL_VERSION);
            assert_eq!(agent_version, env!("CARGO_PKG_VERSION"));
            assert!(isolation.is_active("seccomp"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}

#[test]
fn requests_before_hello_need_the_handshake() {
    let mut agent = Agent::raw();
    let msg = expect_code(agent.call(HostMessage::Ping), ErrorCode::HandshakeRequired);
    assert_eq!(msg, "send hello first");
    let exec = HostMessage::Exec(ExecRequest::argv(["true"]));
    expect_code(agent.call(exec), ErrorCode::HandshakeRequired);
    agent.hello();
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}

#[test]
fn unsupported_version_is_refused_and_a_good_hello_still_works() {
    let mut agent = Agent::raw();
    let msg = expect_code(
        agent.call(HostMessage::Hello {
            protocol: 7,
            client: "old".into(),
        }),
        ErrorCode::UnsupportedVersion,
    );
    assert_eq!(
        msg,
        "protocol version 7 is not supported; this agent speaks 1, 2"
    );
    // Still waiting for a good hello.
    expect_code(agent.call(HostMessage::Ping), ErrorCode::HandshakeRequired);
    agent.hello();
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}

#[test]
fn garbage_json_gets_bad_frame_and_the_agent_keeps_serving() {
    let mut agent = Agent::start();
    let payload = b"{not json";
    let mut frame = Vec::new();
    frame.extend_from_slice(&(payload.len() as u32 + 5).to_be_bytes());
    frame.push(1);
    frame.extend_from_slice(&42u32.to_be_bytes());
    frame.extend_from_slice(payload);
    agent.send_raw(&frame);
    let msg = expect_code(agent.reply(42), ErrorCode::BadFrame);
    assert!(msg.starts_with("malformed message"), "{msg}");
    // An unknown frame kind is reported on its id too.
    let mut unknown = sandcell_protocol::encode_message(43, &HostMessage::Ping);
    unknown[4] = 9;
    agent.send_raw(&unknown);
    expect_code(agent.reply(43), ErrorCode::BadFrame);
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}

#[test]
fn oversized_frame_gets_frame_too_large_and_the_agent_keeps_serving() {
    let mut agent = Agent::start();
    let len = MAX_FRAME_LEN + 1;
    let mut frame = Vec::with_capacity(len as usize + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.push(2);
    frame.extend_from_slice(&77u32.to_be_bytes());
    frame.resize(len as usize + 4, 0xab);
    agent.send_raw(&frame);
    let msg = expect_code(agent.reply(77), ErrorCode::FrameTooLarge);
    assert_eq!(
        msg,
        format!("frame of {len} bytes is over the {MAX_FRAME_LEN}-byte limit")
    );
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}

#[test]
fn a_fatal_frame_error_is_reported_on_id_zero_and_closes() {
    let mut agent = Agent::start();
    // A length too short to hold a header: the stream cannot be trusted any more.
    agent.send_raw(&[0, 0, 0, 1, 0, 0, 0, 0, 0]);
    expect_code(agent.reply(0), ErrorCode::BadFrame);
    let result = agent.wait_done(Duration::from_secs(5));
    assert!(result.is_err(), "serve should report the broken stream");
}

#[test]
fn reusing_an_id_in_flight_is_invalid_state() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::argv(["sleep", "100"]));
    agent.send(id, &HostMessage::Ping);
    let msg = expect_code(agent.reply(id), ErrorCode::InvalidState);
    assert!(msg.contains(&id.to_string()), "{msg}");
    let kill = HostMessage::Signal {
        exec_id: Some(id),
        pid: None,
        signal: 9,
        tree: true,
    };
    assert_eq!(agent.call(kill), GuestMessage::Ok);
    let run = agent.finish_exec(id, pid);
    assert_eq!(run.exit.signal, Some(9));
    // The id is free again once the exec reported its exit.
    agent.send(id, &HostMessage::Ping);
    assert_eq!(agent.reply(id), GuestMessage::Pong);
}

#[test]
fn shutdown_replies_ok_kills_processes_and_returns() {
    let mut agent = Agent::start();
    let (_, pid) = agent.start_exec(ExecRequest::argv(["sleep", "100"]));
    assert!(alive(pid));
    assert_eq!(agent.call(HostMessage::Shutdown), GuestMessage::Ok);
    assert!(agent.wait_done(Duration::from_secs(5)).is_ok());
    assert!(
        wait_dead(pid, Duration::from_secs(2)),
        "sleep {pid} survived shutdown"
    );
}

#[test]
fn eof_from_the_host_ends_serve_and_kills_running_execs() {
    let mut agent = Agent::start();
    let (id, pid) = agent.start_exec(ExecRequest::shell("sleep 100 & echo $!; sleep 100"));
    // The background sleep's pid arrives as the exec's first output.
    let child = match agent.next_for(id) {
        sandcell_protocol::Frame::Data { chunk, .. } => String::from_utf8_lossy(&chunk.bytes)
            .trim()
            .parse::<i32>()
            .unwrap(),
        other => panic!("expected output, got {other:?}"),
    };
    assert!(alive(pid) && alive(child));
    let started = Instant::now();
    assert!(agent.close_and_wait(Duration::from_secs(5)).is_ok());
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        wait_dead(pid, Duration::from_secs(2)),
        "exec {pid} survived eof"
    );
    assert!(
        wait_dead(child, Duration::from_secs(2)),
        "child {child} survived eof"
    );
}

#[test]
fn request_id_zero_is_reserved() {
    let mut agent = Agent::start();
    agent.send(0, &HostMessage::Ping);
    expect_code(agent.reply(0), ErrorCode::InvalidArgument);
    assert_eq!(agent.call(HostMessage::Ping), GuestMessage::Pong);
}
