//! The background share of each credential's request rate: a background
//! call reserves a cell of its credential's background bucket (at `share`
//! of the rate) before its own, so interactive calls keep the rest.

use core::num::NonZeroU32;
use core::time::Duration;
use std::borrow::Cow;

use super::refusal::Refusal;
use super::{Instant, Kept, Source, BACKGROUND};
use crate::admission::spec::{CallSpec, REQUESTS};
use crate::admission::{Admission, Taken};
use crate::bucket::quota::MAX_TOLERANCE;
use crate::bucket::Quota;
use crate::clock::{saturating_nanos, Clock};
use crate::keyed::Scoped;
use crate::sleep::Sleeper;
use crate::throttled::Throttled;

/// The background buckets, one per credential, following its quota.
pub(in crate::admission) struct Background<C: Clock> {
    share: f64,
    pub(super) buckets: Scoped<String, C>,
}

impl<C: Clock> Background<C> {
    pub(in crate::admission) fn new(share: f64, credentials: &Scoped<String, C>, clock: C) -> Self {
        Background {
            share,
            buckets: Scoped::with_clock(part(credentials.default_quota(), share), clock),
        }
    }

    /// Brings `credential`'s background bucket to its share of the
    /// credential's current quota (a write only on a change).
    pub(super) fn follow(&self, credentials: &Scoped<String, C>, credential: &String) {
        let want = part(credentials.quota_of(credential), self.share);
        if self.buckets.quota_of(credential) != want {
            // Refused only past the registry's key limit: the default's part then.
            let _ = self.buckets.set_quota(credential, want);
        }
    }
}

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// The fast path's turn, taken into `taken` if it is now; `false` if it
    /// must be waited for (on the staged path, before the slots).
    #[inline]
    pub(in crate::admission) fn turn_now<'a>(
        &'a self,
        spec: &'a CallSpec,
        started: u64,
        taken: &mut Taken<'a, S, C>,
    ) -> bool {
        let at = Instant {
            now: started,
            max_wait: Duration::ZERO,
            left: Duration::MAX,
        };
        match self.background_turn(spec, at) {
            Ok(None) => true,
            Ok(Some((kept, _))) => {
                taken.turn = Some((&spec.credential, kept));
                true
            }
            Err(_) => false,
        }
    }

    /// The staged path's turn: reserved within the inline wait and deadline,
    /// and slept for holding no slot and no credential cell.
    pub(in crate::admission) async fn wait_turn<'a>(
        &'a self,
        spec: &'a CallSpec,
        deadline_at: u64,
        inline: Duration,
        taken: &mut Taken<'a, S, C>,
    ) -> Result<(), Throttled> {
        let now = self.inner.clock.now_nanos();
        let inline_end = now.saturating_add(saturating_nanos(self.inline_wait(inline)));
        let at = Instant {
            now,
            max_wait: Duration::from_nanos(inline_end.min(deadline_at).saturating_sub(now)),
            left: Duration::from_nanos(deadline_at.saturating_sub(now)),
        };
        let turn = self
            .background_turn(spec, at)
            .map_err(|r| self.rate_refusal(r, &spec.credential, at))?;
        if let Some((kept, wait)) = turn {
            taken.turn = Some((&spec.credential, kept));
            if !wait.is_zero() {
                // Counted in `waiting` while it sleeps.
                let _waiting = crate::admission::pools::Waiting::new(&self.inner.turns_waiting);
                if !self.sleep_unless_closed(wait).await {
                    return Err(self.closed_refusal());
                }
            }
        }
        Ok(())
    }

    /// A background call's turn: a cell of the credential's background bucket
    /// reserved at `at.now` within `at.max_wait`, and the wait until it.
    /// `None` when the call draws on no share (interactive, shared credential,
    /// or no share configured).
    fn background_turn(
        &self,
        spec: &CallSpec,
        at: Instant,
    ) -> Result<Option<(Kept, Duration)>, Refusal> {
        let inner = &*self.inner;
        let Some(background) = &inner.rates.background else {
            return Ok(None);
        };
        let cells = spec.cost_of(REQUESTS).unwrap_or(1);
        if cells == 0 || !spec.priority.is_background() || inner.rates.is_shared(&spec.credential) {
            return Ok(None);
        }
        background.follow(&inner.rates.credentials, &spec.credential);
        let buckets = &background.buckets;
        match buckets.reserve_stamps(&spec.credential, cells, at.max_wait, at.now) {
            Ok(r) => Ok(r.ticket.map(|stamps| {
                (
                    Kept::new(stamps, cells),
                    Duration::from_nanos(r.ready_at - at.now),
                )
            })),
            Err(e) => Err(Refusal {
                e,
                scope: Cow::Borrowed(BACKGROUND),
                period: saturating_nanos(buckets.period_of(&spec.credential))
                    .saturating_mul(u64::from(cells)),
            }),
        }
    }

    /// Gives back a turn reserved for a call that was not admitted.
    pub(in crate::admission) fn give_back_turn(&self, credential: &str, kept: &Kept) {
        let _ = self.undo(credential, None, Source::Background, kept);
    }
}

/// `share` of `quota`: period stretched by `1 / share` (rounded up),
/// burst scaled down (at least one).
pub(super) fn part(quota: Quota, share: f64) -> Quota {
    let period = quota.period().as_nanos() as f64 / share;
    // `as` saturates (a share of 0 gives infinity); cap at the longest
    // tolerance a bucket keeps.
    let period = Duration::from_nanos((period.ceil() as u64).min(MAX_TOLERANCE));
    let burst = (f64::from(quota.burst().get()) * share).floor() as u32;
    Quota::with_period(period).allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_is_never_more_than_its_share() {
        let q = Quota::per_second(NonZeroU32::new(10).unwrap());
        let half = part(q, 0.5);
        assert_eq!(half.period(), Duration::from_millis(200));
        assert_eq!(half.burst().get(), 5);
        let tenth = part(Quota::per_second(NonZeroU32::new(3).unwrap()), 0.1);
        assert!(tenth.period() >= Duration::from_nanos(3_333_333_340));
        assert_eq!(tenth.burst().get(), 1, "at least one");
        let tiny = part(Quota::with_period(Duration::from_nanos(1)), 1e-30);
        assert_eq!(
            tiny.period(),
            Duration::from_nanos(MAX_TOLERANCE),
            "saturates"
        );
        assert_eq!(part(q, 0.0).period(), Duration::from_nanos(MAX_TOLERANCE));
    }
}
