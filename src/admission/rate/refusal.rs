//! How a quota's refusal is worded: which limit, until when (staggered
//! across calls refused together), and the end of the latest server hold.

use core::time::Duration;
use std::borrow::Cow;

use super::Instant;
use crate::admission::Admission;
use crate::bucket::ReserveError;
use crate::clock::{saturating_nanos, Clock};
use crate::sleep::Sleeper;
use crate::throttled::{Human, Status, Throttled};

/// A quota that would not reserve: why, which limit, and how long it
/// takes to free the call's cells (to stagger refusals). Allocation-free:
/// the fast path drops it and the staged path words it.
#[derive(Debug)]
pub(in crate::admission) struct Refusal {
    pub(super) e: ReserveError,
    pub(super) scope: Cow<'static, str>,
    pub(super) period: u64,
}

impl<S, C> Admission<S, C>
where
    S: Sleeper,
    C: Clock,
{
    /// Words a quota's refusal of `credential`'s call at `at`; calls refused
    /// together are told staggered instants (see `stagger.rs`).
    pub(in crate::admission) fn rate_refusal(
        &self,
        refusal: Refusal,
        credential: &str,
        at: Instant,
    ) -> Throttled {
        let background = refusal.scope == super::BACKGROUND;
        let mut refused = self.word_rate_refusal(refusal, credential, at);
        if background {
            refused.hint = format!(
                "background calls draw on their share of this key's rate; {}",
                refused.hint
            );
        }
        refused
    }

    fn word_rate_refusal(&self, refusal: Refusal, credential: &str, at: Instant) -> Throttled {
        let inner = &*self.inner;
        let Refusal { e, scope, period } = refusal;
        let Instant {
            now,
            max_wait,
            left,
        } = at;
        let staggered = |after: Duration| {
            let limit = format!("{scope}\u{0}{credential}");
            let ready = now.saturating_add(saturating_nanos(after));
            let told = inner.told.tell(&limit, now, ready, period, None);
            Duration::from_nanos(told - now)
        };
        if let ReserveError::Unavailable { retry_after } = e {
            // Not a quota: the shared quota store is down (fail closed).
            return Throttled::new(
                Status::RateLimited,
                scope,
                format!(
                    "the shared quota store did not answer; retry after {}",
                    Human(retry_after)
                ),
            )
            .with_retry_after(retry_after);
        }
        if let ReserveError::InsufficientCapacity {
            requested,
            capacity,
        } = e
        {
            return Throttled::new(
                Status::QuotaExhausted,
                scope,
                format!(
                    "this call costs {requested}, more than the quota ever allows at once ({capacity}); \
                     split it or raise the quota"
                ),
            );
        }
        // While a capped server hold lasts, tell the capped hold, not the
        // server's word.
        let told = self.held_until(credential, None).saturating_sub(now);
        if let Some(after) = e.retry_after()
            && told > saturating_nanos(inner.rates.max_retry_after)
        {
            return past_cap(scope, Duration::from_nanos(told), after);
        }
        match e.retry_after() {
            Some(after) if after > inner.rates.max_retry_after => Throttled::new(
                Status::QuotaExhausted,
                scope,
                format!(
                    "the limit resets in {}, longer than any retry is worth; tell the operator",
                    Human(after)
                ),
            )
            .with_retry_after(after),
            Some(after) if after > left => {
                let after = staggered(after);
                Throttled::new(
                    Status::RateLimited,
                    scope,
                    format!(
                        "this call's slot is in {}, after its deadline ({} left); retry later or drop the call",
                        Human(after),
                        Human(left)
                    ),
                )
                .with_retry_after(after)
            }
            Some(after) => {
                let after = staggered(after);
                Throttled::new(
                    Status::RateLimited,
                    scope,
                    format!(
                        "this call's slot is in {}, longer than the {} it could still wait inline; retry after that",
                        Human(after),
                        Human(max_wait)
                    ),
                )
                .with_retry_after(after)
            }
            None => Throttled::new(
                Status::RateLimited,
                scope,
                format!("cannot take a rate-limit slot: {e}"),
            ),
        }
    }

    /// A refusal whose server wait exceeds `max_retry_after` tells the capped
    /// hold, as every later caller is told.
    pub(in crate::admission) fn told_within_cap(
        &self,
        refused: Throttled,
        credential: &str,
    ) -> Throttled {
        let cap = self.inner.rates.max_retry_after;
        match refused.retry_after_ms {
            Some(ms) if Duration::from_millis(ms) > cap => {
                let now = self.inner.clock.now_nanos();
                let held = self.held_until(credential, None).saturating_sub(now);
                let after = Duration::from_nanos(held).min(cap);
                past_cap(refused.scope, Duration::from_millis(ms), after)
                    .with_attempts(refused.attempts)
            }
            _ => refused,
        }
    }

    /// The end of the latest server hold covering `credential`'s calls (own,
    /// weighted, pending shared, and server scope `scope`).
    pub(super) fn held_until(&self, credential: &str, scope: Option<&(String, String)>) -> u64 {
        let inner = &*self.inner;
        let own = inner.rates.credentials.held_until(credential);
        let resources = inner
            .rates
            .resources
            .iter()
            .map(|r| r.buckets.held_until(credential))
            .max()
            .unwrap_or(0);
        let scoped = scope.map_or(0, |k| inner.rates.server_scopes.held_until(k));
        let shared = inner
            .rates
            .pending
            .lock()
            .get(credential)
            .copied()
            .unwrap_or(0);
        own.max(resources).max(scoped).max(shared)
    }
}

/// A limit whose reset is past the layer's cap: asked again `after`.
#[cold]
fn past_cap(scope: impl Into<String>, resets: Duration, after: Duration) -> Throttled {
    Throttled::new(
        Status::QuotaExhausted,
        scope,
        format!(
            "the server said the limit resets in {}, longer than any retry is worth; \
             this layer asks it again in {}; tell the operator",
            Human(resets),
            Human(after)
        ),
    )
    .with_retry_after(after)
}
