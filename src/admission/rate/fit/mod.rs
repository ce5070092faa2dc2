//! A credential's quotas fitted to a server that counts over a rolling
//! window (issue #41), learned from a 429 the local bucket did not predict.
//!
//! A GCRA bucket admits `burst + rate x t` over any span `t`; a server
//! counting the same limit over a rolling window refuses the refill part
//! of the first second after idle. No bucket fits both without giving up
//! rate, so an exact window sits beside the bucket: at most the bucket's
//! burst in any span the burst takes to refill. The bucket still decides;
//! the window only delays a call, never admits more than the bucket alone,
//! and never turns off.
//!
//! Evidence: a 429 charged to a quota whose rate is the server's stated
//! limit, for a call sent less than a burst's span after the bucket was
//! last full. A quota whose rate is only guessed learns through its rate
//! instead, and gets no window. The window counts what a call reserved,
//! not what its reply settles.
//!
//! The windows live behind one mutex per credential; the atomics are
//! relaxed hints read outside it: a stale read makes one call skip the
//! window or one 429 miss evidence, never loses or double-counts a unit.
//! No loom model: see `tests.rs` and `tests/admission/rolling_window.rs`.

use core::time::Duration;
use std::collections::VecDeque;

use parking_lot::Mutex;

use super::held::Place;
use crate::clock::saturating_nanos;
use crate::sync::{AtomicU64, Ordering};

mod evidence;
mod place;

/// The windows of one credential's quotas, by [`Place`] (the request
/// quota at 0, weighted quota `i` at `1 + i`; places past 63 get none).
#[derive(Debug)]
pub(crate) struct Fits {
    /// Bit `p`: the quota at place `p` has a window; bit `32 + p`: the
    /// server states its limit (its busy periods are tracked). Read on
    /// every reservation of the credential (one load); bits are set once,
    /// never cleared.
    active: AtomicU64,
    windows: Mutex<Vec<(Place, Window)>>,
    /// When each of the first [`TRACKED`] quotas last took cells from a
    /// full bucket (`NEVER`: not yet): the start of its busy period, which
    /// tells a 429 at a turn's start from one in the middle of a run.
    busy_since: [AtomicU64; TRACKED],
}

/// The quotas whose busy periods are tracked, and which can get a window:
/// the request quota and the first three weighted quotas (a ticket's
/// inline places). Past them, no 429 is evidence.
pub(in crate::admission) const TRACKED: usize = 4;

/// The windows one call is placed in: `(place, shape, units)` by place
/// index, inline (a reservation allocates nothing for them).
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::admission) struct Fitted([Option<(Place, Shape, u32)>; TRACKED]);

impl Fitted {
    /// The call draws `units` on the fitted quota at `place`.
    pub(in crate::admission) fn add(&mut self, place: Place, shape: Shape, units: u32) {
        if let Some(slot) = self.0.get_mut(place.index()) {
            *slot = Some((place, shape, units));
        }
    }

    fn iter(&self) -> impl Iterator<Item = (Place, Shape, u32)> + '_ {
        self.0.iter().flatten().copied()
    }

    /// The first one, to word a refusal.
    pub(in crate::admission) fn first(&self) -> Option<(Place, Shape, u32)> {
        self.iter().next()
    }
}

/// What a call placed in its windows, to take back if it is not admitted:
/// the instant and the units by place index.
#[derive(Clone, Copy, Debug)]
pub(in crate::admission) struct Placed {
    pub(in crate::admission) at: u64,
    pub(in crate::admission) units: [u32; TRACKED],
}

const NEVER: u64 = u64::MAX;

/// The bits of `Fits::active` that say a quota has a window.
pub(in crate::admission) const FITTED: u64 = (1 << TRACKED) - 1;

impl Default for Fits {
    fn default() -> Self {
        Self {
            active: AtomicU64::new(0),
            windows: Mutex::new(Vec::new()),
            busy_since: core::array::from_fn(|_| AtomicU64::new(NEVER)),
        }
    }
}

/// What a window lets through: `limit` units in any `span`, both read off
/// the quota's bucket when a call reserves, so they follow its learned
/// changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::admission) struct Shape {
    pub(in crate::admission) limit: u32,
    pub(in crate::admission) span: u64,
}

impl Shape {
    /// The window of a bucket of `quota`: its burst, in the time the burst
    /// takes to refill, plus 1/64 of it. The margin keeps apart two calls
    /// placed a span apart that reach the server closer than that.
    pub(in crate::admission) fn of(quota: crate::bucket::Quota) -> Shape {
        let limit = quota.burst().get();
        let refill = saturating_nanos(quota.period()).saturating_mul(u64::from(limit));
        Shape {
            limit,
            span: refill.saturating_add(refill / 64),
        }
    }
}

/// The units placed in one quota's window: `(instant, units)`, in order of
/// instant (instants may be ahead of now: reservations not yet used).
#[derive(Debug, Default)]
struct Window {
    log: VecDeque<(u64, u32)>,
}

impl Fits {
    /// Whether the quota at `place` has a window.
    #[inline]
    pub(in crate::admission) fn is_fitted(&self, place: Place) -> bool {
        place.bit() & self.mask() & FITTED != 0
    }

    /// The places that have a window, and (`<< 32`) those whose limit the
    /// server states, as bits (0: none, the common case).
    #[inline]
    pub(in crate::admission) fn mask(&self) -> u64 {
        // Relaxed: flags read on the reservation path. A call racing the
        // install may go without the window once; the window itself is
        // read under its lock.
        self.active.load(Ordering::Relaxed)
    }

    /// The server states the limit of the quota at `place`: from now on
    /// its busy periods are tracked, so a 429 can be judged (see
    /// `at_busy_start`).
    /// The first reply that states it is for a call sent at `sent_at`:
    /// the calls before it took their cells untracked, so the busy period
    /// they are in is taken to start there.
    pub(in crate::admission) fn stated(&self, place: Place, sent_at: u64) {
        let bit = place.bit() << 32;
        if place.index() < TRACKED && self.mask() & bit == 0 {
            // Relaxed (both): see `mask` and `took_from_full`.
            let _ = self.busy_since[place.index()].compare_exchange(
                NEVER,
                sent_at,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            self.active.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Whether the server states the limit of the quota at `place`, in
    /// `mask` as read by [`mask`](Self::mask).
    #[inline]
    pub(in crate::admission) fn is_stated(mask: u64, place: Place) -> bool {
        mask & (place.bit() << 32) != 0
    }

    /// The quota at `place` took `cells` (stamps `ticket`) from a bucket
    /// of `period` ns per cell at `now`: if the bucket was full, a busy
    /// period starts. A full bucket's new `tat` is `now + cells x period`,
    /// past the old one by more than that; a busy one's by exactly that.
    #[inline]
    pub(in crate::admission) fn took(
        &self,
        place: Place,
        ticket: crate::bucket::gcra::Ticket,
        cells: u32,
        period: u64,
        now: u64,
    ) {
        let moved = ticket.after.wrapping_sub(ticket.before);
        if moved > period.saturating_mul(u64::from(cells)) {
            self.took_from_full(place, now);
        }
    }

    /// The quota at `place` took cells from a full bucket at `now`: a busy
    /// period starts.
    #[inline]
    fn took_from_full(&self, place: Place, now: u64) {
        if let Some(since) = self.busy_since.get(place.index()) {
            // Relaxed: a hint read by a later 429's judgement, which a
            // stale value only makes miss or take one piece of evidence.
            since.store(now, Ordering::Relaxed);
        }
    }

    /// Whether a 429 for a call sent at `sent_at` on the quota at `place`
    /// came at the start of a busy period: less than `span` after the
    /// quota last left a full bucket (a turn's start, after idle, where
    /// a burst plus its refill is what the server refused; later in a run
    /// the bucket paces at the rate, and a 429 there is not about shape).
    pub(in crate::admission) fn at_busy_start(
        &self,
        place: Place,
        sent_at: u64,
        span: u64,
    ) -> bool {
        self.busy_since.get(place.index()).is_some_and(|since| {
            // Relaxed: see `took_from_full`.
            let since = since.load(Ordering::Relaxed);
            since != NEVER && since <= sent_at && sent_at - since < span
        })
    }

    /// Gives the quota at `place` a window (the evidence is in; see the
    /// module). Returns whether it had none.
    pub(in crate::admission) fn fit(&self, place: Place) -> bool {
        if place.index() >= TRACKED || self.is_fitted(place) {
            return false;
        }
        let mut windows = self.windows.lock();
        if !windows.iter().any(|(p, _)| *p == place) {
            windows.push((place, Window::default()));
        }
        // Relaxed: the window above is published by the lock, which every
        // reader of it takes; the flag only tells them to.
        self.active.fetch_or(place.bit(), Ordering::Relaxed) & place.bit() == 0
    }

    /// Places a call in the window of each quota it draws on that has
    /// one (`(place, shape, units)`), at the first instant no earlier
    /// than `from` (and no earlier than any call placed before it: each
    /// window is served in order) at which every one of them lets it
    /// through, and returns that instant. One lock for all of them, so
    /// the instant is the same in each. Units past a limit count as the
    /// limit (a call bigger than the window waits for an empty one, as for
    /// the bucket's burst).
    pub(in crate::admission) fn place(&self, fitted: &Fitted, now: u64, from: u64) -> Placed {
        let mut windows = self.windows.lock();
        let at = first_fit(&mut windows, fitted, now, from);
        let mut units = [0; TRACKED];
        for (place, shape, n) in fitted.iter() {
            let n = n.min(shape.limit);
            if let Some((_, w)) = windows.iter_mut().find(|(p, _)| *p == place) {
                w.log.push_back((at, n));
                units[place.index()] = n;
            }
        }
        Placed { at, units }
    }

    /// The instant [`place`](Self::place) would return, placing nothing:
    /// what a call refused for its wait is told.
    pub(in crate::admission) fn earliest(&self, fitted: &Fitted, now: u64, from: u64) -> u64 {
        first_fit(&mut self.windows.lock(), fitted, now, from)
    }

    /// Takes back what a call placed (a reservation given back).
    pub(in crate::admission) fn remove(&self, placed: &Placed) {
        let mut windows = self.windows.lock();
        for (place, window) in windows.iter_mut() {
            let units = placed.units.get(place.index()).copied().unwrap_or(0);
            if units > 0
                && let Some(i) = window.log.iter().rposition(|e| *e == (placed.at, units))
            {
                window.log.remove(i);
            }
        }
    }
}

/// The first instant no earlier than `from` at which a call fits every
/// window it draws on. Each window's first fit moves the instant only
/// later; a fixed point is reached once no window moves it (at most one
/// pass per window).
fn first_fit(windows: &mut [(Place, Window)], fitted: &Fitted, now: u64, from: u64) -> u64 {
    let mut at = from;
    for _ in 0..=TRACKED {
        let before = at;
        for (place, shape, units) in fitted.iter() {
            if let Some((_, w)) = windows.iter_mut().find(|(p, _)| *p == place) {
                at = w.first_fit(shape, now, at, units);
            }
        }
        if at == before {
            break;
        }
    }
    at
}

impl Window {
    /// The first instant no earlier than `from` (nor than the last call
    /// placed) at which `units` more fit `shape`, forgetting what left
    /// every window that can still matter as of `now`.
    fn first_fit(&mut self, shape: Shape, now: u64, from: u64, units: u32) -> u64 {
        let Shape { limit, span } = shape;
        let units = units.min(limit);
        while self
            .log
            .front()
            .is_some_and(|(at, _)| at.saturating_add(span) <= now)
        {
            self.log.pop_front();
        }
        let last = self.log.back().map_or(0, |(at, _)| *at);
        let mut at = from.max(last);
        // The units in (at - span, at], oldest first; move `at` to when
        // the oldest leaves until `units` more fit.
        let mut first = self
            .log
            .iter()
            .position(|(t, _)| t.saturating_add(span) > at)
            .unwrap_or(self.log.len());
        let mut inside: u64 = self.log.range(first..).map(|(_, u)| u64::from(*u)).sum();
        while inside + u64::from(units) > u64::from(limit) {
            let (t, u) = self.log[first];
            at = at.max(t.saturating_add(span));
            inside -= u64::from(u);
            first += 1;
        }
        at
    }
}

impl Place {
    /// The bit of this place in [`Fits::active`] (0 past 63: no window).
    #[inline]
    fn bit(self) -> u64 {
        u32::try_from(self.index())
            .ok()
            .and_then(|i| 1u64.checked_shl(i))
            .unwrap_or(0)
    }
}

/// How long a window makes a call wait, from `now`.
pub(in crate::admission) fn wait(now: u64, at: u64) -> Duration {
    Duration::from_nanos(at.saturating_sub(now))
}

#[cfg(all(test, not(feature = "loom")))]
mod tests;
