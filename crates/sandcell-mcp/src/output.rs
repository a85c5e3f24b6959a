//! Turning the service's answers into MCP content an LLM reads well: short text first, images as image
//! content, long outputs cut with a marker saying how much was left out.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock};
use sandcell_api::code::CodeResult;
use sandcell_api::exec::ExecOutput;
use sandcell_api::memories::{InferJob, Memory, MemoryList, MemoryScope};
use sandcell_api::runs::RunInfo;
use sandcell_api::sandboxes::{SandboxInfo, SandboxList};

use crate::sandcell::{CallResult, FileHead};

/// Characters of stdout kept.
pub const STDOUT_LIMIT: usize = 50_000;
/// Characters of stderr kept.
pub const STDERR_LIMIT: usize = 120_000;
/// Characters of a result (or any JSON answer) kept.
pub const RESULT_LIMIT: usize = 30_000;
/// Characters of a traceback kept.
pub const TRACEBACK_LIMIT: usize = 8_000;
/// Largest file returned inline by `export_files`.
pub const INLINE_FILE_LIMIT: usize = 1 << 20;

/// `text` cut to `limit` characters, with a marker saying how many were left out.
pub fn truncate(text: &str, limit: usize) -> String {
    let total = text.chars().count();
    if total <= limit {
        return text.to_string();
    }
    let kept: String = text.chars().take(limit).collect();
    format!(
        "{kept}\n[... truncated: {} of {total} characters not shown]",
        total - limit
    )
}

/// `value` as compact JSON, its keys sorted (as the tools have always shown answers).
pub fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// A successful answer showing `value` as JSON, cut at the result limit.
pub fn json_result<T: serde::Serialize>(value: &T) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(truncate(
        &json(value),
        RESULT_LIMIT,
    ))])
}

/// A build as `template_build` and `template_build_status` show it: its state and steps,
/// the last lines of its log, what it made.
pub fn build_status(
    info: &sandcell_api::templates::BuildInfo,
    events: &[sandcell_api::templates::BuildEvent],
) -> CallToolResult {
    use sandcell_api::templates::BuildEvent;
    let steps: Vec<String> = info
        .step_reports
        .iter()
        .map(|s| {
            let how = if s.cached {
                "cached".to_string()
            } else {
                match s.exit_code {
                    Some(0) | None => format!("{:.1} s", s.duration_ms as f64 / 1000.0),
                    Some(code) => format!("exit code {code}"),
                }
            };
            format!("[{}] {} ({how})", s.index, s.text)
        })
        .collect();
    let mut log = String::new();
    for e in events {
        match e {
            BuildEvent::Output { text, .. } => log.push_str(text),
            BuildEvent::Smoke { kernel, ok, .. } => {
                log.push_str(&format!(
                    "kernel {kernel}: {}\n",
                    if *ok { "starts" } else { "missing" }
                ));
            }
            BuildEvent::Warning { line, message } => {
                log.push_str(&format!("warning: line {line}: {message}\n"));
            }
            _ => {}
        }
    }
    let mut v = serde_json::json!({
        "build_id": info.id,
        "name": info.name,
        "state": info.state,
        "step": info.step,
        "steps": info.steps,
        "finished_steps": steps,
        "log_tail": truncate(&log, 4000),
    });
    if let Some(e) = &info.error {
        v["error"] = serde_json::json!(e);
    }
    if let Some(image) = &info.image {
        v["template"] = serde_json::json!({
            "name": image.reference,
            "kernels": image.kernels,
            "next": "create_session with image set to this name starts a session on it",
        });
    }
    if !info.state.is_final() {
        v["next"] = serde_json::json!("call template_build_status with this build_id to follow it");
    }
    json_result(&v)
}

/// Characters of one event's line in `agent_status`.
const EVENT_LINE_LIMIT: usize = 160;

/// The answer to `agent_run`, `agent_fork` and `agent_resume`: the run's id and status, where
/// a fork's history comes from, and what to do next.
pub fn run_started(info: &RunInfo) -> CallToolResult {
    let mut v = serde_json::json!({
        "run_id": info.id,
        "status": info.status,
        "model": info.model,
        "sandbox_id": info.sandbox_id,
        "next": "call agent_status with this run_id to see how it goes (and its answer once it ends); agent_cancel stops it",
    });
    if let Some(from) = &info.forked_from {
        v["forked_from"] = serde_json::json!({"run_id": from.run_id, "step": from.step});
    }
    json_result(&v)
}

/// A memory as the tools show it: in the tools' words (`memory_id`, a `session`'s or the
/// `owner`'s), metadata only when it has some, its score only in search results.
fn memory_view(m: &Memory) -> serde_json::Value {
    let mut v = serde_json::json!({
        "memory_id": m.id,
        "text": m.text,
        "category": m.category,
        "scope": match m.scope {
            MemoryScope::Sandbox => "session",
            MemoryScope::Owner => "owner",
        },
        "created_at": m.created_at,
    });
    if let Some(id) = &m.sandbox_id {
        v["session_id"] = serde_json::json!(id);
    }
    if !m.metadata.is_empty() {
        v["metadata"] = serde_json::json!(m.metadata);
    }
    if let Some(score) = m.score {
        v["score"] = serde_json::json!(score);
    }
    if let Some(by) = m.matched_by {
        v["matched_by"] = serde_json::json!(by);
    }
    if let Some(sim) = m.similarity {
        v["similarity"] = serde_json::json!(sim);
    }
    if let Some(w) = &m.warning {
        v["warning"] = serde_json::json!(w);
    }
    v
}

/// The answer to `memory_add` with `infer` and to `memory_infer_status`: the job in the
/// tools' words, and what to do next while it runs.
pub fn infer_job(j: &InferJob) -> CallToolResult {
    let mut v = serde_json::json!({
        "job_id": j.id,
        "status": j.status,
        "scope": match j.scope {
            MemoryScope::Sandbox => "session",
            MemoryScope::Owner => "owner",
        },
        "model": j.model,
        "category": j.category,
        "memory_ids": j.memories,
    });
    if let Some(id) = &j.sandbox_id {
        v["session_id"] = serde_json::json!(id);
    }
    if let Some(e) = &j.error {
        v["error"] = serde_json::json!(e);
    }
    if !j.status.is_done() {
        v["next"] = serde_json::json!(
            "the facts are being extracted in the background: call memory_infer_status with this job_id to see when they are added"
        );
    }
    json_result(&v)
}

/// The answer to `memory_add`.
pub fn memory_added(m: &Memory) -> CallToolResult {
    json_result(&memory_view(m))
}

/// The answer to `memory_search`: the results best first, each with its rank and score.
pub fn memory_results(list: &MemoryList) -> CallToolResult {
    let results: Vec<serde_json::Value> = list
        .memories
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut v = memory_view(m);
            v["rank"] = serde_json::json!(i + 1);
            v
        })
        .collect();
    let mut v = serde_json::json!({"results": results});
    if let Some(r) = list.ranking {
        v["ranking"] = serde_json::json!(r);
    }
    if let Some(w) = &list.warning {
        v["warning"] = serde_json::json!(w);
    }
    if results.is_empty() {
        v["note"] = serde_json::json!(
            "no memory matched: search looks for the query's words (try fewer or other words), in one scope only (a session's, or your own without session_id)"
        );
    }
    json_result(&v)
}

/// The answer to `memory_list`: a page newest first, and where the next one starts.
pub fn memory_page(list: &MemoryList) -> CallToolResult {
    let memories: Vec<serde_json::Value> = list.memories.iter().map(memory_view).collect();
    let mut v = serde_json::json!({"memories": memories});
    if let Some(cursor) = &list.next_cursor {
        v["next_cursor"] = serde_json::json!(cursor);
    }
    json_result(&v)
}

/// The answer to `agent_status` and `agent_cancel`: the run's status, why it ended, its
/// answer, what it used, and one line per event of `events`.
pub fn run_status(info: &RunInfo, events: &[serde_json::Value]) -> CallToolResult {
    let mut v = serde_json::json!({
        "run_id": info.id,
        "status": info.status,
        "reason": info.reason,
        "answer": info.answer,
        "model": info.model,
        "sandbox_id": info.sandbox_id,
        "usage": info.usage,
        "created_at": info.created_at,
        "ended_at": info.ended_at,
    });
    if !events.is_empty() {
        v["recent_events"] = events.iter().map(event_line).collect();
    }
    json_result(&v)
}

/// One event of a run's trajectory in a line: its number, step, type and the gist.
pub fn event_line(e: &serde_json::Value) -> String {
    let text = |key: &str| e[key].as_str().unwrap_or_default();
    let first_line = |s: &str| s.lines().next().unwrap_or_default().to_string();
    let kind = text("type");
    let gist = match kind {
        "run_started" => format!("model {}", text("model")),
        "sandbox_ready" => format!("session {}", text("sandbox_id")),
        "llm_request" => format!("model call {}", e["call"]),
        "llm_response" => {
            let calls: Vec<&str> = e["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .collect();
            let what = if calls.is_empty() {
                first_line(text("text"))
            } else {
                format!("calls {}", calls.join(", "))
            };
            format!(
                "{} in / {} out tokens · {what}",
                e["usage"]["input_tokens"], e["usage"]["output_tokens"]
            )
        }
        "llm_error" => format!("{}: {}", text("kind"), first_line(text("message"))),
        "tool_call" => format!("{} {}", text("name"), e["arguments"]),
        "tool_result" => format!(
            "{}{}: {}",
            text("name"),
            if e["is_error"] == true {
                " (error)"
            } else {
                ""
            },
            first_line(text("text"))
        ),
        "step_committed" => format!(
            "{} in / {} out tokens so far",
            e["usage"]["input_tokens"], e["usage"]["output_tokens"]
        ),
        "warning" => first_line(text("message")),
        "run_finished" => format!("{} ({})", text("status"), text("reason")),
        _ => String::new(),
    };
    let line = format!("#{} step {} {kind}: {gist}", e["seq"], e["step"]);
    let line = line.trim_end_matches([' ', ':']).to_string();
    if line.chars().count() > EVENT_LINE_LIMIT {
        format!(
            "{}…",
            line.chars().take(EVENT_LINE_LIMIT).collect::<String>()
        )
    } else {
        line
    }
}

/// An optional number as JSON shows it (`null` when absent).
fn number<T: std::fmt::Display>(n: Option<T>) -> String {
    n.map_or_else(|| "null".to_string(), |n| n.to_string())
}

/// The answer to `create_session`.
pub fn session_created(info: &SandboxInfo) -> CallToolResult {
    let text = format!(
        "session_id: {}\nstate: {}\nexpires_at: {}\nidle_timeout_secs: {}",
        info.id,
        info.state,
        info.expires_at.as_deref().unwrap_or_default(),
        number(info.idle_timeout_secs)
    );
    let mut content = vec![ContentBlock::text(text)];
    if let Some(restore) = info.restore.as_ref().filter(|r| !r.is_null()) {
        content.push(ContentBlock::text(format!(
            "restored: {}",
            truncate(&restore.to_string(), RESULT_LIMIT)
        )));
    }
    CallToolResult::success(content)
}

/// The answer to `list_sessions`.
pub fn session_list(list: &SandboxList) -> CallToolResult {
    if list.items.is_empty() {
        return CallToolResult::success(vec![ContentBlock::text("no active sessions")]);
    }
    let lines: Vec<String> = list
        .items
        .iter()
        .map(|s| {
            format!(
                "{}  {}  created {}  expires {}",
                s.id,
                s.state,
                s.created_at,
                s.expires_at.as_deref().unwrap_or_default()
            )
        })
        .collect();
    CallToolResult::success(vec![ContentBlock::text(lines.join("\n"))])
}

/// The non-empty `stdout` and `stderr`, each cut at its limit.
fn streams(stdout: &str, stderr: &str) -> String {
    let mut text = String::new();
    for (name, s, limit) in [
        ("stdout", stdout, STDOUT_LIMIT),
        ("stderr", stderr, STDERR_LIMIT),
    ] {
        if !s.is_empty() {
            text.push_str(&format!("{name}:\n{}\n", truncate(s, limit)));
        }
    }
    text
}

/// The answer to `execute_terminal`.
pub fn exec_result(out: &ExecOutput) -> CallToolResult {
    let mut text = streams(&out.stdout, &out.stderr);
    text.push_str(&format!(
        "exit_code: {}\n{}",
        number(out.exit_code),
        out.result.message
    ));
    if out.result.stdout_truncated || out.result.stderr_truncated {
        text.push_str("\n[output was longer than the server keeps; the start is shown]");
    }
    // A failing command is still a result the model should read, not a tool failure.
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// The answer to `execute_code` / `execute_python`: text, then each image output.
pub fn code_result(result: &CodeResult) -> CallToolResult {
    let mut text = streams(&result.stdout, &result.stderr);
    let mut images = Vec::new();
    for out in &result.outputs {
        let data = &out.data;
        let mut shown = false;
        for mime in ["image/png", "image/jpeg", "image/gif", "image/webp"] {
            if let Some(b64) = data[mime].as_str() {
                images.push(ContentBlock::image(b64.to_string(), mime.to_string()));
                shown = true;
                break;
            }
        }
        if out.kind == "result" {
            if let Some(plain) = data["text/plain"].as_str() {
                text.push_str(&format!("result:\n{}\n", truncate(plain, RESULT_LIMIT)));
            }
        } else if !shown {
            if let Some(plain) = data["text/plain"].as_str() {
                text.push_str(&format!("display:\n{}\n", truncate(plain, RESULT_LIMIT)));
            }
        } else {
            text.push_str("display: an image (below)\n");
        }
    }
    if let Some(err) = &result.error {
        text.push_str(&format!(
            "error: {}: {}\n{}\n",
            err.name,
            err.value,
            truncate(&err.traceback.join("\n"), TRACEBACK_LIMIT)
        ));
    }
    let done = &result.done;
    text.push_str(&format!(
        "status: {} (execution {}, {:.0} ms)",
        done.status, done.execution_count, done.duration_ms
    ));
    if let Some(notice) = done.notice.as_deref().filter(|n| !n.is_empty()) {
        text.push_str(&format!("\nnote: {notice}"));
    }
    if done.state_lost {
        text.push_str("\nthe kernel's state was lost (it died); variables must be defined again");
    }
    let mut content = vec![ContentBlock::text(text)];
    content.extend(images);
    CallToolResult::success(content)
}

/// A file's contents for `export_files`: text when it is UTF-8, else base64.
pub fn file_content(path: &str, read: &CallResult<FileHead>) -> ContentBlock {
    let head = match read {
        Ok(head) => head,
        Err(e) => {
            return ContentBlock::text(format!("{path}: contents not available ({})", e.message));
        }
    };
    if head.size > INLINE_FILE_LIMIT as u64 {
        return ContentBlock::text(format!(
            "{path}: {} bytes, over the {INLINE_FILE_LIMIT}-byte inline limit; use the download link",
            head.size
        ));
    }
    match std::str::from_utf8(&head.bytes) {
        Ok(text) => ContentBlock::text(format!("{path}:\n{}", truncate(text, RESULT_LIMIT))),
        Err(_) => ContentBlock::text(format!(
            "{path} (base64):\n{}",
            base64::engine::general_purpose::STANDARD.encode(&head.bytes)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_as_one_line_with_its_number_and_gist() {
        let e = |v: serde_json::Value| event_line(&v);
        assert_eq!(
            e(
                serde_json::json!({"seq": 4, "step": 1, "type": "llm_response", "text": "",
                "tool_calls": [{"id": "c1", "name": "execute_code", "arguments": {}}],
                "usage": {"input_tokens": 100, "output_tokens": 10}})
            ),
            "#4 step 1 llm_response: 100 in / 10 out tokens · calls execute_code"
        );
        assert_eq!(
            e(
                serde_json::json!({"seq": 6, "step": 1, "type": "tool_result",
                "name": "execute_code", "is_error": false, "text": "DOUBLE 42\nmore"})
            ),
            "#6 step 1 tool_result: execute_code: DOUBLE 42"
        );
        assert_eq!(
            e(
                serde_json::json!({"seq": 9, "step": 3, "type": "run_finished",
                "status": "succeeded", "reason": "final"})
            ),
            "#9 step 3 run_finished: succeeded (final)"
        );
        // A type this build does not know still gets its number and type.
        assert_eq!(
            e(serde_json::json!({"seq": 2, "step": 0, "type": "something_new"})),
            "#2 step 0 something_new"
        );
        let long = e(serde_json::json!({"seq": 1, "step": 0, "type": "warning",
            "message": "w".repeat(500)}));
        assert_eq!(long.chars().count(), EVENT_LINE_LIMIT + 1);
        assert!(long.ends_with('…'));
    }

    fn memory(id: &str, sandbox: Option<&str>, score: Option<f64>) -> Memory {
        Memory {
            id: id.into(),
            scope: if sandbox.is_some() {
                MemoryScope::Sandbox
            } else {
                MemoryScope::Owner
            },
            sandbox_id: sandbox.map(str::to_string),
            text: format!("text of {id}"),
            category: "general".into(),
            metadata: std::collections::BTreeMap::new(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            score,
            matched_by: None,
            similarity: None,
            warning: None,
        }
    }

    fn json_of(r: &CallToolResult) -> serde_json::Value {
        let Some(ContentBlock::Text(t)) = r.content.first() else {
            panic!("no text: {r:?}");
        };
        serde_json::from_str(&t.text).unwrap()
    }

    #[test]
    fn search_results_keep_their_order_with_ranks_scores_and_the_tools_words() {
        let list = MemoryList {
            memories: vec![
                memory("mem-a", Some("sb-1"), Some(2.5)),
                memory("mem-b", Some("sb-1"), Some(0.5)),
            ],
            next_cursor: None,
            ranking: Some(sandcell_api::memories::Ranking::Fts),
            warning: Some("ranked by words only".into()),
        };
        let v = json_of(&memory_results(&list));
        assert_eq!(v["results"][0]["memory_id"], "mem-a");
        assert_eq!(
            (&v["results"][0]["rank"], &v["results"][1]["rank"]),
            (&serde_json::json!(1), &serde_json::json!(2))
        );
        assert_eq!(v["results"][0]["score"], 2.5);
        assert_eq!(v["results"][1]["scope"], "session");
        assert_eq!(v["results"][1]["session_id"], "sb-1");
        // No metadata: none shown; the API's own names are not.
        assert!(v["results"][0].get("metadata").is_none());
        assert!(v["results"][0].get("sandbox_id").is_none());
        assert!(v.get("note").is_none());
        assert_eq!(
            (&v["ranking"], &v["warning"]),
            (
                &serde_json::json!("fts"),
                &serde_json::json!("ranked by words only")
            )
        );
        let none = json_of(&memory_results(&MemoryList {
            memories: vec![],
            next_cursor: None,
            ranking: None,
            warning: None,
        }));
        assert!(
            none["note"]
                .as_str()
                .unwrap()
                .starts_with("no memory matched")
        );
    }

    #[test]
    fn a_page_says_where_the_next_one_starts_and_an_owners_memory_has_no_session() {
        let page = json_of(&memory_page(&MemoryList {
            memories: vec![memory("mem-a", None, None)],
            next_cursor: Some("17".into()),
            ranking: None,
            warning: None,
        }));
        assert_eq!(page["next_cursor"], "17");
        let m = &page["memories"][0];
        assert_eq!(m["scope"], "owner");
        assert!(
            m.get("session_id").is_none() && m.get("score").is_none(),
            "{m}"
        );
    }

    #[test]
    fn long_text_is_cut_with_a_marker() {
        let cut = truncate(&"x".repeat(120), 100);
        assert!(cut.starts_with(&"x".repeat(100)));
        assert!(cut.ends_with("[... truncated: 20 of 120 characters not shown]"));
        assert_eq!(truncate("short", 100), "short");
    }

    fn code_result_of(outputs: serde_json::Value, notice: Option<&str>) -> CodeResult {
        serde_json::from_value(serde_json::json!({
            "stdout": "", "stderr": "",
            "outputs": outputs,
            "result": null, "error": null,
            "done": {"context": "python", "language": "python", "status": "ok",
                "execution_count": 1, "duration_ms": 3.0, "exit_code": null,
                "state_lost": false, "kernel_restarted": false, "crash": null,
                "notice": notice, "artifacts": [], "stdout_dropped": 0, "stderr_dropped": 0}
        }))
        .unwrap()
    }

    #[test]
    fn an_image_output_becomes_image_content() {
        let body = code_result_of(
            serde_json::json!([{"kind": "display", "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}}]),
            None,
        );
        let r = code_result(&body);
        assert!(
            r.content
                .iter()
                .any(|c| matches!(c, ContentBlock::Image(i) if i.mime_type == "image/png"))
        );
    }

    #[test]
    fn the_kernels_notice_is_shown() {
        let body = code_result_of(serde_json::json!([]), Some("the kernel was restarted"));
        let r = code_result(&body);
        let Some(ContentBlock::Text(t)) = r.content.first() else {
            panic!("no text: {r:?}");
        };
        assert!(
            t.text
                .ends_with("status: ok (execution 1, 3 ms)\nnote: the kernel was restarted"),
            "{}",
            t.text
        );
    }
}
