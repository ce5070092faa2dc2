//! [`Aimd`]: TCP Reno's congestion window, applied to a concurrency limit.

use super::algorithm::{clamp_f64, LimitAlgorithm, Limits, Outcome, Sample};

const DEFAULT_MIN: usize = 1;
const DEFAULT_INITIAL: usize = 20;
const DEFAULT_MAX: usize = 1000;
const DEFAULT_BACKOFF: f64 = 0.75;

/// AIMD: grow the limit by one per round trip while the window is used,
/// multiply it by `backoff` on a drop.
///
/// * **Increase.** Each [`Success`](Outcome::Success) whose request started
///   with at least half the limit in flight earns a credit; `limit`
///   credits raise the limit by 1 (one per round trip, as TCP).
/// * **Decrease.** A [`Dropped`](Outcome::Dropped) multiplies the limit by
///   `backoff`, at most once per round trip: a drop of a request that
///   started before the last decrease is ignored.
/// * **The backoff** (default 0.75) sets the saw-tooth: a deeper backoff
///   means longer cycles and fewer drops.
/// * [`Ignored`](Outcome::Ignored) samples change nothing; latency is not
///   looked at (see [`Gradient2`](super::Gradient2)).
///
/// | setting | default | clamp |
/// | --- | --- | --- |
/// | min | 1 | `>= 1` |
/// | initial | 20 | into `[min, max]` |
/// | max | 1000 | `[min, MAX_LIMIT]` |
/// | backoff | 0.75 | `[0.1, 0.99]`; NaN means the default |
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::{Aimd, LimitAlgorithm, Outcome, Sample};
///
/// let mut aimd = Aimd::new().with_limits(1, 10, 100).with_backoff(0.5);
/// assert_eq!(aimd.limit(), 10);
/// // Ten successes with the window full: one round trip, +1.
/// for i in 0..10 {
///     aimd.update(&Sample::new(i, 5, 10, Outcome::Success));
/// }
/// assert_eq!(aimd.limit(), 11);
/// // A drop halves it...
/// assert_eq!(aimd.update(&Sample::new(100, 5, 11, Outcome::Dropped)), 5);
/// // ...and a drop of a request that started before that is ignored.
/// assert_eq!(aimd.update(&Sample::new(101, 5, 11, Outcome::Dropped)), 5);
/// ```
#[derive(Debug, Clone)]
pub struct Aimd {
    limits: Limits,
    backoff: f64,
    /// Within `limits`.
    limit: usize,
    /// Successes since the last change of `limit`; `limit` of them add 1.
    credit: usize,
    /// `end_nanos` of the sample that last lowered the limit: drops of
    /// requests that started before it are ignored.
    last_decrease: u64,
}

impl Aimd {
    /// AIMD with the defaults in the table above.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{Aimd, LimitAlgorithm};
    /// assert_eq!(Aimd::new().limit(), 20);
    /// ```
    pub fn new() -> Self {
        let limits = Limits::new(DEFAULT_MIN, DEFAULT_INITIAL, DEFAULT_MAX);
        Self {
            limits,
            backoff: DEFAULT_BACKOFF,
            limit: limits.initial,
            credit: 0,
            last_decrease: 0,
        }
    }

    /// Sets the bounds and the initial limit (which is also the current
    /// one). Clamped, never a panic: `min` to at least 1, `max` into
    /// `[min, MAX_LIMIT]`, `initial` into `[min, max]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{Aimd, LimitAlgorithm};
    /// assert_eq!(Aimd::new().with_limits(4, 2, 8).limit(), 4);
    /// assert_eq!(Aimd::new().with_limits(0, 0, 0).limit(), 1);
    /// ```
    pub fn with_limits(mut self, min: usize, initial: usize, max: usize) -> Self {
        self.limits = Limits::new(min, initial, max);
        self.limit = self.limits.initial;
        self.credit = 0;
        self
    }

    /// Sets the factor a drop multiplies the limit by (default 0.75;
    /// TCP uses 0.5, Netflix's `AIMDLimit` 0.9). Clamped into `[0.1, 0.99]`; NaN means the default.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{Aimd, LimitAlgorithm, Outcome, Sample};
    /// let mut aimd = Aimd::new().with_limits(1, 100, 100).with_backoff(2.0);
    /// assert_eq!(aimd.update(&Sample::new(0, 1, 1, Outcome::Dropped)), 99);
    /// ```
    pub fn with_backoff(mut self, ratio: f64) -> Self {
        self.backoff = clamp_f64(ratio, 0.1, 0.99, DEFAULT_BACKOFF);
        self
    }
}

impl Default for Aimd {
    fn default() -> Self {
        Self::new()
    }
}

impl LimitAlgorithm for Aimd {
    fn limit(&self) -> usize {
        self.limit
    }

    fn update(&mut self, sample: &Sample) -> usize {
        match sample.outcome() {
            Outcome::Success => {
                let used = sample.in_flight().saturating_mul(2) >= self.limit;
                if used && self.limit < self.limits.max {
                    self.credit += 1;
                    if self.credit >= self.limit {
                        self.limit += 1;
                        self.credit = 0;
                    }
                }
            }
            Outcome::Dropped if sample.start_nanos() >= self.last_decrease => {
                // `as usize` saturates (and maps NaN to 0); `clamp` puts it
                // back into `[min, max]`.
                let lowered = (self.limit as f64 * self.backoff) as usize;
                self.limit = lowered.clamp(self.limits.min, self.limits.max);
                self.credit = 0;
                self.last_decrease = sample.end_nanos();
            }
            Outcome::Dropped | Outcome::Ignored => {}
        }
        self.limit()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn aimd_bad_config_is_clamped() {
        let aimd = Aimd::new().with_backoff(f64::NAN);
        assert_eq!(aimd.backoff, DEFAULT_BACKOFF);
        let aimd = Aimd::new().with_backoff(-3.0);
        assert_eq!(aimd.backoff, 0.1);
        let aimd = Aimd::new().with_limits(usize::MAX, 1, 0);
        assert_eq!(aimd.limit(), crate::adaptive::AdaptiveLimiter::MAX_LIMIT);
    }
}
