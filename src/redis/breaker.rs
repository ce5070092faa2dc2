//! What happens when Redis does not decide, in one place: the breaker
//! that skips Redis for the probe interval after a connection error or a
//! store timeout, and the failure policy that answers instead.

use core::time::Duration;

use super::RedisBucket;
use crate::bucket::{Quota, TokenBucket};
use crate::clock::Clock;
use crate::sync::Arc;

/// Skips Redis for `interval` after a connection error or a store timeout,
/// so a dead server costs one timeout per interval, not one per call.
/// Lives in the bucket's state mutex.
#[derive(Debug)]
pub(super) struct Breaker {
    /// Nanoseconds on the bucket's clock.
    interval: u64,
    /// No Redis calls before this instant.
    down_until: u64,
}

impl Breaker {
    pub(super) fn new(interval: u64) -> Self {
        Breaker {
            interval,
            down_until: 0,
        }
    }

    /// Whether calls skip Redis at `now`.
    #[inline]
    pub(super) fn is_open(&self, now: u64) -> bool {
        now < self.down_until
    }

    /// A connection error or a store timeout at `now`. Never a caller's
    /// short budget, nor an error reply (Redis answered).
    #[cold]
    pub(super) fn trip(&mut self, now: u64) {
        self.down_until = now.saturating_add(self.interval);
    }
}

/// The configured [`FailPolicy`](super::FailPolicy), ready to answer.
#[derive(Debug)]
pub(super) enum Policy {
    /// Decide with this local bucket at `share` of the quota (boxed: a
    /// `TokenBucket` is cache-line padded, and most buckets fail closed).
    Open {
        bucket: Box<TokenBucket<Arc<dyn Clock>>>,
        share: f64,
    },
    /// Refuse with this `retry_after`.
    Closed(Duration),
}

impl Policy {
    /// What answers when Redis did not decide: the fallback bucket, or the
    /// `retry_after` to refuse with.
    pub(super) fn fallback(&self) -> Result<&TokenBucket<Arc<dyn Clock>>, Duration> {
        match self {
            Policy::Open { bucket, .. } => Ok(bucket),
            Policy::Closed(retry_after) => Err(*retry_after),
        }
    }
}

impl RedisBucket {
    /// The quota in force changed: the fallback takes its share of it.
    #[cold]
    pub(super) fn adopt_fallback(&self, quota: Quota) {
        if let Policy::Open { bucket, share } = &self.policy {
            bucket.set_quota(super::builder::share_of(quota, *share));
        }
    }

    /// The failure path of every decision Redis did not make (its store
    /// failed, not the caller's budget): the fallback bucket, counted in
    /// `stats.fallback`, or the `retry_after` of an `Unavailable` refusal.
    #[cold]
    pub(super) fn fall_back(&self) -> Result<&TokenBucket<Arc<dyn Clock>>, Duration> {
        let fallback = self.policy.fallback()?;
        self.state.lock().stats.fallback += 1;
        Ok(fallback)
    }
}
