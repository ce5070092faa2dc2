//! The answers "not now" and "never" of a rate limiter.

use core::fmt;
use core::time::Duration;

/// Why [`try_acquire`](crate::TokenBucket::try_acquire) admitted nothing.
///
/// # Examples
///
/// ```
/// use backpressure::{CheckError, ManualClock, Quota, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// let quota = Quota::per_second(NonZeroU32::new(2).unwrap());
/// let bucket = TokenBucket::with_clock(quota, ManualClock::new());
/// bucket.try_acquire(2).unwrap();
/// let err = bucket.try_acquire(1).unwrap_err();
/// assert_eq!(err, CheckError::NotUntil { wait: Duration::from_millis(500) });
/// assert_eq!(err.to_string(), "rate limited: not before 500ms from now");
/// assert!(bucket.try_acquire(3).unwrap_err().is_insufficient_capacity());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// The cells fit after `wait`. Nothing was consumed.
    NotUntil {
        /// How long until the cells would fit, if nothing else is admitted.
        wait: Duration,
    },
    /// More cells were asked for than the burst: this can never succeed.
    InsufficientCapacity {
        /// Cells asked for.
        requested: u32,
        /// The bucket's burst.
        capacity: u32,
    },
    /// A [`Scoped`](crate::Scoped) registry holds its maximum number of
    /// keys, none of them idle, and this key is new.
    TooManyKeys {
        /// The registry's key limit.
        limit: usize,
    },
    /// The shared store that holds the quota (e.g. Redis) did not answer in
    /// time and fails closed. Nothing was consumed.
    Unavailable {
        /// When to ask again.
        retry_after: Duration,
    },
}

impl CheckError {
    /// The wait, for [`NotUntil`](CheckError::NotUntil).
    pub fn wait(&self) -> Option<Duration> {
        match *self {
            CheckError::NotUntil { wait } => Some(wait),
            _ => None,
        }
    }

    /// Whether more cells were asked for than the burst.
    pub fn is_insufficient_capacity(&self) -> bool {
        matches!(self, CheckError::InsufficientCapacity { .. })
    }
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::NotUntil { wait } => {
                write!(f, "rate limited: not before {wait:?} from now")
            }
            CheckError::InsufficientCapacity {
                requested,
                capacity,
            } => insufficient(f, *requested, *capacity),
            CheckError::TooManyKeys { limit } => too_many_keys(f, *limit),
            CheckError::Unavailable { retry_after } => unavailable(f, *retry_after),
        }
    }
}

impl std::error::Error for CheckError {}

/// Why [`reserve`](crate::TokenBucket::reserve) took nothing.
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, Quota, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// let quota = Quota::per_second(NonZeroU32::new(1).unwrap());
/// let bucket = TokenBucket::with_clock(quota, ManualClock::new());
/// bucket.try_acquire(1).unwrap();
/// let err = bucket.reserve(1, Duration::from_millis(100)).unwrap_err();
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
/// assert!(err.is_rate_limited());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// The cells would be usable only after `retry_after`, longer than the
    /// caller can wait. Nothing was consumed.
    RateLimited {
        /// How long until the cells would fit, if nothing else is admitted.
        retry_after: Duration,
    },
    /// More cells were asked for than the burst: this can never succeed.
    InsufficientCapacity {
        /// Cells asked for.
        requested: u32,
        /// The bucket's burst.
        capacity: u32,
    },
    /// A [`Scoped`](crate::Scoped) registry holds its maximum number of
    /// keys, none of them idle, and this key is new.
    TooManyKeys {
        /// The registry's key limit.
        limit: usize,
    },
    /// The shared store that holds the quota (e.g. Redis) did not answer in
    /// time and fails closed. Nothing was consumed.
    Unavailable {
        /// When to ask again.
        retry_after: Duration,
    },
}

impl ReserveError {
    /// A call that may not go before `not_before` cannot go within a shorter
    /// `max_wait`: nothing is taken and the caller is told `not_before`.
    #[inline]
    pub(crate) fn fits_not_before(not_before: Duration, max_wait: Duration) -> Result<(), Self> {
        if not_before > max_wait {
            return Err(ReserveError::RateLimited {
                retry_after: not_before,
            });
        }
        Ok(())
    }

    /// The same refusal as `try_acquire` words it (a reservation with no
    /// wait allowed refuses exactly what `try_acquire` refuses).
    pub(crate) fn into_check(self) -> CheckError {
        match self {
            ReserveError::RateLimited { retry_after } => CheckError::NotUntil { wait: retry_after },
            ReserveError::InsufficientCapacity {
                requested,
                capacity,
            } => CheckError::InsufficientCapacity {
                requested,
                capacity,
            },
            ReserveError::TooManyKeys { limit } => CheckError::TooManyKeys { limit },
            ReserveError::Unavailable { retry_after } => CheckError::Unavailable { retry_after },
        }
    }

    /// When to ask again: the wait of [`RateLimited`](ReserveError::RateLimited)
    /// or [`Unavailable`](ReserveError::Unavailable); `None` when asking again
    /// cannot help.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::ReserveError;
    /// use std::time::Duration;
    /// let e = ReserveError::RateLimited { retry_after: Duration::from_secs(2) };
    /// assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    /// let down = ReserveError::Unavailable { retry_after: Duration::from_secs(1) };
    /// assert_eq!(down.retry_after(), Some(Duration::from_secs(1)));
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            ReserveError::RateLimited { retry_after }
            | ReserveError::Unavailable { retry_after } => Some(retry_after),
            ReserveError::InsufficientCapacity { .. } | ReserveError::TooManyKeys { .. } => None,
        }
    }

    /// Whether the wait exceeded what the caller could afford.
    pub fn is_rate_limited(&self) -> bool {
        matches!(self, ReserveError::RateLimited { .. })
    }

    /// Whether more cells were asked for than the burst.
    pub fn is_insufficient_capacity(&self) -> bool {
        matches!(self, ReserveError::InsufficientCapacity { .. })
    }
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::RateLimited { retry_after } => {
                write!(f, "rate limited: retry after {retry_after:?}")
            }
            ReserveError::InsufficientCapacity {
                requested,
                capacity,
            } => insufficient(f, *requested, *capacity),
            ReserveError::TooManyKeys { limit } => too_many_keys(f, *limit),
            ReserveError::Unavailable { retry_after } => unavailable(f, *retry_after),
        }
    }
}

impl std::error::Error for ReserveError {}

fn insufficient(f: &mut fmt::Formatter<'_>, requested: u32, capacity: u32) -> fmt::Result {
    write!(
        f,
        "insufficient capacity: {requested} cells requested, the burst is {capacity}"
    )
}

fn too_many_keys(f: &mut fmt::Formatter<'_>, limit: usize) -> fmt::Result {
    write!(f, "too many keys: the registry is full at {limit} keys")
}

fn unavailable(f: &mut fmt::Formatter<'_>, retry_after: Duration) -> fmt::Result {
    write!(
        f,
        "rate limiter unavailable: the shared quota store did not answer; retry after {retry_after:?}"
    )
}
