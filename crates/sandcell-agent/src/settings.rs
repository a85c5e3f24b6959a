//! What a run is started with when its request leaves something out: the configured model,
//! mode and budgets, and the providers (from `[agent]` in the settings and the environment).

use sandcell_api::runs::{Budgets, BudgetsInput, RunMode, SnapshotPolicy};
use sandcell_service::ServiceError;
use sandcell_service::config::AgentConfig;

/// Hard maxima: what no request or setting may go past.
pub const MAX_ITERATIONS: u32 = 50;
/// Levels of sub-runs.
pub const MAX_DEPTH: u32 = 5;
/// US dollars per run tree.
pub const MAX_COST_USD: f64 = 10.0;
/// Seconds per run.
pub const MAX_TIMEOUT_SECS: f64 = 600.0;
/// Seconds per cell.
pub const MAX_CELL_TIMEOUT_SECS: f64 = 600.0;
/// Sub-calls per run tree.
pub const MAX_SUB_CALLS: u32 = 1000;

/// The defaults of runs, resolved from the settings.
#[derive(Debug, Clone)]
pub struct AgentDefaults {
    /// `provider/model`, when one is configured.
    pub model: Option<String>,
    /// The default mode.
    pub mode: RunMode,
    /// Stream model answers.
    pub stream: bool,
    /// Budgets of a run that asks for none.
    pub budgets: Budgets,
    /// When a run that says nothing snapshots its steps.
    pub snapshots: SnapshotPolicy,
    /// Delete an ended run's unneeded step snapshots.
    pub prune_snapshots: bool,
}

impl AgentDefaults {
    /// From the service's `[agent]` settings.
    pub fn from_config(a: &AgentConfig) -> Self {
        Self {
            model: (!a.model.is_empty()).then(|| a.model.clone()),
            mode: if a.mode == "repl" {
                RunMode::Repl
            } else {
                RunMode::Tools
            },
            stream: a.stream,
            // The settings are checked when loaded; anything else is the default.
            snapshots: a.step_snapshots.parse().unwrap_or_default(),
            prune_snapshots: a.prune_step_snapshots,
            budgets: Budgets {
                max_iterations: clamp_u32(a.max_iterations, MAX_ITERATIONS),
                max_depth: clamp_u32(a.max_depth, MAX_DEPTH),
                max_sub_calls: clamp_u32(a.max_sub_calls, MAX_SUB_CALLS),
                token_budget: (a.token_budget > 0).then_some(a.token_budget),
                cost_limit_usd: a.cost_limit_usd.min(MAX_COST_USD),
                timeout_secs: (a.timeout_secs as f64).min(MAX_TIMEOUT_SECS),
                cell_timeout_secs: (a.cell_timeout_secs as f64).min(MAX_CELL_TIMEOUT_SECS),
                max_output_tokens: clamp_u32(a.max_output_tokens, u32::MAX),
            },
        }
    }

    /// A request's budgets over the defaults: each given one checked against its hard maximum.
    pub fn budgets(&self, asked: &BudgetsInput) -> Result<Budgets, ServiceError> {
        let d = &self.budgets;
        let whole = |name: &str, v: Option<u32>, default: u32, max: u32| match v {
            None => Ok(default),
            Some(v) if (1..=max).contains(&v) => Ok(v),
            Some(v) => Err(ServiceError::invalid(format!(
                "budgets.{name} must be 1 to {max}, got {v}"
            ))),
        };
        let secs = |name: &str, v: Option<f64>, default: f64, max: f64| match v {
            None => Ok(default),
            Some(v) if v.is_finite() && v > 0.0 && v <= max => Ok(v),
            Some(v) => Err(ServiceError::invalid(format!(
                "budgets.{name} must be above 0 and at most {max}, got {v}"
            ))),
        };
        let token_budget = match asked.token_budget {
            Some(0) => {
                return Err(ServiceError::invalid(
                    "budgets.token_budget must be positive (leave it out for no limit)",
                ));
            }
            Some(t) => Some(t),
            None => d.token_budget,
        };
        Ok(Budgets {
            max_iterations: whole(
                "max_iterations",
                asked.max_iterations,
                d.max_iterations,
                MAX_ITERATIONS,
            )?,
            max_depth: match asked.max_depth {
                None => d.max_depth,
                Some(v) if v <= MAX_DEPTH => v,
                Some(v) => {
                    return Err(ServiceError::invalid(format!(
                        "budgets.max_depth must be 0 to {MAX_DEPTH}, got {v}"
                    )));
                }
            },
            max_sub_calls: match asked.max_sub_calls {
                None => d.max_sub_calls,
                Some(v) if v <= MAX_SUB_CALLS => v,
                Some(v) => {
                    return Err(ServiceError::invalid(format!(
                        "budgets.max_sub_calls must be 0 to {MAX_SUB_CALLS}, got {v}"
                    )));
                }
            },
            token_budget,
            cost_limit_usd: secs(
                "cost_limit_usd",
                asked.cost_limit_usd,
                d.cost_limit_usd,
                MAX_COST_USD,
            )?,
            timeout_secs: secs(
                "timeout_secs",
                asked.timeout_secs,
                d.timeout_secs,
                MAX_TIMEOUT_SECS,
            )?,
            cell_timeout_secs: secs(
                "cell_timeout_secs",
                asked.cell_timeout_secs,
                d.cell_timeout_secs,
                MAX_CELL_TIMEOUT_SECS,
            )?,
            max_output_tokens: whole(
                "max_output_tokens",
                asked.max_output_tokens,
                d.max_output_tokens,
                u32::MAX,
            )?,
        })
    }
}

fn clamp_u32(v: u64, max: u32) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX).min(max)
}

/// The providers' settings, as the service reads them (moved there so memories' models
/// share them): kept here for the agent's callers.
pub use sandcell_service::config::llm_config;

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> AgentDefaults {
        let home = tempfile::tempdir().unwrap();
        let (config, _) = sandcell_service::config::load(home.path(), None, &[], &[]).unwrap();
        AgentDefaults::from_config(&config.agent)
    }

    #[test]
    fn budgets_default_and_refuse_what_is_past_their_maximum() {
        let d = defaults();
        let b = d.budgets(&BudgetsInput::default()).unwrap();
        assert_eq!(
            (
                b.max_iterations,
                b.max_depth,
                b.max_sub_calls,
                b.token_budget
            ),
            (10, 4, 12, None)
        );
        assert_eq!(
            (b.cost_limit_usd, b.timeout_secs, b.cell_timeout_secs),
            (2.0, 300.0, 30.0)
        );
        let asked = BudgetsInput {
            max_iterations: Some(3),
            token_budget: Some(150),
            ..BudgetsInput::default()
        };
        let b = d.budgets(&asked).unwrap();
        assert_eq!((b.max_iterations, b.token_budget), (3, Some(150)));
        for bad in [
            BudgetsInput {
                max_iterations: Some(51),
                ..BudgetsInput::default()
            },
            BudgetsInput {
                max_depth: Some(6),
                ..BudgetsInput::default()
            },
            BudgetsInput {
                cost_limit_usd: Some(10.5),
                ..BudgetsInput::default()
            },
            BudgetsInput {
                timeout_secs: Some(f64::NAN),
                ..BudgetsInput::default()
            },
            BudgetsInput {
                token_budget: Some(0),
                ..BudgetsInput::default()
            },
        ] {
            let e = d.budgets(&bad).unwrap_err();
            assert!(e.message.starts_with("budgets."), "{}", e.message);
        }
    }
}
