//! GCRA over one atomic word; `TokenBucket` and `Scoped` wrap [`Gcra`].
//!
//! # The algorithm
//!
//! The bucket keeps one number, the theoretical arrival time `tat`: the
//! instant (nanoseconds on the bucket's clock) at which the bucket would be
//! full again if nothing else were admitted. With `T` the period and
//! `τ = burst * T` the tolerance, `n` cells asked for at `now`:
//!
//! ```text
//! earliest = tat - (τ - n*T)            the first instant they fit
//! admit    iff earliest <= now
//! new tat  = max(tat, now) + n*T
//! ```
//!
//! `n*T <= τ` (since `n <= burst`), so `earliest` never overflows; a new
//! `tat` that does not fit in `u64` is a denial, never a wrap. Every other
//! sum saturates. A *reservation* admits cells whose `earliest` is at most
//! `max_wait` ahead, and the caller waits until then. Denials write nothing.
//!
//! # The words
//!
//! | word     | bits   | meaning                                                   |
//! |----------|--------|-----------------------------------------------------------|
//! | `stamp`  | 0..64  | `tat + skew` (mod 2⁶⁴): the `tat`, shifted (see below)     |
//! | `skew`   | 0..64  | what `stamp` is shifted by; written only under `LOCKED`   |
//! | `word`   | 0      | `LOCKED`: an admin operation (cancel, reset, set_quota) is running |
//! |          | 1..32  | epoch: bumped by `reset` and by every quota change         |
//! |          | 32..64 | burst                                                     |
//! | `period` | 0..64  | nanoseconds per cell                                       |
//!
//! Every rule is written in `tat`; `stamp - skew` gives it back.
//!
//! # Why the quota is a seqlock, and what makes a quota change safe
//!
//! The quota (a `u64` period, a `u32` burst) cannot share the `stamp` word,
//! so `word` (burst, epoch, `LOCKED`) is the sequence counter of a seqlock.
//! A decision reads `word` (Acquire), `period`, `skew` and `stamp`
//! (Acquire), then `word` again, and retries if they differ or `LOCKED` was
//! set; writers change `period`, `skew` and `stamp` only under `LOCKED`,
//! with Release stores. The hot path writes nothing extra.
//!
//! The CAS that applies a decision must also fail if the quota changed
//! meanwhile. A quota change may *lower* `tat` (see [`convert`]), and a
//! `tat` lowered then raised could come back to the value an in-flight
//! decision read. So the CAS is on `stamp`, which only moves up: a quota
//! change or reset adds exactly 1 to `stamp` and puts the difference into
//! `skew`, so an in-flight decision's CAS fails and it retries. (Only
//! cancels lower `stamp`, see below; a wrap takes 2⁶⁴ ns of arrivals.)
//!
//! `reset` lowers `tat` to `FULL` through the same `stamp + 1`. Its
//! reservations carry the pre-reset epoch, so a later cancel is refused:
//! conservative, never an over-admission.
//!
//! # Cancelling
//!
//! A reservation remembers the `stamp` it found (`before`), the one it
//! wrote (`after`) and the epoch. Cancelling CASes `after` back to
//! `before`, under `LOCKED` with an epoch check: apart from resets and
//! quota changes `stamp` moves like the top of a stack (only the
//! reservation on top can lower it), so this succeeds only if nothing was
//! admitted, reserved or penalized since, and a refund never frees cells
//! someone else holds.

use core::fmt;

use super::error::{CheckError, ReserveError};
use super::quota::Quota;

mod admin;
mod convert;

use crate::sync::{AtomicU64, Backoff, Ordering};
pub(crate) use admin::Rescale;
pub(crate) use convert::{convert, convert_keeping_queue};

const LOCKED: u64 = 1;
const EPOCH_ONE: u64 = 1 << 1;
const EPOCH_MASK: u64 = 0xFFFF_FFFE;
const BURST_SHIFT: u32 = 32;

/// The largest epoch: epochs are 31 bits and count up mod 2³¹.
pub(crate) const EPOCH_MAX: u32 = u32::MAX >> 1;
/// Half the epoch circle: an epoch less than this far past another is
/// ahead of it.
pub(crate) const EPOCH_HALF: u32 = 1 << 30;

/// How far epoch `a` is past `b`, mod 2³¹ (see `EPOCH_HALF`).
pub(crate) fn epoch_distance(a: u32, b: u32) -> u32 {
    a.wrapping_sub(b) & EPOCH_MAX
}

/// The `tat` a fresh or reset bucket holds: full at any `now`.
const FULL: u64 = 0;

/// What a reservation needs to be cancelled: the `stamp`s around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) before: u64,
    pub(crate) after: u64,
    pub(crate) epoch: u32,
}

/// An admitted reservation, as the raw algorithm reports it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reserved {
    /// When the cells may be used, on the bucket's clock.
    pub(crate) ready_at: u64,
    /// `None` for `n == 0`: nothing to give back.
    pub(crate) ticket: Option<Ticket>,
}

/// A consistent view of the quota and the `tat`.
#[derive(Clone, Copy)]
struct View {
    word: u64,
    period: u64,
    burst: u32,
    /// The raw word, which the CAS compares.
    stamp: u64,
    skew: u64,
    /// `stamp - skew`: what the rules use.
    tat: u64,
}

/// The outcome of the GCRA rule for `n` cells.
enum Rule {
    /// Fits: write `new_tat`; the cells are usable at `ready_at`.
    Fits { new_tat: u64, ready_at: u64 },
    /// `n` is above the burst.
    TooMany { capacity: u32 },
    /// The new `tat` would not fit in `u64`: never admitted.
    Never,
}

impl View {
    #[inline]
    fn tolerance(&self) -> u64 {
        self.period.saturating_mul(self.burst as u64)
    }

    /// The GCRA rule; see the module docs. `n > 0`.
    #[inline]
    fn rule(&self, n: u32, now: u64) -> Rule {
        if n > self.burst {
            return Rule::TooMany {
                capacity: self.burst,
            };
        }
        let inc = self.period.saturating_mul(n as u64);
        // `inc <= tolerance` because `n <= burst` and both saturate alike.
        let earliest = self.tat.saturating_sub(self.tolerance() - inc);
        match self.tat.max(now).checked_add(inc) {
            Some(new_tat) => Rule::Fits {
                new_tat,
                ready_at: earliest.max(now),
            },
            None => Rule::Never,
        }
    }

    #[inline]
    fn epoch(&self) -> u32 {
        ((self.word & EPOCH_MASK) >> 1) as u32
    }
}

/// A GCRA bucket without a clock: every operation takes `now`.
pub(crate) struct Gcra {
    /// `tat + skew` (wrapping). Written with Release, read with Acquire
    /// (the data half of the seqlock; see the module docs).
    stamp: AtomicU64,
    /// `burst << 32 | epoch << 1 | LOCKED`: the seqlock word.
    word: AtomicU64,
    /// Nanoseconds per cell; written only under `LOCKED`.
    period: AtomicU64,
    /// `stamp - tat` (wrapping); written only under `LOCKED`.
    skew: AtomicU64,
    /// The latest end of a server hold, or 0. Not part of the decision: read
    /// by callers waking from a reservation.
    held_until: AtomicU64,
}

impl Gcra {
    pub(crate) fn new(quota: Quota) -> Gcra {
        Gcra::with_epoch(quota, 0)
    }

    /// A fresh bucket whose epoch starts at `epoch` (mod 2³¹), so that
    /// `Scoped`'s refunds from an evicted bucket never match its successor.
    pub(crate) fn with_epoch(quota: Quota, epoch: u32) -> Gcra {
        let quota = quota.clamped();
        let epoch = (u64::from(epoch) << 1) & EPOCH_MASK;
        Gcra {
            stamp: AtomicU64::new(FULL),
            word: AtomicU64::new((quota.burst.get() as u64) << BURST_SHIFT | epoch),
            period: AtomicU64::new(quota.period),
            skew: AtomicU64::new(0),
            held_until: AtomicU64::new(0),
        }
    }

    /// The epoch now (see the module docs). Relaxed: read by `Scoped`'s
    /// sweep under its shard's write lock, which orders it after every
    /// operation on the bucket.
    pub(crate) fn epoch_now(&self) -> u32 {
        ((self.word.load(Ordering::Relaxed) & EPOCH_MASK) >> 1) as u32
    }

    /// A copy of this bucket for a caller that has it to itself (`Scoped`
    /// holds its shard's write lock). Relaxed loads: that lock orders them
    /// after every write made under the read locks.
    pub(crate) fn duplicate(&self) -> Gcra {
        Gcra {
            stamp: AtomicU64::new(self.stamp.load(Ordering::Relaxed)),
            word: AtomicU64::new(self.word.load(Ordering::Relaxed)),
            period: AtomicU64::new(self.period.load(Ordering::Relaxed)),
            skew: AtomicU64::new(self.skew.load(Ordering::Relaxed)),
            held_until: AtomicU64::new(self.held_until.load(Ordering::Relaxed)),
        }
    }

    /// The end of the latest server hold (0: none yet).
    pub(crate) fn held_until(&self) -> u64 {
        // Relaxed: a lone value; missing a concurrent hold is the same as
        // starting just before the 429 arrived.
        self.held_until.load(Ordering::Relaxed)
    }

    /// Reads a consistent (quota, tat) pair.
    #[inline]
    fn view(&self) -> View {
        loop {
            // Acquire: pairs with the Release store that unlocks `word`, so
            // the loads below see what the last admin operation wrote.
            let word = self.word.load(Ordering::Acquire);
            if word & LOCKED == 0 {
                // Acquire (both): if either sees an admin operation's
                // Release store, the second `word` load sees the lock or
                // later and the view is discarded.
                let period = self.period.load(Ordering::Acquire);
                let skew = self.skew.load(Ordering::Acquire);
                let stamp = self.stamp.load(Ordering::Acquire);
                // Relaxed: ordered after the Acquire loads above.
                if self.word.load(Ordering::Relaxed) == word {
                    return View {
                        word,
                        period,
                        burst: (word >> BURST_SHIFT) as u32,
                        stamp,
                        skew,
                        tat: stamp.wrapping_sub(skew),
                    };
                }
            }
            wait_unlocked();
        }
    }

    /// Takes `LOCKED` and returns the word as it was.
    fn lock(&self) -> u64 {
        let backoff = Backoff::new();
        // Relaxed: only a hint; the CAS below decides.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if word & LOCKED != 0 {
                backoff.snooze();
                // Relaxed: as above.
                word = self.word.load(Ordering::Relaxed);
                continue;
            }
            // Acquire: pairs with the Release unlock of the previous admin
            // operation, so this one sees its `period`, `skew` and `stamp`.
            match self.word.compare_exchange_weak(
                word,
                word | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return word,
                Err(actual) => {
                    word = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// Releases `LOCKED`, publishing `word` (which has it clear).
    fn unlock(&self, word: u64) {
        debug_assert_eq!(word & LOCKED, 0);
        // Release: pairs with the Acquire loads of `word` in `view` and
        // `lock`, publishing the `period`, `skew` and `stamp` written under
        // the lock.
        self.word.store(word, Ordering::Release);
    }

    /// Applies `new_tat` if `stamp` still holds `view.stamp`; otherwise
    /// returns the view to retry with (see [`Gcra::refresh`]).
    #[inline]
    fn apply(&self, view: &View, new_tat: u64) -> Result<(), View> {
        // Release: `stamp` is seqlock data (see `view`). Acquire on
        // failure: pairs with the Release write that stored the value we
        // found, for `refresh`.
        match self.stamp.compare_exchange_weak(
            view.stamp,
            new_tat.wrapping_add(view.skew),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(()),
            Err(actual) => Err(self.refresh(view, actual)),
        }
    }

    /// The view after a failed CAS found `stamp == actual`: the old quota
    /// and skew with the new stamp if `word` is unchanged, else a fresh
    /// [`view`](Gcra::view). Sound because every `stamp` write with a new
    /// skew or quota is made under `LOCKED`: the failed CAS read `actual`
    /// with Acquire, so the `word` load then sees `LOCKED` or a new epoch.
    #[inline]
    fn refresh(&self, view: &View, actual: u64) -> View {
        // Relaxed: ordered after the Acquire failure load in `apply` (see
        // above); a stale value can only be `LOCKED` or newer, both unequal.
        if self.word.load(Ordering::Relaxed) == view.word {
            View {
                stamp: actual,
                tat: actual.wrapping_sub(view.skew),
                ..*view
            }
        } else {
            self.view()
        }
    }

    /// Admits `n` cells now, or says how long until they would fit: a
    /// reservation with no wait allowed.
    #[inline]
    pub(crate) fn try_acquire(&self, n: u32, now: u64) -> Result<(), CheckError> {
        self.reserve(n, 0, now)
            .map(drop)
            .map_err(ReserveError::into_check)
    }

    /// Takes `n` cells usable within `max_wait` nanoseconds, in one CAS, or
    /// nothing.
    #[inline]
    pub(crate) fn reserve(
        &self,
        n: u32,
        max_wait: u64,
        now: u64,
    ) -> Result<Reserved, ReserveError> {
        if n == 0 {
            return Ok(Reserved {
                ready_at: now,
                ticket: None,
            });
        }
        let backoff = Backoff::new();
        let mut retried = false;
        let mut view = self.view();
        loop {
            match view.rule(n, now) {
                Rule::Fits { new_tat, ready_at } if ready_at - now <= max_wait => {
                    match self.apply(&view, new_tat) {
                        Ok(()) => {
                            return Ok(Reserved {
                                ready_at,
                                ticket: Some(Ticket {
                                    before: view.stamp,
                                    after: new_tat.wrapping_add(view.skew),
                                    epoch: view.epoch(),
                                }),
                            })
                        }
                        Err(fresh) => view = fresh,
                    }
                    contended(&backoff, &mut retried);
                }
                Rule::Fits { ready_at, .. } => {
                    return Err(ReserveError::RateLimited {
                        retry_after: nanos(ready_at - now),
                    })
                }
                Rule::TooMany { capacity } => {
                    return Err(ReserveError::InsufficientCapacity {
                        requested: n,
                        capacity,
                    })
                }
                Rule::Never => {
                    return Err(ReserveError::RateLimited {
                        retry_after: nanos(u64::MAX),
                    })
                }
            }
        }
    }

    /// Takes `n` cells at `now` whatever the wait and the burst: debt the
    /// next callers wait for. O(1) in `n`; the new `tat` saturates (a debt
    /// past `u64` admits nothing again).
    pub(crate) fn charge(&self, n: u64, now: u64) {
        if n == 0 {
            return;
        }
        let backoff = Backoff::new();
        loop {
            let view = self.view();
            let new_tat = view
                .tat
                .max(now)
                .saturating_add(view.period.saturating_mul(n));
            if self.apply(&view, new_tat).is_ok() {
                return;
            }
            backoff.spin();
        }
    }

    /// Gives a reservation back if nothing was stacked on it since and the
    /// epoch is unchanged. Returns whether it did.
    pub(crate) fn cancel(&self, ticket: Ticket) -> bool {
        let word = self.lock();
        let refunded = ((word & EPOCH_MASK) >> 1) as u32 == ticket.epoch
            // Release: seqlock data, as in `apply`. Relaxed on failure:
            // nothing is read from the value.
            && self
                .stamp
                .compare_exchange(
                    ticket.after,
                    ticket.before,
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_ok();
        self.unlock(word);
        refunded
    }

    /// How many cells `try_acquire` would admit at `now`.
    pub(crate) fn available(&self, now: u64) -> u32 {
        let view = self.view();
        let base = view.tat.max(now);
        let debt = base - now;
        let fit = view.tolerance().saturating_sub(debt) / view.period;
        let room = (u64::MAX - base) / view.period;
        // `fit <= burst`, so the cast is lossless.
        fit.min(room) as u32
    }

    /// The debt at `now` (nanoseconds until full) and its quota, from one
    /// consistent view.
    #[cfg(feature = "admission")]
    pub(crate) fn debt(&self, now: u64) -> (u64, Quota) {
        let view = self.view();
        let quota = Quota {
            period: view.period,
            burst: core::num::NonZeroU32::new(view.burst).expect("a bucket's burst is never 0"),
        };
        (view.tat.saturating_sub(now), quota)
    }

    /// The current quota.
    pub(crate) fn quota(&self) -> Quota {
        let view = self.view();
        Quota {
            period: view.period,
            burst: core::num::NonZeroU32::new(view.burst).expect("a bucket's burst is never 0"),
        }
    }

    /// Whether the bucket is full at `now`, i.e. indistinguishable from a
    /// fresh one (`Scoped` evicts such buckets).
    pub(crate) fn is_full(&self, now: u64) -> bool {
        self.view().tat <= now
    }

    /// The raw `tat`, for tests and the fuzz model.
    #[cfg(any(fuzzing, test))]
    pub(crate) fn tat(&self) -> u64 {
        self.view().tat
    }
}

fn bump_epoch(word: u64) -> u64 {
    (word & !EPOCH_MASK) | (word.wrapping_add(EPOCH_ONE) & EPOCH_MASK)
}

#[inline]
fn nanos(n: u64) -> core::time::Duration {
    core::time::Duration::from_nanos(n)
}

/// After a failed CAS: retry at once the first time (a `pause` costs more
/// than the retry on most x86 parts), back off from the second.
#[inline]
fn contended(backoff: &Backoff, retried: &mut bool) {
    if core::mem::replace(retried, true) {
        backoff.spin();
    }
}

/// Waits for an admin operation (a few instructions) to finish.
#[cold]
fn wait_unlocked() {
    Backoff::new().snooze();
}

impl fmt::Debug for Gcra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let view = self.view();
        f.debug_struct("Gcra")
            .field("tat", &view.tat)
            .field("stamp", &view.stamp)
            .field("period", &view.period)
            .field("burst", &view.burst)
            .field("epoch", &view.epoch())
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests;
