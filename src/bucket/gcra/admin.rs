//! The operations that write under the admin lock (and bump the epoch),
//! following the parent module's seqlock protocol.

use super::{
    bump_epoch, convert, convert_keeping_queue, Gcra, Quota, BURST_SHIFT, EPOCH_MASK, FULL,
};
use crate::sync::{Backoff, Ordering};

impl Gcra {
    /// Admits nothing before `now + retry_after`: raises `tat` so one cell
    /// fits exactly then. A shorter penalty than the current debt leaves
    /// `tat` alone but bumps the epoch, so no cancel can lower `tat` below
    /// it. A zero penalty changes nothing.
    pub(crate) fn penalize(&self, retry_after: u64, now: u64) {
        self.penalize_told(retry_after, retry_after, now);
    }

    /// [`penalize`](Self::penalize) for `hold`, recording `told` (>= `hold`,
    /// the server's ask before a cap) as the hold's end.
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
            // Relaxed (both): under the admin lock (taken with Acquire);
            // every write that lowers `tat` holds it too.
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

    /// Gives `n` cells back at `now` without their stamps: lowers `tat` by
    /// `n` periods, never below `now` nor a running hold's `tat`; returns the
    /// cells given back. Like a quota change, it runs under the admin lock,
    /// moves `stamp` by `+ 1` and voids every outstanding cancel.
    pub(crate) fn give(&self, n: u64, now: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let word = self.lock();
        // Relaxed (both): we hold the lock, and took it with Acquire;
        // `period` and `skew` change only under it.
        let period = self.period.load(Ordering::Relaxed);
        let skew = self.skew.load(Ordering::Relaxed);
        let tolerance = period.saturating_mul(word >> BURST_SHIFT);
        // Acquire: the freshest `stamp`; the CAS retries anyway.
        let mut stamp = self.stamp.load(Ordering::Acquire);
        let (tat, new_tat) = loop {
            // Relaxed, after the Acquire that read `stamp`: as in `requota`.
            let held_until = self.held_until.load(Ordering::Relaxed);
            let tat = stamp.wrapping_sub(skew);
            let floor = if held_until > now {
                held_until.saturating_add(tolerance - period)
            } else {
                now
            };
            let new_tat = tat.saturating_sub(period.saturating_mul(n)).max(floor);
            if new_tat >= tat {
                // Full, or held: nothing to give.
                self.unlock(word);
                return 0;
            }
            // Release: seqlock data. Acquire on failure: as the load above.
            match self.stamp.compare_exchange_weak(
                stamp,
                stamp.wrapping_add(1),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => break (tat, new_tat),
                Err(actual) => stamp = actual,
            }
        };
        // Release: seqlock data, under LOCKED.
        self.skew.store(
            stamp.wrapping_add(1).wrapping_sub(new_tat),
            Ordering::Release,
        );
        self.unlock(bump_epoch(word));
        (tat - new_tat) / period.max(1)
    }

    /// Makes the bucket full and voids outstanding refunds; a bucket already
    /// full at `now` is left as it is.
    pub(crate) fn reset(&self, now: u64) {
        // Sleepers that re-check the hold when they wake go. Relaxed: see
        // `held_until`.
        self.held_until.store(0, Ordering::Relaxed);
        let word = self.lock();
        // Relaxed: we hold the lock, and took it with Acquire.
        let skew = self.skew.load(Ordering::Relaxed);
        // An RMW: a decision landing in between is either wiped or fails
        // its CAS; `stamp + 1` fences out every decision in flight.
        // Release: seqlock data, published by `unlock`. Relaxed on
        // failure: nothing to see.
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

    /// Switches to `quota`, converting the state as [`convert`] says.
    pub(crate) fn set_quota(&self, quota: Quota, now: u64) {
        self.requota(quota, now, Requota::Cells);
    }

    /// [`set_quota`](Self::set_quota) for a learned rate, converting as
    /// [`convert_keeping_queue`] says.
    pub(crate) fn set_learned_quota(&self, quota: Quota, now: u64) {
        self.requota(quota, now, Requota::KeepQueue);
    }

    /// [`set_learned_quota`](Self::set_learned_quota), except that a rate
    /// change alone with no hold running converts the debt as cells
    /// ([`convert`]), so the queue moves with the rate; returns that change
    /// (see [`Rescale`]), `None` when the queue was kept.
    pub(crate) fn rescale_learned_quota(&self, quota: Quota, now: u64) -> Option<Rescale> {
        self.requota(quota, now, Requota::Rescale)
    }

    fn requota(&self, quota: Quota, now: u64, how: Requota) -> Option<Rescale> {
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
            return None;
        }
        // Relaxed: as `period` above.
        let skew = self.skew.load(Ordering::Relaxed);
        // Release: seqlock data; a `view` that sees it also sees LOCKED.
        self.period.store(quota.period, Ordering::Release);
        // Acquire: the freshest `stamp` to convert; the CAS retries anyway
        // (decisions read before the lock may still land).
        let mut stamp = self.stamp.load(Ordering::Acquire);
        let rate_alone = how == Requota::Rescale && quota.burst == old.burst;
        let (new_tat, rescaled) = loop {
            // Relaxed, after the Acquire that read `stamp`: a penalty in
            // this stamp stored its end before its Release CAS; a later one
            // fails its CAS against ours and raises the new `tat` itself.
            let held_until = self.held_until.load(Ordering::Relaxed);
            let tat = stamp.wrapping_sub(skew);
            let rescaled = rate_alone && held_until <= now;
            let new_tat = match how {
                Requota::Cells => convert(tat, now, old, quota, held_until),
                Requota::Rescale if rescaled => convert(tat, now, old, quota, 0),
                Requota::KeepQueue | Requota::Rescale => {
                    convert_keeping_queue(tat, now, old, quota)
                }
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
                Ok(_) => break (new_tat, rescaled),
                Err(actual) => stamp = actual,
            }
        };
        // Release: seqlock data, under LOCKED like `period`.
        self.skew.store(
            stamp.wrapping_add(1).wrapping_sub(new_tat),
            Ordering::Release,
        );
        let word = bump_epoch(((quota.burst.get() as u64) << BURST_SHIFT) | (word & EPOCH_MASK));
        self.unlock(word);
        rescaled.then_some(Rescale {
            at: now,
            old_period: old.period,
            new_period: quota.period,
            epoch: ((word & EPOCH_MASK) >> 1) as u32,
        })
    }
}

/// How [`Gcra::requota`] converts the state.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Requota {
    /// [`convert`]: the debt in cells.
    Cells,
    /// [`convert_keeping_queue`].
    KeepQueue,
    /// A rate change alone with no hold as [`convert`], any other change as
    /// [`convert_keeping_queue`].
    Rescale,
}

/// A learned rate's change applied to cells already queued: every instant
/// past `at` reserved before it (an earlier epoch) now comes at
/// `at + (instant - at) × new_period / old_period`, rounded up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rescale {
    /// When the change was applied, on the bucket's clock.
    pub(crate) at: u64,
    pub(crate) old_period: u64,
    pub(crate) new_period: u64,
    /// The bucket's epoch from the change on.
    pub(crate) epoch: u32,
}

impl Rescale {
    /// Where an instant `ready_at` reserved before the change lies after it.
    #[cfg(feature = "admission")]
    pub(crate) fn moved(&self, ready_at: u64) -> u64 {
        if ready_at <= self.at {
            return ready_at;
        }
        let cells = u128::from(ready_at - self.at) * u128::from(self.new_period);
        let moved = cells.div_ceil(u128::from(self.old_period.max(1)));
        self.at
            .saturating_add(moved.min(u128::from(u64::MAX)) as u64)
    }
}
