//! The client against a canned HTTP server on loopback: typed streams read to their end
//! whatever the chunking, error answers parsed, the key sent, downloads streamed.
#![allow(clippy::unwrap_used)]

use sandcell_api::code::{CodeInput, CodeStreamEvent};
use sandcell_client::{Client, ClientError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves one connection: reads a request (headers and a `Content-Length` body), answers
/// `status` with `headers`, then `body` in `chunks` pieces (each its own write, flushed);
/// returns what was asked.
async fn serve_once(
    status: &'static str,
    headers: &'static str,
    body: Vec<u8>,
    chunks: usize,
) -> (String, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            request.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        let head = format!("HTTP/1.1 {status}\r\n{headers}connection: close\r\n\r\n");
        conn.write_all(head.as_bytes()).await.unwrap();
        let size = body.len().div_ceil(chunks.max(1)).max(1);
        for piece in body.chunks(size) {
            conn.write_all(piece).await.unwrap();
            conn.flush().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        conn.shutdown().await.ok();
        String::from_utf8_lossy(&request).into_owned()
    });
    (url, task)
}

const CODE_EVENTS: &str = ": keep-alive\n\n\
event: stdout\ndata: {\"text\":\"before\\n\"}\n\n\
event: error\ndata: {\"name\":\"KernelDied\",\"value\":\"the python kernel died: exit 7\",\"traceback\":[]}\n\n\
event: done\ndata: {\"context\":\"python\",\"language\":\"python\",\"status\":\"crashed\",\"execution_count\":1,\"duration_ms\":3.5,\"exit_code\":null,\"state_lost\":true,\"kernel_restarted\":false,\"crash\":\"exit 7\",\"notice\":null,\"artifacts\":[],\"stdout_dropped\":0,\"stderr_dropped\":0}\n\n";

#[tokio::test]
async fn a_code_stream_with_an_error_without_traceback_reaches_done() {
    for chunks in [1, 7, CODE_EVENTS.len()] {
        let (url, server) = serve_once(
            "200 OK",
            "content-type: text/event-stream\r\n",
            CODE_EVENTS.as_bytes().to_vec(),
            chunks,
        )
        .await;
        let client = Client::builder(url).api_key("sc_test").build().unwrap();
        let req = CodeInput {
            code: sandcell_api::Code::new("import os; os._exit(7)").unwrap(),
            ..CodeInput::default()
        };
        let mut events = client
            .run_code_stream("sb-0123456789ab", &req)
            .await
            .unwrap();
        let mut seen = Vec::new();
        while let Some(event) = events.next().await {
            seen.push(event.unwrap());
        }
        assert_eq!(seen.len(), 3, "{chunks} chunks: {seen:?}");
        assert!(matches!(&seen[0], CodeStreamEvent::Stdout(t) if t.text == "before\n"));
        assert!(
            matches!(&seen[1], CodeStreamEvent::Error(e) if e.name == "KernelDied" && e.value.contains("died")),
            "{:?}",
            seen[1]
        );
        assert!(matches!(&seen[2], CodeStreamEvent::Done(d) if d.status == "crashed"));
        let request = server.await.unwrap();
        assert!(
            request.starts_with("POST /v1/sandboxes/sb-0123456789ab/code/stream HTTP/1.1"),
            "{request}"
        );
        assert!(
            request.to_ascii_lowercase().contains("x-api-key: sc_test"),
            "{request}"
        );
    }
}

#[tokio::test]
async fn a_stream_error_event_is_the_service_failure() {
    let body = "event: error\ndata: {\"code\":\"sandbox_gone\",\"message\":\"it stopped\"}\n\n";
    let (url, _server) = serve_once(
        "200 OK",
        "content-type: text/event-stream\r\n",
        body.as_bytes().to_vec(),
        1,
    )
    .await;
    let client = Client::builder(url).build().unwrap();
    let mut events = client
        .run_code_stream("sb-0123456789ab", &CodeInput::default())
        .await
        .unwrap();
    let event = events.next().await.unwrap().unwrap();
    assert!(
        matches!(&event, CodeStreamEvent::Failed(e) if e.code == "sandbox_gone"),
        "{event:?}"
    );
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn error_answers_carry_the_body() {
    let body = br#"{"code":"not_found","message":"no sandbox sb-0123456789ab","details":{"id":"sb-0123456789ab"}}"#;
    let (url, _server) = serve_once(
        "404 Not Found",
        "content-type: application/json\r\n",
        body.to_vec(),
        1,
    )
    .await;
    let client = Client::builder(url).build().unwrap();
    let err = client.sandbox("sb-0123456789ab").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "not_found (404): no sandbox sb-0123456789ab"
    );
    let ClientError::Api { status, body } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        (*status, body.details["id"].as_str()),
        (404, Some("sb-0123456789ab"))
    );
}

#[tokio::test]
async fn downloads_arrive_in_chunks_and_whole() {
    let bytes: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let (url, server) = serve_once(
        "200 OK",
        "content-type: application/octet-stream\r\n",
        bytes.clone(),
        13,
    )
    .await;
    let client = Client::builder(url).build().unwrap();
    let mut got = Vec::new();
    let n = client
        .read_file("sb-0123456789ab", "/workspace/a b.bin", |c| {
            got.extend_from_slice(c);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!((n, got == bytes), (200_000, true));
    let request = server.await.unwrap();
    assert!(
        request.starts_with(
            "GET /v1/sandboxes/sb-0123456789ab/files/content?path=%2Fworkspace%2Fa+b.bin "
        ),
        "{request}"
    );
}

const RUN_EVENTS: &str = ": keep-alive\n\n\
id: 4\nevent: llm_response\ndata: {\"seq\":4,\"type\":\"llm_response\",\"text\":\"hi\"}\n\n\
id: 5\nevent: run_finished\ndata: {\"seq\":5,\"type\":\"run_finished\",\"status\":\"succeeded\"}\n\n";

#[tokio::test]
async fn a_run_is_followed_from_an_event_as_json_values() {
    for chunks in [1, 5, RUN_EVENTS.len()] {
        let (url, server) = serve_once(
            "200 OK",
            "content-type: text/event-stream\r\n",
            RUN_EVENTS.as_bytes().to_vec(),
            chunks,
        )
        .await;
        let client = Client::builder(url).api_key("sc_test").build().unwrap();
        let mut events = client.follow_run("run-0123456789abcdef", 3).await.unwrap();
        let mut got = Vec::new();
        while let Some(e) = events.next().await {
            got.push(e.unwrap());
        }
        let seqs: Vec<u64> = got.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, [4, 5], "{chunks} chunks");
        assert_eq!(got[1]["status"], "succeeded");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("GET /v1/runs/run-0123456789abcdef/events?after=3 "),
            "{request}"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("accept: text/event-stream")
        );
    }
}

#[tokio::test]
async fn a_runs_events_are_read_as_a_json_list() {
    let body = br#"{"events":[{"seq":1,"type":"run_started"},{"seq":2,"type":"warning"}]}"#;
    let (url, server) = serve_once(
        "200 OK",
        "content-type: application/json\r\n",
        body.to_vec(),
        1,
    )
    .await;
    let client = Client::builder(url).api_key("sc_test").build().unwrap();
    let events = client.run_events("run-0123456789abcdef", 0).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["type"], "warning");
    let request = server.await.unwrap();
    assert!(
        request.starts_with(
            "GET /v1/runs/run-0123456789abcdef/events?format=json&after=0&limit=1000 "
        ),
        "{request}"
    );
}
