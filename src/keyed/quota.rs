//! Per-key quotas: set by the user ([`Scoped::set_quota`]), or a learned
//! rate's change (the admission layer's), kept apart from the buckets and
//! capped at `max_keys`.

use core::borrow::Borrow;
use core::hash::Hash;

use super::{is, Scoped, TooManyKeys};
use crate::bucket::gcra::Rescale;
use crate::bucket::Quota;
use crate::clock::Clock;
use crate::sync::Ordering;

impl<K: Hash + Eq + Clone, C: Clock> Scoped<K, C> {
    /// Sets `key`'s quota, now and for any bucket the key gets later. A live
    /// bucket converts as [`TokenBucket::set_quota`](crate::TokenBucket::set_quota)
    /// does. At most [`max_keys`](Scoped::max_keys) keys have a quota of their
    /// own; setting a key back to the [`default_quota`](Scoped::default_quota)
    /// frees its place.
    ///
    /// # Errors
    ///
    /// [`TooManyKeys`] when `key` has no quota of its own yet and `max_keys`
    /// keys already do; nothing changes then.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// let free = Quota::per_second(NonZeroU32::new(5).unwrap());
    /// let paid = Quota::per_second(NonZeroU32::new(50).unwrap());
    /// let limits = Scoped::with_clock(free, ManualClock::new()).with_max_keys(1);
    /// limits.set_quota(&"enterprise", paid).unwrap();
    /// assert_eq!(limits.available(&"enterprise"), 50);
    /// assert_eq!(limits.available(&"free"), 5);
    ///
    /// // One key with its own quota is the limit here.
    /// assert!(limits.set_quota(&"startup", paid).is_err());
    /// limits.set_quota(&"enterprise", free).unwrap(); // back to the default
    /// assert_eq!(limits.custom_quotas(), 0);
    /// limits.set_quota(&"startup", paid).unwrap();
    /// ```
    pub fn set_quota<Q>(&self, key: &Q, quota: Quota) -> Result<(), TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.requota(key, quota, Learned::No).map(|_| ())
    }

    /// [`set_quota`](Scoped::set_quota) for a learned rate: calls already
    /// queued past the burst keep their instants.
    #[cfg(feature = "admission")]
    pub(crate) fn set_learned_quota<Q>(&self, key: &Q, quota: Quota) -> Result<(), TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.requota(key, quota, Learned::KeepQueue).map(|_| ())
    }

    /// As [`set_learned_quota`](Scoped::set_learned_quota), but a rate change
    /// with no hold moves the queued cells too, and is returned.
    #[cfg(feature = "admission")]
    pub(crate) fn rescale_learned_quota<Q>(
        &self,
        key: &Q,
        quota: Quota,
    ) -> Result<Option<Rescale>, TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.requota(key, quota, Learned::Rescale)
    }

    fn requota<Q>(
        &self,
        key: &Q,
        quota: Quota,
        learned: Learned,
    ) -> Result<Option<Rescale>, TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now_nanos();
        let mut shard = self.shard(hash).write();
        let is_default = quota == self.default_quota;
        match shard.quotas.find_entry(hash, |(k, _)| is(k, key)) {
            Ok(entry) if is_default => {
                entry.remove();
                // Relaxed: a lone counter; the shard lock orders the table.
                self.custom_quotas.fetch_sub(1, Ordering::Relaxed);
            }
            Ok(mut entry) => entry.get_mut().1 = quota,
            Err(_) if is_default => {}
            Err(_) => {
                // Relaxed: as above; the RMW alone keeps the count exact.
                let room =
                    self.custom_quotas
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            (n < self.max_keys).then_some(n + 1)
                        });
                if room.is_err() {
                    return Err(TooManyKeys {
                        limit: self.max_keys,
                    });
                }
                shard
                    .quotas
                    .insert_unique(hash, (key.to_owned(), quota), |(k, _)| {
                        self.hasher.hash_one(k)
                    });
            }
        }
        let Some(e) = shard.buckets.find(hash, |e| is(&e.key, key)) else {
            return Ok(None);
        };
        let gcra = e.bucket.gcra();
        Ok(match learned {
            Learned::No => {
                gcra.set_quota(quota, now);
                None
            }
            Learned::KeepQueue => {
                gcra.set_learned_quota(quota, now);
                None
            }
            Learned::Rescale => gcra.rescale_learned_quota(quota, now),
        })
    }

    /// How many keys have a quota of their own (at most
    /// [`max_keys`](Scoped::max_keys)).
    pub fn custom_quotas(&self) -> usize {
        // Relaxed: a count for reports; exact once set_quota calls are done.
        self.custom_quotas.load(Ordering::Relaxed)
    }
}

/// Which conversion a quota change on a key uses (see `Scoped::requota`).
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "admission"), allow(dead_code))]
enum Learned {
    /// A quota set by the user: the debt in cells.
    No,
    /// A learned rate's change, the queue keeping its instants.
    KeepQueue,
    /// A learned rate's change, moving the queue with it.
    Rescale,
}
