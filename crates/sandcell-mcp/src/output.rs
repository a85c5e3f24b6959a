//! Turning API answers into MCP content an LLM reads well: short text first, images as image
//! content, long outputs cut with a marker saying how much was left out.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

use crate::api::ApiReply;

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

/// The answer to `create_session`.
pub fn session_created(body: &Value) -> CallToolResult {
    let id = body["id"].as_str().unwrap_or_default();
    let text = format!(
        "session_id: {id}\nstate: {}\nexpires_at: {}\nidle_timeout_secs: {}",
        body["state"].as_str().unwrap_or_default(),
        body["expires_at"].as_str().unwrap_or_default(),
        body["idle_timeout_secs"]
    );
    let mut content = vec![ContentBlock::text(text)];
    if let Some(restore) = body.get("restore").filter(|r| !r.is_null()) {
        content.push(ContentBlock::text(format!(
            "restored: {}",
            truncate(&restore.to_string(), RESULT_LIMIT)
        )));
    }
    CallToolResult::success(content)
}

/// The answer to `list_sessions`.
pub fn session_list(body: &Value) -> CallToolResult {
    let items = body["sandboxes"]
        .as_array()
        .or_else(|| body["items"].as_array())
        .or_else(|| body.as_array())
        .cloned()
        .unwrap_or_default();
    if items.is_empty() {
        return CallToolResult::success(vec![ContentBlock::text("no active sessions")]);
    }
    let lines: Vec<String> = items
        .iter()
        .map(|s| {
            format!(
                "{}  {}  created {}  expires {}",
                s["id"].as_str().unwrap_or_default(),
                s["state"].as_str().unwrap_or_default(),
                s["created_at"].as_str().unwrap_or_default(),
                s["expires_at"].as_str().unwrap_or_default()
            )
        })
        .collect();
    CallToolResult::success(vec![ContentBlock::text(lines.join("\n"))])
}

/// An answer's non-empty `stdout` and `stderr`, each cut at its limit.
fn streams(body: &Value) -> String {
    let mut text = String::new();
    for (name, limit) in [("stdout", STDOUT_LIMIT), ("stderr", STDERR_LIMIT)] {
        let s = body[name].as_str().unwrap_or_default();
        if !s.is_empty() {
            text.push_str(&format!("{name}:\n{}\n", truncate(s, limit)));
        }
    }
    text
}

/// The answer to `execute_terminal`.
pub fn exec_result(body: &Value) -> CallToolResult {
    let mut text = streams(body);
    text.push_str(&format!(
        "exit_code: {}\n{}",
        body["exit_code"],
        body["message"].as_str().unwrap_or_default()
    ));
    if body["stdout_truncated"] == true || body["stderr_truncated"] == true {
        text.push_str("\n[output was longer than the server keeps; the start is shown]");
    }
    // A failing command is still a result the model should read, not a tool failure.
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// The answer to `execute_code` / `execute_python`: text, then each image output.
pub fn code_result(body: &Value) -> CallToolResult {
    let mut text = streams(body);
    let mut images = Vec::new();
    for out in body["outputs"].as_array().into_iter().flatten() {
        let data = &out["data"];
        let mut shown = false;
        for mime in ["image/png", "image/jpeg", "image/gif", "image/webp"] {
            if let Some(b64) = data[mime].as_str() {
                images.push(ContentBlock::image(b64.to_string(), mime.to_string()));
                shown = true;
                break;
            }
        }
        if out["kind"] == "result" {
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
    if let Some(err) = body.get("error").filter(|e| !e.is_null()) {
        let tb: Vec<&str> = err["traceback"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        text.push_str(&format!(
            "error: {}: {}\n{}\n",
            err["name"].as_str().unwrap_or_default(),
            err["value"].as_str().unwrap_or_default(),
            truncate(&tb.join("\n"), TRACEBACK_LIMIT)
        ));
    }
    let done = &body["done"];
    text.push_str(&format!(
        "status: {} (execution {}, {:.0} ms)",
        done["status"].as_str().unwrap_or_default(),
        done["execution_count"],
        done["duration_ms"].as_f64().unwrap_or_default()
    ));
    if let Some(note) = done["note"].as_str().filter(|n| !n.is_empty()) {
        text.push_str(&format!("\nnote: {note}"));
    }
    if done["state_lost"] == true {
        text.push_str("\nthe kernel's state was lost (it died); variables must be defined again");
    }
    let mut content = vec![ContentBlock::text(text)];
    content.extend(images);
    CallToolResult::success(content)
}

/// A file's contents for `export_files`: text when it is UTF-8, else base64.
pub fn file_content(path: &str, reply: &ApiReply) -> ContentBlock {
    if !reply.ok() {
        return ContentBlock::text(format!(
            "{path}: contents not available ({})",
            reply.body["message"].as_str().unwrap_or("not a file")
        ));
    }
    if reply.bytes.len() > INLINE_FILE_LIMIT {
        return ContentBlock::text(format!(
            "{path}: {} bytes, over the {INLINE_FILE_LIMIT}-byte inline limit; use the download link",
            reply.bytes.len()
        ));
    }
    match std::str::from_utf8(&reply.bytes) {
        Ok(text) => ContentBlock::text(format!("{path}:\n{}", truncate(text, RESULT_LIMIT))),
        Err(_) => ContentBlock::text(format!(
            "{path} (base64):\n{}",
            base64::engine::general_purpose::STANDARD.encode(&reply.bytes)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_with_a_marker() {
        let cut = truncate(&"x".repeat(120), 100);
        assert!(cut.starts_with(&"x".repeat(100)));
        assert!(cut.ends_with("[... truncated: 20 of 120 characters not shown]"));
        assert_eq!(truncate("short", 100), "short");
    }

    #[test]
    fn an_image_output_becomes_image_content() {
        let body = serde_json::json!({
            "stdout": "", "stderr": "",
            "outputs": [{"kind": "display", "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}}],
            "result": null, "error": null,
            "done": {"status": "ok", "execution_count": 1, "duration_ms": 3.0}
        });
        let r = code_result(&body);
        assert!(
            r.content
                .iter()
                .any(|c| matches!(c, ContentBlock::Image(i) if i.mime_type == "image/png"))
        );
    }
}
