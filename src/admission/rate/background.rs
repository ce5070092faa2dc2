//! The background share of each credential's request rate
//! (`Builder::priority_lanes`): a background call reserves a cell of its
//! credential's background bucket, at `share` of the credential's rate,
//! as well as the credential's own cell. So background calls draw at most
//! that share of the rate over any stretch of time, and the calls they
//! reserve ahead (queued inline for their turn) leave the rest of the
//! rate to interactive calls, which never touch this bucket.

use crate::bucket::quota::MAX_TOLERANCE;
use crate::bucket::Quota;
use crate::clock::Clock;
use crate::keyed::Scoped;
use core::num::NonZeroU32;
use core::time::Duration;

/// The background buckets, one per credential, each following its
/// credential's request quota (configured, learned or the server's).
pub(in crate::admission) struct Background<C: Clock> {
    share: f64,
    pub(super) buckets: Scoped<String, C>,
}

impl<C: Clock> Background<C> {
    /// `share` (in `(0, 1)`) of each credential's rate in `credentials`.
    pub(in crate::admission) fn new(share: f64, credentials: &Scoped<String, C>, clock: C) -> Self {
        Background {
            share,
            buckets: Scoped::with_clock(part(credentials.default_quota(), share), clock),
        }
    }

    /// Brings `credential`'s background bucket to its share of the
    /// credential's quota now (it changes as the rate is learned or the
    /// server states one): two lookups, and a write only on a change.
    pub(super) fn follow(&self, credentials: &Scoped<String, C>, credential: &String) {
        let want = part(credentials.quota_of(credential), self.share);
        if self.buckets.quota_of(credential) != want {
            // Refused only past the registry's key limit (2^20 credentials
            // with a quota of their own): that credential's background
            // calls then share the default's part.
            let _ = self.buckets.set_quota(credential, want);
        }
    }
}

/// `share` of `quota`: its period stretched by `1 / share` (rounded up:
/// never more than the share), its burst scaled down (at least one).
pub(super) fn part(quota: Quota, share: f64) -> Quota {
    let period = quota.period().as_nanos() as f64 / share;
    // `as` saturates (a share of 0 divides to infinity); past the longest
    // tolerance a bucket keeps, a period is as good as never.
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
