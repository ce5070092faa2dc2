//! A credential's quotas fitted to a server that counts over a rolling
//! window, learned from a 429 the local bucket did not predict. An exact
//! window (at most the burst in any span the burst takes to refill) sits
//! beside the GCRA bucket: it only delays a call, never admits more than
//! the bucket alone, and never turns off. The atomics are relaxed hints
//! read outside the per-credential mutex: a stale read makes one call skip
//! the window or one 429 miss evidence, never loses or double-counts a unit.

use core::time::Duration;
use std::collections::VecDeque;

use parking_lot::Mutex;

use super::held::Place;
use crate::clock::saturating_nanos;
use crate::sync::{AtomicU64, Ordering};

mod evidence;
mod place;

/// The windows of one credential's quotas, by [`Place`] (requests at 0,
/// weighted quota `i` at `1 + i`).
#[derive(Debug)]
pub(crate) struct Fits {
    /// Bit `p`: the quota at place `p` has a window; bit `32 + p`: the server
    /// states its limit. Bits are set once, never cleared.
    active: AtomicU64,
    windows: Mutex<Vec<(Place, Window)>>,
    /// When each tracked quota last took cells from a full bucket (`NEVER`:
    /// not yet): the start of its busy period.
    busy_since: [AtomicU64; TRACKED],
}

/// The quotas whose busy periods are tracked and can get a window: the
/// request quota and the first three weighted quotas.
pub(in crate::admission) const TRACKED: usize = 4;

/// The windows one call is placed in, by place index, inline.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::admission) struct Fitted([Option<(Place, Shape, u32)>; TRACKED]);

impl Fitted {
    pub(in crate::admission) fn add(&mut self, place: Place, shape: Shape, units: u32) {
        if let Some(slot) = self.0.get_mut(place.index()) {
            *slot = Some((place, shape, units));
        }
    }

    fn iter(&self) -> impl Iterator<Item = (Place, Shape, u32)> + '_ {
        self.0.iter().flatten().copied()
    }

    pub(in crate::admission) fn first(&self) -> Option<(Place, Shape, u32)> {
        self.iter().next()
    }
}

/// What a call placed in its windows, to take back if not admitted.
#[derive(Clone, Copy, Debug)]
pub(in crate::admission) struct Placed {
    pub(in crate::admission) at: u64,
    pub(in crate::admission) units: [u32; TRACKED],
}

const NEVER: u64 = u64::MAX;

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

/// What a window lets through: `limit` units in any `span`, read off the
/// bucket at each reservation so they follow learned changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::admission) struct Shape {
    pub(in crate::admission) limit: u32,
    pub(in crate::admission) span: u64,
}

impl Shape {
    /// The window of a bucket of `quota`: its burst, over its refill time
    /// plus 1/64 (a margin for network jitter between calls a span apart).
    pub(in crate::admission) fn of(quota: crate::bucket::Quota) -> Shape {
        let limit = quota.burst().get();
        let refill = saturating_nanos(quota.period()).saturating_mul(u64::from(limit));
        Shape {
            limit,
            span: refill.saturating_add(refill / 64),
        }
    }
}

/// The units placed in one quota's window, in instant order (instants may
/// be ahead of now).
#[derive(Debug, Default)]
struct Window {
    log: VecDeque<(u64, u32)>,
}

impl Fits {
    #[inline]
    pub(in crate::admission) fn is_fitted(&self, place: Place) -> bool {
        place.bit() & self.mask() & FITTED != 0
    }

    /// The places with a window, and (`<< 32`) those whose limit is stated.
    #[inline]
    pub(in crate::admission) fn mask(&self) -> u64 {
        // Relaxed: flags on the reservation path; a call racing the install may
        // skip the window once. The window itself is read under its lock.
        self.active.load(Ordering::Relaxed)
    }

    /// The server states the limit of the quota at `place`: its busy periods
    /// are tracked from now, taken to start at `sent_at` (earlier calls took
    /// their cells untracked).
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

    /// Whether `mask` says the server states the limit at `place`.
    #[inline]
    pub(in crate::admission) fn is_stated(mask: u64, place: Place) -> bool {
        mask & (place.bit() << 32) != 0
    }

    /// The quota at `place` took `cells` from a bucket of `period` ns per
    /// cell: if the bucket was full (`tat` moved by more than
    /// `cells x period`), a busy period starts.
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

    #[inline]
    fn took_from_full(&self, place: Place, now: u64) {
        if let Some(since) = self.busy_since.get(place.index()) {
            // Relaxed: a hint; a stale value only makes a 429 miss or take evidence.
            since.store(now, Ordering::Relaxed);
        }
    }

    /// Whether a 429 for a call sent at `sent_at` came less than `span` into
    /// a busy period (after idle, where the burst plus refill was refused;
    /// later in a run the bucket paces at the rate).
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

    /// Gives the quota at `place` a window; whether it had none.
    pub(in crate::admission) fn fit(&self, place: Place) -> bool {
        if place.index() >= TRACKED || self.is_fitted(place) {
            return false;
        }
        let mut windows = self.windows.lock();
        if !windows.iter().any(|(p, _)| *p == place) {
            windows.push((place, Window::default()));
        }
        // Relaxed: the window is published by the lock every reader takes.
        self.active.fetch_or(place.bit(), Ordering::Relaxed) & place.bit() == 0
    }

    /// Places a call in each of its windows at the first instant no earlier
    /// than `from` (or any earlier placement) that every one lets through,
    /// under one lock; returns that instant. Units past a limit count as it.
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

    /// The instant [`place`](Self::place) would return, placing nothing.
    pub(in crate::admission) fn earliest(&self, fitted: &Fitted, now: u64, from: u64) -> u64 {
        first_fit(&mut self.windows.lock(), fitted, now, from)
    }

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

/// The first instant no earlier than `from` that fits every window; each
/// pass only moves it later, so this reaches a fixed point.
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
    /// The first instant no earlier than `from` (or the last placement) at
    /// which `units` more fit, dropping entries that no longer matter.
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
        // Move `at` past the oldest units in (at - span, at] until `units` fit.
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
    #[inline]
    fn bit(self) -> u64 {
        u32::try_from(self.index())
            .ok()
            .and_then(|i| 1u64.checked_shl(i))
            .unwrap_or(0)
    }
}

pub(in crate::admission) fn wait(now: u64, at: u64) -> Duration {
    Duration::from_nanos(at.saturating_sub(now))
}

#[cfg(all(test, not(feature = "loom")))]
mod tests;
