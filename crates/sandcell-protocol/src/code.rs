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
