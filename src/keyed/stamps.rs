//! Reservations kept as stamps alone (the admission layer's tickets), given
//! back by looking the key up again.
//!
//! A sweep that drops a bucket raises its shard's `epoch_floor` past the
//! bucket's epoch, and a later bucket in that shard starts at the floor. A
//! refund carries its epoch and `Gcra::cancel` refuses any other, so a
//! refund kept from a dropped bucket never frees its successor's cells.
//! (Epochs are 31 bits: a collision takes 2³⁰ epoch changes while held.)

// Without `admission` only `raise_floor` is built.
#![cfg_attr(not(feature = "admission"), allow(unused_imports))]

use core::borrow::Borrow;
use core::hash::Hash;
use core::time::Duration;

use super::{is, Scoped, TooManyKeys};
use crate::bucket::gcra::{
    epoch_distance, Gcra, Reserved, Ticket as Stamps, EPOCH_HALF, EPOCH_MAX,
};
use crate::bucket::ReserveError;
use crate::clock::{saturating_nanos, Clock};

/// Raises `floor` past the epoch of `dropped`. Epochs count up mod 2³¹: one
/// less than half the circle past the floor is ahead of it.
pub(super) fn raise_floor(floor: &mut u32, dropped: &Gcra) {
    let past = dropped.epoch_now().wrapping_add(1) & EPOCH_MAX;
    if epoch_distance(past, *floor) < EPOCH_HALF {
        *floor = past;
    }
}

#[cfg(feature = "admission")]
impl<K: Hash + Eq + Clone, C: Clock> Scoped<K, C> {
    /// Whether `key` is as a fresh key would be at `now`: no bucket, or a
    /// full one with no hold ahead.
    pub(crate) fn is_full_at<Q>(&self, key: &Q, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash).read();
        shard
            .buckets
            .find(hash, |e| is(&e.key, key))
            .is_none_or(|e| e.bucket.gcra().is_full(now) && e.bucket.gcra().held_until() <= now)
    }

    /// The period of `key`'s quota (see [`quota_of`](Self::quota_of)).
    pub(crate) fn period_of<Q>(&self, key: &Q) -> Duration
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.quota_of(key).period()
    }

    /// `key`'s quota: its bucket's, else its configured quota's, else the
    /// default.
    pub(crate) fn quota_of<Q>(&self, key: &Q) -> crate::bucket::Quota
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash).read();
        if let Some(e) = shard.buckets.find(hash, |e| is(&e.key, key)) {
            return e.bucket.gcra().quota();
        }
        shard
            .quotas
            .find(hash, |(k, _)| is(k, key))
            .map_or(self.default_quota, |(_, q)| *q)
    }

    /// [`reserve_at`](Self::reserve_at) keeping only the stamps: no `Arc`,
    /// the bucket stays in its slot. See [`cancel_stamps`](Self::cancel_stamps).
    #[inline]
    pub(crate) fn reserve_stamps<Q>(
        &self,
        key: &Q,
        n: u32,
        max_wait: Duration,
        now: u64,
    ) -> Result<Reserved, ReserveError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let max_wait = saturating_nanos(max_wait);
        self.with_bucket_at(key, now, false, |b, now| b.gcra().reserve(n, max_wait, now))
            .unwrap_or_else(|e| Err(ReserveError::TooManyKeys { limit: e.limit }))
    }

    /// Charges `n` cells to `key` at `now` past its burst (see `Gcra::charge`).
    pub(crate) fn charge<Q>(&self, key: &Q, n: u64, now: u64) -> Result<(), TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_bucket_at(key, now, false, |b, now| b.gcra().charge(n, now))
    }

    /// Gives back a [`reserve_stamps`](Self::reserve_stamps) reservation if
    /// `key` still has its bucket and nothing was stacked on it since.
    pub(crate) fn cancel_stamps<Q>(&self, key: &Q, stamps: Stamps) -> bool
    where
        K: core::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash).read();
        shard
            .buckets
            .find(hash, |e| e.key.borrow() == key)
            .is_some_and(|e| {
                // A refund is a use: a sweep must not drop the bucket before
                // the charge that follows it.
                e.touch();
                e.bucket.gcra().cancel(stamps)
            })
    }
}

#[cfg(all(test, feature = "admission", not(feature = "loom")))]
mod tests {
    use super::*;
    use crate::bucket::Quota;
    use crate::clock::ManualClock;
    use core::num::NonZeroU32;

    const SEC: u64 = 1_000_000_000;

    fn one_per_second(clock: &ManualClock) -> Scoped<String, ManualClock> {
        Scoped::with_clock(Quota::per_second(NonZeroU32::MIN), clock.clone())
            .with_idle_grace(Duration::from_secs(1))
    }

    /// Drops `key`'s bucket: full and idle through two sweeps.
    fn evict(limits: &Scoped<String, ManualClock>, clock: &ManualClock) {
        clock.advance(Duration::from_secs(2));
        limits.sweep();
        clock.advance(Duration::from_secs(2));
        assert_eq!(limits.sweep(), 1);
        assert!(limits.is_empty());
    }

    #[test]
    fn a_bucket_created_again_refuses_the_dropped_ones_refund() {
        let clock = ManualClock::new();
        let limits = one_per_second(&clock);
        let key = "k".to_string();
        let old = limits.reserve_stamps(&key, 1, Duration::ZERO, 0).unwrap();
        let old = old.ticket.unwrap();
        assert_eq!((old.before, old.after), (0, SEC));
        evict(&limits, &clock);
        assert!(!limits.cancel_stamps("k", old), "no bucket: nothing given");
        let new = limits.reserve_stamps(&key, 1, Duration::ZERO, 0).unwrap();
        let new = new.ticket.unwrap();
        assert_eq!((new.before, new.after), (old.before, old.after));
        assert_ne!(new.epoch, old.epoch);
        assert!(!limits.cancel_stamps("k", old), "a foreign refund");
        assert!(limits.cancel_stamps("k", new), "its own refund");
    }

    #[test]
    fn the_floor_passes_every_epoch_dropped() {
        let clock = ManualClock::new();
        let limits = one_per_second(&clock);
        let key = "k".to_string();
        let q = |n| Quota::per_second(NonZeroU32::new(n).unwrap());
        limits.try_acquire(&key, 1).unwrap();
        limits.set_quota(&key, q(2)).unwrap();
        limits.set_quota(&key, q(1)).unwrap();
        evict(&limits, &clock);
        let new = limits.reserve_stamps(&key, 1, Duration::ZERO, 0).unwrap();
        assert_eq!(new.ticket.unwrap().epoch, 3);
    }

    #[test]
    fn the_floor_wraps_with_the_epochs() {
        let quota = Quota::per_second(NonZeroU32::MIN);
        let mut floor = EPOCH_MAX;
        raise_floor(&mut floor, &Gcra::with_epoch(quota, EPOCH_MAX));
        assert_eq!(floor, 0, "past the last epoch is the first");
        raise_floor(&mut floor, &Gcra::with_epoch(quota, EPOCH_MAX - 5));
        assert_eq!(floor, 0, "an epoch behind the floor leaves it");
        raise_floor(&mut floor, &Gcra::with_epoch(quota, 7));
        assert_eq!(floor, 8);
        let mut floor = 0;
        raise_floor(&mut floor, &Gcra::with_epoch(quota, EPOCH_HALF - 1));
        assert_eq!(floor, 0, "an epoch half the circle away is behind");
        raise_floor(&mut floor, &Gcra::with_epoch(quota, EPOCH_HALF - 2));
        assert_eq!(floor, EPOCH_HALF - 1, "just under half is ahead");
    }
}
