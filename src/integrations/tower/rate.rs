//! [`RateLimitLayer`]: a shared GCRA [`TokenBucket`] in front of a
//! service; over the limit, wait up to a budget or reject.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use ::tower::{Layer, Service};

use super::line::{Line, Place};
use super::{rate_limited_check, rate_limited_reserve, BoxError, LimitFuture};
use crate::bucket::{ReserveError, TokenBucket};
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::sleep::{DefaultSleeper, Sleeper};

/// Admits each request through one shared [`TokenBucket`] (GCRA: a rate
/// and a burst, no fixed window).
///
/// By default the cell is taken in `call`, and over the limit the request
/// is refused at once with a
/// [`Throttled`](crate::Throttled) of status [`Status::RateLimited`](crate::throttled::Status::RateLimited)
/// and the exact wait in `retry_after`. With
/// [`wait_up_to`](Self::wait_up_to), `poll_ready` instead waits for a
/// cell that comes within the budget; longer waits are still refused at
/// once. It holds no cell while it sleeps, so a service dropped while
/// waiting gives nothing away; waiters are not served in FIFO order.
///
/// Unlike tower's `RateLimit`, the services are `Clone` and every clone
/// draws from the same bucket.
///
/// # Examples
///
/// ```
/// use backpressure::tower::RateLimitLayer;
/// use backpressure::Status;
/// use backpressure::{ManualClock, Quota, Throttled, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let clock = ManualClock::new();
/// let bucket = Arc::new(TokenBucket::with_clock(
///     Quota::per_second(NonZeroU32::new(2).unwrap()),
///     clock.clone(),
/// ));
/// let svc = RateLimitLayer::new(bucket).layer(service_fn(|()| async { Ok::<_, std::io::Error>(()) }));
/// svc.clone().oneshot(()).await.unwrap();
/// svc.clone().oneshot(()).await.unwrap();
/// let err = svc.clone().oneshot(()).await.unwrap_err();
/// let t = err.downcast_ref::<Throttled>().unwrap();
/// assert_eq!(t.status, Status::RateLimited);
/// assert_eq!(t.retry_after(), Some(Duration::from_millis(500)));
/// clock.advance(Duration::from_millis(500));
/// svc.oneshot(()).await.unwrap();
/// # });
/// ```
pub struct RateLimitLayer<C: Clock = DefaultClock, Sl = DefaultSleeper> {
    bucket: Arc<TokenBucket<C>>,
    budget: Duration,
    sleeper: Sl,
    /// The waiters of this layer's services (see `line.rs`).
    line: Arc<Line<()>>,
}

impl<C: Clock> RateLimitLayer<C, DefaultSleeper> {
    /// Rejects every request that finds no cell in `bucket`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{tower::RateLimitLayer, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::sync::Arc;
    /// let bucket = Arc::new(TokenBucket::new(Quota::per_second(NonZeroU32::new(5).unwrap())));
    /// let layer = RateLimitLayer::new(bucket.clone());
    /// assert!(Arc::ptr_eq(layer.bucket(), &bucket));
    /// ```
    pub fn new(bucket: Arc<TokenBucket<C>>) -> Self {
        RateLimitLayer {
            bucket,
            budget: Duration::ZERO,
            sleeper: DefaultSleeper::new(),
            line: Arc::default(),
        }
    }
}

impl<C: Clock, Sl> RateLimitLayer<C, Sl> {
    /// Waits in `poll_ready` for a cell that comes within `budget`, sleeping
    /// on `sleeper`; a longer wait is refused at once. It holds no cell while
    /// it sleeps.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::tower::RateLimitLayer;
    /// use backpressure::{DefaultSleeper, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let bucket = Arc::new(TokenBucket::new(Quota::per_second(NonZeroU32::new(1000).unwrap())));
    /// let layer = RateLimitLayer::new(bucket)
    ///     .wait_up_to(Duration::from_millis(100), DefaultSleeper::new());
    /// let svc = layer.layer(service_fn(|()| async { Ok::<_, std::io::Error>(()) }));
    /// for _ in 0..1_005 {
    ///     svc.clone().oneshot(()).await.unwrap(); // the last ones wait ~1 ms each
    /// }
    /// # });
    /// ```
    pub fn wait_up_to<S2: Sleeper>(self, budget: Duration, sleeper: S2) -> RateLimitLayer<C, S2> {
        RateLimitLayer {
            bucket: self.bucket,
            budget,
            sleeper,
            line: self.line,
        }
    }

    /// The shared bucket.
    pub fn bucket(&self) -> &Arc<TokenBucket<C>> {
        &self.bucket
    }
}

impl<C: Clock, Sl: Clone> Clone for RateLimitLayer<C, Sl> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            bucket: self.bucket.clone(),
            budget: self.budget,
            sleeper: self.sleeper.clone(),
            line: self.line.clone(),
        }
    }
}

impl<C: Clock, Sl: fmt::Debug> fmt::Debug for RateLimitLayer<C, Sl> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("bucket", &self.bucket)
            .field("budget", &self.budget)
            .field("sleeper", &self.sleeper)
            .finish()
    }
}

impl<S, C: Clock, Sl: Sleeper + Clone> Layer<S> for RateLimitLayer<C, Sl> {
    type Service = RateLimit<S, C, Sl>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            budget: self.budget,
            sleeper: self.sleeper.clone(),
            line: self.line.clone(),
            state: State::Empty,
        }
    }
}

/// The service of [`RateLimitLayer`]; a clone shares the bucket and holds
/// no cell.
///
/// # Examples
///
/// ```
/// use backpressure::tower::RateLimitLayer;
/// use backpressure::{Quota, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let bucket = Arc::new(TokenBucket::new(Quota::per_second(NonZeroU32::new(10).unwrap())));
/// let svc = RateLimitLayer::new(bucket.clone()).layer(service_fn(|x: u8| async move { Ok::<_, std::io::Error>(x) }));
/// assert_eq!(svc.clone().oneshot(3).await.unwrap(), 3);
/// assert_eq!(bucket.available(), 9);
/// # });
/// ```
pub struct RateLimit<S, C: Clock = DefaultClock, Sl: Sleeper = DefaultSleeper> {
    inner: S,
    bucket: Arc<TokenBucket<C>>,
    budget: Duration,
    sleeper: Sl,
    line: Arc<Line<()>>,
    state: State<Sl::Sleep>,
}

enum State<F> {
    /// No cell taken.
    Empty,
    /// No cell taken; in the line, sleeping until one may be free, as long
    /// as the wait ends by `deadline` (the bucket's clock).
    Sleeping {
        sleep: Pin<Box<F>>,
        deadline: u64,
        place: Option<Place<()>>,
    },
    /// A cell is taken for the next `call`; the ticket refunds it if unused.
    Ready(Option<crate::bucket::gcra::Ticket>),
    /// Over the limit: the next `call` answers this.
    Refused(Box<crate::Throttled>),
}

impl<S, C: Clock, Sl: Sleeper> RateLimit<S, C, Sl> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Wait mode: takes one cell, sleeping for it within the budget. `Ready`
    /// once a cell is held or the refusal is decided.
    #[inline(never)]
    fn poll_cell(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let (deadline, place) = match &mut self.state {
                State::Empty => {
                    let now = self.bucket.clock().now_nanos();
                    (saturating_nanos(self.budget).saturating_add(now), None)
                }
                State::Sleeping {
                    sleep,
                    deadline,
                    place,
                } => {
                    core::task::ready!(sleep.as_mut().poll(cx));
                    (*deadline, place.take())
                }
                State::Ready(_) | State::Refused(_) => return Poll::Ready(()),
            };
            self.state = match self.bucket.take_refundable() {
                Ok(ticket) => State::Ready(ticket),
                Err(e) => match e.retry_after() {
                    Some(next) => {
                        // The next cell, plus a period per caller ahead in the line (none
                        // once we have slept our turn).
                        let (ahead, place) = match place {
                            Some(p) => (0, p),
                            None => self.line.join(&()),
                        };
                        let period = saturating_nanos(self.bucket.quota().period());
                        let wait = saturating_nanos(next)
                            .saturating_add(period.saturating_mul(ahead as u64));
                        let now = self.bucket.clock().now_nanos();
                        if now.saturating_add(wait) <= deadline {
                            State::Sleeping {
                                sleep: Box::pin(self.sleeper.sleep(Duration::from_nanos(wait))),
                                deadline,
                                place: Some(place),
                            }
                        } else {
                            let e = ReserveError::RateLimited {
                                retry_after: Duration::from_nanos(wait),
                            };
                            State::Refused(Box::new(rate_limited_reserve(e, "rate")))
                        }
                    }
                    None => State::Refused(Box::new(rate_limited_reserve(e, "rate"))),
                },
            };
        }
    }
}

impl<S, C, Sl, Req> Service<Req> for RateLimit<S, C, Sl>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Clock,
    Sl: Sleeper,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = LimitFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Reject mode takes its cell in `call`: nothing to wait for here.
        if !self.budget.is_zero() {
            core::task::ready!(self.poll_cell(cx));
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        if self.budget.is_zero() {
            return match take_cell(&self.bucket) {
                None => LimitFuture::inner(self.inner.call(req)),
                Some(refused) => LimitFuture::refused_boxed(refused),
            };
        }
        self.call_waited(req)
    }
}

/// Reject mode's check, out of line and answering in one register, so
/// `call` stays small enough to inline into the caller.
#[inline(never)]
fn take_cell<C: Clock>(bucket: &TokenBucket<C>) -> Option<Box<crate::Throttled>> {
    match bucket.try_acquire(1) {
        Ok(()) => None,
        Err(e) => Some(Box::new(rate_limited_check(e, "rate"))),
    }
}

impl<S, C: Clock, Sl: Sleeper> RateLimit<S, C, Sl> {
    /// Wait mode's `call`: out of line, so reject mode's stays small.
    #[inline(never)]
    fn call_waited<Req>(&mut self, req: Req) -> LimitFuture<S::Future>
    where
        S: Service<Req>,
    {
        match core::mem::replace(&mut self.state, State::Empty) {
            State::Ready(_) => LimitFuture::inner(self.inner.call(req)),
            State::Refused(e) => LimitFuture::refused_boxed(e),
            // `call` without a ready `poll_ready`: the cell is checked, never
            // waited for.
            State::Empty | State::Sleeping { .. } => match self.bucket.try_acquire(1) {
                Ok(()) => LimitFuture::inner(self.inner.call(req)),
                Err(e) => LimitFuture::refused(rate_limited_check(e, "rate")),
            },
        }
    }
}

impl<S, C: Clock, Sl: Sleeper> Drop for RateLimit<S, C, Sl> {
    /// A cell taken by `poll_ready` and never used is refunded (when no
    /// other was taken after it).
    fn drop(&mut self) {
        if let State::Ready(Some(ticket)) = self.state {
            self.bucket.refund(ticket);
        }
    }
}

impl<S: Clone, C: Clock, Sl: Sleeper + Clone> Clone for RateLimit<S, C, Sl> {
    /// The same bucket, holding no cell.
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            bucket: self.bucket.clone(),
            budget: self.budget,
            sleeper: self.sleeper.clone(),
            line: self.line.clone(),
            state: State::Empty,
        }
    }
}

impl<S: fmt::Debug, C: Clock, Sl: Sleeper> fmt::Debug for RateLimit<S, C, Sl> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Empty => "empty",
            State::Sleeping { .. } => "sleeping",
            State::Ready(_) => "ready",
            State::Refused(_) => "refused",
        };
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("bucket", &self.bucket)
            .field("budget", &self.budget)
            .field("state", &state)
            .finish()
    }
}
