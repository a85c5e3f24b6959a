//! Code in language kernels whose state persists (`POST /v1/sandboxes/{id}/code`, collected
//! or streamed); contexts, interrupts, restarts and variables (`…/contexts`).

use std::collections::BTreeMap;

use sandcell_protocol::{CodeDone, CodeError, ContextInfo, MimeBundle, Variables};
use serde::{Deserialize, Serialize};

use crate::exec::{StreamError, json_text, to_json};
use crate::sandboxes::Lang;
use crate::values::{Code, Timeout};

/// Code to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CodeInput {
    /// The code.
    #[cfg_attr(feature = "openapi", schema(value_type = String, max_length = 8388608))]
    pub code: Code,
    /// Its language (default `python`; ignored when `context` is given).
    pub language: Option<Lang>,
    /// A context made with `POST /contexts` (default: the language's own context).
    pub context: Option<String>,
    /// Seconds before the execution is interrupted (the kernel is killed if it does not
    /// yield).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, exclusive_minimum = 0, maximum = 604800))]
    pub timeout_secs: Option<Timeout>,
}

/// A finished execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeResult {
    /// Everything printed to stdout.
    pub stdout: String,
    /// Everything printed to stderr.
    pub stderr: String,
    /// Rich outputs in order: displays and the result, each a MIME bundle.
    pub outputs: Vec<RichOutput>,
    /// The value of the last expression, as a MIME bundle (`text/plain`, `image/png`, …).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub result: Option<serde_json::Value>,
    /// The error the code raised.
    pub error: Option<CodeErrorInfo>,
    /// How it ended.
    pub done: CodeDoneInfo,
}

/// One rich output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RichOutput {
    /// `display` or `result`.
    pub kind: String,
    /// MIME type → content (text, or base64 for images).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: serde_json::Value,
}

/// A MIME bundle as the API shows it.
pub fn bundle(data: &MimeBundle) -> serde_json::Value {
    to_json(data)
}

/// An error raised by code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeErrorInfo {
    /// Its type name (`ZeroDivisionError`).
    pub name: String,
    /// Its message.
    pub value: String,
    /// Traceback lines pointing at the user's code.
    pub traceback: Vec<String>,
}

impl From<&CodeError> for CodeErrorInfo {
    fn from(e: &CodeError) -> Self {
        Self {
            name: e.ename.clone(),
            value: e.evalue.clone(),
            traceback: e.traceback.clone(),
        }
    }
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeDoneInfo {
    /// The context it ran in.
    pub context: String,
    /// Its language.
    pub language: Lang,
    /// `ok`, `error`, `interrupted`, `timeout` or `crashed`.
    pub status: String,
    /// Executions of this kernel so far.
    pub execution_count: u64,
    /// Wall time in milliseconds.
    pub duration_ms: f64,
    /// Bash: the cell's exit status.
    pub exit_code: Option<i32>,
    /// The context's state is gone (its kernel died or was killed).
    pub state_lost: bool,
    /// This ran in a fresh kernel because the previous one had died.
    pub kernel_restarted: bool,
    /// Why the kernel died, when it did.
    pub crash: Option<String>,
    /// A note for people (kernel restarted, output cut, …).
    pub notice: Option<String>,
    /// Files created or changed in `/workspace/outputs`.
    pub artifacts: Vec<ArtifactInfo>,
    /// Output bytes dropped past the limit.
    pub stdout_dropped: u64,
    /// Output bytes dropped past the limit.
    pub stderr_dropped: u64,
}

/// A file the code wrote to the outputs folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArtifactInfo {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// MIME type from its name.
    pub mime: String,
}

impl From<&CodeDone> for CodeDoneInfo {
    fn from(d: &CodeDone) -> Self {
        Self {
            context: d.context.clone(),
            language: d.language.into(),
            status: d.status.as_str().to_string(),
            execution_count: d.execution_count,
            duration_ms: d.duration_ms,
            exit_code: d.exit_code,
            state_lost: d.state_lost,
            kernel_restarted: d.kernel_restarted,
            crash: d.crash.clone(),
            notice: d.notice.clone(),
            artifacts: d
                .artifacts
                .iter()
                .map(|a| ArtifactInfo {
                    path: a.path.clone(),
                    size: a.size,
                    mime: a.mime.clone(),
                })
                .collect(),
            stdout_dropped: d.stdout_dropped,
            stderr_dropped: d.stderr_dropped,
        }
    }
}

/// The `stdout` and `stderr` events of streamed code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeText {
    /// What was printed.
    pub text: String,
}

/// The `display` and `result` events of streamed code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RichData {
    /// MIME type → content.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: serde_json::Value,
}

/// One event of `POST …/code/stream`: its SSE name is [`CodeStreamEvent::name`], its data
/// the JSON of what it carries.
#[derive(Debug, Clone, PartialEq)]
pub enum CodeStreamEvent {
    /// `stdout`.
    Stdout(CodeText),
    /// `stderr`.
    Stderr(CodeText),
    /// `display`.
    Display(RichData),
    /// `result`.
    Result(RichData),
    /// `error`: the code raised (`{"name","value","traceback"}`); `done` follows.
    Error(CodeErrorInfo),
    /// `done`: the last event.
    Done(CodeDoneInfo),
    /// `error` with a `code`: the stream ended without a `done`.
    Failed(StreamError),
}

impl CodeStreamEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stdout(_) => "stdout",
            Self::Stderr(_) => "stderr",
            Self::Display(_) => "display",
            Self::Result(_) => "result",
            Self::Error(_) | Self::Failed(_) => "error",
            Self::Done(_) => "done",
        }
    }

    /// The SSE data: the JSON of what it carries.
    pub fn data(&self) -> String {
        match self {
            Self::Stdout(t) | Self::Stderr(t) => json_text(t),
            Self::Display(d) | Self::Result(d) => json_text(d),
            Self::Error(e) => json_text(e),
            Self::Done(d) => json_text(d),
            Self::Failed(e) => json_text(e),
        }
    }

    /// Parses an SSE event of the stream (`None` for an unknown name). An `error` is the
    /// code's own when it has a `name`, the service's when it has a `code`.
    pub fn parse(name: &str, data: &str) -> Option<Result<Self, serde_json::Error>> {
        Some(match name {
            "stdout" => serde_json::from_str(data).map(Self::Stdout),
            "stderr" => serde_json::from_str(data).map(Self::Stderr),
            "display" => serde_json::from_str(data).map(Self::Display),
            "result" => serde_json::from_str(data).map(Self::Result),
            "done" => serde_json::from_str(data).map(Self::Done),
            "error" => serde_json::from_str(data)
                .map(Self::Error)
                .or_else(|_| serde_json::from_str(data).map(Self::Failed)),
            _ => return None,
        })
    }
}

/// `POST /contexts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// The language of its kernel.
    pub language: Lang,
    /// Working directory of its kernel (default `/workspace`).
    pub cwd: Option<String>,
    /// Extra environment of its kernel.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A context: one kernel and its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextView {
    /// Its id (a language's default context is named after it: `python`).
    pub id: String,
    /// Its language.
    pub language: Lang,
    /// The kernel's pid in the sandbox, while it runs.
    pub pid: Option<i32>,
    /// Executions so far in the current kernel.
    pub execution_count: u64,
    /// An execution is running.
    pub busy: bool,
    /// When it was made (RFC 3339), as recorded.
    pub created_at: Option<String>,
    /// When it ended (RFC 3339): only in the list of a sandbox that is no longer running.
    pub ended_at: Option<String>,
    /// Why it ended.
    pub end_reason: Option<String>,
}

impl From<&ContextInfo> for ContextView {
    fn from(c: &ContextInfo) -> Self {
        Self {
            id: c.id.clone(),
            language: c.language.into(),
            pid: c.pid,
            execution_count: c.execution_count,
            busy: c.busy,
            created_at: None,
            ended_at: None,
            end_reason: None,
        }
    }
}

/// Values of a context's variables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VariablesView {
    /// Values that convert to JSON exactly.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub values: BTreeMap<String, serde_json::Value>,
    /// The others: their type and repr.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub unrepresentable: BTreeMap<String, serde_json::Value>,
    /// Requested names that do not exist.
    pub missing: Vec<String>,
}

impl From<Variables> for VariablesView {
    fn from(v: Variables) -> Self {
        Self {
            values: v.values,
            unrepresentable: v
                .unrepresentable
                .into_iter()
                .map(|(k, u)| (k, serde_json::json!({"type": u.type_name, "repr": u.repr})))
                .collect(),
            missing: v.missing,
        }
    }
}

/// `PUT /variables`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetVariables {
    /// Name → JSON value.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub values: BTreeMap<String, serde_json::Value>,
}

/// Variable names changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VariableNames {
    /// The names.
    pub names: Vec<String>,
}

/// The names of a `?names=a,b` value (blanks dropped), added to `names`.
pub fn add_names(names: &mut Vec<String>, value: &str) {
    names.extend(
        value
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_errors_and_service_errors_share_the_error_event() {
        let raised = CodeStreamEvent::Error(CodeErrorInfo {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: vec![],
        });
        let failed = CodeStreamEvent::Failed(StreamError {
            code: "unresponsive".into(),
            message: "no answer".into(),
            details: serde_json::Value::Null,
        });
        for e in [raised, failed] {
            let back = CodeStreamEvent::parse(e.name(), &e.data())
                .unwrap()
                .unwrap();
            assert_eq!(back, e);
        }
        let mut names = vec![];
        add_names(&mut names, "a, b,,c");
        assert_eq!(names, ["a", "b", "c"]);
    }
}
