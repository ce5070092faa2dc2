//! `RateLimiter`: the one seam over every rate limiter the crate has, local
//! or shared. It returns `impl Future`, so it is not object safe: take it as
//! a generic parameter.

use core::future::{ready, Future};
use core::time::Duration;

use crate::bucket::{CheckError, Quota, ReserveError, TokenBucket};
use crate::clock::Clock;

/// A rate limiter, local or shared across processes: admit now, reserve
/// within a wait, hold back after a 429, peek. Implemented by
/// [`TokenBucket`] (its futures are ready at once), by `RedisBucket` with
/// the `redis` feature, and by an `Arc` of either.
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, Quota, RateLimiter, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// // Generic over a local or a shared limiter.
/// async fn start_call<L: RateLimiter>(limiter: &L) -> Option<Duration> {
///     limiter.reserve(1, Duration::from_millis(500)).await.ok()
/// }
///
/// let bucket = TokenBucket::with_clock(
///     Quota::per_second(NonZeroU32::new(2).unwrap()).allow_burst(NonZeroU32::MIN),
///     ManualClock::new(),
/// );
/// futures::executor::block_on(async {
///     assert_eq!(start_call(&bucket).await, Some(Duration::ZERO));
///     assert_eq!(start_call(&bucket).await, Some(Duration::from_millis(500)));
///     assert_eq!(start_call(&bucket).await, None); // past the 500 ms it can wait
/// });
/// ```
pub trait RateLimiter: Send + Sync {
    /// Admits `n` cells now, or says how long until they would fit. A denial
    /// consumes nothing.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotUntil`], [`CheckError::InsufficientCapacity`] when
    /// `n` is above the burst, or [`CheckError::Unavailable`] for a shared
    /// limiter that fails closed.
    fn try_acquire(&self, n: u32) -> impl Future<Output = Result<(), CheckError>> + Send;

    /// Takes `n` cells usable within `max_wait`, or nothing, and returns how
    /// long to wait before using them. The cells stay taken (to give them
    /// back on abandon, use the limiter's own `reserve`).
    ///
    /// # Errors
    ///
    /// [`ReserveError::RateLimited`] when the wait is longer than
    /// `max_wait`, [`ReserveError::InsufficientCapacity`], or
    /// [`ReserveError::Unavailable`] for a shared limiter that fails closed.
    fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Duration, ReserveError>> + Send;

    /// [`reserve`](RateLimiter::reserve) for a call that goes no earlier than
    /// `not_before` from now: the cells are taken as of that instant, so a
    /// refill in between is not counted as spent twice. The wait is at least
    /// `not_before`. The default reserves now and waits the longer of the two.
    ///
    /// # Errors
    ///
    /// As [`reserve`](RateLimiter::reserve); `RateLimited` with `retry_after`
    /// = `not_before`, nothing taken, when `not_before` is past `max_wait`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, RateLimiter, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// // 10 a second, burst 10: full now, and still full in a second.
    /// let bucket = TokenBucket::with_clock(Quota::per_second(NonZeroU32::new(10).unwrap()), ManualClock::new());
    /// futures::executor::block_on(async {
    ///     let second = Duration::from_secs(1);
    ///     // Ten cells for a call that goes in a second: taken then.
    ///     assert_eq!(bucket.reserve_after(10, second, second).await.unwrap(), second);
    ///     // The refill until then is not counted: one more cell waits 100 ms past it.
    ///     let next = bucket.reserve_after(1, Duration::ZERO, Duration::from_secs(2)).await.unwrap();
    ///     assert_eq!(next, Duration::from_millis(1_100));
    /// });
    /// ```
    fn reserve_after(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Duration, ReserveError>> + Send {
        let reserve =
            ReserveError::fits_not_before(not_before, max_wait).map(|()| self.reserve(n, max_wait));
        async move { reserve?.await.map(|wait| wait.max(not_before)) }
    }

    /// The server said "not before `retry_after`": admit nothing until then
    /// (for a shared limiter, in every process on the key).
    fn penalize(&self, retry_after: Duration) -> impl Future<Output = ()> + Send;

    /// How many cells [`try_acquire`](RateLimiter::try_acquire) would admit
    /// now, without consuming any.
    fn available(&self) -> impl Future<Output = u32> + Send;

    /// Takes `n` more cells now, whatever the wait and the burst: debt for a
    /// call that used more than it reserved. The default reserves them with
    /// no bound on the wait; the crate's limiters charge exactly.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, RateLimiter, TokenBucket};
    /// use std::num::NonZeroU32;
    ///
    /// let tokens = TokenBucket::with_clock(Quota::per_second(NonZeroU32::new(100).unwrap()), ManualClock::new());
    /// futures::executor::block_on(async {
    ///     tokens.try_acquire(50).unwrap(); // the estimate
    ///     RateLimiter::charge(&tokens, 80).await; // the reply used 130
    ///     assert_eq!(RateLimiter::available(&tokens).await, 0);
    /// });
    /// ```
    fn charge(&self, n: u32) -> impl Future<Output = ()> + Send {
        let reserve = self.reserve(n, Duration::MAX);
        async move {
            let _ = reserve.await;
        }
    }

    /// Gives back `n` cells taken earlier and not used, never past full nor
    /// into a [`penalize`](RateLimiter::penalize) hold. The default gives
    /// nothing back (erring towards admitting less); the crate's limiters
    /// give back exactly.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, RateLimiter, TokenBucket};
    /// use std::num::NonZeroU32;
    ///
    /// let tokens = TokenBucket::with_clock(Quota::per_second(NonZeroU32::new(100).unwrap()), ManualClock::new());
    /// futures::executor::block_on(async {
    ///     tokens.try_acquire(90).unwrap(); // the estimate
    ///     tokens.try_acquire(10).unwrap(); // another call's
    ///     RateLimiter::refund(&tokens, 60).await; // the first used 30
    ///     assert_eq!(RateLimiter::available(&tokens).await, 60);
    /// });
    /// ```
    fn refund(&self, n: u32) -> impl Future<Output = ()> + Send {
        let _ = n;
        ready(())
    }

    /// The quota in force, if the limiter knows it (a shared one's as of its
    /// latest round trip). The default knows none.
    fn quota(&self) -> Option<Quota> {
        None
    }

    /// Replaces the quota for every user of the limiter (a shared one stores
    /// it, so every process admits against it from its next round trip). The
    /// debt is kept in cells, as [`TokenBucket::set_quota`] keeps it, and a
    /// hold keeps its end. The default ignores it; a shared limiter that
    /// cannot reach its store keeps the old quota.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, RateLimiter, TokenBucket};
    /// use std::num::NonZeroU32;
    ///
    /// let tokens = TokenBucket::with_clock(Quota::per_second(NonZeroU32::new(100).unwrap()), ManualClock::new());
    /// let told = Quota::per_second(NonZeroU32::new(40).unwrap()); // the server's limit
    /// futures::executor::block_on(RateLimiter::set_quota(&tokens, told));
    /// assert_eq!(RateLimiter::quota(&tokens), Some(told));
    /// assert_eq!(tokens.available(), 40);
    /// ```
    fn set_quota(&self, quota: Quota) -> impl Future<Output = ()> + Send {
        let _ = quota;
        ready(())
    }
}

impl<C: Clock> RateLimiter for TokenBucket<C> {
    #[inline]
    fn try_acquire(&self, n: u32) -> impl Future<Output = Result<(), CheckError>> + Send {
        ready(TokenBucket::try_acquire(self, n))
    }

    #[inline]
    fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Duration, ReserveError>> + Send {
        // Dropping a local reservation keeps its cells.
        ready(TokenBucket::reserve(self, n, max_wait).map(|r| r.wait()))
    }

    #[inline]
    fn reserve_after(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Duration, ReserveError>> + Send {
        ready(self.reserve_from(n, not_before, max_wait).map(|r| r.wait()))
    }

    fn penalize(&self, retry_after: Duration) -> impl Future<Output = ()> + Send {
        TokenBucket::penalize(self, retry_after);
        ready(())
    }

    fn available(&self) -> impl Future<Output = u32> + Send {
        ready(TokenBucket::available(self))
    }

    fn charge(&self, n: u32) -> impl Future<Output = ()> + Send {
        self.charge_now(n);
        ready(())
    }

    fn refund(&self, n: u32) -> impl Future<Output = ()> + Send {
        self.give_back(n);
        ready(())
    }

    fn quota(&self) -> Option<Quota> {
        Some(TokenBucket::quota(self))
    }

    fn set_quota(&self, quota: Quota) -> impl Future<Output = ()> + Send {
        TokenBucket::set_quota(self, quota);
        ready(())
    }
}

/// A shared limiter is still a limiter (e.g. for `Admission::shared_quota`).
impl<L: RateLimiter + ?Sized> RateLimiter for std::sync::Arc<L> {
    #[inline]
    fn try_acquire(&self, n: u32) -> impl Future<Output = Result<(), CheckError>> + Send {
        (**self).try_acquire(n)
    }

    #[inline]
    fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Duration, ReserveError>> + Send {
        (**self).reserve(n, max_wait)
    }

    #[inline]
    fn reserve_after(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Duration, ReserveError>> + Send {
        (**self).reserve_after(n, not_before, max_wait)
    }

    #[inline]
    fn penalize(&self, retry_after: Duration) -> impl Future<Output = ()> + Send {
        (**self).penalize(retry_after)
    }

    #[inline]
    fn available(&self) -> impl Future<Output = u32> + Send {
        (**self).available()
    }

    #[inline]
    fn charge(&self, n: u32) -> impl Future<Output = ()> + Send {
        (**self).charge(n)
    }

    #[inline]
    fn refund(&self, n: u32) -> impl Future<Output = ()> + Send {
        (**self).refund(n)
    }

    #[inline]
    fn quota(&self) -> Option<Quota> {
        (**self).quota()
    }

    #[inline]
    fn set_quota(&self, quota: Quota) -> impl Future<Output = ()> + Send {
        (**self).set_quota(quota)
    }
}
