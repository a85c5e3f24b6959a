//! Code execution in language kernels: languages, contexts, events and results.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A language with a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    /// The system `python3`.
    Python,
    /// The system `node`.
    Node,
    /// A persistent `bash`.
    Bash,
    /// `Rscript`.
    R,
}

impl Language {
    /// Every language, in a stable order.
    pub const ALL: [Language; 4] = [
        Language::Python,
        Language::Node,
        Language::Bash,
        Language::R,
    ];

    /// The wire and CLI name (`python`, `node`, `bash`, `r`).
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Bash => "bash",
            Language::R => "r",
        }
    }

    /// Parses a name, accepting common aliases (`py`, `python3`, `js`, `javascript`, `sh`).
    pub fn parse(name: &str) -> Option<Language> {
        match name.to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Some(Language::Python),
            "node" | "nodejs" | "js" | "javascript" => Some(Language::Node),
            "bash" | "sh" | "shell" => Some(Language::Bash),
            "r" => Some(Language::R),
            _ => None,
        }
    }
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A MIME bundle: MIME type -> value (text, base64 for binary types, any JSON for
/// `application/json`).
pub type MimeBundle = BTreeMap<String, serde_json::Value>;

/// Runs code in a context. Replies: `CodeStream`, `CodeDisplay`, `CodeResult`, `CodeError`
/// events in the order they happened, then `CodeDone`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCodeRequest {
    /// The context to run in; `None` means the default context of `language`.
    #[serde(default)]
    pub context: Option<String>,
    /// The language, required without `context` (a given context has its own).
    #[serde(default)]
    pub language: Option<Language>,
    /// The code.
    pub code: String,
    /// Interrupt after this long (then kill the kernel if it does not yield).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeStatus {
    /// It ran to the end.
    Ok,
    /// It raised an error (see the error event), or a Bash cell exited non-zero.
    Error,
    /// It was interrupted on request; the context's state is kept.
    Interrupted,
    /// It passed its timeout and was interrupted (or, if it did not yield, its kernel killed).
    Timeout,
    /// The kernel process died; its state is lost.
    Crashed,
}

impl CodeStatus {
    /// The name used on the wire and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            CodeStatus::Ok => "ok",
            CodeStatus::Error => "error",
            CodeStatus::Interrupted => "interrupted",
            CodeStatus::Timeout => "timeout",
            CodeStatus::Crashed => "crashed",
        }
    }
}

/// An error raised by the code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeError {
    /// The error's type name (`ZeroDivisionError`).
    pub ename: String,
    /// Its message.
    pub evalue: String,
    /// Traceback lines, pointing at the user's code.
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// A file the execution created or changed in the outputs folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// MIME type guessed from the name.
    pub mime: String,
}

/// The end of an execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeDone {
    /// The context it ran in.
    pub context: String,
    /// Its language.
    pub language: Language,
    /// How it ended.
    pub status: CodeStatus,
    /// Executions of this kernel so far, this one included (0 if it never ran).
    pub execution_count: u64,
    /// Wall time of the execution.
    pub duration_ms: f64,
    /// Bash: the cell's exit status.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The context's variables are gone (its kernel died or was killed).
    #[serde(default)]
    pub state_lost: bool,
    /// This execution ran in a fresh kernel because the previous one had died.
    #[serde(default)]
    pub kernel_restarted: bool,
    /// Why the kernel died (a signal, an exit code, out of memory), when it did.
    #[serde(default)]
    pub crash: Option<String>,
    /// The signal that killed the kernel, when one did.
    #[serde(default)]
    pub crash_signal: Option<i32>,
    /// A human-readable note (kernel restarted, output truncated, …).
    #[serde(default)]
    pub notice: Option<String>,
    /// Files created or changed in the outputs folder.
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    /// Stream bytes dropped past the output limit.
    #[serde(default)]
    pub stdout_dropped: u64,
    /// Stream bytes dropped past the output limit.
    #[serde(default)]
    pub stderr_dropped: u64,
}

/// A context: one kernel and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextInfo {
    /// Its id (the default context of a language is named after it: `python`).
    pub id: String,
    /// Its language.
    pub language: Language,
    /// The kernel's pid inside the sandbox, while it runs.
    #[serde(default)]
    pub pid: Option<i32>,
    /// Executions so far in the current kernel.
    pub execution_count: u64,
    /// An execution is running.
    pub busy: bool,
}

/// One variable of a context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableInfo {
    /// Its name.
    pub name: String,
    /// Its type, in the language's words.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Whether its value converts to JSON exactly.
    pub json: bool,
}

/// A variable whose value has no exact JSON form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unrepresentable {
    /// Its type, in the language's words.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Its repr, cut at 1000 characters.
    pub repr: String,
}

/// Values read from a context.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Variables {
    /// Values that convert to JSON exactly.
    pub values: BTreeMap<String, serde_json::Value>,
    /// The others, described.
    #[serde(default)]
    pub unrepresentable: BTreeMap<String, Unrepresentable>,
    /// Requested names that do not exist.
    #[serde(default)]
    pub missing: Vec<String>,
}

/// Whether a piece of code is a complete cell (for REPL continuation lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Completeness {
    /// It can run as is.
    Complete,
    /// It needs more lines.
    Incomplete,
    /// No further line can fix it.
    Invalid,
}

/// A variable that state capture left out of a kernel's state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedVariable {
    /// Its name.
    pub name: String,
    /// Its type, in the language's words.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Why it was left out (an open file, a generator, a value that cannot be cloned, …).
    pub reason: String,
}

/// A variable of a state file that could not be restored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedVariable {
    /// Its name.
    pub name: String,
    /// Why it could not be restored (a module that is not installed, …).
    pub reason: String,
}

/// What a kernel's state file holds: the variables carried, those left out, and its size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateReport {
    /// Variables written, in definition order (modules as their import).
    pub saved: Vec<String>,
    /// Variables left out, each with why.
    #[serde(default)]
    pub skipped: Vec<SkippedVariable>,
    /// Size of the state file in bytes.
    pub bytes: u64,
}

/// What restoring a kernel's state file brought back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreReport {
    /// Variables restored.
    pub restored: Vec<String>,
    /// Variables of the file that could not be restored, each with why.
    #[serde(default)]
    pub failed: Vec<FailedVariable>,
}
