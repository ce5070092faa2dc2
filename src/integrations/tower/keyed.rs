//! [`KeyedRateLimitLayer`]: one GCRA bucket per key (a header, a peer
//! address, a route), from a [`Scoped`] registry and a key closure.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::hash::Hash;
use std::sync::Arc;

use ::tower::{Layer, Service};

use super::line::{Line, Place};
use super::{rate_limited_check, rate_limited_reserve, BoxError, LimitFuture};
use crate::bucket::CheckError;
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::keyed::Scoped;
use crate::sleep::{DefaultSleeper, Sleeper};

/// Admits each request through the bucket of its key in a shared
/// [`Scoped`] registry; the key comes from the request through `key`.
///
/// The key is only known in `call`, so `poll_ready` is the inner
/// service's. Over the limit, by default the request is refused at once
/// with a [`Throttled`](crate::Throttled) of status `rate_limited` (scope
/// `"rate:key"`). With [`wait_up_to`](Self::wait_up_to), a wait within
/// the budget is slept in the response future before the inner call (the
/// ready inner service travels with it, so it must be `Clone`). The
/// future holds no cell while it sleeps, so dropping it gives nothing
/// away. Waiters on a key are not served in FIFO order.
///
/// # Examples
///
/// ```
/// use backpressure::tower::KeyedRateLimitLayer;
/// use backpressure::{ManualClock, Quota, Scoped};
/// use std::num::NonZeroU32;
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // 1 request per second per user.
/// let limits = Arc::new(Scoped::with_clock(
///     Quota::per_second(NonZeroU32::new(1).unwrap()),
///     ManualClock::new(),
/// ));
/// let layer = KeyedRateLimitLayer::new(limits, |req: &(&'static str, u32)| req.0);
/// let svc = layer.layer(service_fn(|req: (&str, u32)| async move { Ok::<_, std::io::Error>(req.1) }));
/// assert_eq!(svc.clone().oneshot(("alice", 1)).await.unwrap(), 1);
/// assert!(svc.clone().oneshot(("alice", 2)).await.is_err()); // alice is spent
/// assert_eq!(svc.clone().oneshot(("bob", 3)).await.unwrap(), 3); // bob is not
/// # });
/// ```
pub struct KeyedRateLimitLayer<K, F, C: Clock = DefaultClock, Sl = DefaultSleeper> {
    limits: Arc<Scoped<K, C>>,
    key: F,
    budget: Duration,
    sleeper: Sl,
    /// The waiters of this layer's services, per key (see `line.rs`).
    line: Arc<Line<K>>,
}

impl<K, F, C: Clock> KeyedRateLimitLayer<K, F, C, DefaultSleeper> {
    /// Rejects a request whose key has no cell; `key` maps a request to its key.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{tower::KeyedRateLimitLayer, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// use std::sync::Arc;
    /// let limits = Arc::new(Scoped::<String>::new(Quota::per_second(NonZeroU32::new(5).unwrap())));
    /// let layer = KeyedRateLimitLayer::new(limits.clone(), |req: &String| req.clone());
    /// assert!(Arc::ptr_eq(layer.limits(), &limits));
    /// ```
    pub fn new(limits: Arc<Scoped<K, C>>, key: F) -> Self {
        KeyedRateLimitLayer {
            limits,
            key,
            budget: Duration::ZERO,
            sleeper: DefaultSleeper::new(),
            line: Arc::default(),
        }
    }
}

impl<K, F, C: Clock, Sl> KeyedRateLimitLayer<K, F, C, Sl> {
    /// Waits, in the response future, for a cell that comes within
    /// `budget`, sleeping on `sleeper`; a longer wait is refused at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{tower::KeyedRateLimitLayer, DefaultSleeper, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limits = Arc::new(Scoped::new(Quota::per_second(NonZeroU32::new(1000).unwrap())));
    /// let layer = KeyedRateLimitLayer::new(limits, |k: &u8| *k)
    ///     .wait_up_to(Duration::from_millis(100), DefaultSleeper::new());
    /// let svc = layer.layer(service_fn(|k: u8| async move { Ok::<_, std::io::Error>(k) }));
    /// for _ in 0..1_005 {
    ///     svc.clone().oneshot(1).await.unwrap();
    /// }
    /// # });
    /// ```
    pub fn wait_up_to<S2: Sleeper>(
        self,
        budget: Duration,
        sleeper: S2,
    ) -> KeyedRateLimitLayer<K, F, C, S2> {
        KeyedRateLimitLayer {
            limits: self.limits,
            key: self.key,
            budget,
            sleeper,
            line: self.line,
        }
    }

    /// The shared registry.
    pub fn limits(&self) -> &Arc<Scoped<K, C>> {
        &self.limits
    }
}

impl<K, F: Clone, C: Clock, Sl: Clone> Clone for KeyedRateLimitLayer<K, F, C, Sl> {
    fn clone(&self) -> Self {
        KeyedRateLimitLayer {
            limits: self.limits.clone(),
            key: self.key.clone(),
            budget: self.budget,
            sleeper: self.sleeper.clone(),
            line: self.line.clone(),
        }
    }
}

impl<K, F, C: Clock, Sl: fmt::Debug> fmt::Debug for KeyedRateLimitLayer<K, F, C, Sl> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimitLayer")
            .field("limits", &self.limits)
            .field("budget", &self.budget)
            .field("sleeper", &self.sleeper)
            .finish_non_exhaustive()
    }
}

impl<S, K, F: Clone, C: Clock, Sl: Clone> Layer<S> for KeyedRateLimitLayer<K, F, C, Sl> {
    type Service = KeyedRateLimit<S, K, F, C, Sl>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedRateLimit {
            inner,
            limits: self.limits.clone(),
            key: self.key.clone(),
            budget: self.budget,
            sleeper: self.sleeper.clone(),
            line: self.line.clone(),
        }
    }
}

/// The service of [`KeyedRateLimitLayer`].
///
/// # Examples
///
/// ```
/// use backpressure::{tower::KeyedRateLimitLayer, Quota, Scoped};
/// use std::num::NonZeroU32;
/// use std::sync::Arc;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let limits = Arc::new(Scoped::new(Quota::per_second(NonZeroU32::new(5).unwrap())));
/// let svc = KeyedRateLimitLayer::new(limits.clone(), |k: &u8| *k)
///     .layer(service_fn(|k: u8| async move { Ok::<_, std::io::Error>(k) }));
/// svc.oneshot(9).await.unwrap();
/// assert_eq!(limits.available(&9), 4);
/// # });
/// ```
pub struct KeyedRateLimit<S, K, F, C: Clock = DefaultClock, Sl = DefaultSleeper> {
    inner: S,
    limits: Arc<Scoped<K, C>>,
    key: F,
    budget: Duration,
    sleeper: Sl,
    line: Arc<Line<K>>,
}

impl<S, K, F, C: Clock, Sl> KeyedRateLimit<S, K, F, C, Sl> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, K, F, C, Sl, Req> Service<Req> for KeyedRateLimit<S, K, F, C, Sl>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    F: Fn(&Req) -> K,
    C: Clock + Send + Sync + 'static,
    Sl: Sleeper + Clone + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = KeyedFuture<S, Req, Sl::Sleep>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let key = (self.key)(&req);
        if self.budget.is_zero() {
            return KeyedFuture::calling(match self.limits.try_acquire(&key, 1) {
                Ok(()) => LimitFuture::inner(self.inner.call(req)),
                Err(e) => LimitFuture::refused(rate_limited_check(e, "rate:key")),
            });
        }
        let deadline =
            crate::clock::saturating_nanos(self.budget).saturating_add(self.limits.now_nanos());
        let mut retake = {
            let (limits, sleeper) = (self.limits.clone(), self.sleeper.clone());
            let (line, mut place) = (self.line.clone(), None);
            move || take_or_sleep(&limits, &key, deadline, &sleeper, &line, &mut place)
        };
        match retake() {
            Take::Taken => KeyedFuture::calling(LimitFuture::inner(self.inner.call(req))),
            Take::Refused(t) => KeyedFuture::calling(LimitFuture::refused(t)),
            Take::Sleep(sleep) => {
                // The ready service goes with the request; keep a fresh clone.
                let fresh = self.inner.clone();
                let ready = core::mem::replace(&mut self.inner, fresh);
                KeyedFuture::sleeping(sleep, Box::new(retake), ready, req)
            }
        }
    }
}

/// What a try for a key's cell found.
enum Take<F> {
    /// The cell is ours.
    Taken,
    /// None is free: sleep this, then try again.
    Sleep(F),
    /// None comes by the deadline (or ever).
    Refused(crate::Throttled),
}

/// Takes `key`'s next cell if free; else joins the key's line and returns
/// the sleep until its turn, if that ends by `deadline`.
fn take_or_sleep<K, C, Sl>(
    limits: &Scoped<K, C>,
    key: &K,
    deadline: u64,
    sleeper: &Sl,
    line: &Arc<Line<K>>,
    place: &mut Option<Place<K>>,
) -> Take<Sl::Sleep>
where
    K: Hash + Eq + Clone,
    C: Clock,
    Sl: Sleeper,
{
    let next = match limits.try_acquire(key, 1) {
        Ok(()) => {
            *place = None;
            return Take::Taken;
        }
        Err(CheckError::NotUntil { wait }) => wait,
        Err(e) => {
            *place = None;
            return Take::Refused(rate_limited_check(e, "rate:key"));
        }
    };
    // Once we have slept our turn, nobody is ahead any more.
    let ahead = match place {
        Some(_) => 0,
        None => {
            let (ahead, joined) = line.join(key);
            *place = Some(joined);
            ahead
        }
    };
    let period = saturating_nanos(limits.period_of(key));
    let wait = saturating_nanos(next).saturating_add(period.saturating_mul(ahead as u64));
    if limits.now_nanos().saturating_add(wait) <= deadline {
        return Take::Sleep(sleeper.sleep(Duration::from_nanos(wait)));
    }
    *place = None;
    Take::Refused(rate_limited_reserve(
        crate::bucket::ReserveError::RateLimited {
            retry_after: Duration::from_nanos(wait),
        },
        "rate:key",
    ))
}

/// Tries a key's cell again after a sleep (boxed, so the future's type
/// does not name the key or the clock).
type Retake<F> = Box<dyn FnMut() -> Take<F> + Send>;

impl<S: Clone, K, F: Clone, C: Clock, Sl: Clone> Clone for KeyedRateLimit<S, K, F, C, Sl> {
    fn clone(&self) -> Self {
        KeyedRateLimit {
            inner: self.inner.clone(),
            limits: self.limits.clone(),
            key: self.key.clone(),
            budget: self.budget,
            sleeper: self.sleeper.clone(),
            line: self.line.clone(),
        }
    }
}

impl<S: fmt::Debug, K, F, C: Clock, Sl> fmt::Debug for KeyedRateLimit<S, K, F, C, Sl> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimit")
            .field("inner", &self.inner)
            .field("limits", &self.limits)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`KeyedRateLimit`]: a sleep for the key's
    /// cell (wait mode), then the inner call; or a refusal.
    ///
    /// # Cancel safety
    ///
    /// It holds no cell while it sleeps: dropping it then gives nothing
    /// away.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct KeyedFuture<S, Req, Sl>
    where
        S: Service<Req>,
    {
        #[pin]
        state: KeyedState<S, Req, Sl>,
    }
}

pin_project_lite::pin_project! {
    #[project = KeyedProj]
    enum KeyedState<S, Req, Sl>
    where
        S: Service<Req>,
    {
        // Waiting for the key's next cell, holding none.
        Sleeping {
            #[pin]
            sleep: Sl,
            retake: Retake<Sl>,
            service: Option<S>,
            req: Option<Req>,
        },
        // Calling the inner service (or refused).
        Calling {
            #[pin]
            future: LimitFuture<S::Future>,
        },
    }
}

impl<S: Service<Req>, Req, Sl> KeyedFuture<S, Req, Sl> {
    fn calling(future: LimitFuture<S::Future>) -> Self {
        KeyedFuture {
            state: KeyedState::Calling { future },
        }
    }

    fn sleeping(sleep: Sl, retake: Retake<Sl>, service: S, req: Req) -> Self {
        KeyedFuture {
            state: KeyedState::Sleeping {
                sleep,
                retake,
                service: Some(service),
                req: Some(req),
            },
        }
    }
}

impl<S, Req, Sl> Future for KeyedFuture<S, Req, Sl>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Sl: Future<Output = ()>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                KeyedProj::Sleeping {
                    mut sleep,
                    retake,
                    service,
                    req,
                } => {
                    core::task::ready!(sleep.as_mut().poll(cx));
                    let future = match retake() {
                        Take::Taken => match (service.take(), req.take()) {
                            (Some(mut svc), Some(req)) => LimitFuture::inner(svc.call(req)),
                            // Unreachable: both are taken only here.
                            _ => LimitFuture::refused(crate::Throttled::new(
                                crate::throttled::Status::RateLimited,
                                "rate:key",
                                "polled after completion",
                            )),
                        },
                        Take::Refused(t) => LimitFuture::refused(t),
                        Take::Sleep(next) => {
                            // Another waiter took the cell: the next one.
                            sleep.set(next);
                            continue;
                        }
                    };
                    state.set(KeyedState::Calling { future });
                }
                KeyedProj::Calling { future } => return future.poll(cx),
            }
        }
    }
}

impl<S: Service<Req>, Req, Sl> fmt::Debug for KeyedFuture<S, Req, Sl> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            KeyedState::Sleeping { .. } => "sleeping",
            KeyedState::Calling { .. } => "calling",
        };
        f.debug_struct("KeyedFuture")
            .field("state", &state)
            .finish()
    }
}
