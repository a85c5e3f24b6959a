//! The tools of `tools` mode: named as the MCP tools users already know, each run through the
//! service's typed operations on the run's sandbox, its result turned into what the model
//! reads (text, and images kept as artifacts).

use base64::Engine as _;
use sandcell_api::SandboxId;
use sandcell_api::code::{CodeInput, CodeResult, SetVariables};
use sandcell_api::exec::ExecInput;
use sandcell_api::memories::{AddMemory, SearchMemories};
use sandcell_api::sandboxes::Lang;
use sandcell_api::transfer::{CreateExport, ImportRequest};
use sandcell_api::{Code, Timeout};
use sandcell_llm::{Image, ToolSpec};
use sandcell_service::memory::Scope;
use sandcell_service::{Caller, Service, ServiceError};
use serde_json::{Value, json};

/// The longest text of one tool result the model reads; the rest is cut with a marker.
pub const MAX_RESULT_CHARS: usize = 20_000;
/// The tool that ends a run with its answer.
pub const FINAL_ANSWER: &str = "final_answer";
/// One sub-call to a model.
pub const SUB_COMPLETE: &str = "sub_complete";
/// Several sub-calls at once.
pub const SUB_COMPLETE_BATCHED: &str = "sub_complete_batched";

fn spec(name: &str, description: &str, parameters: Value) -> ToolSpec {
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        parameters,
    }
}

const LANGUAGES: [&str; 4] = ["python", "node", "bash", "r"];

/// The tools offered to the model.
pub fn specs() -> Vec<ToolSpec> {
    let language = json!({"type": "string", "enum": LANGUAGES, "description": "the kernel's language (default python)"});
    vec![
        spec(
            "execute_code",
            "Run code in the sandbox's live kernel. Variables, imports and definitions persist between calls. Returns stdout, stderr, the value of the last expression, errors with a traceback, and images of plots.",
            json!({"type": "object", "properties": {"code": {"type": "string", "description": "the code to run"}, "language": language}, "required": ["code"]}),
        ),
        spec(
            "execute_terminal",
            "Run a shell command in the sandbox (sh -c, working directory /workspace). Returns stdout, stderr and how it ended.",
            json!({"type": "object", "properties": {"command": {"type": "string"}, "cwd": {"type": "string"}}, "required": ["command"]}),
        ),
        spec(
            "get_repl_context",
            "Read variables of a kernel as JSON (all user variables, or the names given).",
            json!({"type": "object", "properties": {"names": {"type": "array", "items": {"type": "string"}}, "language": language}}),
        ),
        spec(
            "set_repl_context",
            "Set variables in a kernel from JSON values.",
            json!({"type": "object", "properties": {"variables": {"type": "object"}, "language": language}, "required": ["variables"]}),
        ),
        spec(
            "clear_repl_context",
            "Delete variables from a kernel (all user variables when no names are given).",
            json!({"type": "object", "properties": {"names": {"type": "array", "items": {"type": "string"}}, "language": language}}),
        ),
        spec(
            "import_files",
            "Write files into the sandbox: each {path, text} or {path, base64}.",
            json!({"type": "object", "properties": {"files": {"type": "array", "items": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}, "base64": {"type": "string"}}, "required": ["path"]}}}, "required": ["files"]}),
        ),
        spec(
            "export_files",
            "Copy files or folders out of the sandbox so they outlive it; returns an export id per path.",
            json!({"type": "object", "properties": {"paths": {"type": "array", "items": {"type": "string"}}}, "required": ["paths"]}),
        ),
        spec(
            "memory_add",
            "Remember a fact for later runs: kept with this sandbox (scope \"sandbox\", the default) or with you across sandboxes (scope \"owner\"). Forks of this sandbox see what it remembered.",
            json!({"type": "object", "properties": {"text": {"type": "string"}, "category": {"type": "string", "description": "lowercase letters, digits, - _ . (default general)"}, "scope": {"type": "string", "enum": ["sandbox", "owner"]}}, "required": ["text"]}),
        ),
        spec(
            "memory_search",
            "Search what was remembered (memory_add), most relevant first, by the words of the query.",
            json!({"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 100}, "category": {"type": "string"}, "scope": {"type": "string", "enum": ["sandbox", "owner"]}}, "required": ["query"]}),
        ),
        spec(
            SUB_COMPLETE,
            "Ask a language model one question (no tools); returns its answer. Use it on pieces of a large input.",
            json!({"type": "object", "properties": {"prompt": {"type": "string"}, "model": {"type": "string", "description": "provider/model (default: this run's)"}}, "required": ["prompt"]}),
        ),
        spec(
            SUB_COMPLETE_BATCHED,
            "Ask a language model several independent questions at once; returns the answers in order.",
            json!({"type": "object", "properties": {"prompts": {"type": "array", "items": {"type": "string"}}, "model": {"type": "string"}}, "required": ["prompts"]}),
        ),
        spec(
            FINAL_ANSWER,
            "Give the final answer to the task; the run ends.",
            json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}),
        ),
    ]
}

/// What a tool gave back.
#[derive(Debug, Default)]
pub struct Outcome {
    /// What the model reads.
    pub text: String,
    /// Images (plots).
    pub images: Vec<Image>,
    /// The tool failed or the code raised.
    pub is_error: bool,
}

impl Outcome {
    fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            images: Vec::new(),
            is_error: true,
        }
    }
}

/// Cuts `text` to at most `max` characters, keeping its start and end around a marker.
pub fn truncate(text: &str, max: usize) -> (String, bool) {
    let count = text.chars().count();
    if count <= max {
        return (text.to_string(), false);
    }
    let head: String = text.chars().take(max * 3 / 4).collect();
    let tail: String = text.chars().skip(count - max / 4).collect();
    let cut = count - head.chars().count() - tail.chars().count();
    (format!("{head}\n…[{cut} characters cut]…\n{tail}"), true)
}

fn string_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, String> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("argument '{name}' (a string) is required"))
}

fn language(args: &Value) -> Result<Lang, String> {
    match args
        .get("language")
        .and_then(Value::as_str)
        .unwrap_or("python")
    {
        "python" => Ok(Lang::Python),
        "node" | "javascript" | "js" => Ok(Lang::Node),
        "bash" | "sh" | "shell" => Ok(Lang::Bash),
        "r" | "R" => Ok(Lang::R),
        other => Err(format!(
            "unknown language '{other}' (python, node, bash or r)"
        )),
    }
}

/// The default context of `l` (its id is the language's name).
fn lang_name(l: Lang) -> &'static str {
    sandcell_protocol::Language::from(l).as_str()
}

fn names(args: &Value) -> Option<Vec<String>> {
    args.get("names")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .filter(|n| !n.is_empty())
}

/// The text of a code result: streams, the result's text, the error with its traceback's
/// tail; and its images.
pub fn code_outcome(r: &CodeResult) -> Outcome {
    let mut text = String::new();
    if !r.stdout.is_empty() {
        text.push_str(&r.stdout);
        if !r.stdout.ends_with('\n') {
            text.push('\n');
        }
    }
    if !r.stderr.is_empty() {
        text.push_str("[stderr]\n");
        text.push_str(&r.stderr);
        if !r.stderr.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(plain) = r
        .result
        .as_ref()
        .and_then(|b| b.get("text/plain"))
        .and_then(Value::as_str)
    {
        text.push_str(&format!("[result] {plain}\n"));
    }
    let mut images = Vec::new();
    for o in &r.outputs {
        for media in ["image/png", "image/jpeg"] {
            if let Some(data) = o.data.get(media).and_then(Value::as_str) {
                images.push(Image {
                    media_type: media.to_string(),
                    data: data.replace(['\n', '\r'], ""),
                });
            }
        }
    }
    let is_error = r.error.is_some();
    if let Some(e) = &r.error {
        let tail: Vec<&String> = e.traceback.iter().rev().take(10).collect();
        text.push_str(&format!("[error] {}: {}\n", e.name, e.value));
        for line in tail.into_iter().rev() {
            text.push_str(line);
            if !line.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    if text.is_empty() {
        text.push_str(if images.is_empty() {
            "(no output)"
        } else {
            "(an image)"
        });
    }
    Outcome {
        text,
        images,
        is_error,
    }
}

/// Where the sandbox tools act, and with what limits.
#[derive(Debug, Clone)]
pub struct Sandbox<'a> {
    /// The service.
    pub service: &'a Service,
    /// Whose run it is.
    pub caller: &'a Caller,
    /// The run's sandbox.
    pub id: &'a SandboxId,
    /// Seconds one cell may run.
    pub cell_timeout: Timeout,
}

impl Sandbox<'_> {
    /// Runs sandbox tool `name` (not a sub-call, not the final answer).
    pub async fn run(&self, name: &str, args: &Value) -> Outcome {
        match self.dispatch(name, args).await {
            Ok(outcome) => outcome,
            Err(Failure::Argument(m)) => Outcome::error(format!("invalid arguments: {m}")),
            Err(Failure::Service(e)) => Outcome::error(format!("{}: {}", e.code(), e.message)),
        }
    }

    async fn dispatch(&self, name: &str, args: &Value) -> Result<Outcome, Failure> {
        let (s, caller, id) = (self.service, self.caller, self.id);
        match name {
            "execute_code" => {
                let lang = language(args)?;
                let code = Code::new(string_arg(args, "code")?).map_err(|e| e.0)?;
                let input = CodeInput {
                    code,
                    language: Some(lang),
                    context: None,
                    timeout_secs: Some(self.cell_timeout),
                };
                Ok(code_outcome(&s.run_code(caller, id, input).await?))
            }
            "execute_terminal" => {
                let input = ExecInput {
                    cmd: Some(string_arg(args, "command")?.to_string()),
                    cwd: args.get("cwd").and_then(Value::as_str).map(str::to_string),
                    timeout_secs: Some(self.cell_timeout),
                    ..ExecInput::default()
                };
                let out = s.exec(caller, id, input).await?;
                let mut text = out.stdout.clone();
                if !out.stderr.is_empty() {
                    text.push_str("\n[stderr]\n");
                    text.push_str(&out.stderr);
                }
                text.push_str(&format!("\n[{}]", out.result.message));
                Ok(Outcome {
                    text,
                    images: Vec::new(),
                    is_error: !out.ok,
                })
            }
            "get_repl_context" => {
                let context = lang_name(language(args)?);
                let view = s.get_variables(caller, id, context, names(args)).await?;
                Ok(json_outcome(&view))
            }
            "set_repl_context" => {
                let context = lang_name(language(args)?);
                let values = args
                    .get("variables")
                    .and_then(Value::as_object)
                    .ok_or("argument 'variables' (an object) is required")?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let set = s
                    .set_variables(caller, id, context, SetVariables { values })
                    .await?;
                Ok(json_outcome(&set))
            }
            "clear_repl_context" => {
                let context = lang_name(language(args)?);
                let cleared = s.clear_variables(caller, id, context, names(args)).await?;
                Ok(json_outcome(&cleared))
            }
            "import_files" => {
                let files = args
                    .get("files")
                    .and_then(Value::as_array)
                    .filter(|f| !f.is_empty())
                    .ok_or("argument 'files' (a non-empty list) is required")?;
                let mut lines = Vec::new();
                for f in files {
                    let req = ImportRequest {
                        path: string_arg(f, "path")?.to_string(),
                        text: f.get("text").and_then(Value::as_str).map(str::to_string),
                        base64: f.get("base64").and_then(Value::as_str).map(str::to_string),
                        ..ImportRequest::default()
                    };
                    let done = s.import(caller, id, req).await?;
                    lines.push(format!("{} ({} bytes)", done.path, done.bytes));
                }
                Ok(Outcome {
                    text: format!("imported: {}", lines.join(", ")),
                    ..Outcome::default()
                })
            }
            "export_files" => {
                let paths = args
                    .get("paths")
                    .and_then(Value::as_array)
                    .filter(|p| !p.is_empty())
                    .ok_or("argument 'paths' (a non-empty list) is required")?;
                let mut lines = Vec::new();
                for p in paths {
                    let path = p.as_str().ok_or("each path is a string")?;
                    let info = s
                        .create_export(
                            caller,
                            id,
                            CreateExport {
                                path: path.to_string(),
                            },
                        )
                        .await?;
                    lines.push(format!("{} -> export {}", info.path, info.id));
                }
                Ok(Outcome {
                    text: lines.join("\n"),
                    ..Outcome::default()
                })
            }
            "memory_add" | "memory_search" => {
                let scope = match args.get("scope").and_then(Value::as_str) {
                    None | Some("sandbox") => Scope::Sandbox(id),
                    Some("owner") => Scope::Owner,
                    Some(other) => {
                        return Err(Failure::Argument(format!(
                            "'scope' is sandbox or owner, not {other:?}"
                        )));
                    }
                };
                // The request types check their fields (text, query, category) as they are
                // read: the same rules as the REST routes.
                let mut fields = args.clone();
                if let Some(o) = fields.as_object_mut() {
                    o.remove("scope");
                }
                let bad = |e: serde_json::Error| Failure::Argument(e.to_string());
                if name == "memory_add" {
                    let req: AddMemory = serde_json::from_value(fields).map_err(bad)?;
                    let m = s.add_memory(caller, scope, req).await?;
                    Ok(Outcome {
                        text: format!("remembered as {} ({})", m.id, m.category),
                        ..Outcome::default()
                    })
                } else {
                    let req: SearchMemories = serde_json::from_value(fields).map_err(bad)?;
                    let found = s.search_memories(caller, scope, req).await?;
                    Ok(json_outcome(&found))
                }
            }
            other => Err(Failure::Argument(format!("there is no tool '{other}'"))),
        }
    }
}

fn json_outcome<T: serde::Serialize>(v: &T) -> Outcome {
    Outcome {
        text: serde_json::to_string(v).unwrap_or_default(),
        ..Outcome::default()
    }
}

enum Failure {
    Argument(String),
    Service(ServiceError),
}

impl From<String> for Failure {
    fn from(m: String) -> Self {
        Failure::Argument(m)
    }
}

impl From<&str> for Failure {
    fn from(m: &str) -> Self {
        Failure::Argument(m.to_string())
    }
}

impl From<ServiceError> for Failure {
    fn from(e: ServiceError) -> Self {
        Failure::Service(e)
    }
}

/// Decodes an image's bytes (for keeping it as an artifact).
pub fn image_bytes(image: &Image) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(&image.data)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcell_api::code::{CodeDoneInfo, CodeErrorInfo};

    #[test]
    fn every_tool_has_an_object_schema_and_a_unique_name() {
        let specs = specs();
        let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), specs.len());
        for s in &specs {
            assert_eq!(s.parameters["type"], "object", "{}", s.name);
        }
        assert!(names.contains(&"execute_code") && names.contains(&FINAL_ANSWER));
    }

    #[test]
    fn long_text_keeps_its_start_and_end() {
        let text: String = (0..1000).map(|i| format!("{i}\n")).collect();
        let (cut, truncated) = truncate(&text, 100);
        assert!(truncated);
        assert!(cut.starts_with("0\n1\n") && cut.ends_with("999\n"), "{cut}");
        assert!(cut.contains("characters cut"));
        assert_eq!(truncate("short", 100), ("short".to_string(), false));
    }

    #[test]
    fn a_code_result_reads_as_streams_result_and_error() {
        let r = CodeResult {
            stdout: "SET 21\n".into(),
            stderr: String::new(),
            outputs: Vec::new(),
            result: Some(json!({"text/plain": "42"})),
            error: Some(CodeErrorInfo {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback: vec!["line 1".into()],
            }),
            done: CodeDoneInfo {
                context: "python".into(),
                language: Lang::Python,
                status: "error".into(),
                execution_count: 1,
                duration_ms: 1.0,
                exit_code: None,
                state_lost: false,
                kernel_restarted: false,
                crash: None,
                notice: None,
                artifacts: Vec::new(),
                stdout_dropped: 0,
                stderr_dropped: 0,
            },
        };
        let o = code_outcome(&r);
        assert!(o.is_error);
        assert!(
            o.text.contains("SET 21") && o.text.contains("[result] 42"),
            "{}",
            o.text
        );
        assert!(
            o.text
                .contains("ZeroDivisionError: division by zero\nline 1"),
            "{}",
            o.text
        );
    }
}
