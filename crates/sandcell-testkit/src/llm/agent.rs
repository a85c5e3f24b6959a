//! The default scripted agent: a small deterministic conversation decided from the request,
//! shared by Rust tests ([`super::Script::default_agent`]) and the `scripted-llm` binary.

use serde_json::Value;

use super::{Recorded, ScriptedCall, Turn};

/// The text answered when the last user message holds no ```` ```python ```` block.
pub const NO_PYTHON_BLOCK: &str = "scripted agent: no ```python block in the last user message";

/// The text answered when tools are offered but none runs code.
pub const NO_CODE_TOOL: &str = "scripted agent: no code tool offered";

/// Decides one turn of the default agent:
///
/// 1. once a tool result is in the conversation: text `"FINAL: " + <the last tool result's
///    text>`;
/// 2. a code tool offered (a tool whose name contains `code` or `python`, any case; its
///    argument is `code` when the schema has it, else the first string property): call it
///    with the code of the first ```` ```python ```` (or ```` ```py ````) fenced block of the
///    last user message;
/// 3. no tools offered (REPL mode): answer that code as a ```` ```python ```` block;
/// 4. otherwise (no fenced block, or tools but none runs code): the text
///    [`NO_PYTHON_BLOCK`], or with tools but none that runs code [`NO_CODE_TOOL`].
pub fn default_agent_turn(r: &Recorded) -> Turn {
    if let Some(result) = r.last_tool_result() {
        return Turn::Text(format!("FINAL: {result}"));
    }
    let code = r.last_user_text().and_then(|t| python_block(&t));
    let tools = r.tools();
    if tools.is_empty() {
        return match code {
            Some(code) => Turn::Text(format!("```python\n{code}\n```")),
            None => Turn::Text(NO_PYTHON_BLOCK.to_string()),
        };
    }
    let Some((name, arg)) = code_tool(&tools) else {
        return Turn::Text(NO_CODE_TOOL.to_string());
    };
    match code {
        Some(code) => {
            let mut args = serde_json::Map::new();
            args.insert(arg, Value::String(code));
            Turn::ToolCalls(vec![ScriptedCall::new(name, Value::Object(args))])
        }
        None => Turn::Text(NO_PYTHON_BLOCK.to_string()),
    }
}

/// The first tool that runs code, and the name of its code argument.
fn code_tool(tools: &[(String, Value)]) -> Option<(String, String)> {
    tools.iter().find_map(|(name, schema)| {
        let lower = name.to_ascii_lowercase();
        if !(lower.contains("code") || lower.contains("python")) {
            return None;
        }
        let props = schema.get("properties").and_then(Value::as_object);
        let arg = match props {
            Some(p) if p.contains_key("code") => "code".to_string(),
            Some(p) => p
                .iter()
                .find(|(_, v)| v.get("type").and_then(Value::as_str) == Some("string"))
                .map(|(k, _)| k.clone())
                .unwrap_or_else(|| "code".to_string()),
            None => "code".to_string(),
        };
        Some((name.clone(), arg))
    })
}

/// The body of the first ```` ```python ```` / ```` ```py ```` fenced block of `text`.
pub(crate) fn python_block(text: &str) -> Option<String> {
    let mut rest = text;
    while let Some(at) = rest.find("```") {
        let after = &rest[at + 3..];
        let (info, body) = after.split_once('\n')?;
        let end = body.find("```")?;
        let lang = info.trim().to_ascii_lowercase();
        if lang == "python" || lang == "py" {
            return Some(body[..end].trim_end_matches('\n').to_string());
        }
        rest = &body[end + 3..];
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::llm::Protocol;

    fn rec(protocol: Protocol, body: Value) -> Recorded {
        Recorded {
            protocol,
            path: String::new(),
            headers: BTreeMap::new(),
            body,
            stream: false,
        }
    }

    #[test]
    fn finds_the_first_python_block() {
        let t = "see\n```bash\nls\n```\nthen\n```python\nx = 1\nprint(x)\n```\n```py\nno\n```";
        assert_eq!(python_block(t).as_deref(), Some("x = 1\nprint(x)"));
        assert_eq!(python_block("```py\n1\n```").as_deref(), Some("1"));
        assert_eq!(python_block("no fence"), None);
        assert_eq!(python_block("```python\nunterminated"), None);
    }

    #[test]
    fn agent_calls_then_finishes() {
        let tools = json!([{"type": "function", "function": {"name": "execute_code",
            "parameters": {"type": "object", "properties": {"language": {"type": "string"}, "code": {"type": "string"}}}}}]);
        let first = rec(
            Protocol::OpenAi,
            json!({"messages": [{"role": "user", "content": "do\n```python\nprint(6*7)\n```"}], "tools": tools}),
        );
        assert_eq!(
            default_agent_turn(&first),
            Turn::tool_call("execute_code", json!({"code": "print(6*7)"}))
        );
        let second = rec(
            Protocol::OpenAi,
            json!({"messages": [
                {"role": "user", "content": "do\n```python\nprint(6*7)\n```"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "execute_code", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42\n"}
            ], "tools": tools}),
        );
        assert_eq!(default_agent_turn(&second), Turn::text("FINAL: 42\n"));
    }

    #[test]
    fn agent_picks_the_string_argument_and_answers_repl_mode() {
        let r = rec(
            Protocol::Anthropic,
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "```python\n1+1\n```"}]}],
                "tools": [{"name": "web_search", "input_schema": {}},
                          {"name": "Python", "input_schema": {"properties": {"n": {"type": "integer"}, "src": {"type": "string"}}}}]}),
        );
        assert_eq!(
            default_agent_turn(&r),
            Turn::tool_call("Python", json!({"src": "1+1"}))
        );
        let repl = rec(
            Protocol::Anthropic,
            json!({"messages": [{"role": "user", "content": "```python\n1+1\n```"}]}),
        );
        assert_eq!(default_agent_turn(&repl), Turn::text("```python\n1+1\n```"));
        let none = rec(
            Protocol::Anthropic,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(default_agent_turn(&none), Turn::text(NO_PYTHON_BLOCK));
        let no_code_tool = rec(
            Protocol::OpenAi,
            json!({"messages": [{"role": "user", "content": "```python\n1\n```"}],
                "tools": [{"type": "function", "function": {"name": "search"}}]}),
        );
        assert_eq!(default_agent_turn(&no_code_tool), Turn::text(NO_CODE_TOOL));
    }
}
