//! [`ConcurrencyLimitLayer`]: at most N requests in flight across every
//! clone of a service, queued (FIFO) or shed.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use ::tower::{Layer, Service};

use super::poll_semaphore::PollSemaphore;
use super::{BoxError, LimitFuture};
use crate::semaphore::{OwnedSemaphorePermit, Semaphore};
use crate::{throttled::Status, Throttled};

/// One semaphore permit held as the `Arc` alone (one pointer, so the
/// response future stays narrow); released on drop.
struct Permit(Arc<Semaphore>);

impl Permit {
    /// One free permit, taken with one CAS (never overtaking a waiter), or `None`.
    #[inline]
    fn try_take(semaphore: &Arc<Semaphore>) -> Option<Self> {
        match semaphore.try_take(1) {
            Ok(()) => Some(Permit(semaphore.clone())),
            Err(_) => None,
        }
    }

    /// The one permit `PollSemaphore::poll_acquire` answered with.
    fn from_owned(permit: OwnedSemaphorePermit) -> Self {
        debug_assert_eq!(permit.num_permits(), 1);
        let semaphore = permit.semaphore().clone();
        // Now owned by the new `Permit`, which releases it on drop.
        permit.forget();
        Permit(semaphore)
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        self.0.release(1, crate::semaphore::Guess::NONE);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("sem", &self.0)
            .field("permits", &1)
            .finish()
    }
}

/// Limits the requests in flight through every service it wraps to the
/// permits of one shared [`Semaphore`].
///
/// By default a request waits for a permit in `poll_ready` (FIFO). With
/// [`reject`](Self::reject), a request that finds no permit free is
/// refused at once with a [`Throttled`] of status [`Status::Shed`]. The
/// permit travels with the response future and returns when the response
/// completes or the future is dropped. Errors are [`BoxError`]s: the inner
/// service's error, or a [`Throttled`].
///
/// # Examples
///
/// ```
/// use backpressure::tower::ConcurrencyLimitLayer;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let layer = ConcurrencyLimitLayer::new(2);
/// let mut svc = layer.layer(service_fn(|x: u32| async move { Ok::<_, std::io::Error>(x * 2) }));
/// let semaphore = layer.semaphore().clone();
///
/// let fut = svc.ready().await.unwrap().call(21);
/// assert_eq!(semaphore.available_permits(), 1); // held by `fut`
/// assert_eq!(fut.await.unwrap(), 42);
/// assert_eq!(semaphore.available_permits(), 2);
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct ConcurrencyLimitLayer {
    semaphore: Arc<Semaphore>,
    reject: Option<Duration>,
}

impl ConcurrencyLimitLayer {
    /// At most `max` requests in flight (a semaphore of `max` permits).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::tower::ConcurrencyLimitLayer;
    /// assert_eq!(ConcurrencyLimitLayer::new(8).semaphore().available_permits(), 8);
    /// ```
    pub fn new(max: usize) -> Self {
        Self::with_semaphore(Arc::new(Semaphore::new(max)))
    }

    /// Shares `semaphore` (with other layers, or with code outside tower).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{tower::ConcurrencyLimitLayer, Semaphore};
    /// use std::sync::Arc;
    /// let shared = Arc::new(Semaphore::new(4));
    /// let layer = ConcurrencyLimitLayer::with_semaphore(shared.clone());
    /// assert!(Arc::ptr_eq(layer.semaphore(), &shared));
    /// ```
    pub fn with_semaphore(semaphore: Arc<Semaphore>) -> Self {
        ConcurrencyLimitLayer {
            semaphore,
            reject: None,
        }
    }

    /// Refuses a request at once when no permit is free, instead of queueing
    /// it: a [`Throttled`] with status [`Status::Shed`], scope `"concurrency"`
    /// and `retry_after` = `drain_estimate` (a typical response time).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// use backpressure::{Throttled, tower::ConcurrencyLimitLayer};
    /// use std::time::Duration;
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let layer = ConcurrencyLimitLayer::new(1).reject(Duration::from_millis(50));
    /// let inner = service_fn(|()| async { Ok::<_, std::io::Error>(()) });
    /// let mut a = layer.layer(inner);
    /// let mut b = a.clone();
    /// let held = a.ready().await.unwrap().call(());
    /// let err = b.ready().await.unwrap().call(()).await.unwrap_err();
    /// let t = err.downcast_ref::<Throttled>().unwrap();
    /// assert_eq!(t.status, Status::Shed);
    /// assert_eq!(t.retry_after_ms, Some(50));
    /// held.await.unwrap();
    /// # });
    /// ```
    pub fn reject(mut self, drain_estimate: Duration) -> Self {
        self.reject = Some(drain_estimate);
        self
    }

    /// The shared semaphore.
    pub fn semaphore(&self) -> &Arc<Semaphore> {
        &self.semaphore
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> ConcurrencyLimit<S> {
        ConcurrencyLimit {
            inner,
            semaphore: PollSemaphore::new(self.semaphore.clone()),
            permit: None,
            reject: self.reject,
        }
    }
}

/// The service of [`ConcurrencyLimitLayer`]; a clone shares the semaphore
/// and holds no permit.
pub struct ConcurrencyLimit<S> {
    inner: S,
    semaphore: PollSemaphore,
    /// The permit `poll_ready` took, for the next `call`.
    permit: Option<Permit>,
    reject: Option<Duration>,
}

impl<S> ConcurrencyLimit<S> {
    /// Wraps `inner`, queueing for permits of `semaphore`.
    pub fn new(inner: S, semaphore: Arc<Semaphore>) -> Self {
        ConcurrencyLimitLayer::with_semaphore(semaphore).layer(inner)
    }

    /// The shared semaphore.
    pub fn semaphore(&self) -> &Arc<Semaphore> {
        self.semaphore.semaphore()
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// `poll_ready` without a free permit, out of line to keep the fast path
    /// small. `None` when a permit was taken; else what `poll_ready` answers.
    #[inline(never)]
    fn poll_acquire_slow(&mut self, cx: &mut Context<'_>) -> Option<Poll<Result<(), BoxError>>> {
        if self.reject.is_some() {
            // No permit: `call` answers with the refusal, without waiting
            // for the inner service.
            return match Permit::try_take(self.semaphore.semaphore()) {
                Some(permit) => {
                    self.permit = Some(permit);
                    None
                }
                None => Some(Poll::Ready(Ok(()))),
            };
        }
        match self.semaphore.poll_acquire(cx) {
            Poll::Ready(Some(permit)) => {
                self.permit = Some(Permit::from_owned(permit));
                None
            }
            Poll::Ready(None) => Some(Poll::Ready(Err(closed().into()))),
            Poll::Pending => Some(Poll::Pending),
        }
    }

    /// `call` without a permit: one last try, then the refusal. Out of line
    /// so `call` stays small enough to inline into the caller.
    #[inline(never)]
    fn last_try(&self) -> Result<Permit, Box<Throttled>> {
        Permit::try_take(self.semaphore.semaphore()).ok_or_else(|| Box::new(self.shed()))
    }

    #[cold]
    fn shed(&self) -> Throttled {
        // A closed semaphore will never free a slot: `closed`, not `shed`.
        if self.semaphore.semaphore().is_closed() {
            return closed();
        }
        let t = Throttled::new(
            Status::Shed,
            "concurrency",
            "every concurrency slot is busy; retry after the drain estimate",
        );
        match self.reject {
            Some(d) => t.with_retry_after(d),
            None => t,
        }
    }
}

impl<S, Req> Service<Req> for ConcurrencyLimit<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.permit.is_none() {
            // Fast path, unless this service already waits in the queue.
            let free = match self.semaphore.is_waiting() {
                false => Permit::try_take(self.semaphore.semaphore()),
                true => None,
            };
            match free {
                Some(permit) => self.permit = Some(permit),
                None => {
                    if let Some(answer) = self.poll_acquire_slow(cx) {
                        return answer;
                    }
                }
            }
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        // Without a permit: one last try, then the refusal. Never a panic.
        let permit = match self.permit.take() {
            Some(p) => p,
            None => match self.last_try() {
                Ok(p) => p,
                Err(refused) => return ResponseFuture::rejected(refused),
            },
        };
        ResponseFuture::new(self.inner.call(req), permit)
    }
}

impl<S: Clone> Clone for ConcurrencyLimit<S> {
    /// The same semaphore, with no permit held.
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            semaphore: self.semaphore.clone(),
            permit: None,
            reject: self.reject,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for ConcurrencyLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("semaphore", &self.semaphore)
            .field("has_permit", &self.permit.is_some())
            .field("reject", &self.reject)
            .finish()
    }
}

#[cold]
fn closed() -> Throttled {
    Throttled::new(
        Status::Closed,
        "concurrency",
        "the concurrency limit was closed",
    )
}

pin_project_lite::pin_project! {
    /// The response future of [`ConcurrencyLimit`]: the inner future and
    /// the permit, given back as soon as the response is ready or the
    /// future is dropped.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: LimitFuture<F>,
        permit: Option<Permit>,
    }
}

impl<F> ResponseFuture<F> {
    #[inline]
    fn new(inner: F, permit: Permit) -> Self {
        ResponseFuture {
            inner: LimitFuture::inner(inner),
            permit: Some(permit),
        }
    }

    fn rejected(t: Box<Throttled>) -> Self {
        ResponseFuture {
            inner: LimitFuture::refused_boxed(t),
            permit: None,
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = core::task::ready!(this.inner.poll(cx));
        // Free the slot now, not when the caller drops the future.
        drop(this.permit.take());
        Poll::Ready(out)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("permit", &self.permit)
            .finish_non_exhaustive()
    }
}
