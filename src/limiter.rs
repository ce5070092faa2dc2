//! `AsyncRateLimiter`: the [`RateLimiter`] contract for limiters whose
//! decisions take a round trip (a shared bucket in Redis), so callers and
//! the admission layer can take a local or a shared bucket alike.
//!
//! # Why a second trait
//!
//! [`RateLimiter`] decides at once, and its [`Reservation`] gives cells
//! back synchronously. A shared limiter cannot do either: its decision is
//! a network round trip, and so is a refund. Rather than bend the local
//! contract (a local decision would then pay for a future it never
//! needs), this trait has the same method names and error types, returns
//! futures, and lets each limiter name its reservation. Every
//! [`RateLimiter`] is an `AsyncRateLimiter` through a blanket impl whose
//! futures are ready at once, so code written against this trait takes a
//! [`TokenBucket`](crate::TokenBucket) unchanged.
//!
//! The trait uses `impl Future` in its methods, so it is not object safe;
//! take it as a generic parameter.

use core::future::{ready, Future};
use core::time::Duration;

use crate::bucket::{CheckError, RateLimiter, Reservation, ReserveError};

/// Cells taken from an [`AsyncRateLimiter`], usable after
/// [`wait`](AsyncReservation::wait).
///
/// As with the local [`Reservation`], dropping it keeps the cells taken;
/// [`cancel`](AsyncReservation::cancel) gives them back when nothing was
/// stacked on them since.
///
/// # Examples
///
/// ```
/// use backpressure::{AsyncRateLimiter, AsyncReservation, ManualClock, Quota, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// async fn reserve_and_give_back<L: AsyncRateLimiter>(limiter: &L) -> bool {
///     let r = limiter.reserve(1, Duration::from_secs(1)).await.unwrap();
///     r.cancel().await
/// }
///
/// let bucket = TokenBucket::with_clock(
///     Quota::per_second(NonZeroU32::new(1).unwrap()),
///     ManualClock::new(),
/// );
/// assert!(futures::executor::block_on(reserve_and_give_back(&bucket)));
/// ```
pub trait AsyncReservation: Send {
    /// How long the caller must wait before using the cells, measured from
    /// the moment the reservation was returned.
    fn wait(&self) -> Duration;

    /// Gives the cells back if nothing was stacked on them since; returns
    /// whether it did. A shared limiter that cannot be reached answers
    /// `false` (the cells stay taken: the safe side).
    fn cancel(self) -> impl Future<Output = bool> + Send;

    /// Keeps the cells taken for a call that starts after the returned
    /// wait, letting the reservation go now. For a local reservation this
    /// is dropping it; a shared one (`RedisReservation`) dropped before its
    /// wait would give its cells back instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{AsyncRateLimiter, AsyncReservation, ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(1).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// futures::executor::block_on(async {
    ///     let wait = AsyncRateLimiter::reserve(&bucket, 1, Duration::ZERO).await.unwrap().keep();
    ///     assert_eq!(wait, Duration::ZERO);
    ///     assert!(AsyncRateLimiter::try_acquire(&bucket, 1).await.is_err()); // kept
    /// });
    /// ```
    fn keep(self) -> Duration
    where
        Self: Sized,
    {
        self.wait()
    }
}

/// The [`RateLimiter`] contract, for limiters whose decisions may take a
/// round trip: same method names, same errors, futures instead of values.
///
/// Implemented by every [`RateLimiter`] (ready at once) and, with the
/// `redis` feature, by `RedisBucket`.
///
/// # Examples
///
/// ```
/// use backpressure::{AsyncRateLimiter, ManualClock, Quota, TokenBucket};
/// use std::num::NonZeroU32;
///
/// async fn start_call<L: AsyncRateLimiter>(limiter: &L) -> bool {
///     limiter.try_acquire(1).await.is_ok()
/// }
///
/// let bucket = TokenBucket::with_clock(
///     Quota::per_second(NonZeroU32::new(1).unwrap()),
///     ManualClock::new(),
/// );
/// futures::executor::block_on(async {
///     assert!(start_call(&bucket).await);
///     assert!(!start_call(&bucket).await);
/// });
/// ```
pub trait AsyncRateLimiter: Send + Sync {
    /// What [`reserve`](AsyncRateLimiter::reserve) hands out.
    type Reservation<'a>: AsyncReservation
    where
        Self: 'a;

    /// Admits `n` cells now, or says how long until they would fit.
    /// A denial consumes nothing.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::try_acquire`]; a shared limiter that fails closed
    /// also answers [`CheckError::Unavailable`].
    fn try_acquire(&self, n: u32) -> impl Future<Output = Result<(), CheckError>> + Send;

    /// Takes `n` cells usable within `max_wait`, or nothing.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::reserve`]; a shared limiter that fails closed also
    /// answers [`ReserveError::Unavailable`].
    fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Self::Reservation<'_>, ReserveError>> + Send;

    /// The server said "not before `retry_after`": admit nothing until
    /// then (for a shared limiter: in every process on the key).
    fn penalize(&self, retry_after: Duration) -> impl Future<Output = ()> + Send;

    /// How many cells `try_acquire` would admit now (a peek).
    fn available(&self) -> impl Future<Output = u32> + Send;
}

impl AsyncReservation for Reservation<'_> {
    #[inline]
    fn wait(&self) -> Duration {
        Reservation::wait(self)
    }

    fn cancel(self) -> impl Future<Output = bool> + Send {
        ready(Reservation::cancel(self))
    }
}

impl<L: RateLimiter + ?Sized> AsyncRateLimiter for L {
    type Reservation<'a>
        = Reservation<'a>
    where
        Self: 'a;

    #[inline]
    fn try_acquire(&self, n: u32) -> impl Future<Output = Result<(), CheckError>> + Send {
        ready(RateLimiter::try_acquire(self, n))
    }

    #[inline]
    fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Reservation<'_>, ReserveError>> + Send {
        ready(RateLimiter::reserve(self, n, max_wait))
    }

    fn penalize(&self, retry_after: Duration) -> impl Future<Output = ()> + Send {
        RateLimiter::penalize(self, retry_after);
        ready(())
    }

    fn available(&self) -> impl Future<Output = u32> + Send {
        ready(RateLimiter::available(self))
    }
}
