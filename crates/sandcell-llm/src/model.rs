//! Which provider and model a call goes to, as one `provider/model` string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{LlmError, LlmErrorKind};

/// The wire protocol (and default endpoint) a model is reached through. `OpenAi` also covers
/// every server that speaks the Chat Completions protocol at a custom base URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI Chat Completions (`openai`).
    OpenAi,
    /// Anthropic Messages (`anthropic`).
    Anthropic,
}

impl ProviderKind {
    /// Every provider, in the order error messages list them.
    pub const ALL: [ProviderKind; 2] = [ProviderKind::OpenAi, ProviderKind::Anthropic];

    /// The name used in model strings, config files and messages.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    /// The official endpoint, used when no base URL is configured.
    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => crate::config::OPENAI_DEFAULT_BASE_URL,
            ProviderKind::Anthropic => crate::config::ANTHROPIC_DEFAULT_BASE_URL,
        }
    }

    /// The environment variable the official clients read the key from.
    pub fn default_key_env(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "OPENAI_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        }
    }

    /// The environment variable the official clients read a custom base URL from.
    pub fn base_url_env(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "OPENAI_BASE_URL",
            ProviderKind::Anthropic => "ANTHROPIC_BASE_URL",
        }
    }

    fn names() -> String {
        ProviderKind::ALL
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProviderKind {
    type Err = LlmError;

    fn from_str(s: &str) -> Result<Self, LlmError> {
        ProviderKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                LlmError::new(
                    LlmErrorKind::Config,
                    format!(
                        "unknown provider {s:?}: expected one of {}",
                        ProviderKind::names()
                    ),
                )
            })
    }
}

/// A model on a provider, written `provider/model` (`openai/gpt-4o-mini`,
/// `anthropic/claude-sonnet-4-5`). The model part may itself contain `/`
/// (`openai/meta-llama/Llama-3.1-8B` on vLLM or OpenRouter): only the first `/` splits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRef {
    /// The protocol and endpoint.
    pub provider: ProviderKind,
    /// The model name as the provider knows it (sent as the request's `model`).
    pub model: String,
}

impl ModelRef {
    /// A reference from its parts.
    pub fn new(provider: ProviderKind, model: impl Into<String>) -> Self {
        Self {
            provider,
            model: model.into(),
        }
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

impl FromStr for ModelRef {
    type Err = LlmError;

    fn from_str(s: &str) -> Result<Self, LlmError> {
        let s = s.trim();
        let Some((provider, model)) = s.split_once('/') else {
            return Err(LlmError::new(
                LlmErrorKind::Config,
                format!(
                    "model {s:?} names no provider: write provider/model, with provider one of {}",
                    ProviderKind::names()
                ),
            ));
        };
        let provider: ProviderKind = provider.parse().map_err(|_| {
            LlmError::new(
                LlmErrorKind::Config,
                format!(
                    "model {s:?} has unknown provider {provider:?}: expected one of {}",
                    ProviderKind::names()
                ),
            )
        })?;
        if model.trim().is_empty() {
            return Err(LlmError::new(
                LlmErrorKind::Config,
                format!(
                    "model {s:?} names no model after the provider: write provider/model, with provider one of {}",
                    ProviderKind::names()
                ),
            ));
        }
        Ok(ModelRef::new(provider, model))
    }
}

impl Serialize for ModelRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ModelRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_provider_and_model() {
        let m: ModelRef = "openai/gpt-4o-mini".parse().unwrap();
        assert_eq!(m, ModelRef::new(ProviderKind::OpenAi, "gpt-4o-mini"));
        let m: ModelRef = "anthropic/claude-sonnet-4-5".parse().unwrap();
        assert_eq!(m.provider, ProviderKind::Anthropic);
        assert_eq!(m.model, "claude-sonnet-4-5");
        assert_eq!(m.to_string(), "anthropic/claude-sonnet-4-5");
    }

    #[test]
    fn model_part_may_contain_slashes() {
        let m: ModelRef = "openai/meta-llama/Llama-3.1-8B".parse().unwrap();
        assert_eq!(m.provider, ProviderKind::OpenAi);
        assert_eq!(m.model, "meta-llama/Llama-3.1-8B");
        assert_eq!(m.to_string(), "openai/meta-llama/Llama-3.1-8B");
    }

    #[test]
    fn rejects_unknown_provider_listing_the_known_ones() {
        let e = "gemini/gemini-2.0".parse::<ModelRef>().unwrap_err();
        assert_eq!(e.kind, LlmErrorKind::Config);
        assert!(e.message.contains("gemini"), "{}", e.message);
        assert!(
            e.message.contains("openai") && e.message.contains("anthropic"),
            "{}",
            e.message
        );
        let e = "gpt-4o".parse::<ModelRef>().unwrap_err();
        assert_eq!(e.kind, LlmErrorKind::Config);
        assert!(e.message.contains("openai, anthropic"), "{}", e.message);
    }

    #[test]
    fn rejects_empty_model() {
        for s in ["openai/", "anthropic/  ", "openai"] {
            let e = s.parse::<ModelRef>().unwrap_err();
            assert_eq!(e.kind, LlmErrorKind::Config, "{s}");
        }
    }

    #[test]
    fn serde_as_one_string() {
        let m = ModelRef::new(ProviderKind::OpenAi, "meta-llama/Llama-3.1-8B");
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, "\"openai/meta-llama/Llama-3.1-8B\"");
        let back: ModelRef = serde_json::from_str(&j).unwrap();
        assert_eq!(back, m);
        assert!(serde_json::from_str::<ModelRef>("\"nope/x\"").is_err());
        assert_eq!(
            serde_json::to_string(&ProviderKind::OpenAi).unwrap(),
            "\"openai\""
        );
    }
}
