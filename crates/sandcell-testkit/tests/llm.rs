//! The scripted LLM server seen from a raw HTTP client: every shape of both protocols, plain
//! and streamed (reassembled here as a client must), usage, faults, delays, what is recorded,
//! and the `scripted-llm` binary.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sandcell_testkit::llm::{
    Fault, NO_MORE_TURNS, Protocol, Script, ScriptedCall, ScriptedLlm, Turn, Usage,
};
use serde_json::{Value, json};

const OPENAI_KEY: &str = "sk-test-openai-key";
const ANTHROPIC_KEY: &str = "sk-ant-test-key";

async fn start(script: Script) -> ScriptedLlm {
    ScriptedLlm::start(script).await.expect("server starts")
}

async fn post_openai(llm: &ScriptedLlm, body: &Value) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", llm.openai_base()))
        .bearer_auth(OPENAI_KEY)
        .json(body)
        .send()
        .await
}

async fn post_anthropic(llm: &ScriptedLlm, body: &Value) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{}/v1/messages", llm.anthropic_base()))
        .header("x-api-key", ANTHROPIC_KEY)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
}

fn openai_body(stream: bool) -> Value {
    json!({
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "function", "function": {"name": "run_code", "parameters": {"type": "object"}}}],
        "stream": stream,
    })
}

fn anthropic_body(stream: bool) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"name": "run_code", "input_schema": {"type": "object"}}],
        "stream": stream,
    })
}

fn two_calls() -> Vec<ScriptedCall> {
    vec![
        ScriptedCall::new(
            "run_code",
            json!({"language": "python", "code": "print('héllo')\nprint(6 * 7)"}),
        ),
        ScriptedCall::new(
            "read_file",
            json!({"path": "/workspace/notes/a-long-file-name.txt"}),
        ),
    ]
}

const LONG_TEXT: &str = "The answer is 42, said the scripted server — twice ✓.";

/// (event name, data) of each server-sent event.
fn sse(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push(d);
                }
            }
            (name, data.join("\n"))
        })
        .collect()
}

/// An OpenAI stream put back together as a client must.
#[derive(Debug, Default)]
struct OpenAiStream {
    role: Option<String>,
    content: String,
    content_pieces: usize,
    /// index -> (id, name, arguments, fragments)
    calls: BTreeMap<u64, (String, String, String, usize)>,
    /// The index of each tool-call fragment, in arrival order.
    fragment_order: Vec<u64>,
    finish: Option<String>,
    usage: Option<Value>,
    chunks_with_usage_key: usize,
    done: bool,
}

fn reassemble_openai(text: &str) -> OpenAiStream {
    let mut s = OpenAiStream::default();
    for (name, data) in sse(text) {
        assert!(name.is_none(), "OpenAI streams have no event names");
        assert!(!s.done, "nothing may follow [DONE]");
        if data == "[DONE]" {
            s.done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).expect("chunk is JSON");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert!(
            chunk["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("chatcmpl-"))
        );
        assert_eq!(chunk["model"], "gpt-test");
        if chunk.get("usage").is_some() {
            s.chunks_with_usage_key += 1;
        }
        let choices = chunk["choices"].as_array().expect("choices is a list");
        if choices.is_empty() {
            assert!(s.usage.is_none(), "one usage chunk");
            s.usage = Some(chunk["usage"].clone());
            continue;
        }
        assert!(s.usage.is_none(), "the usage chunk comes last");
        let choice = &choices[0];
        assert_eq!(choice["index"], 0);
        let delta = &choice["delta"];
        if let Some(role) = delta["role"].as_str() {
            assert!(s.role.is_none(), "the role comes once");
            s.role = Some(role.to_string());
        }
        if let Some(c) = delta["content"].as_str()
            && !c.is_empty()
        {
            s.content.push_str(c);
            s.content_pieces += 1;
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().expect("every fragment has an index");
            s.fragment_order.push(index);
            let args = tc["function"]["arguments"].as_str().unwrap_or("");
            match tc.get("id") {
                Some(id) => {
                    assert!(
                        !s.calls.contains_key(&index),
                        "only the first fragment has an id"
                    );
                    assert_eq!(tc["type"], "function");
                    let name = tc["function"]["name"]
                        .as_str()
                        .expect("first fragment names it");
                    s.calls.insert(
                        index,
                        (
                            id.as_str().expect("id").to_string(),
                            name.to_string(),
                            args.to_string(),
                            1,
                        ),
                    );
                }
                None => {
                    assert!(tc.get("type").is_none() && tc["function"].get("name").is_none());
                    let call = s.calls.get_mut(&index).expect("a fragment of a named call");
                    call.2.push_str(args);
                    call.3 += 1;
                }
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            s.finish = Some(f.to_string());
        }
    }
    s
}

/// An Anthropic stream put back together as a client must.
#[derive(Debug, Default)]
struct AnthropicStream {
    events: Vec<String>,
    input_tokens: u64,
    start_output_tokens: u64,
    output_tokens: Option<u64>,
    /// The finished blocks, `input` parsed at content_block_stop.
    blocks: Vec<Value>,
    json_pieces: usize,
    text_pieces: usize,
    stop_reason: Option<String>,
    error: Option<Value>,
}

fn reassemble_anthropic(text: &str) -> AnthropicStream {
    let mut s = AnthropicStream::default();
    let mut open: BTreeMap<u64, (Value, String)> = BTreeMap::new();
    for (name, data) in sse(text) {
        let name = name.expect("every event is named");
        let ev: Value = serde_json::from_str(&data).expect("event data is JSON");
        assert_eq!(
            ev["type"],
            name.as_str(),
            "the event name matches data.type"
        );
        s.events.push(name.clone());
        match name.as_str() {
            "message_start" => {
                let m = &ev["message"];
                assert_eq!(m["type"], "message");
                assert_eq!(m["role"], "assistant");
                assert_eq!(m["content"], json!([]));
                assert!(m["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
                s.input_tokens = m["usage"]["input_tokens"].as_u64().expect("input tokens");
                s.start_output_tokens = m["usage"]["output_tokens"].as_u64().expect("output");
            }
            "content_block_start" => {
                let index = ev["index"].as_u64().expect("index");
                assert_eq!(index, s.blocks.len() as u64, "blocks come in order");
                open.insert(index, (ev["content_block"].clone(), String::new()));
            }
            "content_block_delta" => {
                let index = ev["index"].as_u64().expect("index");
                let (block, json_buf) = open.get_mut(&index).expect("delta of an open block");
                let d = &ev["delta"];
                match d["type"].as_str() {
                    Some("text_delta") => {
                        let t = d["text"].as_str().expect("text");
                        let joined = format!("{}{t}", block["text"].as_str().unwrap_or(""));
                        block["text"] = Value::String(joined);
                        s.text_pieces += 1;
                    }
                    Some("input_json_delta") => {
                        json_buf.push_str(d["partial_json"].as_str().expect("partial_json"));
                        s.json_pieces += 1;
                    }
                    other => panic!("unexpected delta {other:?}"),
                }
            }
            "content_block_stop" => {
                let index = ev["index"].as_u64().expect("index");
                let (mut block, json_buf) = open.remove(&index).expect("stop of an open block");
                if block["type"] == "tool_use" {
                    block["input"] = serde_json::from_str(&json_buf).expect("input JSON is whole");
                }
                s.blocks.push(block);
            }
            "message_delta" => {
                s.stop_reason = ev["delta"]["stop_reason"].as_str().map(str::to_string);
                s.output_tokens = ev["usage"]["output_tokens"].as_u64();
            }
            "message_stop" | "ping" => {}
            "error" => s.error = Some(ev["error"].clone()),
            other => panic!("unexpected event {other}"),
        }
    }
    s
}

// ---------------------------------------------------------------------------------------
// OpenAI

#[tokio::test]
async fn openai_plain_text() {
    let llm = start(Script::new().turn(Turn::text(LONG_TEXT))).await;
    let resp = post_openai(&llm, &openai_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req_scripted1");
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("application/json")
    );
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["object"], "chat.completion");
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-"))
    );
    assert_eq!(v["model"], "gpt-test");
    assert!(v["created"].as_u64().is_some_and(|t| t > 1_600_000_000));
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], LONG_TEXT);
    assert!(choice["message"].get("tool_calls").is_none());
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110})
    );
}

#[tokio::test]
async fn openai_plain_parallel_tool_calls() {
    let llm = start(Script::new().turn(Turn::ToolCalls(two_calls()))).await;
    let v: Value = post_openai(&llm, &openai_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 2);
    let mut ids = Vec::new();
    for (call, want) in calls.iter().zip(two_calls()) {
        let id = call["id"].as_str().expect("id");
        assert!(id.starts_with("call_"), "{id}");
        ids.push(id.to_string());
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], want.name.as_str());
        let args: Value = serde_json::from_str(
            call["function"]["arguments"]
                .as_str()
                .expect("a JSON string"),
        )
        .expect("arguments are JSON");
        assert_eq!(args, want.arguments);
    }
    assert_ne!(ids[0], ids[1]);
}

#[tokio::test]
async fn openai_text_and_tool_calls_plain() {
    let llm =
        start(Script::new().turn(Turn::TextAndToolCalls("let me run it".into(), two_calls())))
            .await;
    let v: Value = post_openai(&llm, &openai_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "let me run it");
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn openai_streamed_text_in_pieces_without_usage_chunk() {
    let llm = start(Script::new().turn(Turn::text(LONG_TEXT)).chunk_bytes(5)).await;
    let resp = post_openai(&llm, &openai_body(true))
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/event-stream")
    );
    assert_eq!(resp.headers()["x-request-id"], "req_scripted1");
    let s = reassemble_openai(&resp.text().await.expect("body"));
    assert_eq!(s.role.as_deref(), Some("assistant"));
    assert_eq!(s.content, LONG_TEXT);
    assert!(
        s.content_pieces >= LONG_TEXT.len() / 7,
        "{} pieces",
        s.content_pieces
    );
    assert_eq!(s.finish.as_deref(), Some("stop"));
    assert!(s.calls.is_empty());
    assert!(s.done, "ends with [DONE]");
    assert!(s.usage.is_none(), "no usage chunk without include_usage");
    assert_eq!(s.chunks_with_usage_key, 0);
}

#[tokio::test]
async fn openai_streamed_parallel_calls_interleave_and_reassemble() {
    let llm = start(Script::new().turn(Turn::ToolCalls(two_calls()))).await;
    let text = post_openai(&llm, &openai_body(true))
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    let s = reassemble_openai(&text);
    assert_eq!(s.finish.as_deref(), Some("tool_calls"));
    assert_eq!(s.content, "");
    assert_eq!(s.calls.len(), 2);
    for (i, want) in two_calls().into_iter().enumerate() {
        let (id, name, args, fragments) = &s.calls[&(i as u64)];
        assert!(id.starts_with("call_"));
        assert_eq!(name, &want.name);
        let args: Value = serde_json::from_str(args).expect("reassembled arguments are JSON");
        assert_eq!(args, want.arguments);
        assert!(*fragments > 3, "arguments arrive in pieces: {fragments}");
    }
    // The fragments of the two calls alternate rather than coming one call after the other.
    let first_of_1 = s
        .fragment_order
        .iter()
        .position(|&i| i == 1)
        .expect("call 1");
    let last_of_0 = s
        .fragment_order
        .iter()
        .rposition(|&i| i == 0)
        .expect("call 0");
    assert!(
        first_of_1 < last_of_0,
        "interleaved: {:?}",
        s.fragment_order
    );
}

#[tokio::test]
async fn openai_usage_chunk_only_with_include_usage() {
    let usage = Usage {
        input_tokens: 1234,
        output_tokens: 56,
    };
    let llm = start(
        Script::new()
            .usage(usage)
            .turns([Turn::text("one"), Turn::text("two")]),
    )
    .await;
    let mut body = openai_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = post_openai(&llm, &body)
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    let s = reassemble_openai(&text);
    assert_eq!(s.content, "one");
    assert_eq!(
        s.usage,
        Some(json!({"prompt_tokens": 1234, "completion_tokens": 56, "total_tokens": 1290}))
    );
    // Every chunk carries `usage` (null but on the last) when it was asked for.
    assert!(s.chunks_with_usage_key >= 3);
    let events = sse(&text);
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let before_done: Value = serde_json::from_str(&events[events.len() - 2].1).expect("json");
    assert_eq!(before_done["choices"], json!([]));

    let mut body = openai_body(true);
    body["stream_options"] = json!({"include_usage": false});
    let s = reassemble_openai(
        &post_openai(&llm, &body)
            .await
            .expect("request")
            .text()
            .await
            .expect("body"),
    );
    assert_eq!(s.content, "two");
    assert!(s.usage.is_none());
}

// ---------------------------------------------------------------------------------------
// Anthropic

#[tokio::test]
async fn anthropic_plain_text_and_tools() {
    let llm = start(Script::new().turns([
        Turn::text(LONG_TEXT),
        Turn::ToolCalls(two_calls()),
        Turn::TextAndToolCalls("running".into(), two_calls()),
    ]))
    .await;
    let resp = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["request-id"], "req_scripted1");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-test");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(v["content"], json!([{"type": "text", "text": LONG_TEXT}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 100, "output_tokens": 10})
    );

    let v: Value = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["stop_reason"], "tool_use");
    let blocks = v["content"].as_array().expect("content");
    assert_eq!(blocks.len(), 2);
    for (b, want) in blocks.iter().zip(two_calls()) {
        assert_eq!(b["type"], "tool_use");
        assert!(b["id"].as_str().is_some_and(|id| id.starts_with("toolu_")));
        assert_eq!(b["name"], want.name.as_str());
        assert_eq!(b["input"], want.arguments);
    }
    assert_ne!(blocks[0]["id"], blocks[1]["id"]);

    let v: Value = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    let types: Vec<&str> = v["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter_map(|b| b["type"].as_str())
        .collect();
    assert_eq!(types, ["text", "tool_use", "tool_use"]);
    assert_eq!(v["content"][0]["text"], "running");
}

#[tokio::test]
async fn anthropic_streamed_text_and_parallel_tools_with_cumulative_usage() {
    let usage = Usage {
        input_tokens: 321,
        output_tokens: 77,
    };
    let llm = start(
        Script::new()
            .usage(usage)
            .turn(Turn::TextAndToolCalls(LONG_TEXT.into(), two_calls()))
            .turn(Turn::text("just text")),
    )
    .await;
    let resp = post_anthropic(&llm, &anthropic_body(true))
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/event-stream")
    );
    assert_eq!(resp.headers()["request-id"], "req_scripted1");
    let s = reassemble_anthropic(&resp.text().await.expect("body"));
    assert_eq!(s.events.first().map(String::as_str), Some("message_start"));
    assert_eq!(s.events.last().map(String::as_str), Some("message_stop"));
    assert_eq!(s.input_tokens, 321);
    assert_eq!(s.start_output_tokens, 1);
    // The total, not an increment on message_start's 1: a client summing would say 78.
    assert_eq!(s.output_tokens, Some(77));
    assert_eq!(s.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(s.blocks.len(), 3);
    assert_eq!(s.blocks[0], json!({"type": "text", "text": LONG_TEXT}));
    assert!(s.text_pieces > 3);
    assert!(
        s.json_pieces > 6,
        "input arrives in pieces: {}",
        s.json_pieces
    );
    for (b, want) in s.blocks[1..].iter().zip(two_calls()) {
        assert_eq!(b["type"], "tool_use");
        assert!(b["id"].as_str().is_some_and(|id| id.starts_with("toolu_")));
        assert_eq!(b["name"], want.name.as_str());
        assert_eq!(b["input"], want.arguments);
    }
    assert!(s.error.is_none());

    let s = reassemble_anthropic(
        &post_anthropic(&llm, &anthropic_body(true))
            .await
            .expect("request")
            .text()
            .await
            .expect("body"),
    );
    assert_eq!(s.blocks, vec![json!({"type": "text", "text": "just text"})]);
    assert_eq!(s.stop_reason.as_deref(), Some("end_turn"));
}

// ---------------------------------------------------------------------------------------
// Faults

#[tokio::test]
async fn status_faults_in_each_protocols_shape() {
    let rate_limited = || {
        Turn::Fault(Fault::Status {
            status: 429,
            retry_after: Some("3".into()),
            message: "slow down".into(),
        })
    };
    let llm = start(Script::new().turns([
        rate_limited(),
        rate_limited(),
        Turn::Fault(Fault::status(500, "boom")),
        Turn::Fault(Fault::status(500, "boom")),
    ]))
    .await;
    let resp = post_openai(&llm, &openai_body(true))
        .await
        .expect("request");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "3");
    assert!(resp.headers().contains_key("x-request-id"));
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["message"], "slow down");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert!(v["error"]["type"].is_string());

    let resp = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "3");
    assert!(resp.headers().contains_key("request-id"));
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["type"], "error");
    assert_eq!(
        v["error"],
        json!({"type": "rate_limit_error", "message": "slow down"})
    );

    let resp = post_openai(&llm, &openai_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status(), 500);
    assert!(!resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["type"], "server_error");

    let v: Value = post_anthropic(&llm, &anthropic_body(true))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["error"]["type"], "api_error");
}

#[tokio::test]
async fn unauthorized_in_each_protocols_shape() {
    let llm = start(Script::new().turns([
        Turn::Fault(Fault::Unauthorized),
        Turn::Fault(Fault::Unauthorized),
    ]))
    .await;
    let resp = post_openai(&llm, &openai_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let resp = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
}

#[tokio::test]
async fn overloaded_per_protocol() {
    let llm = start(Script::new().turns([
        Turn::Fault(Fault::Overloaded),
        Turn::Fault(Fault::Overloaded),
        Turn::Fault(Fault::Overloaded),
    ]))
    .await;
    // Anthropic streamed: 200, some output, then an error event and no message_stop.
    let resp = post_anthropic(&llm, &anthropic_body(true))
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let s = reassemble_anthropic(&resp.text().await.expect("body"));
    assert_eq!(s.events.first().map(String::as_str), Some("message_start"));
    assert_eq!(s.events.last().map(String::as_str), Some("error"));
    assert!(
        s.events.contains(&"content_block_delta".to_string()),
        "partial output first"
    );
    assert!(!s.events.contains(&"message_stop".to_string()));
    assert_eq!(
        s.error,
        Some(json!({"type": "overloaded_error", "message": "Overloaded"}))
    );
    // Anthropic plain: 529.
    let resp = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 529);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["type"], "overloaded_error");
    // OpenAI: 503.
    let resp = post_openai(&llm, &openai_body(true))
        .await
        .expect("request");
    assert_eq!(resp.status(), 503);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["type"], "server_error");
}

/// Reads a streamed body until it ends or breaks: (bytes received, whether it broke).
async fn read_until_end(resp: reqwest::Response) -> (String, bool) {
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), true),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), false)
}

#[tokio::test]
async fn drop_stream_breaks_streams_and_plain_requests() {
    let llm = start(Script::new().turns([
        Turn::Fault(Fault::DropStream),
        Turn::Fault(Fault::DropStream),
        Turn::Fault(Fault::DropStream),
        Turn::Fault(Fault::DropStream),
        Turn::text("after the drops"),
    ]))
    .await;

    let resp = post_openai(&llm, &openai_body(true))
        .await
        .expect("the stream starts");
    assert_eq!(resp.status(), 200);
    let (got, broke) = read_until_end(resp).await;
    assert!(broke, "the body ends in an error, not a clean end");
    assert!(got.contains("\"content\""), "some chunks came first: {got}");
    assert!(!got.contains("[DONE]"));

    let resp = post_anthropic(&llm, &anthropic_body(true))
        .await
        .expect("the stream starts");
    let (got, broke) = read_until_end(resp).await;
    assert!(broke);
    assert!(got.contains("event: content_block_delta"), "{got}");
    assert!(!got.contains("message_stop"));

    // Plain: no response at all.
    let e = post_openai(&llm, &openai_body(false))
        .await
        .expect_err("no response");
    assert!(!e.is_status() && !e.is_timeout(), "{e:?}");
    let e = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect_err("no response");
    assert!(!e.is_status(), "{e:?}");

    // The server is still fine afterwards.
    let v: Value = post_openai(&llm, &openai_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "after the drops");
}

#[tokio::test]
async fn slow_waits_then_answers_and_survives_a_cancelled_client() {
    let slow = |ms, t| {
        Turn::Fault(Fault::Slow {
            delay_ms: ms,
            then: Box::new(t),
        })
    };
    let llm = start(Script::new().turns([
        slow(300, Turn::text("late")),
        slow(5_000, Turn::text("never read")),
        slow(10, Turn::Fault(Fault::Unauthorized)),
    ]))
    .await;
    let t0 = Instant::now();
    let v: Value = post_openai(&llm, &openai_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(v["choices"][0]["message"]["content"], "late");

    // A client that gives up (cancellation) gets nothing; the server carries on.
    let t0 = Instant::now();
    let e = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("client")
        .post(format!("{}/v1/messages", llm.anthropic_base()))
        .json(&anthropic_body(true))
        .send()
        .await
        .expect_err("the client times out first");
    assert!(e.is_timeout(), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));

    let resp = post_anthropic(&llm, &anthropic_body(false))
        .await
        .expect("request");
    assert_eq!(resp.status(), 401, "the slow turn wraps a fault too");
    assert_eq!(llm.requests().len(), 3);
}

// ---------------------------------------------------------------------------------------
// The script, the record, refusals

#[tokio::test]
async fn queue_then_function_then_fallback_and_push_while_running() {
    let llm = start(Script::new().turn(Turn::text("queued"))).await;
    let content = |v: Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let ask = || async {
        post_openai(&llm, &openai_body(false))
            .await
            .expect("request")
            .json::<Value>()
            .await
            .expect("json")
    };
    assert_eq!(content(ask().await), "queued");
    assert_eq!(content(ask().await), NO_MORE_TURNS);
    llm.push(Turn::text("pushed"));
    assert_eq!(llm.pending_turns(), 1);
    assert_eq!(content(ask().await), "pushed");
    assert_eq!(llm.pending_turns(), 0);

    let decided = start(Script::new().turn(Turn::text("first")).respond_with(|r| {
        Turn::text(format!(
            "{} tools: {}",
            r.transcript(),
            r.tool_names().join(",")
        ))
    }))
    .await;
    let v: Value = post_anthropic(&decided, &anthropic_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["content"][0]["text"], "first");
    let v: Value = post_anthropic(&decided, &anthropic_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["content"][0]["text"], "hello tools: run_code");
}

#[tokio::test]
async fn records_requests_headers_transcript_and_images() {
    let llm = start(Script::new()).await;
    let openai = json!({
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a", "type": "function",
                "function": {"name": "run_code", "arguments": "{\"code\":\"1\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "out-1"},
            {"role": "user", "content": [
                {"type": "text", "text": "the plot:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
            ]}
        ],
        "tools": [{"type": "function", "function": {"name": "run_code", "parameters": {}}},
                  {"type": "function", "function": {"name": "read_file", "parameters": {}}}],
        "stream": true,
        "stream_options": {"include_usage": true}
    });
    post_openai(&llm, &openai)
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    let anthropic = json!({
        "model": "claude-test",
        "max_tokens": 100,
        "system": "sys",
        "messages": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "run_code", "input": {"code": "1"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": [
                {"type": "text", "text": "out-1"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
            ]}]}
        ],
        "tools": [{"name": "run_code", "input_schema": {"type": "object"}}]
    });
    post_anthropic(&llm, &anthropic)
        .await
        .expect("request")
        .text()
        .await
        .expect("body");

    let recs = llm.requests();
    assert_eq!(recs.len(), 2);
    let (o, a) = (&recs[0], &recs[1]);
    assert_eq!(o.protocol, Protocol::OpenAi);
    assert_eq!(o.path, "/v1/chat/completions");
    assert!(o.stream);
    assert_eq!(
        o.headers.get("authorization").map(String::as_str),
        Some("Bearer sk-test-openai-key")
    );
    assert_eq!(o.body, openai);
    assert_eq!(o.transcript(), "sys\nrun it\nout-1\nthe plot:");
    assert_eq!(o.tool_names(), vec!["run_code", "read_file"]);
    let imgs = o.images();
    assert_eq!(imgs.len(), 1);
    assert_eq!((imgs[0].role.as_str(), imgs[0].message_index), ("user", 4));
    assert_eq!(imgs[0].media_type.as_deref(), Some("image/png"));
    assert_eq!(imgs[0].data_base64.as_deref(), Some("iVBORw0KGgo="));

    assert_eq!(a.protocol, Protocol::Anthropic);
    assert_eq!(a.path, "/v1/messages");
    assert!(!a.stream);
    assert_eq!(a.header("x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(a.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(a.transcript(), "run it\nout-1");
    assert_eq!(a.tool_names(), vec!["run_code"]);
    assert_eq!(a.last_tool_result().as_deref(), Some("out-1"));
    let imgs = a.images();
    assert_eq!(imgs.len(), 1);
    assert!(imgs[0].in_tool_result);
    assert_eq!(imgs[0].role, "user");
}

#[tokio::test]
async fn refuses_what_the_real_services_refuse_without_consuming_turns() {
    let llm = start(Script::new().turn(Turn::text("kept"))).await;
    let mut no_max = anthropic_body(false);
    no_max.as_object_mut().expect("object").remove("max_tokens");
    let resp = post_anthropic(&llm, &no_max).await.expect("request");
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens"))
    );

    let image_in_tool = json!({"model": "gpt-test", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}
    ]});
    let resp = post_openai(&llm, &image_in_tool).await.expect("request");
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", llm.openai_base()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 400);

    let resp = reqwest::Client::new()
        .post(format!("{}/v1/nothing", llm.anthropic_base()))
        .json(&json!({}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 404);

    // Refused requests are recorded, and the queued turn is still there.
    assert_eq!(llm.requests().len(), 3);
    assert_eq!(llm.requests()[2].body, Value::String("{not json".into()));
    let v: Value = post_openai(&llm, &openai_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "kept");
}

#[tokio::test]
async fn default_agent_runs_the_fenced_code_then_answers_final() {
    let llm = start(Script::default_agent()).await;
    let tools = json!([{"type": "function", "function": {"name": "execute_code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]);
    let user = json!({"role": "user", "content": "compute\n```python\nprint(6 * 7)\n```"});
    let body = json!({"model": "gpt-test", "messages": [user], "tools": tools, "stream": true});
    let s = reassemble_openai(
        &post_openai(&llm, &body)
            .await
            .expect("request")
            .text()
            .await
            .expect("body"),
    );
    let (id, name, args, _) = s.calls[&0].clone();
    assert_eq!(name, "execute_code");
    assert_eq!(
        serde_json::from_str::<Value>(&args).expect("json"),
        json!({"code": "print(6 * 7)"})
    );

    let body = json!({"model": "gpt-test", "tools": tools, "messages": [
        user,
        {"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": name, "arguments": args}}]},
        {"role": "tool", "tool_call_id": id, "content": "42"}
    ]});
    let v: Value = post_openai(&llm, &body)
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "FINAL: 42");

    // REPL mode (no tools), Anthropic: the code comes back as a fenced block.
    let body = json!({"model": "claude-test", "max_tokens": 10,
        "messages": [{"role": "user", "content": "```python\nx = 1\n```"}]});
    let v: Value = post_anthropic(&llm, &body)
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["content"][0]["text"], "```python\nx = 1\n```");
}

#[tokio::test]
async fn dropping_the_server_stops_it() {
    let llm = start(Script::new()).await;
    let addr = llm.addr();
    post_openai(&llm, &openai_body(false))
        .await
        .expect("serves while alive");
    drop(llm);
    // The listener goes with the server task; give it a moment to notice.
    let mut refused = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "still accepting connections on {addr}");
}

// ---------------------------------------------------------------------------------------
// The binary

#[tokio::test]
async fn binary_serves_a_script_then_the_default_agent_and_logs() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = std::env::temp_dir().join(format!("scripted-llm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let script = dir.join("script.json");
    let log = dir.join("log.jsonl");
    let _ = std::fs::remove_file(&log);
    std::fs::write(
        &script,
        r#"[{"fault": {"status": 429, "retry_after": "0"}}, {"text": "scripted"}]"#,
    )
    .expect("script");

    let help = Command::new(env!("CARGO_BIN_EXE_scripted-llm"))
        .arg("--help")
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("FINAL: ") && help.contains("--script") && help.contains("--log"),
        "{help}"
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_scripted-llm"))
        .args(["--port", "0", "--script"])
        .arg(&script)
        .arg("--log")
        .arg(&log)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn scripted-llm");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .expect("the listening line")
        .to_string();
    assert!(base.starts_with("http://127.0.0.1:"), "{line}");

    let client = reqwest::Client::new();
    let ask = |body: Value| {
        client
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(OPENAI_KEY)
            .json(&body)
            .send()
    };
    let resp = ask(openai_body(false)).await.expect("request");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "0");
    let v: Value = ask(openai_body(false))
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "scripted");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "```python\nprint(1)\n```"}],
        "tools": [{"type": "function", "function": {"name": "run_python", "parameters": {}}}]});
    let v: Value = ask(body)
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "run_python");
    assert_eq!(call["arguments"], r#"{"code":"print(1)"}"#);

    let _ = child.kill();
    let _ = child.wait();
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["protocol"], "openai");
    assert_eq!(lines[0]["path"], "/v1/chat/completions");
    assert_eq!(
        lines[0]["headers"]["authorization"],
        format!("Bearer {OPENAI_KEY}")
    );
    assert_eq!(lines[2]["body"]["messages"][0]["role"], "user");
    assert_eq!(lines[2]["stream"], false);
    let _ = std::fs::remove_dir_all(&dir);
}
