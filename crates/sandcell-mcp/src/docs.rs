//! The tool list as Markdown, for docs/mcp.md (a test checks the doc holds the current one).

use crate::tools::SandcellMcp;

/// Markdown listing every tool with its description and parameters.
pub fn tools_markdown() -> String {
    let mut out = String::new();
    for tool in SandcellMcp::tools() {
        out.push_str(&format!("### `{}`\n\n", tool.name));
        if let Some(d) = &tool.description {
            out.push_str(&format!("{d}\n\n"));
        }
        let schema = serde_json::Value::Object((*tool.input_schema).clone());
        let required: Vec<&str> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        let props = schema["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        if props.is_empty() {
            out.push_str("No parameters.\n\n");
            continue;
        }
        out.push_str("| parameter | required | description |\n|---|---|---|\n");
        for (name, p) in props {
            let desc = p["description"]
                .as_str()
                .unwrap_or_default()
                .replace('\n', " ");
            let req = if required.contains(&name.as_str()) {
                "yes"
            } else {
                ""
            };
            out.push_str(&format!("| `{name}` | {req} | {desc} |\n"));
        }
        out.push('\n');
    }
    out
}
