//! Inserting a new key (under the cap on keys) and sweeping idle ones out.

use core::borrow::Borrow;
use core::hash::Hash;

use super::{is, Entry, Scoped, Shard, Slot, TooManyKeys, MIN_SWEEP, MIN_SWEEP_INTERVAL};
use crate::bucket::gcra::Gcra;
use crate::clock::Clock;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Ordering, RwLock};

impl<K: Hash + Eq + Clone, C: Clock> Scoped<K, C> {
    /// Removes the buckets that are full again and have been idle for a
    /// grace period; returns how many.
    ///
    /// A shard is swept at most once per [grace
    /// period](Scoped::with_idle_grace), so a key goes one to two grace
    /// periods after its last call. Not needed for bounded memory (inserts
    /// sweep as they go); useful after a burst of one-off keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), clock.clone());
    /// limits.try_acquire(&"k", 1).unwrap();
    /// assert_eq!(limits.sweep(), 0);
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(limits.sweep(), 0); // full, but used since the last sweep
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(limits.sweep(), 1);
    /// assert!(limits.is_empty());
    /// ```
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_nanos();
        self.shards
            .iter()
            .map(|s| self.sweep_shard(&mut s.write(), now))
            .sum()
    }

    /// Sweeps one shard (held for writing) and frees its dropped keys' slots.
    fn sweep_shard(&self, shard: &mut Shard<K>, now: u64) -> usize {
        let dropped = shard.sweep(now, self.idle_grace, &self.hasher);
        if dropped > 0 {
            // Relaxed: a count changed only by RMWs; the shard locks guard
            // the buckets.
            self.live_keys.fetch_sub(dropped, Ordering::Relaxed);
        }
        dropped
    }

    /// Takes a slot for a new key; `false` when `max_keys` are tracked.
    fn take_key_slot(&self) -> bool {
        // Relaxed: see `sweep_shard`.
        self.live_keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// The slow path of `with_bucket`: a new key, or a key whose bucket
    /// must move behind an `Arc`. `f` runs under the write lock, so a sweep
    /// cannot evict a new (full) bucket before `f` has charged it.
    #[cold]
    pub(super) fn insert<Q, R>(
        &self,
        shard: &RwLock<Shard<K>>,
        hash: u64,
        key: &Q,
        now: u64,
        shared: bool,
        f: impl FnOnce(&Slot, u64) -> R,
    ) -> Result<R, TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut swept_all = false;
        let mut guard = loop {
            let mut guard = shard.write();
            if let Some(e) = guard.buckets.find_mut(hash, |e| is(&e.key, key)) {
                e.touch();
                if shared {
                    e.bucket.share();
                }
                return Ok(f(&e.bucket, now));
            }
            let len = guard.buckets.len();
            if len >= guard.sweep_at
                || (len >= MIN_SWEEP
                    && now.saturating_sub(guard.swept_at)
                        >= self.idle_grace.max(MIN_SWEEP_INTERVAL))
            {
                self.sweep_shard(&mut guard, now);
                guard.sweep_at = (guard.buckets.len() * 2).max(MIN_SWEEP);
            }
            if self.take_key_slot() {
                break guard;
            }
            // At the cap: this shard's idle keys first, then every other
            // shard's, one lock at a time (no lock order to keep).
            self.sweep_shard(&mut guard, now);
            if self.take_key_slot() {
                break guard;
            }
            // Relaxed: a time stamp that only spaces the passes out.
            let last = self.full_sweep_at.load(Ordering::Relaxed);
            let recent = last != 0 && now.saturating_sub(last) < MIN_SWEEP_INTERVAL;
            if swept_all || recent {
                return Err(TooManyKeys {
                    limit: self.max_keys,
                });
            }
            self.full_sweep_at.store(now.max(1), Ordering::Relaxed);
            drop(guard);
            for other in self.shards.iter() {
                if !core::ptr::eq(&**other, shard) {
                    self.sweep_shard(&mut other.write(), now);
                }
            }
            swept_all = true;
        };
        // Gives the slot back if user code (`Eq`, `Clone`, `Hash`) panics.
        let slot = KeySlot(&self.live_keys);
        let quota = guard
            .quotas
            .find(hash, |(k, _)| is(k, key))
            .map_or(self.default_quota, |(_, q)| *q);
        let gcra = Gcra::with_epoch(quota, guard.epoch_floor);
        let bucket = if shared {
            Slot::Shared(Arc::new(gcra))
        } else {
            Slot::Inline(gcra)
        };
        let out = f(&bucket, now);
        let entry = Entry {
            key: key.to_owned(),
            bucket,
            touched: AtomicBool::new(true),
        };
        guard
            .buckets
            .insert_unique(hash, entry, |e| self.hasher.hash_one(&e.key));
        // In the table: the sweep that drops it gives the slot back.
        core::mem::forget(slot);
        Ok(out)
    }
}

/// A slot of `live_keys` taken for a bucket not yet in its table.
struct KeySlot<'a>(&'a AtomicUsize);

impl Drop for KeySlot<'_> {
    fn drop(&mut self) {
        // Relaxed: see `Scoped::sweep_shard`.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<K> Shard<K> {
    /// Drops the full buckets untouched since the previous sweep and clears
    /// the other bits, if a grace period has passed; returns how many.
    fn sweep(&mut self, now: u64, grace: u64, hasher: &ahash::RandomState) -> usize
    where
        K: Hash,
    {
        if now.saturating_sub(self.swept_at) < grace {
            return 0;
        }
        self.swept_at = now;
        let before = self.buckets.len();
        let floor = &mut self.epoch_floor;
        self.buckets.retain(|e| {
            // Relaxed: we hold the write lock (see `Entry::touch`).
            let keep = e.touched.swap(false, Ordering::Relaxed) || !e.bucket.gcra().is_full(now);
            if !keep {
                super::stamps::raise_floor(floor, e.bucket.gcra());
            }
            keep
        });
        let len = self.buckets.len();
        // Give the memory back once the table is mostly empty.
        if self.buckets.capacity() > 4 * len.max(MIN_SWEEP) {
            self.buckets.shrink_to(2 * len, |e| hasher.hash_one(&e.key));
        }
        before - len
    }
}
