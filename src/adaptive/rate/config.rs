//! The configuration of a learned rate ([`AdaptiveRate`]) and what one
//! reply says ([`RateOutcome`]); the controller is in the parent module.

use core::num::NonZeroU32;
use core::time::Duration;
use std::collections::VecDeque;

use parking_lot::Mutex;

use super::{clamp_f64, clamp_rate, Phase, RateController, State, RTTS, WINDOW};

/// How the server answered one request, as far as the rate is concerned.
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::RateOutcome;
/// use std::time::Duration;
///
/// fn classify(status: u16, limit: Option<(u64, Duration)>) -> RateOutcome {
///     match (status, limit) {
///         (429, _) => RateOutcome::Throttled,
///         (200..=299, Some((limit, window))) => RateOutcome::ServerLimit { limit, window },
///         (200..=299, None) => RateOutcome::Success,
///         _ => RateOutcome::Ignored,
///     }
/// }
/// assert_eq!(classify(429, None), RateOutcome::Throttled);
/// assert_eq!(classify(500, None), RateOutcome::Ignored);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateOutcome {
    /// The server accepted the request.
    Success,
    /// The server refused it for its rate: a 429, or a 503 with
    /// `Retry-After`.
    Throttled,
    /// The server accepted it and said its limit: `limit` requests per
    /// `window` (the `RateLimit` / `X-RateLimit-*` headers). The rate jumps
    /// to `limit / window` and never probes above it. A zero `limit` or
    /// `window` is taken as a plain [`Success`](RateOutcome::Success). For
    /// a 429 with these headers, feed [`Throttled`](RateOutcome::Throttled).
    ServerLimit {
        /// Requests allowed per window.
        limit: u64,
        /// The window.
        window: Duration,
    },
    /// Says nothing about the rate (a timeout, a 500, a client error).
    Ignored,
}

/// The configuration of an adaptive rate: a starting guess, bounds, and
/// how fast to fall and climb. One value makes any number of
/// [`RateController`]s, one per credential.
///
/// | setting | default | bad values |
/// | --- | --- | --- |
/// | [`initial`](AdaptiveRate::initial) | `Some(10.0)` requests/s | NaN → 10; ≤ 0 → `min_rate`; +∞ → `None` |
/// | [`min_rate`](AdaptiveRate::min_rate) | 0.1/s | NaN → 0.1; clamped to [0.001, 10⁹] |
/// | [`max_rate`](AdaptiveRate::max_rate) | 1,000/s | NaN → 1,000; clamped to [0.001, 10⁹]; below `min_rate` → `min_rate` |
/// | [`decrease`](AdaptiveRate::decrease) | 0.5 | NaN → 0.5; clamped to [0.05, 0.95] |
/// | [`slow_start`](AdaptiveRate::slow_start) | `true` | |
/// | [`probe_after`](AdaptiveRate::probe_after) | 30 s | |
/// | [`probe_gain`](AdaptiveRate::probe_gain) | 0.05 per second | NaN or < 0 → 0 (never probe); above 10 → 10 |
/// | [`burst`](AdaptiveRate::burst) | 1 | 0 → 1 |
/// | [`server_burst`](AdaptiveRate::server_burst) | 2 | 0 → 1 |
/// | [`holdoff`](AdaptiveRate::holdoff) | 2 s | |
///
/// No setting panics; the initial guess is clamped into
/// `[min_rate, max_rate]` when a controller is made.
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
/// use backpressure::{ManualClock, TokenBucket};
///
/// let clock = ManualClock::new();
/// let controller = AdaptiveRate::new().controller(0);
/// let bucket = TokenBucket::with_clock(controller.quota(), clock.clone());
/// assert_eq!(controller.rate(), 10.0);
///
/// // The server says 4 per second: the bucket follows at once.
/// let outcome = RateOutcome::ServerLimit { limit: 4, window: std::time::Duration::from_secs(1) };
/// if let Some(quota) = controller.on_reply(5_000_000, 0, outcome) {
///     bucket.set_learned_quota(quota);
/// }
/// assert_eq!(bucket.quota().period().as_millis(), 250);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveRate {
    pub(super) initial: Option<f64>,
    pub(super) min_rate: f64,
    pub(super) max_rate: f64,
    pub(super) decrease: f64,
    pub(super) slow_start: bool,
    pub(super) probe_after: Duration,
    pub(super) probe_gain: f64,
    pub(super) burst: NonZeroU32,
    pub(super) server_burst: u32,
    pub(super) holdoff: Duration,
}

impl Default for AdaptiveRate {
    fn default() -> Self {
        Self::new()
    }
}

impl AdaptiveRate {
    /// The defaults (see the table on [`AdaptiveRate`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::AdaptiveRate;
    /// let c = AdaptiveRate::new().controller(0);
    /// assert_eq!(c.rate(), 10.0);
    /// assert_eq!(c.quota().burst().get(), 1);
    /// ```
    pub fn new() -> Self {
        AdaptiveRate {
            initial: Some(10.0),
            min_rate: 0.1,
            max_rate: 1000.0,
            decrease: 0.5,
            slow_start: true,
            probe_after: Duration::from_secs(30),
            probe_gain: 0.05,
            burst: NonZeroU32::MIN,
            server_burst: 2,
            holdoff: Duration::from_secs(2),
        }
    }

    /// The starting rate in requests per second, or `None` to start at
    /// [`max_rate`](AdaptiveRate::max_rate) ("unlimited") until the first
    /// 429. NaN is taken as the default (10), zero or less as `min_rate`,
    /// +∞ as `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::AdaptiveRate;
    /// assert_eq!(AdaptiveRate::new().initial(Some(4.5)).controller(0).rate(), 4.5);
    /// let unlimited = AdaptiveRate::new().initial(None).max_rate(50.0);
    /// assert_eq!(unlimited.controller(0).rate(), 50.0);
    /// assert_eq!(AdaptiveRate::new().initial(Some(f64::NAN)).controller(0).rate(), 10.0);
    /// assert_eq!(AdaptiveRate::new().initial(Some(-1.0)).controller(0).rate(), 0.1);
    /// ```
    #[must_use]
    pub fn initial(mut self, rate: Option<f64>) -> Self {
        self.initial = match rate {
            Some(r) if r.is_nan() => Some(10.0),
            Some(r) if r == f64::INFINITY => None,
            Some(r) if r <= 0.0 => Some(0.0), // becomes min_rate
            other => other,
        };
        self
    }

    /// The lowest rate a 429 can push the controller to. NaN is taken as
    /// the default (0.1); values are clamped to [0.001, 10⁹].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    /// let c = AdaptiveRate::new().initial(Some(1.0)).min_rate(0.8).controller(0);
    /// c.on_reply(10, 0, RateOutcome::Throttled);
    /// assert_eq!(c.rate(), 0.8);
    /// ```
    #[must_use]
    pub fn min_rate(mut self, rate: f64) -> Self {
        self.min_rate = clamp_rate(rate, 0.1);
        self
    }

    /// The highest rate the controller climbs to. NaN is taken as the
    /// default (1,000); values are clamped to [0.001, 10⁹]; a `max_rate`
    /// below `min_rate` is raised to `min_rate`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::AdaptiveRate;
    /// let c = AdaptiveRate::new().max_rate(5.0).controller(0);
    /// assert_eq!(c.rate(), 5.0); // the guess of 10 is clamped
    /// ```
    #[must_use]
    pub fn max_rate(mut self, rate: f64) -> Self {
        self.max_rate = clamp_rate(rate, 1000.0);
        self
    }

    /// The multiplicative decrease applied to the ceiling when a 429 came
    /// too fast to measure the server's rate. NaN is taken as the default
    /// (0.5); values are clamped to [0.05, 0.95].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    /// let c = AdaptiveRate::new().decrease(0.25).controller(0);
    /// c.on_reply(10, 0, RateOutcome::Throttled);
    /// assert_eq!(c.rate(), 2.5);
    /// assert_eq!(AdaptiveRate::new().decrease(7.0), AdaptiveRate::new().decrease(0.95));
    /// ```
    #[must_use]
    pub fn decrease(mut self, factor: f64) -> Self {
        self.decrease = clamp_f64(factor, 0.05, 0.95, 0.5);
        self
    }

    /// Whether to climb fast (+1 request/s per success) until the first
    /// 429. Off, the rate stays at the initial guess until then.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    /// let c = AdaptiveRate::new().slow_start(false).controller(0);
    /// assert_eq!(c.on_reply(10, 0, RateOutcome::Success), None);
    /// let c = AdaptiveRate::new().controller(0);
    /// assert!(c.on_reply(10, 0, RateOutcome::Success).is_some());
    /// assert_eq!(c.rate(), 11.0);
    /// ```
    #[must_use]
    pub fn slow_start(mut self, on: bool) -> Self {
        self.slow_start = on;
        self
    }

    /// How long the rate holds, once the server's rate is known, before it
    /// probes above it again (and at least 100 successes). Each probe that
    /// finds the same limit costs one 429 and doubles this wait, up to 16×.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    /// use std::time::Duration;
    ///
    /// const MS: u64 = 1_000_000;
    /// let c = AdaptiveRate::new()
    ///     .initial(Some(4.0))
    ///     .slow_start(false)
    ///     .probe_after(Duration::from_secs(60))
    ///     .controller(0);
    /// // 4/s accepted for 5 s, then a 429: the server's rate is measured.
    /// for i in 0..20 {
    ///     c.on_reply(i * 250 * MS + 5 * MS, i * 250 * MS, RateOutcome::Success);
    /// }
    /// c.on_reply(5_005 * MS, 5_000 * MS, RateOutcome::Throttled);
    /// let settled = c.rate();
    /// assert!(settled > 3.5 && settled < 4.0);
    /// // It holds there: no probe for 60 s.
    /// for i in 0..100 {
    ///     let t = 6_000 * MS + i * 270 * MS;
    ///     c.on_reply(t + 5 * MS, t, RateOutcome::Success);
    /// }
    /// assert_eq!(c.rate(), settled);
    /// ```
    #[must_use]
    pub fn probe_after(mut self, wait: Duration) -> Self {
        self.probe_after = wait;
        self
    }

    /// How fast a probe climbs: by this fraction of the rate per second,
    /// compounding (default 0.05). NaN or negative means never probe;
    /// above 10 is taken as 10.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::AdaptiveRate;
    /// assert_eq!(AdaptiveRate::new().probe_gain(-1.0), AdaptiveRate::new().probe_gain(0.0));
    /// ```
    #[must_use]
    pub fn probe_gain(mut self, fraction_per_sec: f64) -> Self {
        self.probe_gain = clamp_f64(fraction_per_sec, 0.0, 10.0, 0.0);
        self
    }

    /// The largest burst of the quotas handed out (default 1; 0 is taken
    /// as 1). They never burst past the
    /// [`server_burst`](AdaptiveRate::server_burst) assumed either: a burst
    /// the server refuses costs one 429 per request over it, and a hold.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::AdaptiveRate;
    /// // At most the server's assumed burst (2 by default)...
    /// assert_eq!(AdaptiveRate::new().burst(3).controller(0).quota().burst().get(), 2);
    /// // ...which a known server burst raises.
    /// let known = AdaptiveRate::new().burst(3).server_burst(8);
    /// assert_eq!(known.controller(0).quota().burst().get(), 3);
    /// assert_eq!(AdaptiveRate::new().burst(0).controller(0).quota().burst().get(), 1);
    /// ```
    #[must_use]
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        self
    }

    /// The burst the server is assumed to allow (default 2; 0 is taken as
    /// 1). It enters the floor and ceiling the controller measures: too low
    /// and the floor comes out high (a 429 at a proven rate then grows it),
    /// too high and the rate settles lower. A server with no burst at all is
    /// 1; nginx's `limit_req burst=2` lets three through at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    ///
    /// const MS: u64 = 1_000_000;
    /// // The same evidence: 20 successes at 4/s, then a 429.
    /// let settle = |burst| {
    ///     let c = AdaptiveRate::new()
    ///         .initial(Some(4.0))
    ///         .slow_start(false)
    ///         .server_burst(burst)
    ///         .controller(0);
    ///     for i in 0..20 {
    ///         c.on_reply(i * 250 * MS + 5 * MS, i * 250 * MS, RateOutcome::Success);
    ///     }
    ///     c.on_reply(5_005 * MS, 5_000 * MS, RateOutcome::Throttled);
    ///     c.rate()
    /// };
    /// // A larger burst explains more of the successes: a lower rate.
    /// assert!(settle(1) > settle(2));
    /// assert!(settle(2) > settle(4));
    /// ```
    #[must_use]
    pub fn server_burst(mut self, burst: u32) -> Self {
        self.server_burst = burst.max(1);
        self
    }

    /// How long after a decrease 429s still count as the same event (default
    /// 2 s): requests sent shortly after it were admitted before the hold
    /// began. 429s of requests sent before a decrease are always ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    /// use std::time::Duration;
    ///
    /// const MS: u64 = 1_000_000;
    /// let c = AdaptiveRate::new().holdoff(Duration::from_secs(2)).controller(0);
    /// assert!(c.on_reply(5 * MS, 0, RateOutcome::Throttled).is_some());
    /// let cut = c.rate();
    /// // Admitted before the hold, sent during it: not a second decrease.
    /// assert_eq!(c.on_reply(505 * MS, 500 * MS, RateOutcome::Throttled), None);
    /// assert_eq!(c.rate(), cut);
    /// // Sent after the holdoff: a new decrease.
    /// assert!(c.on_reply(2_505 * MS, 2_500 * MS, RateOutcome::Throttled).is_some());
    /// ```
    #[must_use]
    pub fn holdoff(mut self, holdoff: Duration) -> Self {
        self.holdoff = holdoff;
        self
    }

    /// A controller for one credential, created at `now_nanos` (on the
    /// clock its replies will be timed with).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::AdaptiveRate;
    /// use backpressure::{Clock, ManualClock, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let controller = AdaptiveRate::new().controller(clock.now_nanos());
    /// let bucket = TokenBucket::with_clock(controller.quota(), clock);
    /// assert!(bucket.try_acquire(1).is_ok());
    /// ```
    pub fn controller(&self, now_nanos: u64) -> RateController {
        let mut cfg = self.clone();
        cfg.max_rate = cfg.max_rate.max(cfg.min_rate);
        let rate = match cfg.initial {
            Some(r) => r.clamp(cfg.min_rate, cfg.max_rate),
            None => cfg.max_rate,
        };
        let phase = if cfg.slow_start {
            Phase::SlowStart
        } else {
            Phase::Hold {
                until: u64::MAX,
                successes: 0,
                climb_to: None,
            }
        };
        let controller = RateController {
            state: Mutex::new(State {
                target: rate,
                applied: rate,
                // Set below, from the state (see `RateController::burst`).
                applied_burst: NonZeroU32::MIN,
                cap: cfg.max_rate,
                server: None,
                phase,
                decreased_at: None,
                epoch_start: now_nanos,
                epoch: VecDeque::with_capacity(WINDOW),
                epoch_first: None,
                backoff: 1,
                last_settled: None,
                proven_first: false,
                proven: None,
                last_floor: None,
                server_burst: cfg.server_burst,
                rtts: [0; RTTS],
                replies: 0,
            }),
            cfg,
        };
        controller.init_burst();
        controller
    }
}
