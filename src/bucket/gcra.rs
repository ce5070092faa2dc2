//! GCRA over one atomic word. The public API in `mod.rs` is a thin,
//! documented shell over [`Gcra`]; `Scoped` keeps one `Gcra` per key.
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
//! so over any window of length `t`, at most `burst + t / T` cells are
//! admitted. `n*T <= τ` (since `n <= burst`), so `earliest` never
//! overflows; the one sum that can is `new tat`, and a decision whose new
//! `tat` does not fit in `u64` (584 years after the clock's origin) is a
//! denial, never a wrap. Every other sum saturates.
//!
//! A *reservation* admits cells whose `earliest` is in the future (at most
//! `max_wait` ahead): the same `new tat`, and the caller waits until
//! `earliest`. Denials write nothing.
//!
//! # The words
//!
//! | word     | bits   | meaning                                                   |
//! |----------|--------|-----------------------------------------------------------|
//! | `tat`    | 0..64  | theoretical arrival time, nanoseconds since the clock's origin |
//! | `word`   | 0      | `LOCKED`: an admin operation (cancel, reset, set_quota) is running |
//! |          | 1..32  | epoch: bumped by `reset` and by every quota change         |
//! |          | 32..64 | burst                                                     |
//! | `period` | 0..64  | nanoseconds per cell                                       |
//!
//! # Why the quota is a seqlock, and what makes a quota change safe
//!
//! The quota is 96 bits (a `u64` period and a `u32` burst) and cannot share
//! the `tat` word without cutting the time range to a few years, so it lives
//! beside it: the burst in `word`, the period in `period`, and `word` is
//! the sequence counter of a seqlock. A decision reads `word` (Acquire),
//! `period` and `tat` (Acquire), then `word` again, and retries if the
//! two reads differ or `LOCKED` was set; writers change `period` and `tat`
//! only while `LOCKED` is held, with Release stores. The hot path therefore
//! pays two extra loads of a line it reads anyway, and no write.
//!
//! The seqlock makes each decision see a consistent (quota, tat) pair; the
//! compare-and-swap that applies it must also fail if the quota changed in
//! between. That is why a quota change never lowers `tat`: it converts the
//! state with a maximum of terms that all start at `tat + 1` or above (see
//! [`convert`]), and afterwards only cancels lower `tat`, and only back to
//! values taken after the change. So a decision still in flight with the
//! old quota expects a `tat` the word will never hold again: its CAS fails
//! and it retries under the new quota.
//!
//! `reset` is the one operation that lowers `tat` for good (to `FULL`; it
//! writes nothing when the bucket is already full). A decision in flight
//! across a reset fails its CAS, unless other callers push `tat` back to
//! exactly the value it read. Its decision is then still right for the
//! state it lands on (same quota), but its reservation carries the
//! pre-reset epoch, so a later cancel is refused: conservative, never an
//! over-admission. (If a quota change also fell inside that window, the
//! decision was made under the previous quota.) The loom model allows
//! exactly the refused cancel.
//!
//! # Cancelling
//!
//! A reservation remembers the `tat` it found (`before`), the one it wrote
//! (`after`) and the epoch. Cancelling compare-and-swaps `after` back to
//! `before`: that succeeds only if nothing was admitted, reserved or
//! penalized since, so a refund never frees cells that someone else holds,
//! and the bucket never holds more than its burst. The epoch check and the
//! CAS run under `LOCKED`, so a `reset` or quota change cannot slip between
//! them (after a reset, callers could push `tat` back to exactly `after`).
//! Apart from reset and quota changes, `tat` moves like the top of a stack:
//! admissions and penalties raise it, and only the reservation on top can
//! lower it, to the value below. So `tat == after` means that reservation
//! is still on top.

use core::fmt;

use super::error::{CheckError, ReserveError};
use super::quota::Quota;
use crate::sync::{AtomicU64, Backoff, Ordering};

const LOCKED: u64 = 1;
const EPOCH_ONE: u64 = 1 << 1;
const EPOCH_MASK: u64 = 0xFFFF_FFFE;
const BURST_SHIFT: u32 = 32;

/// The `tat` a fresh or reset bucket holds: full at any `now`.
const FULL: u64 = 0;

/// What a reservation needs to be cancelled.
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
    /// Theoretical arrival time. Written with Release, read with Acquire
    /// (the data half of the seqlock; see the module docs).
    tat: AtomicU64,
    /// `burst << 32 | epoch << 1 | LOCKED`: the seqlock word.
    word: AtomicU64,
    /// Nanoseconds per cell; written only under `LOCKED`.
    period: AtomicU64,
    /// The latest end of a server hold (`now + retry_after` of the latest
    /// `penalize`), or 0. Not part of the decision: callers that reserved
    /// before a hold read it when they wake to see whether their instant
    /// fell inside it.
    held_until: AtomicU64,
}

impl Gcra {
    pub(crate) fn new(quota: Quota) -> Gcra {
        Gcra {
            tat: AtomicU64::new(FULL),
            word: AtomicU64::new((quota.burst.get() as u64) << BURST_SHIFT),
            period: AtomicU64::new(quota.period),
            held_until: AtomicU64::new(0),
        }
    }

    /// The end of the latest server hold (0: none yet).
    pub(crate) fn held_until(&self) -> u64 {
        // Relaxed: a lone value that orders no other memory; a reader that
        // misses a hold landing concurrently is in the same position as a
        // call that started just before the 429 arrived.
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
                // Acquire (both): if either load sees a value an admin
                // operation stored (Release) after taking the lock, the
                // second `word` load below sees the lock or later, and the
                // view is discarded. They also keep that load after them.
                let period = self.period.load(Ordering::Acquire);
                let tat = self.tat.load(Ordering::Acquire);
                // Relaxed: ordered after the Acquire loads above.
                if self.word.load(Ordering::Relaxed) == word {
                    return View {
                        word,
                        period,
                        burst: (word >> BURST_SHIFT) as u32,
                        tat,
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
            // operation, so this one sees its `period` and `tat`.
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
        // `lock`, publishing the `period` and `tat` written under the lock.
        self.word.store(word, Ordering::Release);
    }

    /// Applies `new_tat` if `tat` still holds `view.tat`.
    #[inline]
    fn apply(&self, view: &View, new_tat: u64) -> bool {
        // Release: `tat` is seqlock data (see `view`). Relaxed on failure:
        // the caller re-reads through `view`.
        self.tat
            .compare_exchange_weak(view.tat, new_tat, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Admits `n` cells now, or says how long until they would fit.
    #[inline]
    pub(crate) fn try_acquire(&self, n: u32, now: u64) -> Result<(), CheckError> {
        let backoff = Backoff::new();
        loop {
            let view = self.view();
            if n == 0 {
                return Ok(());
            }
            match view.rule(n, now) {
                Rule::Fits { new_tat, ready_at } if ready_at <= now => {
                    if self.apply(&view, new_tat) {
                        return Ok(());
                    }
                    backoff.spin();
                }
                Rule::Fits { ready_at, .. } => {
                    return Err(CheckError::NotUntil {
                        wait: nanos(ready_at - now),
                    })
                }
                Rule::TooMany { capacity } => {
                    return Err(CheckError::InsufficientCapacity {
                        requested: n,
                        capacity,
                    })
                }
                Rule::Never => {
                    return Err(CheckError::NotUntil {
                        wait: nanos(u64::MAX),
                    })
                }
            }
        }
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
        let backoff = Backoff::new();
        loop {
            let view = self.view();
            if n == 0 {
                return Ok(Reserved {
                    ready_at: now,
                    ticket: None,
                });
            }
            match view.rule(n, now) {
                Rule::Fits { new_tat, ready_at } if ready_at - now <= max_wait => {
                    if self.apply(&view, new_tat) {
                        return Ok(Reserved {
                            ready_at,
                            ticket: Some(Ticket {
                                before: view.tat,
                                after: new_tat,
                                epoch: view.epoch(),
                            }),
                        });
                    }
                    backoff.spin();
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

    /// Gives a reservation back if nothing was stacked on it since and the
    /// bucket was neither reset nor given a new quota. Returns whether it
    /// did.
    pub(crate) fn cancel(&self, ticket: Ticket) -> bool {
        let word = self.lock();
        let refunded = ((word & EPOCH_MASK) >> 1) as u32 == ticket.epoch
            // Release: seqlock data, as in `apply`. Relaxed on failure:
            // nothing is read from the value.
            && self
                .tat
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

    /// Admits nothing before `now + retry_after`: raises `tat` so that the
    /// first single cell fits exactly then, in one CAS (retried only if
    /// another write got there first).
    ///
    /// A penalty shorter than the current debt leaves `tat` alone but voids
    /// every outstanding refund (it bumps the epoch under the admin lock):
    /// otherwise cancelling the reservation that made the debt could lower
    /// `tat` below the penalty and admit a call before the server's
    /// `Retry-After`. Voiding refunds only ever errs towards admitting less.
    pub(crate) fn penalize(&self, retry_after: u64, now: u64) {
        // Relaxed: see `held_until`.
        self.held_until
            .fetch_max(now.saturating_add(retry_after), Ordering::Relaxed);
        let backoff = Backoff::new();
        loop {
            let view = self.view();
            let target = now
                .saturating_add(retry_after)
                .saturating_add(view.tolerance() - view.period);
            if view.tat < target {
                if self.apply(&view, target) {
                    return;
                }
                backoff.spin();
                continue;
            }
            let word = self.lock();
            // Relaxed: we hold the admin lock (taken with Acquire), and the
            // only writes that lower `tat` (cancel, reset, set_quota) hold
            // it too; concurrent admissions only raise it.
            if self.tat.load(Ordering::Relaxed) >= target {
                self.unlock(bump_epoch(word));
                return;
            }
            // A refund landed before the lock: raise `tat` instead.
            self.unlock(word);
        }
    }

    /// Makes the bucket full, and voids every outstanding reservation's
    /// refund. A bucket already full at `now` is left as it is (its
    /// reservations' refunds stay valid): writing `FULL` over an equal
    /// value would let a decision in flight succeed with a stale epoch.
    pub(crate) fn reset(&self, now: u64) {
        let word = self.lock();
        // An RMW, not a load and a store: a reservation landing in between
        // must be either seen (and wiped) or fail its CAS. Release: seqlock
        // data, published by `unlock`. Relaxed on failure: nothing to see.
        let wiped = self
            .tat
            .fetch_update(Ordering::Release, Ordering::Relaxed, |tat| {
                (tat > now).then_some(FULL)
            })
            .is_ok();
        self.unlock(if wiped { bump_epoch(word) } else { word });
    }

    /// Switches to `quota`, converting the state so that nothing is granted
    /// that the old quota had not granted yet (see [`convert`]).
    pub(crate) fn set_quota(&self, quota: Quota, now: u64) {
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
        // Release: seqlock data; a `view` that sees it also sees LOCKED.
        self.period.store(quota.period, Ordering::Release);
        // Acquire: the freshest `tat` to convert; the CAS retries anyway.
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let new = convert(tat, now, old, quota);
            // Release: seqlock data. Acquire on failure: as the load above.
            match self
                .tat
                .compare_exchange_weak(tat, new, Ordering::Release, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(actual) => tat = actual,
            }
        }
        let word = ((quota.burst.get() as u64) << BURST_SHIFT) | (word & EPOCH_MASK);
        self.unlock(bump_epoch(word));
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

/// Converts a `tat` from quota `old` to quota `new` at `now`. The result
/// is the largest of:
///
/// * `tat + 1`: `tat` never goes down, which fences out any decision still
///   in flight under the old quota (see the module docs);
/// * `now + debt * T_new / T_old` (rounded up): the debt taken so far is
///   kept in *cells*, so lowering the rate cannot turn recent admissions
///   into free capacity;
/// * `tat + (τ_new - T_new) - (τ_old - T_old)`: the next single cell fits
///   no earlier than it would have under the old quota, so a penalty
///   survives and a larger burst does not open at once.
///
/// So a quota change never grants anything the old quota had not granted
/// yet: a raised rate or burst takes effect as the bucket refills.
/// Saturates at `u64::MAX`.
pub(crate) fn convert(tat: u64, now: u64, old: Quota, new: Quota) -> u64 {
    let debt = tat.saturating_sub(now) as u128;
    let kept = now as u128 + (debt * new.period as u128).div_ceil(old.period as u128);
    let next = tat as i128 + (new.tolerance() - new.period) as i128
        - (old.tolerance() - old.period) as i128;
    let next = next.max(0) as u128;
    let fence = tat as u128 + 1;
    kept.max(next).max(fence).min(u64::MAX as u128) as u64
}

fn bump_epoch(word: u64) -> u64 {
    (word & !EPOCH_MASK) | (word.wrapping_add(EPOCH_ONE) & EPOCH_MASK)
}

#[inline]
fn nanos(n: u64) -> core::time::Duration {
    core::time::Duration::from_nanos(n)
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
            .field("period", &view.period)
            .field("burst", &view.burst)
            .field("epoch", &view.epoch())
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use core::num::NonZeroU32;

    fn q(period: u64, burst: u32) -> Quota {
        Quota {
            period,
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[test]
    fn epoch_wraps_inside_its_bits() {
        let word = (7u64 << BURST_SHIFT) | EPOCH_MASK;
        let bumped = bump_epoch(word);
        assert_eq!(bumped >> BURST_SHIFT, 7);
        assert_eq!(bumped & EPOCH_MASK, 0);
        assert_eq!(bump_epoch(bumped) & EPOCH_MASK, EPOCH_ONE);
    }

    #[test]
    fn convert_keeps_debt_in_cells_when_the_rate_falls() {
        // 1000/s, burst 1000, drained at 0: tat = 1s. Now 1/s, burst 1000.
        let t = convert(1_000_000_000, 0, q(1_000_000, 1000), q(1_000_000_000, 1000));
        assert_eq!(t, 1_000 * 1_000_000_000);
    }

    #[test]
    fn convert_never_moves_the_next_cell_earlier() {
        // 1/s burst 1, drained at 0 (next cell at 1s). Now 100/s burst 100.
        let old = q(1_000_000_000, 1);
        let new = q(10_000_000, 100);
        let t = convert(1_000_000_000, 0, old, new);
        // The first cell under the new quota fits at t - (τ - T) = 1s.
        assert_eq!(t - (new.tolerance() - new.period), 1_000_000_000);
    }

    #[test]
    fn convert_always_raises_and_saturates() {
        assert_eq!(convert(5, 100, q(10, 1), q(10, 2)), 100);
        assert_eq!(convert(500, 100, q(10, 100), q(10, 1)), 501);
        assert_eq!(
            convert(u64::MAX, 0, q(1, 1), q(u64::MAX, u32::MAX)),
            u64::MAX
        );
    }
}
