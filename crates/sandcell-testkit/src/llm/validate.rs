//! The checks a real service makes before answering, kept to the ones its public
//! documentation states, so a client that sends what the real service refuses fails here
//! first (with the protocol's 400).

use std::collections::BTreeSet;

use serde_json::Value;

/// OpenAI Chat Completions: `model` and a non-empty `messages`; images only in user
/// messages; every assistant `tool_calls` answered by `tool` messages (one per id) before
/// any other message, and no `tool` message that answers nothing.
pub(crate) fn openai(body: &Value) -> Result<(), String> {
    if !body.get("model").is_some_and(Value::is_string) {
        return Err("you must provide a model parameter".into());
    }
    let messages = match body.get("messages").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => m,
        _ => return Err("'messages' must be a non-empty array".into()),
    };
    let mut pending: BTreeSet<String> = BTreeSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(format!("Invalid value for 'messages[{i}].role': {role:?}"));
        }
        if role != "user" {
            let has_image = m
                .get("content")
                .and_then(Value::as_array)
                .is_some_and(|parts| {
                    parts
                        .iter()
                        .any(|p| p.get("type").and_then(Value::as_str) == Some("image_url"))
                });
            if has_image {
                return Err(format!(
                    "Invalid 'messages[{i}]'. Image URLs are only allowed for messages with role \
                     'user', but this message with role '{role}' contains an image URL."
                ));
            }
        }
        if role == "tool" {
            let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
            if !pending.remove(id) {
                return Err(format!(
                    "Invalid parameter: messages[{i}] with role 'tool' must be a response to a \
                     preceding message with 'tool_calls' (tool_call_id {id:?})."
                ));
            }
            continue;
        }
        if !pending.is_empty() {
            return Err(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages \
                 responding to each 'tool_call_id'. The following tool_call_ids did not have \
                 response messages: {}",
                pending.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        if role == "assistant"
            && let Some(calls) = m.get("tool_calls").and_then(Value::as_array)
        {
            for c in calls {
                let id = c.get("id").and_then(Value::as_str).unwrap_or("");
                pending.insert(id.to_string());
            }
        }
    }
    if !pending.is_empty() {
        return Err(format!(
            "An assistant message with 'tool_calls' must be followed by tool messages responding \
             to each 'tool_call_id'. The following tool_call_ids did not have response \
             messages: {}",
            pending.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(())
}

/// Anthropic Messages: `model`, `max_tokens` and a non-empty `messages` of user/assistant
/// roles; every `tool_use` answered by a `tool_result` in the next (user) message, and no
/// `tool_result` for an id the previous message did not use.
pub(crate) fn anthropic(body: &Value) -> Result<(), String> {
    if !body.get("model").is_some_and(Value::is_string) {
        return Err("model: Field required".into());
    }
    if !body.get("max_tokens").is_some_and(Value::is_u64) {
        return Err("max_tokens: Field required".into());
    }
    let messages = match body.get("messages").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => m,
        _ => return Err("messages: at least one message is required".into()),
    };
    let mut used: BTreeSet<String> = BTreeSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "user" | "assistant") {
            return Err(format!(
                "messages.{i}.role: Input should be 'user' or 'assistant'"
            ));
        }
        let blocks = m
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let of_type = |t: &str| {
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some(t))
                .collect::<Vec<_>>()
        };
        let results: BTreeSet<String> = of_type("tool_result")
            .iter()
            .map(|b| {
                b.get("tool_use_id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        if let Some(stray) = results.iter().find(|id| !used.contains(*id)) {
            return Err(format!(
                "messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: \
                 {stray}. Each `tool_result` block must have a corresponding `tool_use` block \
                 in the previous message."
            ));
        }
        let missing: Vec<&String> = used.iter().filter(|id| !results.contains(*id)).collect();
        if !missing.is_empty() {
            return Err(format!(
                "messages.{i}: `tool_use` ids were found without `tool_result` blocks \
                 immediately after: {}. Each `tool_use` block must have a corresponding \
                 `tool_result` block in the next message.",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        used = of_type("tool_use")
            .iter()
            .map(|b| {
                b.get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
    }
    if !used.is_empty() {
        return Err(format!(
            "messages: `tool_use` ids were found without `tool_result` blocks immediately \
             after: {}. Each `tool_use` block must have a corresponding `tool_result` block in \
             the next message.",
            used.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn openai_accepts_a_complete_tool_exchange() {
        let ok = json!({"model": "m", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "b", "content": "1"},
            {"role": "tool", "tool_call_id": "a", "content": "2"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}
        ]});
        assert_eq!(openai(&ok), Ok(()));
    }

    #[test]
    fn openai_refuses_what_the_service_refuses() {
        let call = json!({"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]});
        let user = json!({"role": "user", "content": "x"});
        let cases = [
            (json!({"messages": [user]}), "model"),
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": [user, call]}),
                "did not have response",
            ),
            (
                json!({"model": "m", "messages": [user, call, user]}),
                "did not have response",
            ),
            (
                json!({"model": "m", "messages": [user, {"role": "tool", "tool_call_id": "z", "content": "1"}]}),
                "must be a response",
            ),
            (
                json!({"model": "m", "messages": [user, call, {"role": "tool", "tool_call_id": "a",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}]}),
                "only allowed for messages with role 'user'",
            ),
        ];
        for (body, want) in cases {
            let e = openai(&body).expect_err("refused");
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn anthropic_checks_fields_and_pairs() {
        let use_ = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]});
        let result = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]});
        let user = json!({"role": "user", "content": "go"});
        assert_eq!(
            anthropic(&json!({"model": "m", "max_tokens": 5, "messages": [user, use_, result]})),
            Ok(())
        );
        let cases = [
            (json!({"model": "m", "messages": [user]}), "max_tokens"),
            (json!({"max_tokens": 5, "messages": [user]}), "model"),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [user, use_]}),
                "without `tool_result`",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [user, use_, user]}),
                "without `tool_result`",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [user, result]}),
                "unexpected `tool_use_id`",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "s"}]}),
                "role",
            ),
        ];
        for (body, want) in cases {
            let e = anthropic(&body).expect_err("refused");
            assert!(e.contains(want), "{body}: {e}");
        }
    }
}
