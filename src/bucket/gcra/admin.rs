//! The operations that write under the admin lock (and bump the epoch
//! that voids refunds): a server's penalty, a reset, a quota change. The
//! seqlock protocol they follow is the parent module's.

use super::{
    bump_epoch, convert, convert_keeping_queue, Gcra, Quota, BURST_SHIFT, EPOCH_MASK, FULL,
};
use crate::sync::{Backoff, Ordering};

impl Gcra {
    /// Admits nothing before `now + retry_after`: raises `tat` so that the
    /// first single cell fits exactly then, in one CAS (retried only if
    /// another write got there first).
    ///
    /// A penalty shorter than the current debt leaves `tat` alone but voids
    /// every outstanding refund (it bumps the epoch under the admin lock):
    /// otherwise cancelling the reservation that made the debt could lower
    /// `tat` below the penalty and admit a call before the server's
    /// `Retry-After`. Voiding refunds only ever errs towards admitting less.
    ///
    /// A zero penalty (`Retry-After: 0`, "retry now") holds nothing back
    /// and leaves the bucket as it is: a retry now should not cost the
    /// headroom the bucket still has.
    pub(crate) fn penalize(&self, retry_after: u64, now: u64) {
        self.penalize_told(retry_after, retry_after, now);
    }

    /// [`penalize`](Self::penalize) for `hold`, recording `told` (at least
    /// `hold`: what the server asked for, before a cap) as the hold's end
    /// that sleepers and refusals read.
    pub(crate) fn penalize_told(&self, hold: u64, told: u64, now: u64) {
        let retry_after = hold;
        if retry_after == 0 {
            return;
        }
        // Relaxed: see `held_until`.
        self.held_until
            .fetch_max(now.saturating_add(told.max(hold)), Ordering::Relaxed);
        let backoff = Backoff::new();
        loop {
            let view = self.view();
            let target = now
                .saturating_add(retry_after)
                .saturating_add(view.tolerance() - view.period);
            if view.tat < target {
                if self.apply(&view, target).is_ok() {
                    return;
                }
                backoff.spin();
                continue;
            }
            let word = self.lock();
            // Relaxed (both): we hold the admin lock (taken with Acquire),
            // `skew` changes only under it, and the only writes that lower
            // `tat` (cancel, reset, set_quota) hold it too; concurrent
            // admissions only raise it.
            let skew = self.skew.load(Ordering::Relaxed);
            let tat = self.stamp.load(Ordering::Relaxed).wrapping_sub(skew);
            if tat >= target {
                self.unlock(bump_epoch(word));
                return;
            }
            // A refund landed before the lock: raise `tat` instead.
            self.unlock(word);
        }
    }

    /// Makes the bucket full, and voids every outstanding reservation's
    /// refund. A bucket already full at `now` is left as it is (its
    /// reservations' refunds stay valid).
    pub(crate) fn reset(&self, now: u64) {
        // A full bucket holds nothing back: sleepers that re-check the hold
        // when they wake go. Relaxed: see `held_until`.
        self.held_until.store(0, Ordering::Relaxed);
        let word = self.lock();
        // Relaxed: we hold the lock, and took it with Acquire.
        let skew = self.skew.load(Ordering::Relaxed);
        // An RMW, not a load and a store: a decision landing in between
        // must be either seen (and wiped) or fail its CAS. `stamp + 1`
        // fences out every decision in flight (module docs). Release:
        // seqlock data, published by `unlock`. Relaxed on failure: nothing
        // to see.
        let wiped = self
            .stamp
            .fetch_update(Ordering::Release, Ordering::Relaxed, |stamp| {
                (stamp.wrapping_sub(skew) > now).then_some(stamp.wrapping_add(1))
            });
        match wiped {
            Ok(stamp) => {
                // `tat = FULL` at the new stamp. Release: seqlock data.
                let stamp = stamp.wrapping_add(1);
                self.skew.store(stamp.wrapping_sub(FULL), Ordering::Release);
                self.unlock(bump_epoch(word));
            }
            Err(_) => self.unlock(word),
        }
    }

    /// Switches to `quota`, converting the state as [`convert`] says: the
    /// debt in cells is kept (none forgiven), a full bucket stays full, and
    /// a server hold keeps its end.
    pub(crate) fn set_quota(&self, quota: Quota, now: u64) {
        self.requota(quota, now, false);
    }

    /// [`set_quota`](Self::set_quota) for a learned rate's change: the
    /// state converted as [`convert_keeping_queue`] says (calls already
    /// queued past the burst keep their instants).
    pub(crate) fn set_learned_quota(&self, quota: Quota, now: u64) {
        self.requota(quota, now, true);
    }

    fn requota(&self, quota: Quota, now: u64, keeping_queue: bool) {
        let quota = quota.clamped();
        let word = self.lock();
        let old = Quota {
            // Relaxed: we hold the lock, and took it with Acquire.
            period: self.period.load(Ordering::Relaxed),
            burst: core::num::NonZeroU32::new((word >> BURST_SHIFT) as u32)
                .expect("a bucket's burst is never 0"),
        };
        if old == quota {
            self.unlock(word);
            return;
        }
        // Relaxed: as `period` above.
        let skew = self.skew.load(Ordering::Relaxed);
        // Release: seqlock data; a `view` that sees it also sees LOCKED.
        self.period.store(quota.period, Ordering::Release);
        // Acquire: the freshest `stamp` to convert; the CAS retries anyway
        // (decisions read before the lock may still land).
        let mut stamp = self.stamp.load(Ordering::Acquire);
        let new_tat = loop {
            // Relaxed, after the Acquire that read `stamp`: a penalty whose
            // `tat` this stamp holds stored its end before its Release CAS,
            // so it is seen here; one landing later fails its CAS against
            // ours and raises the converted `tat` itself.
            let held_until = self.held_until.load(Ordering::Relaxed);
            let tat = stamp.wrapping_sub(skew);
            let new_tat = if keeping_queue {
                convert_keeping_queue(tat, now, old, quota)
            } else {
                convert(tat, now, old, quota, held_until)
            };
            // `stamp + 1`: never a value the word held before, so every
            // decision in flight under the old quota fails its CAS.
            // Release: seqlock data. Acquire on failure: as the load above.
            match self.stamp.compare_exchange_weak(
                stamp,
                stamp.wrapping_add(1),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => break new_tat,
                Err(actual) => stamp = actual,
            }
        };
        // Release: seqlock data, under LOCKED like `period`.
        self.skew.store(
            stamp.wrapping_add(1).wrapping_sub(new_tat),
            Ordering::Release,
        );
        let word = ((quota.burst.get() as u64) << BURST_SHIFT) | (word & EPOCH_MASK);
        self.unlock(bump_epoch(word));
    }
}
