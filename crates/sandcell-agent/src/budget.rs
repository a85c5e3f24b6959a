//! One budget pool per run tree: every model call (the run's own, its sub-calls, its
//! sub-runs') reserves its worst case before it is sent and settles at its real usage, so no
//! call is sent that could take the tree past its token or cost limit; the reservation also
//! shrinks a call's `max_tokens` to what is left.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sandcell_api::runs::{Budgets, RunUsage};
use sandcell_llm::{Price, Usage};

/// Fewest output tokens worth a call: below this a reservation is refused rather than sent
/// to produce a truncated answer.
pub const MIN_OUTPUT_TOKENS: u64 = 16;

/// Which limit stopped something (the run's reason is `budget:<which>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// The token budget.
    Tokens,
    /// The cost limit.
    Cost,
    /// Sub-calls.
    SubCalls,
    /// Model calls with tools.
    Iterations,
    /// Levels of sub-runs.
    Depth,
}

impl Exhausted {
    /// `budget:tokens`, …
    pub fn reason(self) -> &'static str {
        match self {
            Exhausted::Tokens => "budget:tokens",
            Exhausted::Cost => "budget:cost",
            Exhausted::SubCalls => "budget:sub_calls",
            Exhausted::Iterations => "budget:iterations",
            Exhausted::Depth => "budget:depth",
        }
    }
}

/// What one call may use, held until it settles.
#[derive(Debug)]
#[must_use = "a reservation is settled (or released) once its call is done"]
pub struct Reservation {
    tokens: u64,
    cost: f64,
    /// The output tokens the call may ask for.
    pub max_tokens: u32,
}

#[derive(Debug, Default)]
struct Counts {
    input: u64,
    output: u64,
    cost: f64,
    cost_unknown: bool,
    estimated: bool,
    reserved_tokens: u64,
    reserved_cost: f64,
    llm_calls: u32,
    sub_calls: u32,
    tool_calls: u32,
    steps: u32,
}

/// A run tree's budgets and what it has used.
#[derive(Debug)]
pub struct Pool {
    budgets: Budgets,
    started: Instant,
    counts: Mutex<Counts>,
}

impl Pool {
    /// A fresh pool under `budgets`, its clock started now.
    pub fn new(budgets: Budgets) -> Self {
        Self {
            budgets,
            started: Instant::now(),
            counts: Mutex::default(),
        }
    }

    /// A pool that continues from usage recorded earlier (a run resumed after a restart).
    pub fn resumed(budgets: Budgets, used: &RunUsage, ran: Duration) -> Self {
        let mut pool = Self::new(budgets);
        // The run's clock goes on from the time it had run before it stopped.
        if let Some(started) = pool.started.checked_sub(ran) {
            pool.started = started;
        }
        {
            let mut c = pool.counts();
            c.input = used.input_tokens;
            c.output = used.output_tokens;
            c.cost = used.cost_usd.unwrap_or(0.0);
            c.cost_unknown = used.cost_usd.is_none() && used.llm_calls > 0;
            c.estimated = used.estimated;
            c.llm_calls = used.llm_calls;
            c.sub_calls = used.sub_calls;
            c.tool_calls = used.tool_calls;
            c.steps = used.steps;
        }
        pool
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The budgets.
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    /// Time left of the tree's wall-clock budget (zero once past it).
    pub fn time_left(&self) -> Duration {
        Duration::from_secs_f64(self.budgets.timeout_secs).saturating_sub(self.started.elapsed())
    }

    /// Reserves one model call: `prompt_tokens` estimated, up to `max_output` out, at `price`
    /// (unknown: the cost limit cannot be held, and the caller says so). `sub_call`: it counts
    /// against the sub-call budget too.
    pub fn reserve(
        &self,
        prompt_tokens: u64,
        max_output: u32,
        price: Option<&Price>,
        sub_call: bool,
    ) -> Result<Reservation, Exhausted> {
        let mut c = self.counts();
        if sub_call && c.sub_calls >= self.budgets.max_sub_calls {
            return Err(Exhausted::SubCalls);
        }
        let mut out = u64::from(max_output);
        if let Some(budget) = self.budgets.token_budget {
            let left = budget.saturating_sub(c.input + c.output + c.reserved_tokens);
            let room = left.saturating_sub(prompt_tokens);
            if room < MIN_OUTPUT_TOKENS {
                return Err(Exhausted::Tokens);
            }
            out = out.min(room);
        }
        let mut cost = 0.0;
        if let Some(p) = price {
            let left = self.budgets.cost_limit_usd - c.cost - c.reserved_cost;
            let input_cost = prompt_tokens as f64 * p.input_per_mtok / 1e6;
            if p.output_per_mtok > 0.0 {
                let affordable = ((left - input_cost) * 1e6 / p.output_per_mtok).floor();
                if affordable < MIN_OUTPUT_TOKENS as f64 {
                    return Err(Exhausted::Cost);
                }
                out = out.min(affordable as u64);
            } else if input_cost > left {
                return Err(Exhausted::Cost);
            }
            cost = input_cost + out as f64 * p.output_per_mtok / 1e6;
        }
        let tokens = prompt_tokens + out;
        c.reserved_tokens += tokens;
        c.reserved_cost += cost;
        c.llm_calls += 1;
        if sub_call {
            c.sub_calls += 1;
        }
        Ok(Reservation {
            tokens,
            cost,
            max_tokens: u32::try_from(out).unwrap_or(u32::MAX),
        })
    }

    /// Settles a call at its real usage and cost (`None`: unknown price).
    pub fn settle(&self, r: Reservation, usage: &Usage, cost: Option<f64>) {
        let mut c = self.counts();
        c.reserved_tokens = c.reserved_tokens.saturating_sub(r.tokens);
        c.reserved_cost = (c.reserved_cost - r.cost).max(0.0);
        c.input += usage.input_tokens;
        c.output += usage.output_tokens;
        c.estimated |= usage.estimated;
        match cost {
            Some(v) => c.cost += v,
            None => c.cost_unknown = true,
        }
    }

    /// Gives back a reservation whose call was never answered (it failed or was cancelled).
    pub fn release(&self, r: Reservation) {
        let mut c = self.counts();
        c.reserved_tokens = c.reserved_tokens.saturating_sub(r.tokens);
        c.reserved_cost = (c.reserved_cost - r.cost).max(0.0);
    }

    /// Counts a sub-call that is not a model call of its own (a sub-run), refused past the
    /// sub-call budget.
    pub fn take_sub_call(&self) -> Result<(), Exhausted> {
        let mut c = self.counts();
        if c.sub_calls >= self.budgets.max_sub_calls {
            return Err(Exhausted::SubCalls);
        }
        c.sub_calls += 1;
        Ok(())
    }

    /// Counts a model call answered before a restart (its usage spent, not yet in the
    /// totals the run was resumed with).
    pub fn count_spent(&self, usage: &Usage, cost: Option<f64>) {
        let mut c = self.counts();
        c.llm_calls += 1;
        c.input += usage.input_tokens;
        c.output += usage.output_tokens;
        c.estimated |= usage.estimated;
        match cost {
            Some(v) => c.cost += v,
            None => c.cost_unknown = true,
        }
    }

    /// Counts a tool call.
    pub fn count_tool_call(&self) {
        self.counts().tool_calls += 1;
    }

    /// Counts a finished step.
    pub fn count_step(&self) {
        self.counts().steps += 1;
    }

    /// What the tree has used so far.
    pub fn usage(&self) -> RunUsage {
        let c = self.counts();
        RunUsage {
            input_tokens: c.input,
            output_tokens: c.output,
            cost_usd: (!c.cost_unknown).then_some(c.cost),
            steps: c.steps,
            llm_calls: c.llm_calls,
            tool_calls: c.tool_calls,
            sub_calls: c.sub_calls,
            estimated: c.estimated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(tokens: Option<u64>, cost: f64) -> Budgets {
        Budgets {
            max_iterations: 10,
            max_depth: 4,
            max_sub_calls: 2,
            token_budget: tokens,
            cost_limit_usd: cost,
            timeout_secs: 300.0,
            cell_timeout_secs: 30.0,
            max_output_tokens: 4096,
        }
    }

    fn usage(i: u64, o: u64) -> Usage {
        Usage {
            input_tokens: i,
            output_tokens: o,
            estimated: false,
        }
    }

    #[test]
    fn a_token_budget_shrinks_the_call_then_refuses_it() {
        let pool = Pool::new(budgets(Some(300), 2.0));
        let r = pool.reserve(100, 4096, None, false).unwrap();
        // Only what is left after the prompt may be asked for.
        assert_eq!(r.max_tokens, 200);
        pool.settle(r, &usage(100, 10), None);
        let r = pool.reserve(100, 4096, None, false).unwrap();
        assert_eq!(r.max_tokens, 90);
        // While one call holds its worst case, the next cannot fit.
        assert_eq!(
            pool.reserve(100, 4096, None, false).unwrap_err(),
            Exhausted::Tokens
        );
        pool.settle(r, &usage(100, 10), None);
        let used = pool.usage();
        assert_eq!(
            (used.input_tokens, used.output_tokens, used.llm_calls),
            (200, 20, 2)
        );
        assert_eq!(used.cost_usd, None, "an unknown price is no cost, not zero");
        // Never past the budget: 220 used, the next prompt alone leaves under the minimum.
        assert_eq!(
            pool.reserve(70, 4096, None, false).unwrap_err(),
            Exhausted::Tokens
        );
    }

    #[test]
    fn a_cost_limit_holds_with_a_known_price_and_sub_calls_are_counted() {
        // $1 per million either way: $0.001 buys 1000 tokens.
        let price = Price {
            input_per_mtok: 1.0,
            output_per_mtok: 1.0,
            context_window: None,
        };
        let pool = Pool::new(budgets(None, 0.001));
        let r = pool.reserve(400, 4096, Some(&price), true).unwrap();
        assert_eq!(r.max_tokens, 600);
        pool.settle(r, &usage(400, 600), Some(0.001));
        assert_eq!(
            pool.reserve(10, 100, Some(&price), false).unwrap_err(),
            Exhausted::Cost
        );
        let _ = pool.reserve(0, 0, None, true);
        assert_eq!(
            pool.reserve(0, 0, None, true).unwrap_err(),
            Exhausted::SubCalls
        );
        assert_eq!(pool.usage().cost_usd, Some(0.001));
    }
}
