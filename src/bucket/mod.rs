//! `TokenBucket`: how many calls may start per second; GCRA in `gcra.rs`.

mod error;
pub(crate) mod gcra;
pub(crate) mod quota;
mod reservation;

use core::fmt;
use core::time::Duration;

use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::sleep::Sleeper;
use crate::sync::CachePadded;

pub use error::{CheckError, ReserveError};
pub use quota::{Quota, QuotaError};
pub use reservation::Reservation;

use gcra::Gcra;

/// A lock-free GCRA rate limiter: one cell per period, bursts up to the
/// quota's burst, in integer nanoseconds on a [`Clock`].
///
/// Every decision is one CAS of one `AtomicU64`, and a denial writes
/// nothing. Beyond the usual check, it can [`reserve`](TokenBucket::reserve)
/// cells within a deadline budget, [`cancel`](Reservation::cancel) an
/// abandoned reservation, [`penalize`](TokenBucket::penalize) after a 429,
/// [`set_quota`](TokenBucket::set_quota) at run time, and wait in
/// [`until_ready`](TokenBucket::until_ready) on any runtime. Over any window
/// of length `t`, at most `burst + t / period` cells are admitted.
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, Quota, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let quota = Quota::per_second(NonZeroU32::new(10).unwrap())
///     .allow_burst(NonZeroU32::new(3).unwrap());
/// let bucket = TokenBucket::with_clock(quota, clock.clone());
///
/// // The burst, then one per 100 ms.
/// assert!(bucket.try_acquire(3).is_ok());
/// assert!(bucket.try_acquire(1).is_err());
/// clock.advance(Duration::from_millis(100));
/// assert!(bucket.try_acquire(1).is_ok());
/// ```
pub struct TokenBucket<C: Clock = DefaultClock> {
    /// Alone on its cache line(s), apart from the clock.
    gcra: CachePadded<Gcra>,
    clock: C,
}

impl TokenBucket<DefaultClock> {
    /// A full bucket on the default (monotonic, `quanta`) clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// let bucket = TokenBucket::new(Quota::per_second(NonZeroU32::new(100).unwrap()));
    /// assert!(bucket.try_acquire(1).is_ok());
    /// ```
    pub fn new(quota: Quota) -> Self {
        Self::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock> TokenBucket<C> {
    /// A full bucket on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_minute(NonZeroU32::new(60).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// assert_eq!(bucket.available(), 60);
    /// ```
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        TokenBucket {
            gcra: CachePadded::new(Gcra::new(quota)),
            clock,
        }
    }

    /// Admits `n` cells now, or returns how long until they would fit. A
    /// denial consumes nothing. `n == 0` always succeeds.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotUntil`] with the wait when the cells do not fit
    /// yet; [`CheckError::InsufficientCapacity`] when `n` is above the
    /// burst (it never will).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{CheckError, ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(1).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// assert!(bucket.try_acquire(1).is_ok());
    /// assert_eq!(
    ///     bucket.try_acquire(1),
    ///     Err(CheckError::NotUntil { wait: Duration::from_secs(1) }),
    /// );
    /// assert_eq!(
    ///     bucket.try_acquire(2),
    ///     Err(CheckError::InsufficientCapacity { requested: 2, capacity: 1 }),
    /// );
    /// ```
    #[inline]
    pub fn try_acquire(&self, n: u32) -> Result<(), CheckError> {
        self.gcra.try_acquire(n, self.clock.now_nanos())
    }

    /// Takes `n` cells, in one CAS, if they are usable within `max_wait`;
    /// otherwise takes nothing and says how long they would have taken (so
    /// a call that cannot afford the wait returns rate-limited at once).
    ///
    /// # Errors
    ///
    /// [`ReserveError::RateLimited`] when the wait exceeds `max_wait`;
    /// [`ReserveError::InsufficientCapacity`] when `n` is above the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(2).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// bucket.try_acquire(2).unwrap();
    /// // The next cell is 500 ms away.
    /// assert!(bucket.reserve(1, Duration::from_millis(499)).is_err());
    /// let r = bucket.reserve(1, Duration::from_millis(500)).unwrap();
    /// assert_eq!(r.wait(), Duration::from_millis(500));
    /// ```
    #[inline]
    pub fn reserve(&self, n: u32, max_wait: Duration) -> Result<Reservation<'_>, ReserveError> {
        self.reserve_from(n, Duration::ZERO, max_wait)
    }

    /// [`reserve`](Self::reserve) with the cells taken as of `not_before`
    /// from now (the refill before then is not counted). The wait is at
    /// least `not_before`; nothing is taken if that is past `max_wait`.
    pub(crate) fn reserve_from(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> Result<Reservation<'_>, ReserveError> {
        ReserveError::fits_not_before(not_before, max_wait)?;
        let now = self.clock.now_nanos();
        let budget = saturating_nanos(max_wait);
        let after = saturating_nanos(not_before).min(budget);
        match self
            .gcra
            .reserve(n, budget - after, now.saturating_add(after))
        {
            Ok(r) => Ok(Reservation::borrowed(&self.gcra, r, now)),
            Err(ReserveError::RateLimited { retry_after }) => Err(ReserveError::RateLimited {
                retry_after: retry_after.saturating_add(Duration::from_nanos(after)),
            }),
            Err(e) => Err(e),
        }
    }

    /// Takes one cell now, with a ticket to give it back while nothing is
    /// stacked on it (a ready tower service's cell); else the wait.
    #[cfg(feature = "tower")]
    pub(crate) fn take_refundable(&self) -> Result<Option<gcra::Ticket>, ReserveError> {
        let now = self.clock.now_nanos();
        self.gcra.reserve(1, 0, now).map(|r| r.ticket)
    }

    /// Gives back a [`take_refundable`](Self::take_refundable) cell if
    /// nothing was stacked on it; returns whether it did.
    #[cfg(feature = "tower")]
    pub(crate) fn refund(&self, ticket: gcra::Ticket) -> bool {
        self.gcra.cancel(ticket)
    }

    /// Admits nothing before `now + retry_after` (a 429 or 503 with
    /// `Retry-After`), in one CAS. Then one cell fits, then one per period:
    /// the burst is not handed out at once after a throttle. A shorter
    /// penalty than the current wait changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(10).unwrap()),
    ///     clock.clone(),
    /// );
    /// bucket.penalize(Duration::from_secs(30));
    /// assert_eq!(bucket.try_acquire(1).unwrap_err().wait(), Some(Duration::from_secs(30)));
    /// clock.advance(Duration::from_secs(30));
    /// assert!(bucket.try_acquire(1).is_ok());
    /// assert!(bucket.try_acquire(1).is_err());
    /// ```
    pub fn penalize(&self, retry_after: Duration) {
        self.gcra
            .penalize(saturating_nanos(retry_after), self.clock.now_nanos());
    }

    /// Changes the rate and burst at run time.
    ///
    /// The debt already taken is kept in cells and nothing more is charged:
    /// a full bucket stays full; `k` cells of debt stay `k` cells under the
    /// new quota (rounded up to a nanosecond; none forgiven, even past a
    /// lowered burst); a running [`penalize`](TokenBucket::penalize) keeps
    /// its end exactly. So changing the quota back and forth builds no debt.
    /// For a learned rate, see [`set_learned_quota`](Self::set_learned_quota).
    /// Outstanding reservations can no longer be cancelled. Never panics.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(10).unwrap()),
    ///     clock.clone(),
    /// );
    /// bucket.try_acquire(10).unwrap(); // drained
    /// // Slower: the 10 cells just taken now cost 10 seconds.
    /// bucket.set_quota(Quota::per_second(NonZeroU32::new(1).unwrap())
    ///     .allow_burst(NonZeroU32::new(10).unwrap()));
    /// assert_eq!(bucket.try_acquire(1).unwrap_err().wait(), Some(Duration::from_secs(1)));
    /// assert_eq!(bucket.quota().burst().get(), 10);
    ///
    /// // Back and forth: the same 10 cells of debt, nothing added.
    /// for _ in 0..100 {
    ///     bucket.set_quota(Quota::per_second(NonZeroU32::new(10).unwrap()));
    ///     bucket.set_quota(Quota::per_second(NonZeroU32::new(1).unwrap())
    ///         .allow_burst(NonZeroU32::new(10).unwrap()));
    /// }
    /// clock.advance(Duration::from_secs(10));
    /// assert_eq!(bucket.available(), 10);
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.gcra.set_quota(quota, self.clock.now_nanos());
    }

    /// [`set_quota`](Self::set_quota) for a quota a
    /// [`RateController`](crate::adaptive::RateController) hands out: debt
    /// within the burst is kept in cells (capped at the new burst), debt past
    /// it as time, so queued calls keep their instants and a hold its end.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let q = |n| Quota::per_second(NonZeroU32::new(n).unwrap());
    /// let (learned, set) = (
    ///     TokenBucket::with_clock(q(10), clock.clone()),
    ///     TokenBucket::with_clock(q(10), clock.clone()),
    /// );
    /// for b in [&learned, &set] {
    ///     for _ in 0..15 {
    ///         drop(b.reserve(1, Duration::from_secs(1)).unwrap()); // 10 now, 5 queued
    ///     }
    /// }
    /// learned.set_learned_quota(q(5)); // the queue's last call at 0.5 s; then 5/s
    /// set.set_quota(q(5)); // 15 cells at 5/s: 3 s of debt, less a burst
    /// assert_eq!(learned.try_acquire(1).unwrap_err().wait(), Some(Duration::from_millis(600)));
    /// assert_eq!(set.try_acquire(1).unwrap_err().wait(), Some(Duration::from_millis(2_200)));
    /// ```
    pub fn set_learned_quota(&self, quota: Quota) {
        self.gcra.set_learned_quota(quota, self.clock.now_nanos());
    }

    /// The quota in force.
    pub fn quota(&self) -> Quota {
        self.gcra.quota()
    }

    /// How many cells [`try_acquire`](TokenBucket::try_acquire) would admit
    /// now, without consuming any.
    pub fn available(&self) -> u32 {
        self.gcra.available(self.clock.now_nanos())
    }

    /// Makes the bucket full again and forgets any penalty; outstanding
    /// reservations can no longer be cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(5).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// bucket.penalize(Duration::from_secs(60));
    /// bucket.reset();
    /// assert_eq!(bucket.available(), 5);
    /// ```
    pub fn reset(&self) {
        self.gcra.reset(self.clock.now_nanos());
    }

    /// The bucket's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Waits until `n` cells are admitted, if that takes at most `max_wait`.
    ///
    /// It reserves first, in one CAS, then sleeps exactly the reserved wait
    /// on `sleeper`, so a woken caller already holds its cells. When the
    /// cells would come after `max_wait`, it returns
    /// [`ReserveError::RateLimited`] at once. A
    /// [`penalize`](TokenBucket::penalize) landing while it sleeps that
    /// holds past its instant sends it back to queue behind the hold.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps cancels the reservation (see
    /// [`Reservation::cancel`]).
    ///
    /// # Errors
    ///
    /// As [`reserve`](TokenBucket::reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, DefaultSleeper, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// let bucket = TokenBucket::new(Quota::per_second(NonZeroU32::new(1000).unwrap()));
    /// futures::executor::block_on(async {
    ///     for _ in 0..1010 {
    ///         // The last ten wait about a millisecond each.
    ///         bucket.until_ready(1, Duration::from_secs(1), &DefaultSleeper::new()).await.unwrap();
    ///     }
    ///     // A call that cannot wait is told so at once.
    ///     bucket.try_acquire(1000).unwrap_err();
    ///     assert!(bucket.until_ready(1000, Duration::ZERO, &DefaultSleeper::new()).await.is_err());
    /// });
    /// ```
    pub async fn until_ready<S: Sleeper>(
        &self,
        n: u32,
        max_wait: Duration,
        sleeper: &S,
    ) -> Result<(), ReserveError> {
        wait_unless_held(
            &self.clock,
            max_wait,
            || self.gcra.held_until(),
            |left| self.reserve(n, left),
            sleeper,
        )
        .await
    }

    /// The debt now and the quota, read together; see `headers::write`.
    #[cfg(feature = "admission")]
    pub(crate) fn debt(&self) -> (u64, Quota) {
        self.gcra.debt(self.clock.now_nanos())
    }

    /// Takes `n` cells now whatever the wait and the burst (see
    /// [`RateLimiter::charge`](crate::RateLimiter::charge)).
    pub(crate) fn charge_now(&self, n: u32) {
        self.gcra.charge(u64::from(n), self.clock.now_nanos());
    }

    /// Gives `n` cells back without their stamps (see
    /// [`RateLimiter::refund`](crate::RateLimiter::refund)); returns how
    /// many went back.
    pub(crate) fn give_back(&self, n: u32) -> u32 {
        // At most `n`: the cast is lossless.
        self.gcra.give(u64::from(n), self.clock.now_nanos()) as u32
    }

    /// The raw algorithm, for `Scoped` and the fuzz model.
    #[cfg(any(fuzzing, test))]
    pub(crate) fn raw(&self) -> &Gcra {
        &self.gcra
    }
}

/// `until_ready`'s loop: reserve within what is left of `max_wait`, sleep,
/// and reserve again behind a hold placed meanwhile.
pub(crate) async fn wait_unless_held<'a, C: Clock, S: Sleeper>(
    clock: &C,
    max_wait: Duration,
    held: impl Fn() -> u64,
    mut reserve: impl FnMut(Duration) -> Result<Reservation<'a>, ReserveError>,
    sleeper: &S,
) -> Result<(), ReserveError> {
    let end = clock.now_nanos().saturating_add(saturating_nanos(max_wait));
    loop {
        let left = Duration::from_nanos(end.saturating_sub(clock.now_nanos()));
        let held_before = held();
        if sleep_unless_held(held_before, reserve(left)?, sleeper).await {
            return Ok(());
        }
    }
}

/// Sleeps out `reservation`'s wait, cancelling it if dropped. Returns
/// `false` when a hold placed since `held_before` covers its instant (the
/// cells are then given back and the caller queues again).
async fn sleep_unless_held<S: Sleeper>(
    held_before: u64,
    reservation: Reservation<'_>,
    sleeper: &S,
) -> bool {
    let wait = reservation.wait();
    if wait.is_zero() {
        return true;
    }
    let ready_at = reservation.ready_at();
    let held_before = Some(held_before);
    let guard = CancelOnDrop(Some(reservation));
    sleeper.sleep(wait).await;
    let held = guard.0.as_ref().and_then(Reservation::held_until);
    if held.is_none_or(|h| h <= ready_at) || held == held_before {
        guard.disarm();
        return true;
    }
    drop(guard);
    false
}

/// Cancels a reservation whose wait was abandoned.
struct CancelOnDrop<'a>(Option<Reservation<'a>>);

impl CancelOnDrop<'_> {
    fn disarm(mut self) {
        drop(self.0.take());
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.cancel();
        }
    }
}

impl<C: Clock> fmt::Debug for TokenBucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("state", &self.gcra)
            .field("clock", &self.clock)
            .finish()
    }
}
