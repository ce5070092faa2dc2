//! `Quota`: a rate and a burst, in integer nanoseconds.

use core::fmt;
use core::num::NonZeroU32;
use core::time::Duration;

use crate::clock::saturating_nanos;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// How many cells a bucket admits: one every [`period`](Quota::period), up
/// to [`burst`](Quota::burst) at once.
///
/// The period is kept in whole nanoseconds, rounded up, so the effective
/// rate never exceeds the one asked for. The typed constructors are
/// infallible; [`Quota::new`] checks untrusted values from configuration.
///
/// # Examples
///
/// ```
/// use backpressure::Quota;
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// // 10 calls per second, at most 5 at once.
/// let q = Quota::per_second(NonZeroU32::new(10).unwrap())
///     .allow_burst(NonZeroU32::new(5).unwrap());
/// assert_eq!(q.period(), Duration::from_millis(100));
/// assert_eq!(q.burst().get(), 5);
///
/// // The same from a config file.
/// assert_eq!(Quota::new(10.0, 5), Ok(q));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Nanoseconds per cell, at least 1.
    pub(crate) period: u64,
    pub(crate) burst: NonZeroU32,
}

/// The longest a bucket's whole burst may take to refill: 2⁶² ns.
pub(crate) const MAX_TOLERANCE: u64 = 1 << 62;

impl Quota {
    /// `rate` cells per second; the burst is `rate`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Quota;
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_second(NonZeroU32::new(4).unwrap());
    /// assert_eq!(q.period().as_millis(), 250);
    /// assert_eq!(q.burst().get(), 4);
    /// ```
    pub const fn per_second(rate: NonZeroU32) -> Quota {
        Quota {
            period: NANOS_PER_SEC.div_ceil(rate.get() as u64),
            burst: rate,
        }
    }

    /// `rate` cells per minute; the burst is `rate`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Quota;
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_minute(NonZeroU32::new(60).unwrap());
    /// assert_eq!(q.period().as_secs(), 1);
    /// ```
    pub const fn per_minute(rate: NonZeroU32) -> Quota {
        Quota {
            period: (60 * NANOS_PER_SEC).div_ceil(rate.get() as u64),
            burst: rate,
        }
    }

    /// One cell every `period`; the burst is 1. A zero period is taken as
    /// 1 ns and one past `u64::MAX` ns as `u64::MAX` ns, so this never fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Quota;
    /// use std::time::Duration;
    /// let q = Quota::with_period(Duration::from_millis(200));
    /// assert_eq!(q.burst().get(), 1);
    /// assert_eq!(Quota::with_period(Duration::ZERO).period(), Duration::from_nanos(1));
    /// ```
    pub fn with_period(period: Duration) -> Quota {
        Quota {
            period: saturating_nanos(period).max(1),
            burst: NonZeroU32::MIN,
        }
    }

    /// The same rate with room for `burst` cells at once.
    ///
    /// A bucket caps a burst whose whole refill (`period × burst`) would take
    /// longer than 2⁶² ns (about 146 years) to the cells that fit, at least
    /// one; its [`quota`](crate::TokenBucket::quota) reports the capped burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let q = Quota::per_second(NonZeroU32::new(1).unwrap())
    ///     .allow_burst(NonZeroU32::new(20).unwrap());
    /// assert_eq!(q.burst().get(), 20);
    ///
    /// // One cell per 2⁶¹ ns (73 years), ten at once: two fit in 146 years.
    /// let slow = Quota::with_period(Duration::from_nanos(1 << 61))
    ///     .allow_burst(NonZeroU32::new(10).unwrap());
    /// let bucket = TokenBucket::new(slow);
    /// assert_eq!(bucket.quota().burst().get(), 2);
    /// assert!(bucket.try_acquire(2).is_ok());
    /// ```
    #[must_use]
    pub const fn allow_burst(self, burst: NonZeroU32) -> Quota {
        Quota {
            period: self.period,
            burst,
        }
    }

    /// A quota from untrusted numbers: `rate_per_sec` cells per second
    /// (fractions allowed, e.g. `0.5`), `burst` at once.
    ///
    /// # Errors
    ///
    /// [`QuotaError`] when the rate is zero, negative, NaN or infinite, the
    /// burst is 0, or one cell's period does not fit in whole nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Quota;
    /// let q = Quota::new(0.5, 1).unwrap();
    /// assert_eq!(q.period().as_secs(), 2);
    /// assert!(Quota::new(f64::NAN, 1).is_err());
    /// assert!(Quota::new(10.0, 0).is_err());
    /// assert_eq!(
    ///     Quota::new(-1.0, 3).unwrap_err().to_string(),
    ///     "invalid quota: the rate must be a positive finite number, got -1",
    /// );
    /// ```
    pub fn new(rate_per_sec: f64, burst: u32) -> Result<Quota, QuotaError> {
        if !(rate_per_sec.is_finite() && rate_per_sec > 0.0) {
            return Err(QuotaError::InvalidRate(rate_per_sec));
        }
        let Some(burst) = NonZeroU32::new(burst) else {
            return Err(QuotaError::ZeroBurst);
        };
        let period = NANOS_PER_SEC as f64 / rate_per_sec;
        if period < 1.0 {
            return Err(QuotaError::PeriodTooShort(rate_per_sec));
        }
        // `u64::MAX as f64` rounds up to 2^64, so `>=` is exact.
        if period.ceil() >= u64::MAX as f64 {
            return Err(QuotaError::PeriodTooLong(rate_per_sec));
        }
        Ok(Quota {
            // In range by the checks above; `ceil` keeps the rate at or below.
            period: period.ceil() as u64,
            burst,
        })
    }

    /// The time between two cells at the sustained rate.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Quota;
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_second(NonZeroU32::new(3).unwrap());
    /// assert_eq!(q.period().as_nanos(), 333_333_334); // rounded up
    /// ```
    pub const fn period(&self) -> Duration {
        Duration::from_nanos(self.period)
    }

    /// How many cells may be admitted at once.
    pub const fn burst(&self) -> NonZeroU32 {
        self.burst
    }

    /// The burst capped to refill within [`MAX_TOLERANCE`], at least one cell.
    pub(crate) const fn clamped(self) -> Quota {
        let fit = MAX_TOLERANCE / self.period;
        if self.burst.get() as u64 <= fit {
            return self;
        }
        // `fit < burst <= u32::MAX`: the cast is exact.
        let burst = match NonZeroU32::new(fit as u32) {
            Some(b) => b,
            None => NonZeroU32::MIN,
        };
        Quota {
            period: self.period,
            burst,
        }
    }

    /// `burst * period` (GCRA's τ, the tolerance), saturating.
    pub(crate) const fn tolerance(&self) -> u64 {
        self.period.saturating_mul(self.burst.get() as u64)
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("period", &self.period())
            .field("burst", &self.burst)
            .finish()
    }
}

/// Why [`Quota::new`] rejected its input.
///
/// # Examples
///
/// ```
/// use backpressure::{Quota, QuotaError};
/// assert!(matches!(Quota::new(0.0, 1), Err(QuotaError::InvalidRate(_))));
/// assert!(matches!(Quota::new(2e9, 1), Err(QuotaError::PeriodTooShort(_))));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The rate was zero, negative, NaN or infinite.
    InvalidRate(f64),
    /// The burst was 0: such a bucket could never admit anything.
    ZeroBurst,
    /// The rate was above 10⁹ per second: a period shorter than 1 ns.
    PeriodTooShort(f64),
    /// The rate was so low that one period overflows `u64` nanoseconds.
    PeriodTooLong(f64),
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::InvalidRate(r) => write!(
                f,
                "invalid quota: the rate must be a positive finite number, got {r}"
            ),
            QuotaError::ZeroBurst => f.write_str("invalid quota: the burst must be at least 1"),
            QuotaError::PeriodTooShort(r) => write!(
                f,
                "invalid quota: a rate of {r} per second is above one per nanosecond"
            ),
            QuotaError::PeriodTooLong(r) => write!(
                f,
                "invalid quota: a rate of {r} per second has a period that overflows u64 nanoseconds"
            ),
        }
    }
}

impl std::error::Error for QuotaError {}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn rounding_never_exceeds_the_rate() {
        for rate in 1..2000u32 {
            let q = Quota::per_second(NonZeroU32::new(rate).unwrap());
            assert!(q.period * rate as u64 >= NANOS_PER_SEC, "rate {rate}");
        }
    }

    #[test]
    fn config_values_are_checked() {
        for bad in [0.0, -0.0, -3.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(matches!(
                Quota::new(bad, 1),
                Err(QuotaError::InvalidRate(_))
            ));
        }
        assert_eq!(Quota::new(1.0, 0), Err(QuotaError::ZeroBurst));
        assert!(matches!(
            Quota::new(1e9 + 1.0, 1),
            Err(QuotaError::PeriodTooShort(_))
        ));
        assert_eq!(Quota::new(1e9, 1).unwrap().period, 1);
        assert!(matches!(
            Quota::new(1e-11, 1),
            Err(QuotaError::PeriodTooLong(_))
        ));
        assert_eq!(
            Quota::new(1e-9, 1).unwrap().period,
            1_000_000_000_000_000_000
        );
        assert_eq!(Quota::new(3.0, 2).unwrap().period, 333_333_334);
    }

    #[test]
    fn tolerance_saturates() {
        let q = Quota::with_period(Duration::MAX).allow_burst(NonZeroU32::MAX);
        assert_eq!(q.period, u64::MAX);
        assert_eq!(q.tolerance(), u64::MAX);
    }
}
