//! The first stage: the run's call budget and the tool's, taken before a
//! call waits for anything and given back if it is refused later.

use super::tools::ToolState;
use crate::sync::{AtomicU32, Ordering};
use crate::throttled::{Status, Throttled};

/// Takes the run budget; gives it back on drop unless kept.
pub(super) struct BudgetClaim<'a> {
    pub(super) run: Option<&'a AtomicU32>,
    pub(super) tool: Option<&'a AtomicU32>,
}

impl BudgetClaim<'_> {
    #[inline]
    pub(super) fn keep(mut self) {
        self.run = None;
        self.tool = None;
    }
}

impl Drop for BudgetClaim<'_> {
    fn drop(&mut self) {
        // Relaxed: a counter; it guards no other memory.
        if let Some(c) = self.run {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(c) = self.tool {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
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

/// The run's call budget (`Builder::run_budget`): what `reset_run`
/// starts again.
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

    /// Takes one unit of the run's budget and one of `tool`'s.
    #[inline]
    pub(super) fn claim<'a>(
        &'a self,
        tool: &'a ToolState,
        tool_name: &str,
    ) -> Result<BudgetClaim<'a>, Throttled> {
        let mut claim = BudgetClaim {
            run: None,
            tool: None,
        };
        if !take_below(&self.used, self.limit) {
            return Err(Throttled::new(
                Status::BudgetExhausted,
                "run",
                "this run's call budget is spent; finish with what you have",
            ));
        }
        claim.run = self.limit.map(|_| &self.used);
        if !take_below(&tool.used, tool.budget) {
            return Err(Throttled::new(
                Status::BudgetExhausted,
                format!("tool:{tool_name}"),
                format!("this run's budget for {tool_name} is spent"),
            ));
        }
        claim.tool = tool.budget.map(|_| &tool.used);
        Ok(claim)
    }

    /// The run counts from zero again.
    pub(super) fn reset(&self) {
        // Relaxed: a counter.
        self.used.store(0, Ordering::Relaxed);
    }
}
