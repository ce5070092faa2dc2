//! `TokenBucket`: how many calls may *start* per second. GCRA over one
//! atomic word; the algorithm and its invariants are in `gcra.rs`.

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
/// Every decision is one compare-and-swap of one `AtomicU64` (retried only
/// when another thread's CAS got there first), and a denial writes nothing.
/// Beyond the usual check, it can:
///
/// * [`reserve`](TokenBucket::reserve) cells that fit within a caller's
///   deadline budget, or say at once that they do not;
/// * [`cancel`](Reservation::cancel) an abandoned reservation;
/// * [`penalize`](TokenBucket::penalize): hold back after a server's 429;
/// * [`set_quota`](TokenBucket::set_quota) at run time, keeping the debt
///   (in cells) and any penalty, and inventing none;
/// * wait in [`until_ready`](TokenBucket::until_ready) on any runtime,
///   sleeping exactly the reserved time.
///
/// Over any window of length `t`, at most `burst + t / period` cells are
/// admitted.
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
    /// Alone on its cache line(s): the clock must not false-share with
    /// `stamp`, which every admission writes.
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

    /// Admits `n` cells now, or returns how long until they would fit.
    /// A denial consumes nothing and writes nothing. `n == 0` always
    /// succeeds.
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

    /// Takes `n` cells, in one compare-and-swap, if they are usable within
    /// `max_wait`; otherwise takes nothing and says how long they would
    /// have taken. This is the rule "the wait comes out of the call's
    /// deadline budget; if it is longer than the call can afford, do not
    /// sleep: return rate-limited at once".
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

    /// [`reserve`](Self::reserve), the cells taken as of `not_before` from
    /// now: the call goes no earlier, so the refill a full bucket would
    /// lose before then is not counted. The wait is from now and at least
    /// `not_before`; nothing is taken if that is past `max_wait`.
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

    /// Takes one cell now if one is free, with the ticket that gives it
    /// back while nothing is stacked on it (for a cell held before use,
    /// like a ready tower service's); the wait for the next one if not.
    #[cfg(feature = "tower")]
    pub(crate) fn take_refundable(&self) -> Result<Option<gcra::Ticket>, ReserveError> {
        let now = self.clock.now_nanos();
        self.gcra.reserve(1, 0, now).map(|r| r.ticket)
    }

    /// Gives back a cell [`take_refundable`](Self::take_refundable) took,
    /// if nothing was stacked on it since. Returns whether it did.
    #[cfg(feature = "tower")]
    pub(crate) fn refund(&self, ticket: gcra::Ticket) -> bool {
        self.gcra.cancel(ticket)
    }

    /// Admits nothing before `now + retry_after`, in one compare-and-swap:
    /// the server said so (a 429 or 503 with `Retry-After`).
    /// At that instant one cell fits, then one per period: the burst is
    /// not handed out at once after a throttle. A shorter penalty than the
    /// current wait changes nothing, and a zero one (`Retry-After: 0`,
    /// "retry now") leaves the bucket's headroom as it is.
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
    /// The debt already taken is kept, and nothing more is charged:
    ///
    /// * a full bucket stays full;
    /// * `k` cells of debt (taken, or reserved by calls still queued) stay
    ///   `k` cells under the new quota (so lowering the rate makes them
    ///   last longer, raising it shorter), rounded up to a whole
    ///   nanosecond. A burst lowered below `k` leaves the bucket
    ///   over-drawn until they refill: none is forgiven;
    /// * a running [`penalize`](TokenBucket::penalize) keeps its end
    ///   exactly, so a server's `Retry-After` survives the change (cells
    ///   reserved behind it stay cells).
    ///
    /// So changing the quota back and forth builds no debt and frees none.
    /// For a quota a learned rate hands out, see
    /// [`set_learned_quota`](Self::set_learned_quota). Outstanding
    /// reservations stay taken but can no longer be cancelled. Never
    /// panics, whatever the quotas.
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
    /// within the burst is kept in cells (capped at the new burst), debt
    /// past it as time: queued calls keep their instants and a hold keeps
    /// its end. (`set_quota` charges queued cells in full at the new rate,
    /// which would stall a queue at each cut of a learned rate.)
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
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_second(NonZeroU32::new(7).unwrap());
    /// assert_eq!(TokenBucket::new(q).quota(), q);
    /// ```
    pub fn quota(&self) -> Quota {
        self.gcra.quota()
    }

    /// How many cells [`try_acquire`](TokenBucket::try_acquire) would admit
    /// now, without consuming any. The answer may be stale by the time it
    /// is used when other threads share the bucket.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(5).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// bucket.try_acquire(2).unwrap();
    /// assert_eq!(bucket.available(), 3);
    /// ```
    pub fn available(&self) -> u32 {
        self.gcra.available(self.clock.now_nanos())
    }

    /// Makes the bucket full again and forgets any penalty; outstanding
    /// reservations stay taken but can no longer be cancelled.
    ///
    /// An administrative operation: a reservation made concurrently with
    /// a reset may afterwards refuse to cancel (conservative; see
    /// `gcra.rs`).
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
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Clock, ManualClock, Quota, TokenBucket};
    /// use std::time::Duration;
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::with_period(Duration::from_secs(1)),
    ///     ManualClock::starting_at(5),
    /// );
    /// assert_eq!(bucket.clock().now_nanos(), 5);
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Waits until `n` cells are admitted, if that takes at most
    /// `max_wait` (the time left before the caller's deadline).
    ///
    /// It reserves first, in one CAS, then sleeps exactly the reserved
    /// wait on `sleeper`: a woken caller already holds its cells and does
    /// not contend again. It never sleeps past `max_wait`: when the cells
    /// would come later, it returns [`ReserveError::RateLimited`] at once
    /// and consumes nothing.
    ///
    /// A [`penalize`](TokenBucket::penalize) that lands while it sleeps and
    /// holds the bucket past its reserved instant sends it back to queue
    /// behind the hold (within what is left of `max_wait`, else
    /// `RateLimited`), rather than go at the old instant into the 429 the
    /// hold was placed for.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps cancels the reservation (see
    /// [`Reservation::cancel`]), so an abandoned wait gives its cells back
    /// when no later reservation was stacked on it.
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

    /// The debt now (nanoseconds until full) and the quota, read together;
    /// see `headers::write`.
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

/// `until_ready`'s loop, for a bucket and a `Scoped` key: reserve within
/// what is left of `max_wait`, sleep, and reserve again behind a hold
/// placed meanwhile. `held` is read before each reservation.
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

/// Sleeps out `reservation`'s wait; cancels it if dropped before the end.
/// Returns `true` when its cells are the caller's to use, `false` when a
/// hold placed since `held_before` covers its instant: the cells are then
/// given back and the caller queues again behind the hold.
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
        // The cells are used: keep them.
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
