//! A credential's quotas fitted to a server that counts over a rolling
//! window (issue #41): the shape of the limit, learned from a 429 the
//! local bucket did not predict.
//!
//! A learned quota is a GCRA bucket at the server's stated rate with one
//! slice's worth of burst (a second's, see `Provider`). Over any span `t`
//! it admits `burst + rate x t`: after idle, a whole burst at once and then
//! the refill. A server that counts the same limit over a rolling window
//! (a sliding log: at most `burst` in any second) refuses the refill part
//! of that first second, every time the caller comes back from idle: the
//! same 429 at every turn's start.
//!
//! No bucket can fit both: a GCRA matching "T per W" needs
//! `burst + rate x W <= T`, so it must give up rate (a burst of one call
//! of 805 tokens leaves 1,195 of the 2,000 a second), on every server.
//! So the evidence turns on an exact window beside the bucket, not a
//! smaller burst: at most the bucket's burst in any span the burst takes
//! to refill. The bucket still decides (its holds, debts, settles and
//! rate changes are unchanged); the window only delays a call that would
//! put more than a burst in one span. It never admits more than the bucket
//! alone, and it admits the bucket's own rate over any long run, so it has
//! nothing to give back and never turns off: against a server that does
//! allow the double burst it costs only the first span after idle (one
//! burst instead of two).
//!
//! Evidence: a 429 charged to a quota whose rate is the server's own
//! stated limit (a weighted quota the provider's headers state, or a
//! request rate from a stated request limit), for a call sent less than
//! a burst's span after the quota's bucket was last full (a turn's start,
//! after idle). The rate cannot be what is wrong there, so the shape is.
//! Later in a run the bucket paces at the rate and a 429 says something
//! else (a first reply's usage nothing metered, another user of the key). A quota whose rate is only guessed (no
//! limit stated: nginx's `limit_req`) learns from the 429 through its rate
//! instead, and gets no window.
//!
//! The window counts what a call reserved (its estimate), not what its
//! reply settles: a settle moves the bucket, whose rate still bounds the
//! long run.

use core::time::Duration;
use std::collections::VecDeque;

use parking_lot::Mutex;

use super::held::Place;
use crate::clock::saturating_nanos;
use crate::sync::{AtomicU64, Ordering};

/// The windows of one credential's quotas, by [`Place`] (the request
/// quota at 0, weighted quota `i` at `1 + i`; places past 63 get none).
#[derive(Debug)]
pub(crate) struct Fits {
    /// Bit `p`: the quota at place `p` has a window. Read on every
    /// reservation of the credential (one load); set once, never cleared.
    active: AtomicU64,
    windows: Mutex<Vec<(Place, Window)>>,
    /// When each of the first [`TRACKED`] quotas last took cells from a
    /// full bucket (`NEVER`: not yet): the start of its busy period, which
    /// tells a 429 at a turn's start from one in the middle of a run.
    busy_since: [AtomicU64; TRACKED],
}

/// The quotas whose busy periods are tracked: the request quota and the
/// first three weighted quotas (a ticket's inline places). Past them, no
/// 429 is evidence.
const TRACKED: usize = 4;

const NEVER: u64 = u64::MAX;

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
    /// takes to refill, plus 1/64 of it (15.6 ms a second). The server
    /// starts its window when a request reaches it, and a call placed a
    /// span after another can reach it sooner after that one than it left
    /// (the first was slower on its way): the margin keeps such a pair
    /// apart, for 1.5% of the rate.
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
        // Relaxed: a flag read on the reservation path. A call racing the
        // install may go without the window once; the window itself is
        // read under its lock.
        place.bit() & self.active.load(Ordering::Relaxed) != 0
    }

    /// The quota at `place` took cells from a full bucket at `now`: a busy
    /// period starts.
    #[inline]
    pub(in crate::admission) fn took_from_full(&self, place: Place, now: u64) {
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
        if place.bit() == 0 || self.is_fitted(place) {
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
    pub(in crate::admission) fn place(
        &self,
        fitted: &[(Place, Shape, u32)],
        now: u64,
        from: u64,
    ) -> u64 {
        let mut windows = self.windows.lock();
        let at = first_fit(&mut windows, fitted, now, from);
        for &(place, shape, units) in fitted {
            if let Some((_, w)) = windows.iter_mut().find(|(p, _)| *p == place) {
                w.log.push_back((at, units.min(shape.limit)));
            }
        }
        at
    }

    /// The instant [`place`](Self::place) would return, placing nothing:
    /// what a call refused for its wait is told.
    pub(in crate::admission) fn earliest(
        &self,
        fitted: &[(Place, Shape, u32)],
        now: u64,
        from: u64,
    ) -> u64 {
        first_fit(&mut self.windows.lock(), fitted, now, from)
    }

    /// Takes back `units` placed at `at` (a reservation given back).
    pub(in crate::admission) fn remove(&self, place: Place, at: u64, units: u32) {
        let mut windows = self.windows.lock();
        if let Some((_, window)) = windows.iter_mut().find(|(p, _)| *p == place)
            && let Some(i) = window.log.iter().rposition(|e| *e == (at, units))
        {
            window.log.remove(i);
        }
    }
}

/// The first instant no earlier than `from` at which a call fits every
/// window it draws on. Each window's first fit moves the instant only
/// later; a fixed point is reached once no window moves it (at most one
/// pass per window).
fn first_fit(
    windows: &mut [(Place, Window)],
    fitted: &[(Place, Shape, u32)],
    now: u64,
    from: u64,
) -> u64 {
    let mut at = from;
    for _ in 0..=fitted.len() {
        let before = at;
        for &(place, shape, units) in fitted {
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
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const TOKENS: Shape = Shape {
        limit: 2_000,
        span: SEC,
    };

    fn fitted() -> (Fits, Place) {
        let fits = Fits::default();
        let place = super::super::Source::Resource(0).place().unwrap();
        assert!(!fits.is_fitted(place));
        assert!(fits.fit(place));
        assert!(!fits.fit(place), "fitted once");
        (fits, place)
    }

    #[test]
    fn a_window_lets_one_burst_through_per_span() {
        let (fits, p) = fitted();
        // 805-token calls, all ready at once: two fit a second, the third
        // waits until the first leaves, the fifth until the third does.
        let at: Vec<u64> = (0..5)
            .map(|_| fits.place(&[(p, TOKENS, 805)], 0, 0))
            .collect();
        assert_eq!(at, [0, 0, SEC, SEC, 2 * SEC]);
        // Never more than the limit in any span starting at a placement.
        for &start in &at {
            let inside = at
                .iter()
                .filter(|&&t| t >= start && t < start + SEC)
                .count();
            assert!(inside * 805 <= 2_000, "{at:?}");
        }
    }

    #[test]
    fn a_window_keeps_order_and_the_buckets_instant() {
        let (fits, p) = fitted();
        // The bucket's own instant is kept when the window has room.
        assert_eq!(fits.place(&[(p, TOKENS, 805)], 0, 300), 300);
        // A later call is never placed before an earlier one.
        assert_eq!(fits.place(&[(p, TOKENS, 805)], 0, 100), 300);
        // Past the limit: waits for an empty window, counted as the limit.
        assert_eq!(fits.place(&[(p, TOKENS, 9_000)], 0, 0), 300 + SEC);
        assert_eq!(fits.place(&[(p, TOKENS, 1)], 0, 0), 300 + 2 * SEC);
    }

    #[test]
    fn a_window_forgets_what_left_and_what_was_given_back() {
        let (fits, p) = fitted();
        assert_eq!(fits.place(&[(p, TOKENS, 2_000)], 0, 0), 0);
        // Given back: the next call takes its room at once.
        fits.remove(p, 0, 2_000);
        assert_eq!(fits.place(&[(p, TOKENS, 2_000)], 0, 0), 0);
        // A span later the window is empty again.
        assert_eq!(fits.place(&[(p, TOKENS, 2_000)], SEC, SEC), SEC);
        assert_eq!(fits.windows.lock()[0].1.log.len(), 1, "the old one left");
    }

    #[test]
    fn no_window_no_delay() {
        let fits = Fits::default();
        let p = super::super::Source::Requests.place().unwrap();
        assert_eq!(fits.place(&[(p, TOKENS, 2_000)], 0, 7), 7);
        assert_eq!(fits.place(&[(p, TOKENS, 2_000)], 0, 7), 7);
        let shape = Shape::of(crate::bucket::Quota::new(2_000.0, 2_000).unwrap());
        assert_eq!((shape.limit, shape.span), (2_000, SEC + SEC / 64));
    }

    #[test]
    fn a_call_goes_at_one_instant_in_every_window() {
        let (fits, tokens) = fitted();
        let requests = super::super::Source::Requests.place().unwrap();
        assert!(fits.fit(requests));
        let three = Shape {
            limit: 3,
            span: SEC,
        };
        // Requests allow three a second, tokens two calls: the third call
        // waits for the tokens, and is counted at that instant in both.
        let call = [(requests, three, 1), (tokens, TOKENS, 805)];
        let at: Vec<u64> = (0..4).map(|_| fits.place(&call, 0, 0)).collect();
        assert_eq!(at, [0, 0, SEC, SEC]);
        let windows = fits.windows.lock();
        assert!(windows.iter().all(|(_, w)| w.log.len() == 4));
        assert!(windows.iter().all(|(_, w)| w.log[2].0 == SEC));
    }
}
