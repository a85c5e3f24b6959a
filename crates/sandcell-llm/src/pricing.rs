//! Model prices, to turn usage into cost for budgets and reports.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::ModelRef;
use crate::response::Usage;

/// A model's list price in USD per million tokens, and its context window when known.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// USD per million input tokens.
    pub input_per_mtok: f64,
    /// USD per million output tokens.
    pub output_per_mtok: f64,
    /// The most tokens (prompt and output) the model takes, for condensing history in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
}

impl Price {
    const fn new(input_per_mtok: f64, output_per_mtok: f64, context_window: u32) -> Self {
        Self {
            input_per_mtok,
            output_per_mtok,
            context_window: Some(context_window),
        }
    }
}

/// Prices by model: keys are `provider/model` or a bare `model`; a key also prices the
/// dated snapshots it is a prefix of (`gpt-4o` prices `gpt-4o-2024-08-06`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable(BTreeMap<String, Price>);

/// Public list prices (USD per million tokens, standard tier, no caching or batch discounts)
/// of a handful of current models, so costs show without any setup. Prices change: operators
/// override or add models in the config file (`[agent.prices]`), which wins over these.
/// Keyed by bare model name, so an operator's `provider/model` key takes precedence.
const BUILTIN: &[(&str, Price)] = &[
    // OpenAI
    ("gpt-5", Price::new(1.25, 10.0, 400_000)),
    ("gpt-5-mini", Price::new(0.25, 2.0, 400_000)),
    ("gpt-5-nano", Price::new(0.05, 0.40, 400_000)),
    ("gpt-4.1", Price::new(2.0, 8.0, 1_047_576)),
    ("gpt-4.1-mini", Price::new(0.40, 1.60, 1_047_576)),
    ("gpt-4.1-nano", Price::new(0.10, 0.40, 1_047_576)),
    ("gpt-4o", Price::new(2.50, 10.0, 128_000)),
    ("gpt-4o-mini", Price::new(0.15, 0.60, 128_000)),
    ("o3", Price::new(2.0, 8.0, 200_000)),
    ("o4-mini", Price::new(1.10, 4.40, 200_000)),
    // Anthropic
    ("claude-opus-4-5", Price::new(5.0, 25.0, 200_000)),
    ("claude-opus-4-1", Price::new(15.0, 75.0, 200_000)),
    ("claude-opus-4", Price::new(15.0, 75.0, 200_000)),
    ("claude-sonnet-4-5", Price::new(3.0, 15.0, 200_000)),
    ("claude-sonnet-4", Price::new(3.0, 15.0, 200_000)),
    ("claude-haiku-4-5", Price::new(1.0, 5.0, 200_000)),
    ("claude-3-5-haiku", Price::new(0.80, 4.0, 200_000)),
];

impl PriceTable {
    /// An empty table (every cost unknown).
    pub fn new() -> Self {
        Self::default()
    }

    /// The built-in list prices (see `BUILTIN`; operators override them in the config).
    pub fn builtin() -> Self {
        Self(
            BUILTIN
                .iter()
                .map(|(k, p)| ((*k).to_string(), *p))
                .collect(),
        )
    }

    /// Adds or replaces the price under `key` (`provider/model` or a bare model).
    pub fn insert(&mut self, key: String, p: Price) {
        self.0.insert(key, p);
    }

    /// Every entry, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Price)> {
        self.0.iter().map(|(k, p)| (k.as_str(), p))
    }

    /// The price of `m`: the exact `provider/model` key, else the bare model, else the
    /// longest key that is a prefix of it ending at a `-`, `@` or `:` (dated snapshots such
    /// as `gpt-4o-2024-08-06` or `claude-sonnet-4-5-20250929`; provider-qualified keys win
    /// ties). `None` when nothing matches.
    pub fn get(&self, m: &ModelRef) -> Option<&Price> {
        let full = m.to_string();
        if let Some(p) = self.0.get(&full) {
            return Some(p);
        }
        if let Some(p) = self.0.get(&m.model) {
            return Some(p);
        }
        let qualifier = format!("{}/", m.provider);
        let mut best: Option<(usize, bool, &Price)> = None;
        for (key, price) in &self.0 {
            let (name, qualified) = match key.strip_prefix(&qualifier) {
                Some(rest) => (rest, true),
                None => (key.as_str(), false),
            };
            if !is_snapshot_of(&m.model, name) {
                continue;
            }
            let better = match best {
                None => true,
                Some((len, q, _)) => name.len() > len || (name.len() == len && qualified && !q),
            };
            if better {
                best = Some((name.len(), qualified, price));
            }
        }
        best.map(|(_, _, p)| p)
    }

    /// The cost in USD of `u` on `m`; `None` when the price is unknown (never a made-up 0).
    pub fn cost(&self, m: &ModelRef, u: &Usage) -> Option<f64> {
        let p = self.get(m)?;
        Some(
            (u.input_tokens as f64 * p.input_per_mtok + u.output_tokens as f64 * p.output_per_mtok)
                / 1_000_000.0,
        )
    }
}

/// Whether `model` is `base` followed by a version suffix.
fn is_snapshot_of(model: &str, base: &str) -> bool {
    !base.is_empty()
        && model
            .strip_prefix(base)
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| matches!(c, '-' | '@' | ':'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProviderKind;

    fn m(s: &str) -> ModelRef {
        s.parse().unwrap()
    }

    #[test]
    fn exact_then_bare_then_prefix() {
        let mut t = PriceTable::builtin();
        assert_eq!(t.get(&m("openai/gpt-4o")).unwrap().input_per_mtok, 2.50);
        assert_eq!(
            t.get(&m("openai/gpt-4o-mini")).unwrap().input_per_mtok,
            0.15
        );
        // A dated snapshot takes the longest prefix: gpt-4o-mini, not gpt-4o.
        assert_eq!(
            t.get(&m("openai/gpt-4o-mini-2024-07-18"))
                .unwrap()
                .input_per_mtok,
            0.15
        );
        assert_eq!(
            t.get(&m("openai/gpt-4o-2024-08-06"))
                .unwrap()
                .output_per_mtok,
            10.0
        );
        assert_eq!(
            t.get(&m("anthropic/claude-sonnet-4-5-20250929"))
                .unwrap()
                .output_per_mtok,
            15.0
        );
        assert_eq!(
            t.get(&m("anthropic/claude-opus-4-1-20250805"))
                .unwrap()
                .input_per_mtok,
            15.0
        );
        // An operator's provider-qualified key wins over the built-in bare one.
        t.insert(
            "openai/gpt-4o".into(),
            Price {
                input_per_mtok: 1.0,
                output_per_mtok: 2.0,
                context_window: None,
            },
        );
        assert_eq!(t.get(&m("openai/gpt-4o")).unwrap().input_per_mtok, 1.0);
        assert_eq!(
            t.get(&m("openai/gpt-4o-2024-08-06"))
                .unwrap()
                .input_per_mtok,
            1.0
        );
        // ... and a bare override replaces the built-in one.
        t.insert(
            "gpt-4o-mini".into(),
            Price {
                input_per_mtok: 9.0,
                output_per_mtok: 9.0,
                context_window: None,
            },
        );
        assert_eq!(t.get(&m("openai/gpt-4o-mini")).unwrap().input_per_mtok, 9.0);
    }

    #[test]
    fn unknown_models_have_no_price_and_no_cost() {
        let t = PriceTable::builtin();
        let u = Usage {
            input_tokens: 1000,
            output_tokens: 1000,
            estimated: false,
        };
        for s in [
            "openai/meta-llama/Llama-3.1-8B",
            "openai/gpt-4oz",
            "openai/gpt-5.1",
            "anthropic/claude-2",
        ] {
            assert!(t.get(&m(s)).is_none(), "{s}");
            assert_eq!(t.cost(&m(s), &u), None, "{s}");
        }
        assert_eq!(PriceTable::new().cost(&m("openai/gpt-4o"), &u), None);
    }

    #[test]
    fn cost_is_per_million_tokens() {
        let t = PriceTable::builtin();
        let u = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            estimated: false,
        };
        let c = t
            .cost(
                &ModelRef::new(ProviderKind::Anthropic, "claude-sonnet-4-5"),
                &u,
            )
            .unwrap();
        assert!((c - (3.0 + 7.5)).abs() < 1e-9, "{c}");
        let zero = Usage::default();
        assert_eq!(t.cost(&m("openai/gpt-4o"), &zero), Some(0.0));
    }

    #[test]
    fn local_models_priced_by_full_key() {
        let mut t = PriceTable::new();
        t.insert(
            "openai/meta-llama/Llama-3.1-8B".into(),
            Price {
                input_per_mtok: 0.0,
                output_per_mtok: 0.0,
                context_window: Some(8192),
            },
        );
        let p = t.get(&m("openai/meta-llama/Llama-3.1-8B")).unwrap();
        assert_eq!(p.context_window, Some(8192));
        assert!(t.get(&m("anthropic/meta-llama/Llama-3.1-8B")).is_none());
    }
}
