//! `scripted-llm`: the scripted OpenAI / Anthropic server as a process, for the SDK test
//! suites and the benchmark (which cannot link the Rust library).
#![forbid(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;

use clap::Parser;
use sandcell_testkit::llm::{Recorded, Script, ScriptedLlm, default_agent_turn};

/// A scripted LLM server on 127.0.0.1 speaking OpenAI Chat Completions
/// (POST /v1/chat/completions; base URL http://127.0.0.1:PORT/v1) and Anthropic Messages
/// (POST /v1/messages; base URL http://127.0.0.1:PORT), plain and streamed.
///
/// Prints `listening on http://127.0.0.1:PORT` once it accepts connections, then serves
/// until killed. Every answer reports 100 input and 10 output tokens (unless the script
/// sets "usage").
///
/// With no script (and after a script's turns run out) a small deterministic agent answers,
/// decided from the conversation:
///
///   1. once a tool result is in the conversation: the text "FINAL: " followed by the last
///      tool result's text;
///
///   2. if a code tool is offered (a tool whose name contains "code" or "python"; its
///      argument "code", else its first string property): a call of it with the code of the
///      first ```python fenced block of the last user message;
///
///   3. with no tools offered (REPL mode): that code, answered as a ```python block;
///
///   4. without such a block: the text "scripted agent: no ```python block in the last user
///      message" (with tools but no code tool: "scripted agent: no code tool offered").
///
/// Requests a real service would refuse (no model; Anthropic without max_tokens; an OpenAI
/// image outside a user message; tool calls left without results) get that protocol's 400.
///
/// POST /v1/embeddings answers deterministic vectors (a hashed bag of words, stop words left
/// out, scaled to length 1; the script's "embeddings": {"dims", "synonyms", "fault"} sets
/// their length, the word groups that count as one word, and a fault for every embeddings
/// request); embeddings requests take no turn of the script.
#[derive(Parser, Debug)]
#[command(name = "scripted-llm", verbatim_doc_comment)]
struct Args {
    /// The port to listen on, on 127.0.0.1 (0 picks a free one; the line printed says which).
    #[arg(long)]
    port: u16,

    /// A JSON script: a list of turns answered one per request, in order, whatever the
    /// protocol. Turns: {"text": "…"} | {"tool_calls": [{"name": "…", "arguments": {…}}]}
    /// (with "text" too: text then calls) | {"fault": {"status": 429, "retry_after": "0",
    /// "message": "…"}} | {"fault": "drop_stream"} | {"fault": "overloaded"} |
    /// {"fault": "unauthorized"} | {"slow": {"delay_ms": 500, "then": <turn>}}. Or an object
    /// {"turns": [...], "usage": {"input_tokens": N, "output_tokens": N}, "chunk_bytes": N,
    /// "embeddings": {"dims": N, "synonyms": [["car", "automobile"]], "fault": <fault>}}.
    #[arg(long, value_name = "FILE.json")]
    script: Option<PathBuf>,

    /// Appends every request received as a JSON line {"protocol", "path", "headers",
    /// "body", "stream"} (headers in full: keys given to this server are test keys).
    #[arg(long, value_name = "FILE.jsonl")]
    log: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("scripted-llm: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scripted-llm: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let script = match &args.script {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the script {}: {e}", path.display()))?;
            Script::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Script::new(),
    }
    .respond_with(default_agent_turn);
    let script = match &args.log {
        Some(path) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open the log {}: {e}", path.display()))?;
            let log = Mutex::new(file);
            script.on_request(move |r| write_log(&log, r))
        }
        None => script,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], args.port));
    let llm = ScriptedLlm::start_at(script, addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on http://{}", llm.addr())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(out);
    std::future::pending::<()>().await;
    Ok(())
}

fn write_log(log: &Mutex<File>, r: &Recorded) {
    let line = match serde_json::to_string(r) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("scripted-llm: cannot encode a request for the log: {e}");
            return;
        }
    };
    let mut f = log.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Err(e) = writeln!(f, "{line}").and_then(|()| f.flush()) {
        eprintln!("scripted-llm: cannot write the log: {e}");
    }
}
