//! Where each provider is, which key it takes, how calls retry, and what models cost.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::ProviderKind;
use crate::pricing::{Price, PriceTable};

/// OpenAI's endpoint; like the official client's, the base includes `/v1`.
pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// Anthropic's endpoint; like the official client's, the base has no `/v1`.
pub const ANTHROPIC_DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

/// One provider's endpoint and key.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The base URL, without a trailing `/` (OpenAI's includes `/v1`, Anthropic's does not).
    pub base_url: String,
    /// The key, if one was found. Never printed (`Debug` shows `***`).
    pub api_key: Option<String>,
    /// The environment variable the key is read from (named in "no key" errors).
    pub key_env: String,
}

impl ProviderConfig {
    /// The provider's official endpoint with no key yet.
    pub fn default_for(kind: ProviderKind) -> Self {
        Self {
            base_url: kind.default_base_url().to_string(),
            api_key: None,
            key_env: kind.default_key_env().to_string(),
        }
    }

    /// Whether this is the provider's official endpoint (which always needs a key; local
    /// servers at a custom URL may take none).
    pub fn is_official(&self, kind: ProviderKind) -> bool {
        normalize_base_url(&self.base_url) == kind.default_base_url()
    }
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("key_env", &self.key_env)
            .finish()
    }
}

/// How failed calls are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 4, so at most 5 attempts).
    pub max_retries: u32,
    /// The first backoff (default 500 ms), doubled each retry.
    pub base_delay: Duration,
    /// The longest wait, for backoff and for a server's `retry-after` (default 30 s).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

/// Everything [`crate::Llm`] needs.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// The Chat Completions endpoint (OpenAI or a compatible server).
    pub openai: ProviderConfig,
    /// The Messages endpoint.
    pub anthropic: ProviderConfig,
    /// Retries.
    pub retry: RetryPolicy,
    /// Prices for costs.
    pub prices: PriceTable,
    /// The longest one attempt may take, streaming included (default 600 s, as the official
    /// clients).
    pub request_timeout: Duration,
}

impl Default for LlmConfig {
    /// The official endpoints, no keys, default retries, built-in prices.
    fn default() -> Self {
        Self {
            openai: ProviderConfig::default_for(ProviderKind::OpenAi),
            anthropic: ProviderConfig::default_for(ProviderKind::Anthropic),
            retry: RetryPolicy::default(),
            prices: PriceTable::builtin(),
            request_timeout: Duration::from_secs(600),
        }
    }
}

/// The config file's provider settings (`[agent.providers.*]` and `[agent.prices]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LlmSettings {
    /// `[agent.providers.openai]`.
    pub openai: Option<ProviderSettings>,
    /// `[agent.providers.anthropic]`.
    pub anthropic: Option<ProviderSettings>,
    /// Prices by `provider/model` or bare `model`, added to or overriding the built-in ones.
    pub prices: BTreeMap<String, Price>,
}

/// One provider's settings in the config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderSettings {
    /// Its endpoint (a local server, a gateway).
    pub base_url: Option<String>,
    /// The environment variable holding its key (the key itself never goes in the file).
    pub key_env: Option<String>,
}

/// Trims the trailing `/` so URLs join and compare the same however they were written.
pub(crate) fn normalize_base_url(url: &str) -> &str {
    url.trim().trim_end_matches('/')
}

/// A variable's value, treating an empty one as unset (as shells leave them).
fn non_empty(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

impl LlmConfig {
    /// From the environment like the official clients: `OPENAI_API_KEY`, `OPENAI_BASE_URL`
    /// (the base includes `/v1`; default `https://api.openai.com/v1`), `ANTHROPIC_API_KEY`,
    /// `ANTHROPIC_BASE_URL` (no `/v1`; default `https://api.anthropic.com`).
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Same, reading variables through `get` (tests pass a map rather than change the
    /// process environment).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let provider = |kind: ProviderKind| {
            let key_env = kind.default_key_env().to_string();
            ProviderConfig {
                base_url: non_empty(get(kind.base_url_env()))
                    .map(|u| normalize_base_url(&u).to_string())
                    .unwrap_or_else(|| kind.default_base_url().to_string()),
                api_key: non_empty(get(&key_env)),
                key_env,
            }
        };
        Self {
            openai: provider(ProviderKind::OpenAi),
            anthropic: provider(ProviderKind::Anthropic),
            ..Self::default()
        }
    }

    /// Applies the config file's settings over this: a `base_url` replaces the current one;
    /// a `key_env` names the variable the key is read from instead (through `get`; unset
    /// means no key); prices are added or override. The file wins over the environment's
    /// base URLs, since it is the more specific choice.
    pub fn with_settings(mut self, s: &LlmSettings, get: impl Fn(&str) -> Option<String>) -> Self {
        for (kind, settings) in [
            (ProviderKind::OpenAi, &s.openai),
            (ProviderKind::Anthropic, &s.anthropic),
        ] {
            let Some(settings) = settings else { continue };
            let p = self.provider_mut(kind);
            if let Some(url) = non_empty(settings.base_url.clone()) {
                p.base_url = normalize_base_url(&url).to_string();
            }
            if let Some(var) = non_empty(settings.key_env.clone()) {
                p.api_key = non_empty(get(&var));
                p.key_env = var;
            }
        }
        for (key, price) in &s.prices {
            self.prices.insert(key.clone(), *price);
        }
        self
    }

    /// One provider's settings.
    pub fn provider(&self, kind: ProviderKind) -> &ProviderConfig {
        match kind {
            ProviderKind::OpenAi => &self.openai,
            ProviderKind::Anthropic => &self.anthropic,
        }
    }

    /// One provider's settings, to change.
    pub fn provider_mut(&mut self, kind: ProviderKind) -> &mut ProviderConfig {
        match kind {
            ProviderKind::OpenAi => &mut self.openai,
            ProviderKind::Anthropic => &mut self.anthropic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_are_the_official_endpoints() {
        let c = LlmConfig::from_vars(vars(&[]));
        assert_eq!(c.openai.base_url, "https://api.openai.com/v1");
        assert_eq!(c.anthropic.base_url, "https://api.anthropic.com");
        assert_eq!(c.openai.api_key, None);
        assert_eq!(c.openai.key_env, "OPENAI_API_KEY");
        assert_eq!(c.anthropic.key_env, "ANTHROPIC_API_KEY");
        assert!(c.openai.is_official(ProviderKind::OpenAi));
        assert_eq!(c.retry.max_retries, 4);
        assert_eq!(c.retry.base_delay, Duration::from_millis(500));
        assert_eq!(c.retry.max_delay, Duration::from_secs(30));
        assert_eq!(c.request_timeout, Duration::from_secs(600));
        assert!(c.prices.iter().count() > 5);
    }

    #[test]
    fn reads_keys_and_base_urls() {
        let c = LlmConfig::from_vars(vars(&[
            ("OPENAI_API_KEY", "sk-openai-secret"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1/"),
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
            ("ANTHROPIC_BASE_URL", ""),
        ]));
        assert_eq!(c.openai.api_key.as_deref(), Some("sk-openai-secret"));
        assert_eq!(c.openai.base_url, "http://127.0.0.1:8000/v1");
        assert!(!c.openai.is_official(ProviderKind::OpenAi));
        assert_eq!(c.anthropic.base_url, ANTHROPIC_DEFAULT_BASE_URL);
        assert_eq!(c.anthropic.api_key.as_deref(), Some("sk-ant-secret"));
    }

    #[test]
    fn debug_never_shows_a_key() {
        let c = LlmConfig::from_vars(vars(&[
            ("OPENAI_API_KEY", "sk-openai-secret"),
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
        ]));
        let d = format!("{c:?} {:?} {:#?}", c.openai, c);
        assert!(!d.contains("sk-openai-secret"), "{d}");
        assert!(!d.contains("sk-ant-secret"), "{d}");
        assert!(d.contains("***"), "{d}");
    }

    #[test]
    fn settings_apply_over_the_environment() {
        let settings: LlmSettings = serde_json::from_value(serde_json::json!({
            "openai": {"base_url": "http://127.0.0.1:11434/v1", "key_env": "LOCAL_KEY"},
            "prices": {
                "openai/llama3": {"input_per_mtok": 0.0, "output_per_mtok": 0.0, "context_window": 8192},
                "gpt-4o": {"input_per_mtok": 1.0, "output_per_mtok": 4.0}
            }
        }))
        .unwrap();
        let get = vars(&[
            ("OPENAI_API_KEY", "sk-openai-secret"),
            ("LOCAL_KEY", "local-secret"),
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
        ]);
        let c = LlmConfig::from_vars(&get).with_settings(&settings, &get);
        assert_eq!(c.openai.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(c.openai.key_env, "LOCAL_KEY");
        assert_eq!(c.openai.api_key.as_deref(), Some("local-secret"));
        // Untouched provider keeps what the environment gave.
        assert_eq!(c.anthropic.api_key.as_deref(), Some("sk-ant-secret"));
        let llama: crate::ModelRef = "openai/llama3".parse().unwrap();
        assert_eq!(c.prices.get(&llama).unwrap().context_window, Some(8192));
        let gpt: crate::ModelRef = "openai/gpt-4o".parse().unwrap();
        assert_eq!(c.prices.get(&gpt).unwrap().input_per_mtok, 1.0);

        // A key_env naming an unset variable means no key.
        let s2 = LlmSettings {
            anthropic: Some(ProviderSettings {
                base_url: None,
                key_env: Some("MISSING".into()),
            }),
            ..Default::default()
        };
        let c = LlmConfig::from_vars(&get).with_settings(&s2, &get);
        assert_eq!(c.anthropic.api_key, None);
        assert_eq!(c.anthropic.key_env, "MISSING");
    }

    #[test]
    fn provider_settings_reject_unknown_fields() {
        let r: Result<ProviderSettings, _> =
            serde_json::from_value(serde_json::json!({"base-url": "x"}));
        assert!(r.is_err());
    }
}
