//! The algorithm side: what a finished request tells an algorithm
//! ([`Sample`], [`Outcome`]) and what an algorithm answers
//! ([`LimitAlgorithm`]).

use core::fmt;

use crate::Semaphore;

/// The largest limit an adaptive limiter applies
/// ([`AdaptiveLimiter::MAX_LIMIT`](super::AdaptiveLimiter::MAX_LIMIT)).
pub(crate) const MAX_LIMIT: usize = if ((u32::MAX >> 1) as usize) < Semaphore::MAX_PERMITS {
    (u32::MAX >> 1) as usize
} else {
    Semaphore::MAX_PERMITS
};

/// How a request ended, as far as the limit is concerned.
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::Outcome;
/// assert_ne!(Outcome::Success, Outcome::Dropped);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The downstream answered: its round-trip time is a latency signal.
    Success,
    /// The downstream refused or failed under load: a 429, a 503, a
    /// timeout. A congestion signal.
    Dropped,
    /// Says nothing about the downstream (the caller gave up, a client-side
    /// error). [`AdaptiveLimiter`](super::AdaptiveLimiter) does not pass these on.
    Ignored,
}

/// One finished request: when it started, how long it took, how many
/// requests were in flight when it started (itself included), and how it
/// ended. Times are nanoseconds of the limiter's [`Clock`](crate::Clock).
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::{Outcome, Sample};
///
/// let s = Sample::new(1_000, 250, 3, Outcome::Success);
/// assert_eq!(s.end_nanos(), 1_250);
/// assert_eq!((s.rtt_nanos(), s.in_flight(), s.outcome()), (250, 3, Outcome::Success));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    start_nanos: u64,
    rtt_nanos: u64,
    in_flight: usize,
    outcome: Outcome,
}

impl Sample {
    /// A sample of a request that started at `start_nanos`, took
    /// `rtt_nanos`, and found `in_flight` requests in flight (itself
    /// included) when it started.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{Outcome, Sample};
    /// let s = Sample::new(0, 10, 1, Outcome::Dropped);
    /// assert_eq!(s.outcome(), Outcome::Dropped);
    /// ```
    pub const fn new(start_nanos: u64, rtt_nanos: u64, in_flight: usize, outcome: Outcome) -> Self {
        Self {
            start_nanos,
            rtt_nanos,
            in_flight,
            outcome,
        }
    }

    /// When the request started (got its permit).
    pub const fn start_nanos(&self) -> u64 {
        self.start_nanos
    }

    /// How long it took, from permit to outcome.
    pub const fn rtt_nanos(&self) -> u64 {
        self.rtt_nanos
    }

    /// When it ended: `start + rtt`, saturating.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{Outcome, Sample};
    /// assert_eq!(Sample::new(u64::MAX, 3, 1, Outcome::Success).end_nanos(), u64::MAX);
    /// ```
    pub const fn end_nanos(&self) -> u64 {
        self.start_nanos.saturating_add(self.rtt_nanos)
    }

    /// Requests in flight when it started, itself included.
    pub const fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// How it ended.
    pub const fn outcome(&self) -> Outcome {
        self.outcome
    }
}

/// An algorithm that turns samples into a concurrency limit.
///
/// [`AdaptiveLimiter`](super::AdaptiveLimiter) calls it with exclusive
/// access (never concurrently), so implementations are plain `&mut self`
/// state machines; they only need to be `Send`. Two are provided:
/// [`Aimd`](super::Aimd) and [`Gradient2`](super::Gradient2).
///
/// An implementation should keep its limit within its own bounds, ignore
/// [`Outcome::Ignored`], and lower the limit at most once per round trip
/// (drops of requests already in flight at the last decrease are one
/// event). The limiter clamps the result into `[1, MAX_LIMIT]`. If `update`
/// panics, the panic propagates out of the permit's drop; the permit is
/// still given back and the limit stays as it was.
///
/// # Examples
///
/// A fixed limit that drops to 1 after any drop:
///
/// ```
/// use backpressure::adaptive::{AdaptiveLimiter, LimitAlgorithm, Outcome, Sample};
///
/// #[derive(Debug)]
/// struct OneStrike(usize);
///
/// impl LimitAlgorithm for OneStrike {
///     fn limit(&self) -> usize {
///         self.0
///     }
///     fn update(&mut self, sample: &Sample) -> usize {
///         if sample.outcome() == Outcome::Dropped {
///             self.0 = 1;
///         }
///         self.0
///     }
/// }
///
/// let limiter = AdaptiveLimiter::new(OneStrike(8));
/// assert_eq!(limiter.limit(), 8);
/// limiter.try_acquire().unwrap().dropped();
/// assert_eq!(limiter.limit(), 1);
/// ```
pub trait LimitAlgorithm: Send + fmt::Debug {
    /// The current limit; before any sample, the initial one.
    fn limit(&self) -> usize;

    /// Takes one finished request into account and returns the new limit.
    fn update(&mut self, sample: &Sample) -> usize;
}

impl<A: LimitAlgorithm + ?Sized> LimitAlgorithm for Box<A> {
    fn limit(&self) -> usize {
        (**self).limit()
    }

    fn update(&mut self, sample: &Sample) -> usize {
        (**self).update(sample)
    }
}

/// `[min, max]` bounds and an initial limit: `1 <= min <= max <= MAX_LIMIT`,
/// `initial` in `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    pub(super) min: usize,
    pub(super) initial: usize,
    pub(super) max: usize,
}

impl Limits {
    pub(super) fn new(min: usize, initial: usize, max: usize) -> Self {
        let min = min.clamp(1, MAX_LIMIT);
        let max = max.clamp(min, MAX_LIMIT);
        Self {
            min,
            initial: initial.clamp(min, max),
            max,
        }
    }

    /// `limit` (a float the algorithms keep internally) into `[min, max]`.
    pub(super) fn clamp(&self, limit: f64) -> f64 {
        let (min, max) = (self.min as f64, self.max as f64);
        clamp_f64(limit, min, max, min)
    }
}

/// `value` if it lies in `[lo, hi]`; clamped if outside; `default` if NaN.
pub(super) fn clamp_f64(value: f64, lo: f64, hi: f64, default: f64) -> f64 {
    if value.is_nan() {
        default
    } else {
        value.clamp(lo, hi)
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn limits_clamp_bad_input_instead_of_panicking() {
        assert_eq!(
            Limits::new(0, 0, 0),
            Limits {
                min: 1,
                initial: 1,
                max: 1
            }
        );
        assert_eq!(
            Limits::new(10, 5, 3),
            Limits {
                min: 10,
                initial: 10,
                max: 10
            }
        );
        let l = Limits::new(2, usize::MAX, usize::MAX);
        assert_eq!((l.min, l.initial, l.max), (2, MAX_LIMIT, MAX_LIMIT));
        assert_eq!(l.clamp(f64::NAN), 2.0);
        assert_eq!(l.clamp(f64::INFINITY), MAX_LIMIT as f64);
        assert_eq!(clamp_f64(f64::NAN, 0.0, 1.0, 0.5), 0.5);
        assert_eq!(clamp_f64(7.0, 0.0, 1.0, 0.5), 1.0);
    }
}
