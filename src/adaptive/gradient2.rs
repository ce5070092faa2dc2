//! [`Gradient2`]: Netflix's `Gradient2Limit` with a no-load long-term RTT
//! re-measured by probes (BBR's ProbeRTT), a small standing queue, and
//! halving on a drop.

use super::algorithm::{clamp_f64, LimitAlgorithm, Limits, Outcome, Sample};

const DEFAULT_MIN: usize = 1;
const DEFAULT_INITIAL: usize = 20;
const DEFAULT_MAX: usize = 1000;
const DEFAULT_TOLERANCE: f64 = 1.0;
const DEFAULT_SMOOTHING: f64 = 0.2;
const DEFAULT_LONG_WINDOW: u32 = 600;
/// The queue the limit settles on, in `√limit`s.
const HEADROOM: f64 = 0.5;
/// Round trips before the first probe: the first measurement was likely
/// taken with a queue (the initial limit in flight at once).
const FIRST_PROBE: u32 = 8;
/// A probe that measures less than this share of the no-load RTT it
/// replaces is followed by another after `FIRST_PROBE` round trips.
const REPROBE_BELOW: f64 = 0.9;
/// The steepest gradient: one window never asks for less than half.
const MIN_GRADIENT: f64 = 0.5;

/// Gradient2: compare the short-term RTT with the no-load one and move the
/// limit towards `limit × gradient + headroom`, smoothed; halve it on a
/// drop.
///
/// Samples are grouped into **windows of one round trip**: a window closes
/// with the first sample of a request that started after it opened. Per
/// window:
///
/// * `short` is the window's mean RTT of successes.
/// * `long`, the no-load RTT, falls to `short` when `short` is lower and
///   otherwise holds still, so a standing queue cannot drag it up.
/// * **Probes** keep `long` true if the downstream becomes slower or the
///   first measurement was queued: after 8 round trips, then after
///   `long_window` (default 600) without `long` falling, the limit is
///   **halved until one round trip of requests sent after the halving has
///   come back**; their mean RTT becomes `long`, and the limit goes back.
///   A probe that finds `long` 10% lower is repeated after 8 round trips.
/// * `gradient = clamp(tolerance × long / short, 0.5, 1)`.
/// * `headroom = √limit / 2`: the queue the limit may keep to probe upward.
/// * `limit += smoothing × (limit × gradient + headroom − limit)`
///   (smoothing 0.2 by default); a window with gradient 1 takes its whole
///   headroom at once, and an app-limited window (under half the limit in
///   use) does not grow.
/// * A window with a drop **halves** the limit, unsmoothed, like TCP. A
///   drop of a request that started before the last decrease (or probe) is
///   ignored.
///
/// Against a downstream whose RTT grows linearly with its queue, the limit
/// settles where the queue is about the headroom and stays there between
/// probes. For a downstream with noisy no-load RTT, a tolerance above 1
/// (Netflix uses 1.5) keeps the noise from holding the limit down, at the
/// price of a longer standing queue.
///
/// | setting | default | clamp |
/// | --- | --- | --- |
/// | min | 1 | `>= 1` |
/// | initial | 20 | into `[min, max]` |
/// | max | 1000 | `[min, MAX_LIMIT]` |
/// | tolerance | 1.0 | `[1, 100]`; NaN means the default |
/// | smoothing | 0.2 | `[0.01, 1]`; NaN means the default |
/// | long window (probe interval) | 600 round trips | `>= 1` |
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::{Gradient2, LimitAlgorithm, Outcome, Sample};
///
/// let mut g = Gradient2::new().with_limits(1, 20, 100);
/// // Steady 10 ms round trips with the window full: the limit grows.
/// let mut t = 0;
/// for _ in 0..50 {
///     for _ in 0..20 {
///         g.update(&Sample::new(t, 10_000_000, 20, Outcome::Success));
///     }
///     t += 10_000_000;
/// }
/// let grown = g.limit();
/// assert!(grown > 20);
/// // Then latency triples (a queue): the limit falls. (Were it to stay
/// // tripled with the limit halved, a probe would take it for the new
/// // no-load latency, 8 round trips in.)
/// for _ in 0..5 {
///     for _ in 0..20 {
///         g.update(&Sample::new(t, 30_000_000, grown, Outcome::Success));
///     }
///     t += 30_000_000;
/// }
/// assert!(g.limit() < grown);
/// ```
#[derive(Debug, Clone)]
pub struct Gradient2 {
    limits: Limits,
    tolerance: f64,
    smoothing: f64,
    long_window: u32,
    /// Within `limits`; fractional so that small steps add up.
    limit: f64,
    /// The no-load RTT in nanoseconds; 0 until the first window closes.
    long_rtt: f64,
    /// Windows closed since `long_rtt` was last lowered or re-measured.
    stale: u32,
    /// `end_nanos` of the sample that closed the last decreasing window.
    last_decrease: u64,
    window: Window,
    /// A probe of the no-load RTT under way.
    probe: Option<Probe>,
    /// Whether a probe has ended yet (the first one comes early).
    probed: bool,
}

/// A probe: the limit is halved until one round trip of requests started
/// after the halving has come back; their mean RTT is the new no-load RTT.
#[derive(Debug, Clone)]
struct Probe {
    /// The limit to go back to.
    resume: f64,
    /// When it started: requests that started at or after it are clean.
    start: u64,
    /// `end_nanos` of the first clean sample; the probe ends with the first
    /// clean sample of a request that started at or after it.
    first_end: Option<u64>,
    successes: u64,
    rtt_sum: u128,
}

/// The round trip being measured.
#[derive(Debug, Clone, Default)]
struct Window {
    /// When it opened: the end of the sample that closed the last one.
    start: u64,
    successes: u64,
    rtt_sum: u128,
    max_in_flight: usize,
    /// A drop of a request that started at or after `last_decrease`.
    dropped: bool,
}

impl Gradient2 {
    /// Gradient2 with the defaults in the table above.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{Gradient2, LimitAlgorithm};
    /// assert_eq!(Gradient2::new().limit(), 20);
    /// ```
    pub fn new() -> Self {
        let limits = Limits::new(DEFAULT_MIN, DEFAULT_INITIAL, DEFAULT_MAX);
        Self {
            limits,
            tolerance: DEFAULT_TOLERANCE,
            smoothing: DEFAULT_SMOOTHING,
            long_window: DEFAULT_LONG_WINDOW,
            limit: limits.initial as f64,
            long_rtt: 0.0,
            stale: 0,
            last_decrease: 0,
            window: Window::default(),
            probe: None,
            probed: false,
        }
    }

    /// Sets the bounds and the initial limit (which is also the current
    /// one). Clamped, never a panic: `min` to at least 1, `max` into
    /// `[min, MAX_LIMIT]`, `initial` into `[min, max]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{Gradient2, LimitAlgorithm};
    /// assert_eq!(Gradient2::new().with_limits(5, 50, 40).limit(), 40);
    /// ```
    pub fn with_limits(mut self, min: usize, initial: usize, max: usize) -> Self {
        self.limits = Limits::new(min, initial, max);
        self.limit = self.limits.initial as f64;
        self
    }

    /// Sets how much slower than the no-load RTT the short-term one may be
    /// before the limit falls (default 1.0: not at all; 1.5 lets a queue
    /// add 50%). Clamped into `[1, 100]`; NaN means the default.
    pub fn with_tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = clamp_f64(tolerance, 1.0, 100.0, DEFAULT_TOLERANCE);
        self
    }

    /// Sets how far one round trip moves the limit towards its target
    /// (default 0.2). Clamped into `[0.01, 1]`; NaN means the default.
    pub fn with_smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = clamp_f64(smoothing, 0.01, 1.0, DEFAULT_SMOOTHING);
        self
    }

    /// Sets after how many round trips without a lower RTT a probe
    /// re-measures the no-load RTT (default 600; at least 1).
    pub fn with_long_window(mut self, round_trips: u32) -> Self {
        self.long_window = round_trips.max(1);
        self
    }

    /// Closes the window at `now`: updates the RTTs and the limit.
    fn close_window(&mut self, now: u64) {
        let w = core::mem::take(&mut self.window);
        self.window.start = now;
        let before = self.limit;
        if w.dropped {
            // Unsmoothed, like TCP: it drains the queue that caused the
            // drop, so the long-term RTT can fall back to the no-load one.
            self.limit = self.limits.clamp(before * MIN_GRADIENT);
            self.last_decrease = now;
            return;
        }
        if w.successes == 0 {
            return;
        }
        let short = (w.rtt_sum / u128::from(w.successes)) as f64;
        if self.long_rtt == 0.0 || short <= self.long_rtt {
            self.long_rtt = short;
            self.stale = 0;
        } else {
            self.stale = self.stale.saturating_add(1);
        }
        let gradient = if short > 0.0 {
            clamp_f64(
                self.tolerance * self.long_rtt / short,
                MIN_GRADIENT,
                1.0,
                1.0,
            )
        } else {
            1.0
        };
        let headroom = HEADROOM * before.sqrt();
        let app_limited = (w.max_in_flight as f64) < before / 2.0;
        let next = if app_limited && gradient >= 1.0 {
            before
        } else if gradient >= 1.0 {
            // No queue seen: take the whole headroom at once.
            before + headroom
        } else {
            let mut target = before * gradient + headroom;
            if app_limited {
                target = target.min(before);
            }
            before + self.smoothing * (target - before)
        };
        self.limit = self.limits.clamp(next);
        if self.limit < before {
            self.last_decrease = now;
        }
        let due = if self.probed {
            self.long_window
        } else {
            FIRST_PROBE.min(self.long_window)
        };
        if self.stale >= due {
            self.start_probe(now);
        }
    }

    /// Halves the limit until a round trip of requests that started after
    /// `now` has measured the no-load RTT again.
    fn start_probe(&mut self, now: u64) {
        self.probe = Some(Probe {
            resume: self.limit,
            start: now,
            first_end: None,
            successes: 0,
            rtt_sum: 0,
        });
        self.limit = self.limits.clamp(self.limit * MIN_GRADIENT);
        // Drops of requests sent before the probe come from the queue it
        // drains: already answered.
        self.last_decrease = now;
    }

    /// A sample while probing.
    fn probe_update(&mut self, sample: &Sample) {
        let Some(p) = &mut self.probe else { return };
        if sample.start_nanos() < p.start {
            // Sent before the probe: it measured the queue being drained.
            return;
        }
        let now = sample.end_nanos();
        if sample.outcome() == Outcome::Dropped {
            // Congestion even at the halved limit: stay there, as a drop
            // window would have halved it anyway.
            self.probe = None;
            self.stale = 0;
            self.probed = true;
            self.last_decrease = now;
            self.window = Window {
                start: now,
                ..Window::default()
            };
            return;
        }
        let done = p.first_end.is_some_and(|end| sample.start_nanos() >= end);
        p.successes += 1;
        p.rtt_sum += u128::from(sample.rtt_nanos());
        p.first_end.get_or_insert(now);
        if done {
            // A measurement, not a minimum: the downstream may have become
            // slower, and then the no-load RTT goes up.
            let measured = (p.rtt_sum / u128::from(p.successes)) as f64;
            // Much lower than what it replaces: that was measured with a queue,
            // so probe again soon.
            self.probed = measured >= REPROBE_BELOW * self.long_rtt;
            self.long_rtt = measured;
            self.limit = p.resume;
            self.stale = 0;
            self.probe = None;
            self.window = Window {
                start: now,
                ..Window::default()
            };
        }
    }
}

impl Default for Gradient2 {
    fn default() -> Self {
        Self::new()
    }
}

impl LimitAlgorithm for Gradient2 {
    fn limit(&self) -> usize {
        self.limit as usize
    }

    fn update(&mut self, sample: &Sample) -> usize {
        if sample.outcome() == Outcome::Ignored {
            return self.limit();
        }
        if self.probe.is_some() {
            self.probe_update(sample);
            return self.limit();
        }
        let w = &mut self.window;
        match sample.outcome() {
            Outcome::Ignored => return self.limit(),
            Outcome::Success => {
                w.successes += 1;
                w.rtt_sum += u128::from(sample.rtt_nanos());
            }
            Outcome::Dropped => {
                if sample.start_nanos() >= self.last_decrease {
                    w.dropped = true;
                }
            }
        }
        w.max_in_flight = w.max_in_flight.max(sample.in_flight());
        if sample.start_nanos() >= w.start {
            self.close_window(sample.end_nanos());
        }
        self.limit()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Feeds `rounds` round trips of `per_round` samples each, all with the
    /// same RTT and in-flight count; returns the end time.
    fn rounds(g: &mut Gradient2, mut t: u64, rounds: u32, rtt: u64, in_flight: usize) -> u64 {
        for _ in 0..rounds {
            for _ in 0..in_flight.max(1) {
                g.update(&Sample::new(t, rtt, in_flight, Outcome::Success));
            }
            t += rtt;
        }
        t
    }

    /// 8 requests that started together all fail: one decrease, not 8.
    #[test]
    fn gradient2_eight_concurrent_drops_decrease_once() {
        let mut g = Gradient2::new().with_limits(1, 100, 1000);
        let t = rounds(&mut g, 0, 3, 10 * MS, 100);
        let before = g.limit;
        for i in 0..8 {
            g.update(&Sample::new(t + i, 10 * MS, 100, Outcome::Dropped));
        }
        // One window with a drop: halved, once.
        assert_eq!(g.limit(), (before * 0.5) as usize);
    }

    /// A closed loop before a server of `capacity` workers with no-load latency
    /// `base`: each round trip takes `base × max(1, limit / capacity)`.
    fn closed_loop(g: &mut Gradient2, mut t: u64, rounds: u32, base: u64, capacity: usize) -> u64 {
        for _ in 0..rounds {
            let l = g.limit();
            let rtt = base * l.max(capacity) as u64 / capacity as u64;
            for _ in 0..l {
                g.update(&Sample::new(t, rtt, l, Outcome::Success));
            }
            t += rtt;
        }
        t
    }

    /// The limit settles just above the capacity and stays there across probes.
    #[test]
    fn gradient2_settles_near_capacity_without_drifting_up() {
        let mut g = Gradient2::new().with_limits(1, 10, 1000);
        let mut t = closed_loop(&mut g, 0, 200, 10 * MS, 40);
        for _ in 0..30 {
            t = closed_loop(&mut g, t, 100, 10 * MS, 40);
            let l = g.limit();
            // 40 + 0.5 √44 ≈ 43; a probe halves it for two round trips.
            assert!((40..=46).contains(&l) || g.probe.is_some(), "{l}");
        }
    }

    /// With the initial limit above capacity, the first probe learns the no-load RTT.
    #[test]
    fn gradient2_learns_the_no_load_rtt_when_the_initial_limit_is_above_capacity() {
        let mut g = Gradient2::new().with_limits(1, 40, 1000);
        closed_loop(&mut g, 0, 300, 10 * MS, 10);
        assert!((10..=13).contains(&g.limit()), "{}", g.limit());
        assert_eq!(g.long_rtt, (10 * MS) as f64);
    }

    /// A downstream that became slower for good: the probe re-measures its RTT.
    #[test]
    fn gradient2_probe_relearns_a_slower_downstream() {
        let mut g = Gradient2::new().with_limits(1, 10, 1000);
        let t = closed_loop(&mut g, 0, 200, 10 * MS, 40);
        assert!(g.limit() >= 40);
        // Twice as slow: the gradient halves the limit...
        let t = closed_loop(&mut g, t, 50, 20 * MS, 40);
        assert!(g.limit() < 30, "{}", g.limit());
        // ...until the next probe finds the new no-load RTT.
        closed_loop(&mut g, t, 700, 20 * MS, 40);
        assert!(g.limit() >= 40, "{}", g.limit());
        assert_eq!(g.long_rtt, (20 * MS) as f64);
    }

    #[test]
    fn gradient2_bad_config_is_clamped() {
        let g = Gradient2::new()
            .with_tolerance(f64::NAN)
            .with_smoothing(-1.0)
            .with_long_window(0);
        assert_eq!(g.tolerance, DEFAULT_TOLERANCE);
        assert_eq!(g.smoothing, 0.01);
        assert_eq!(g.long_window, 1);
    }
}
