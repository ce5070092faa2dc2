//! The circuit stage of [`Admission`] (the circuits are in `breaker.rs`).

use core::time::Duration;
use std::sync::Arc;

use super::breaker::{self, CircuitBreaker};
use super::spec::CallSpec;
use super::tools::ToolState;
use super::Admission;
use crate::clock::{saturating_nanos, Clock};
use crate::sleep::Sleeper;
use crate::throttled::{Status, Throttled};

impl<S, C> Admission<S, C>
where
    S: Sleeper,
    C: Clock,
{
    /// The call's place in its circuit: closed, or the trial; refused while
    /// open or while another trial is out.
    #[inline(never)]
    pub(super) fn circuit(
        &self,
        breakers: &breaker::Breakers,
        spec: &CallSpec,
        deadline: Duration,
        tool: &ToolState,
        now: u64,
    ) -> Result<breaker::Pass, Throttled> {
        let circuit = breakers.circuit(&tool.name, &spec.credential);
        // A trial is out for a cool-down at most (or its deadline), and a tenth
        // of one at least, so a trial with no time does not make the next call one.
        let cool_down = breakers.config.cool_down_nanos();
        let trial_for = cool_down
            .min(saturating_nanos(deadline))
            .max(cool_down / 10)
            .max(1);
        match circuit.admit(now, trial_for) {
            breaker::Admit::Closed => Ok(breaker::Pass { circuit, trial: 0 }),
            breaker::Admit::Trial(trial) => Ok(breaker::Pass { circuit, trial }),
            breaker::Admit::Refused { until, trial } => {
                Err(self.circuit_refusal(&breakers.config, spec, now, until, trial))
            }
        }
    }

    /// Words an open circuit's refusal; calls refused together are told
    /// instants a tenth of the cool-down apart.
    #[cold]
    fn circuit_refusal(
        &self,
        config: &CircuitBreaker,
        spec: &CallSpec,
        now: u64,
        until: u64,
        trial: bool,
    ) -> Throttled {
        let inner = &*self.inner;
        let step = config.cool_down_nanos() / 10;
        // A trial is usually answered well before it lapses: a step later.
        let ready = if trial {
            now.saturating_add(step).min(until)
        } else {
            until
        };
        let limit = format!("circuit\u{0}{}\u{0}{}", spec.tool, spec.credential);
        let after = Duration::from_nanos(inner.told.tell(&limit, now, ready, step, Some(10)) - now);
        let hint = if trial {
            format!(
                "the server kept failing and one trial call is testing it now; retry after {}",
                crate::throttled::Human(after)
            )
        } else {
            format!(
                "the server kept failing (5xx or no answer); nothing is sent for {}, then one trial call; retry after {}",
                crate::throttled::Human(Duration::from_nanos(until - now)),
                crate::throttled::Human(after)
            )
        };
        Throttled::new(Status::Unavailable, format!("circuit:{}", spec.tool), hint)
            .with_retry_after(after)
    }

    /// Feeds a call's outcome to its circuit, if the layer keeps circuits.
    #[inline]
    pub(super) fn circuit_outcome(
        &self,
        tool: &Arc<str>,
        credential: &str,
        outcome: breaker::Outcome,
        trial: bool,
    ) {
        if let Some(breakers) = &self.inner.breakers {
            // The clock is read only for a failure (it may open the circuit).
            let now = match outcome {
                breaker::Outcome::Failed => self.inner.clock.now_nanos(),
                _ => 0,
            };
            breakers
                .circuit(tool, credential)
                .record(&breakers.config, outcome, now, trial);
        }
    }
}
