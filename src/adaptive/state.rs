//! Shared state behind an `AdaptiveLimiter`: samples reach the algorithm
//! without a blocking lock, and a new limit is applied to the semaphore
//! without losing a permit.
//!
//! `state` (`AtomicU64`) holds `in_flight` (bits 0..32, permits held by
//! `AdaptivePermit`s) and `excess` (bits 32..64, permits out that a shrink
//! has marked to be withheld), so a returner's `fetch_sub` of `in_flight`
//! also reads `excess` afresh. Neither can pass `MAX_LIMIT`.
//!
//! `ctl` is a lock nobody waits for: `LOCKED` (one thread feeds the
//! algorithm and resizes) and `DIRTY` (work was left for the holder). A
//! recorder that fails to CAS `LOCKED` adds its sample to `Pending` and
//! `fetch_or`s `LOCKED | DIRTY`: either it now holds the lock, or the
//! holder's unlocking CAS fails on `DIRTY` and it goes round again.
//!
//! Invariants:
//! 1. `issued == limit + excess` (`issued`: the semaphore's available +
//!    held + assigned to waiters), outside the steps of one operation.
//! 2. With nothing held, running or waiting, `excess == 0`, so
//!    `available == limit`.
//! 3. Only the holder of `LOCKED` touches `core`, changes `limit` and runs
//!    `settle`.
//!
//! Returning a permit: if `excess > 0`, CAS `excess -= 1, in_flight -= 1`
//! and forget it; else release it to the semaphore, then `fetch_sub`
//! `in_flight`, and if that sees `excess > 0` (a shrink landed in between)
//! `kick` the holder to `settle`. A shrink is `fetch_add(excess)` (Acquire,
//! pairing with the returner's Release) then `settle`: whichever RMW comes
//! first, a free permit cannot hide from the excess (invariant 2).

use core::fmt;
use std::sync::Arc;

use crate::clock::Clock;
use crate::sync::{AtomicU64, AtomicUsize, CachePadded, Ordering, UnsafeCell};
use crate::Semaphore;

use super::algorithm::{LimitAlgorithm, Outcome, Sample, MAX_LIMIT};

const IN_FLIGHT_ONE: u64 = 1;
const EXCESS_ONE: u64 = 1 << 32;

#[inline]
fn in_flight_of(state: u64) -> usize {
    (state & 0xFFFF_FFFF) as usize
}

#[inline]
fn excess_of(state: u64) -> usize {
    (state >> 32) as usize
}

const LOCKED: usize = 1;
const DIRTY: usize = 2;

/// Successes merged in `Pending::ok`: count in the top 16 bits, the sum of
/// their RTTs in microseconds (each at most `u32::MAX`) in the low 48, so
/// the sum cannot overflow before the count does.
const OK_COUNT_SHIFT: u32 = 48;
const OK_COUNT_ONE: u64 = 1 << OK_COUNT_SHIFT;
const OK_SUM_MASK: u64 = OK_COUNT_ONE - 1;

pub(super) struct Shared {
    pub(super) sem: Arc<Semaphore>,
    /// `in_flight | excess << 32`; see the module docs.
    state: CachePadded<AtomicU64>,
    /// `LOCKED | DIRTY`; see the module docs.
    ctl: AtomicUsize,
    /// A copy of `core.limit` for readers; written by the `ctl` holder.
    limit: AtomicUsize,
    /// Samples that lost the race for `ctl`.
    pending: Pending,
    /// Only accessed by the thread holding `LOCKED` in `ctl`.
    core: UnsafeCell<Core>,
    clock: Box<dyn Clock>,
}

// SAFETY: `core` (the only field that is not `Sync`: it holds a
// `LimitAlgorithm`, which is only `Send`) is accessed by one thread at a time,
// the holder of `ctl`'s `LOCKED` bit, which takes it with Acquire and gives it
// up with Release (see `record`, `kick` and `run_locked`). That is a mutex,
// so `Send` suffices, and `Core` is `Send`.
unsafe impl Sync for Shared {}

struct Core {
    algorithm: Box<dyn LimitAlgorithm>,
    /// The limit applied to the semaphore, in `[1, MAX_LIMIT]`.
    limit: usize,
}

/// Lock-free accumulators for samples whose recorder found `ctl` locked.
///
/// Each sample writes its in-flight count first (Relaxed `fetch_max`), then
/// its signal word with Release; the holder swaps the signal word with
/// Acquire, then the in-flight word.
struct Pending {
    /// See `OK_COUNT_SHIFT`. Saturates: a success past 65,535 merged is
    /// dropped rather than overflow.
    ok: AtomicU64,
    ok_in_flight: AtomicUsize,
    /// The latest start of a merged drop, plus one; 0 when none.
    drop_start: AtomicU64,
    drop_in_flight: AtomicUsize,
}

impl Pending {
    fn new() -> Self {
        Self {
            ok: AtomicU64::new(0),
            ok_in_flight: AtomicUsize::new(0),
            drop_start: AtomicU64::new(0),
            drop_in_flight: AtomicUsize::new(0),
        }
    }

    fn push(&self, sample: &Sample) {
        match sample.outcome() {
            Outcome::Success => {
                // Relaxed: published by the Release below.
                self.ok_in_flight
                    .fetch_max(sample.in_flight(), Ordering::Relaxed);
                let micros = (sample.rtt_nanos() / 1_000).min(u64::from(u32::MAX));
                // Release: pairs with the Acquire swap in `drain`.
                let _ = self
                    .ok
                    .fetch_update(Ordering::Release, Ordering::Relaxed, |w| {
                        (w >> OK_COUNT_SHIFT != u64::from(u16::MAX))
                            .then(|| w + OK_COUNT_ONE + micros)
                    });
            }
            Outcome::Dropped => {
                // Relaxed: published by the Release below.
                self.drop_in_flight
                    .fetch_max(sample.in_flight(), Ordering::Relaxed);
                // Release: pairs with the Acquire swap in `drain`.
                self.drop_start
                    .fetch_max(sample.start_nanos().saturating_add(1), Ordering::Release);
            }
            Outcome::Ignored => {}
        }
    }

    /// Feeds what accumulated to `algorithm`: the merged successes (as
    /// many samples as there were, each with the mean RTT), then one drop
    /// with the latest start. Both end at `now`.
    fn drain(&self, algorithm: &mut dyn LimitAlgorithm, clock: &dyn Clock) {
        // Relaxed loads first, so that the common case (nothing merged)
        // writes nothing. A push they miss is followed by its pusher's
        // `fetch_or(DIRTY)`, which sends the holder round again.
        let ok = match self.ok.load(Ordering::Relaxed) {
            0 => 0,
            // Acquire: pairs with the Release in `push`, so the in-flight
            // maxima written before it are seen.
            _ => self.ok.swap(0, Ordering::Acquire),
        };
        let drop_start = match self.drop_start.load(Ordering::Relaxed) {
            0 => 0,
            // Acquire: as above.
            _ => self.drop_start.swap(0, Ordering::Acquire),
        };
        if ok == 0 && drop_start == 0 {
            return;
        }
        let now = clock.now_nanos();
        let count = ok >> OK_COUNT_SHIFT;
        if let Some(mean_micros) = (ok & OK_SUM_MASK).checked_div(count) {
            let rtt = mean_micros * 1_000;
            // Relaxed: ordered by the Acquire swap above.
            let in_flight = self.ok_in_flight.swap(0, Ordering::Relaxed);
            let sample = Sample::new(now.saturating_sub(rtt), rtt, in_flight, Outcome::Success);
            for _ in 0..count {
                algorithm.update(&sample);
            }
        }
        if drop_start != 0 {
            let start = drop_start - 1;
            // Relaxed: ordered by the Acquire swap above.
            let in_flight = self.drop_in_flight.swap(0, Ordering::Relaxed);
            algorithm.update(&Sample::new(
                start,
                now.saturating_sub(start),
                in_flight,
                Outcome::Dropped,
            ));
        }
    }
}

impl Shared {
    pub(super) fn new(algorithm: Box<dyn LimitAlgorithm>, clock: Box<dyn Clock>) -> Self {
        let limit = algorithm.limit().clamp(1, MAX_LIMIT);
        Self {
            sem: Arc::new(Semaphore::new(limit)),
            state: CachePadded::new(AtomicU64::new(0)),
            ctl: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
            pending: Pending::new(),
            core: UnsafeCell::new(Core { algorithm, limit }),
            clock,
        }
    }

    pub(super) fn limit(&self) -> usize {
        // Relaxed: a reading; nothing is published with it.
        self.limit.load(Ordering::Relaxed)
    }

    pub(super) fn in_flight(&self) -> usize {
        // Relaxed: a reading.
        in_flight_of(self.state.load(Ordering::Relaxed))
    }

    /// Permits out that returns still owe to a shrink.
    pub(super) fn excess(&self) -> usize {
        // Relaxed: a reading.
        excess_of(self.state.load(Ordering::Relaxed))
    }

    /// Counts a permit just taken from the semaphore; returns its start
    /// time and the in-flight count including it.
    #[inline]
    pub(super) fn on_acquired(&self) -> (u64, usize) {
        // Relaxed: a count; the semaphore ordered the permit itself (an RMW,
        // so it continues the release sequence). The clock (user code, may
        // panic) is read first, before anything is counted.
        let start = self.clock.now_nanos();
        let prev = self.state.fetch_add(IN_FLIGHT_ONE, Ordering::Relaxed);
        (start, in_flight_of(prev) + 1)
    }

    /// A permit's drop: record its sample (unless ignored), then give the
    /// permit back or withhold it. Recording first lets a drop that lowers
    /// the limit withhold its own permit.
    ///
    /// If the algorithm panics, the panic propagates, but the permit is
    /// still given back and the lock released (see `UnlockOnPanic`).
    #[inline]
    pub(super) fn finish(&self, start: u64, in_flight: usize, outcome: Outcome) {
        let _give_back = GiveBack(self);
        if outcome != Outcome::Ignored {
            let now = self.clock.now_nanos();
            self.record(Sample::new(
                start,
                now.saturating_sub(start),
                in_flight,
                outcome,
            ));
        }
    }

    #[inline]
    fn give_back(&self) {
        // Relaxed: the CAS re-checks; a stale 0 is caught after the release.
        let mut state = self.state.load(Ordering::Relaxed);
        while excess_of(state) > 0 {
            // Relaxed: withholding touches no other memory; the CAS is
            // ordered with the shrink's RMW by `state`'s modification order.
            match self.state.compare_exchange_weak(
                state,
                state - EXCESS_ONE - IN_FLIGHT_ONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
        self.sem.add_permits(1);
        // Release: pairs with the Acquire of a later shrink's `fetch_add`
        // (and `settle`'s load), so they see the permit just released.
        let prev = self.state.fetch_sub(IN_FLIGHT_ONE, Ordering::Release);
        if excess_of(prev) > 0 {
            // A shrink came between the check and the release.
            self.kick();
        }
    }

    /// Feeds `sample` to the algorithm now, or leaves it for the thread
    /// that is doing so.
    fn record(&self, sample: Sample) {
        // Acquire: pairs with the Release unlock in `run_locked`, so `core`
        // is as the last holder left it.
        if self
            .ctl
            .compare_exchange(0, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            self.run_locked(Some(sample));
        } else {
            self.pending.push(&sample);
            self.kick();
        }
    }

    /// Marks work pending; runs it if nobody holds the lock.
    #[cold]
    fn kick(&self) {
        // AcqRel: Release publishes what this thread pushed or released
        // (pairs with the holder's Acquire in `run_locked`); Acquire, when
        // this takes the lock, pairs with the last holder's Release unlock.
        if self.ctl.fetch_or(LOCKED | DIRTY, Ordering::AcqRel) & LOCKED == 0 {
            self.run_locked(None);
        }
    }

    /// With `LOCKED` held: feeds `first` and everything pending to the
    /// algorithm, applies its limit, settles the excess, and unlocks,
    /// going round again while others leave work (`DIRTY`).
    fn run_locked(&self, mut first: Option<Sample>) {
        let unlock_on_panic = UnlockOnPanic(&self.ctl);
        loop {
            self.core.with_mut(|core| {
                // SAFETY: this thread holds `LOCKED` (invariant 3), so no
                // other reference to `core` exists.
                let core = unsafe { &mut *core };
                if let Some(sample) = first.take() {
                    core.algorithm.update(&sample);
                }
                self.pending.drain(&mut *core.algorithm, &*self.clock);
                let target = core.algorithm.limit().clamp(1, MAX_LIMIT);
                self.resize(core, target);
            });
            self.settle();
            // Release: publishes `core` to the next holder (pairs with the
            // Acquire in `record`/`kick`).
            match self
                .ctl
                .compare_exchange(LOCKED, 0, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => {
                    core::mem::forget(unlock_on_panic);
                    return;
                }
                Err(_) => {
                    // DIRTY: clear it, keep LOCKED, go again. Acquire: pairs
                    // with the Release `fetch_or` in `kick` of whoever set
                    // it, so its pushes and releases are seen.
                    self.ctl.swap(LOCKED, Ordering::Acquire);
                }
            }
        }
    }

    /// Applies `target` to the semaphore (lock held).
    fn resize(&self, core: &mut Core, target: usize) {
        let old = core.limit;
        if target == old {
            return;
        }
        core.limit = target;
        // Relaxed: a reading for `limit()`; the holder uses `core.limit`.
        self.limit.store(target, Ordering::Relaxed);
        if target > old {
            let grow = target - old;
            // Permits a shrink marked to withhold are still out: un-mark
            // them before adding new ones.
            let mut cancelled = 0;
            // AcqRel/Acquire: pairs with returners' Release `fetch_sub`.
            let _ = self
                .state
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                    cancelled = excess_of(s).min(grow);
                    Some(s - cancelled as u64 * EXCESS_ONE)
                });
            self.sem.add_permits(grow - cancelled);
        } else {
            // AcqRel: Acquire pairs with the Release `fetch_sub` of every
            // returner before this in `state`'s order, so `settle` sees the
            // permits they released.
            self.state
                .fetch_add((old - target) as u64 * EXCESS_ONE, Ordering::AcqRel);
        }
    }

    /// Pays the excess from free permits (lock held): forgets up to
    /// `excess` available ones, and gives back any it took beyond what is
    /// still owed (returns may have paid meanwhile).
    fn settle(&self) {
        // Acquire: pairs with returners' Release `fetch_sub`.
        let owed = excess_of(self.state.load(Ordering::Acquire));
        if owed == 0 {
            return;
        }
        let took = self.sem.forget_permits(owed);
        if took == 0 {
            return;
        }
        let mut paid = 0;
        // AcqRel/Acquire: as in `resize`.
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                paid = excess_of(s).min(took);
                Some(s - paid as u64 * EXCESS_ONE)
            });
        if took > paid {
            self.sem.add_permits(took - paid);
        }
    }
}

/// Gives a permit back when dropped: after its sample is recorded, or
/// while the algorithm's panic unwinds.
struct GiveBack<'a>(&'a Shared);

impl Drop for GiveBack<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// Releases `ctl` if the algorithm panics while this thread holds it.
/// Forgotten on the normal path, which unlocks with a CAS.
struct UnlockOnPanic<'a>(&'a AtomicUsize);

impl Drop for UnlockOnPanic<'_> {
    fn drop(&mut self) {
        // Release: as the normal unlock in `run_locked`.
        self.0.store(0, Ordering::Release);
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimiter")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("available", &self.sem.available_permits())
            .field("excess", &self.excess())
            .field("closed", &self.sem.is_closed())
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests;
