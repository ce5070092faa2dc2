//! [`AdaptiveLimiter`], its acquire future and its permit; the protocol
//! lives in `state.rs`.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use crate::clock::{Clock, DefaultClock};
use crate::semaphore::AcquireOwned;
use crate::{AcquireError, TryAcquireError};

use super::algorithm::{LimitAlgorithm, Outcome};
use super::state::Shared;

/// A concurrency limit that a [`LimitAlgorithm`] moves, applied to a FIFO
/// [`Semaphore`](crate::Semaphore).
///
/// Each permit records a sample when dropped:
/// [`success`](AdaptivePermit::success) or
/// [`dropped`](AdaptivePermit::dropped); a plain drop says nothing
/// ([`Outcome::Ignored`]). A new limit is applied at once: growth adds
/// permits (oldest waiters first); a shrink forgets free permits, then
/// withholds returning ones until the excess is paid. The wait list keeps
/// its order. See the [module docs](super).
///
/// Cloning is cheap (an `Arc`); clones share the limit. Permits are
/// `'static` and may move to other tasks or threads.
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
///
/// # futures::executor::block_on(async {
/// let limiter = AdaptiveLimiter::new(Aimd::new().with_limits(1, 4, 64).with_backoff(0.5));
/// let permit = limiter.acquire().await.unwrap();
/// // ... send the request; it came back 429 ...
/// permit.dropped();
/// assert_eq!(limiter.limit(), 2);
/// # });
/// ```
#[derive(Clone)]
pub struct AdaptiveLimiter {
    pub(super) shared: Arc<Shared>,
}

impl AdaptiveLimiter {
    /// The largest limit the limiter applies: 2³¹ − 1, or
    /// [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS) where that
    /// is smaller. Every proposal is clamped into `[1, MAX_LIMIT]`.
    pub const MAX_LIMIT: usize = super::algorithm::MAX_LIMIT;

    /// A limiter driven by `algorithm`, timed by a `DefaultClock`. It
    /// starts with `algorithm.limit()` permits (clamped into
    /// `[1, MAX_LIMIT]`, as every later limit is).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveLimiter, Gradient2};
    /// let limiter = AdaptiveLimiter::new(Gradient2::new());
    /// assert_eq!(limiter.limit(), 20);
    /// assert_eq!(limiter.available(), 20);
    /// ```
    pub fn new(algorithm: impl LimitAlgorithm + 'static) -> Self {
        Self::with_clock(algorithm, DefaultClock::new())
    }

    /// As [`new`](Self::new), timing round trips with `clock` (a
    /// [`ManualClock`](crate::ManualClock) in tests and simulations).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
    /// use backpressure::ManualClock;
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let limiter = AdaptiveLimiter::with_clock(Aimd::new(), clock.clone());
    /// let permit = limiter.try_acquire().unwrap();
    /// clock.advance(Duration::from_millis(20)); // a 20 ms round trip
    /// permit.success();
    /// ```
    pub fn with_clock(
        algorithm: impl LimitAlgorithm + 'static,
        clock: impl Clock + 'static,
    ) -> Self {
        Self {
            shared: Arc::new(Shared::new(Box::new(algorithm), Box::new(clock))),
        }
    }

    /// Waits for a permit, in FIFO order.
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the limiter is [closed](Self::close).
    ///
    /// # Cancel safety
    ///
    /// As [`Semaphore::acquire`](crate::Semaphore::acquire): dropping the
    /// future gives back whatever was assigned to it; its place in the
    /// queue is lost.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
    /// # futures::executor::block_on(async {
    /// let limiter = AdaptiveLimiter::new(Aimd::new());
    /// let permit = limiter.acquire().await.unwrap();
    /// assert_eq!(limiter.in_flight(), 1);
    /// permit.success();
    /// assert_eq!(limiter.in_flight(), 0);
    /// # });
    /// ```
    #[inline]
    pub fn acquire(&self) -> AdaptiveAcquire {
        AdaptiveAcquire {
            shared: Some(self.shared.clone()),
            inner: self.shared.sem.clone().acquire_owned(),
        }
    }

    /// Takes a permit if one is free and nobody waits for it.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] or [`TryAcquireError::NoPermits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
    /// let limiter = AdaptiveLimiter::new(Aimd::new().with_limits(1, 1, 10));
    /// let permit = limiter.try_acquire().unwrap();
    /// assert!(limiter.try_acquire().unwrap_err().is_no_permits());
    /// drop(permit); // "ignored": the limit does not move
    /// assert_eq!(limiter.limit(), 1);
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<AdaptivePermit, TryAcquireError> {
        let permit = self.shared.sem.try_acquire()?;
        // Counted first, forgotten after: a clock that panics in between
        // drops `permit`, which gives the permit back.
        let adaptive = AdaptivePermit::new(self.shared.clone());
        permit.forget();
        Ok(adaptive)
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.shared.limit()
    }

    /// How many permits are held.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    /// How many permits are free right now. After a shrink this can be
    /// below `limit - in_flight` until returning permits have paid the
    /// excess; with nothing held and nobody waiting it equals
    /// [`limit`](Self::limit).
    pub fn available(&self) -> usize {
        self.shared.sem.available_permits()
    }

    /// Closes the limiter: waiting and future acquires fail. Permits
    /// already held stay valid, and their samples are still recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
    /// let limiter = AdaptiveLimiter::new(Aimd::new());
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// assert!(limiter.try_acquire().unwrap_err().is_closed());
    /// ```
    pub fn close(&self) {
        self.shared.sem.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.sem.is_closed()
    }

    /// Permits out that returns still owe to a shrink.
    #[cfg(test)]
    pub(crate) fn excess(&self) -> usize {
        self.shared.excess()
    }
}

impl fmt::Debug for AdaptiveLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

/// Future returned by [`AdaptiveLimiter::acquire`].
///
/// # Cancel safety
///
/// Dropping it before completion gives back every permit already assigned
/// to it; the place in the queue is lost.
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct AdaptiveAcquire {
    /// `None` once the future has completed.
    shared: Option<Arc<Shared>>,
    /// Structurally pinned.
    inner: AcquireOwned,
}

impl Future for AdaptiveAcquire {
    type Output = Result<AdaptivePermit, AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `inner` is structurally pinned: it is never moved out of
        // a pinned `AdaptiveAcquire` (there is no `Drop` impl here that
        // could move it, and no method hands it out); `shared` is not
        // pinned and may be moved out.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: as above.
        let inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        let permit = core::task::ready!(inner.poll(cx))?;
        let shared = this
            .shared
            .take()
            .expect("`AdaptiveAcquire` polled after completion");
        // As in `try_acquire`: forgotten only once counted.
        let adaptive = AdaptivePermit::new(shared);
        permit.forget();
        Poll::Ready(Ok(adaptive))
    }
}

impl fmt::Debug for AdaptiveAcquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveAcquire")
            .field("inner", &self.inner)
            .finish()
    }
}

/// One permit of an [`AdaptiveLimiter`]; dropping it gives the permit
/// back and records how the request went, with the round trip measured
/// from the grant:
///
/// * [`success`](Self::success): the downstream answered; an RTT sample.
/// * [`dropped`](Self::dropped): a 429, a 503, a timeout; congestion.
/// * a plain drop (an error on this side, a cancelled task): ignored.
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
///
/// let limiter = AdaptiveLimiter::new(Aimd::new());
/// let permit = limiter.try_acquire().unwrap();
/// std::thread::spawn(move || {
///     // ... the request ...
///     permit.success();
/// })
/// .join()
/// .unwrap();
/// assert_eq!(limiter.in_flight(), 0);
/// ```
#[must_use = "a permit is given back, recording nothing, as soon as it is dropped"]
#[clippy::has_significant_drop]
pub struct AdaptivePermit {
    shared: Arc<Shared>,
    start: u64,
    in_flight: usize,
    outcome: Outcome,
}

impl AdaptivePermit {
    #[inline]
    fn new(shared: Arc<Shared>) -> Self {
        let (start, in_flight) = shared.on_acquired();
        Self {
            shared,
            start,
            in_flight,
            outcome: Outcome::Ignored,
        }
    }

    /// Gives the permit back, recording a success and its round-trip time.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
    /// let limiter = AdaptiveLimiter::new(Aimd::new().with_limits(1, 1, 10));
    /// limiter.try_acquire().unwrap().success();
    /// assert_eq!(limiter.limit(), 2); // a full window of successes: +1
    /// ```
    #[inline]
    pub fn success(mut self) {
        self.outcome = Outcome::Success;
    }

    /// Gives the permit back, recording a drop (429, 503, timeout).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveLimiter, Aimd};
    /// let limiter = AdaptiveLimiter::new(Aimd::new().with_limits(1, 10, 10));
    /// limiter.try_acquire().unwrap().dropped();
    /// assert_eq!(limiter.limit(), 7); // backoff 0.75
    /// ```
    #[inline]
    pub fn dropped(mut self) {
        self.outcome = Outcome::Dropped;
    }

    /// When the permit was granted, in nanoseconds of the limiter's clock.
    pub fn start_nanos(&self) -> u64 {
        self.start
    }
}

impl Drop for AdaptivePermit {
    #[inline]
    fn drop(&mut self) {
        self.shared.finish(self.start, self.in_flight, self.outcome);
    }
}

impl fmt::Debug for AdaptivePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptivePermit")
            .field("start_nanos", &self.start)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}
