//! The first stage: the run's and the tool's call budgets, given back if
//! the call is refused later.

use super::tools::ToolState;
use crate::sync::{AtomicU32, Ordering};
use crate::throttled::{Status, Throttled};

/// Which budget units a call holds (each only when that budget is limited).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Units {
    run: bool,
    tool: bool,
}

/// Takes one unit of `counter` if it is below `limit`.
#[inline]
pub(super) fn take_below(counter: &AtomicU32, limit: Option<u32>) -> bool {
    let Some(limit) = limit else { return true };
    // Relaxed: a counter; the CAS makes the bound exact.
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            (used < limit).then_some(used + 1)
        })
        .is_ok()
}

/// The run's call budget (`Builder::run_budget`).
pub(super) struct RunBudget {
    limit: Option<u32>,
    used: AtomicU32,
}

impl RunBudget {
    pub(super) fn new(limit: Option<u32>) -> Self {
        Self {
            limit,
            used: AtomicU32::new(0),
        }
    }

    /// Takes one unit of the run's budget and one of `tool`'s, or neither.
    #[inline]
    pub(super) fn claim(&self, tool: &ToolState, tool_name: &str) -> Result<Units, Throttled> {
        if !take_below(&self.used, self.limit) {
            return Err(Throttled::new(
                Status::BudgetExhausted,
                "run",
                "this run's call budget is spent; finish with what you have",
            ));
        }
        let units = Units {
            run: self.limit.is_some(),
            tool: tool.budget.is_some(),
        };
        if !take_below(&tool.used, tool.budget) {
            self.give_back(
                tool,
                Units {
                    tool: false,
                    ..units
                },
            );
            return Err(Throttled::new(
                Status::BudgetExhausted,
                format!("tool:{tool_name}"),
                format!("this run's budget for {tool_name} is spent"),
            ));
        }
        Ok(units)
    }

    /// Gives back the units `claim` took for a call that was not admitted.
    #[inline]
    pub(super) fn give_back(&self, tool: &ToolState, units: Units) {
        // Relaxed: counters; they guard no other memory.
        if units.run {
            self.used.fetch_sub(1, Ordering::Relaxed);
        }
        if units.tool {
            tool.used.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub(super) fn reset(&self) {
        // Relaxed: a counter.
        self.used.store(0, Ordering::Relaxed);
    }
}
