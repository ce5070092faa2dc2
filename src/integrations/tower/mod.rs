//! Tower layers over the crate's primitives (feature `tower`).
//!
//! | layer | primitive | over the limit |
//! | --- | --- | --- |
//! | [`ConcurrencyLimitLayer`] | one shared [`Semaphore`](crate::Semaphore) | queue (FIFO) in `poll_ready`, or shed |
//! | [`RateLimitLayer`] | one shared [`TokenBucket`](crate::TokenBucket) | wait up to a budget in `poll_ready`, or reject |
//! | [`KeyedRateLimitLayer`] | a [`Scoped`](crate::Scoped) registry and a key closure | wait up to a budget in the response future, or reject |
//! | [`AdmissionLayer`] | an [`Admission`](crate::admission::Admission) and a spec closure; the [`Ticket`](crate::admission::Ticket) held by the response future, which observes the response | wait up to the request's deadline in the response future, or refuse |
//! | [`HintRetry`] (a `tower::retry::Policy`) | [`RetryPolicy`](crate::retry::RetryPolicy) and [`Deadline`](crate::retry::Deadline) | honours `Retry-After`; gives up with a [`Throttled`] instead of sleeping past the deadline |
//!
//! Every layer's services are `Clone` and share their limiter, so a stack
//! can be cloned per connection or per task and still count as one.
//! A refusal is a [`Throttled`] inside the [`BoxError`]; downcast it to
//! read the status and the retry time (or to hand it, serialized, to a
//! model).
//!
//! [`PollSemaphore`](crate::PollSemaphore) is the helper
//! [`ConcurrencyLimit`] acquires with; hand-written services can use it too.
//!
//! # Examples
//!
//! ```
//! use backpressure::tower::{ConcurrencyLimitLayer, RateLimitLayer};
//! use backpressure::{Quota, TokenBucket};
//! use std::num::NonZeroU32;
//! use std::sync::Arc;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let bucket = Arc::new(TokenBucket::new(Quota::per_second(NonZeroU32::new(100).unwrap())));
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(bucket))
//!     .layer(ConcurrencyLimitLayer::new(4))
//!     .service(service_fn(|x: u32| async move { Ok::<_, std::io::Error>(x + 1) }));
//! assert_eq!(svc.oneshot(1).await.unwrap(), 2);
//! # });
//! ```

mod admission;
mod concurrency;
mod keyed;
mod line;
mod rate;
mod retry;

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

#[cfg(feature = "http")]
pub use crate::integrations::refusal::{is_refusal, refusal_response, Attempts, REFUSAL_HEADER};
#[cfg(feature = "http")]
pub use crate::integrations::RequestDeadline;
pub use admission::{
    AdmissionFuture, AdmissionLayer, AdmissionService, MakeSpec, Observe, ObserveOk, UsageFrom,
};
#[cfg(feature = "http")]
pub use admission::{HttpSpec, ObserveHttp, RefusalResponses};
pub use concurrency::{
    ConcurrencyLimit, ConcurrencyLimitLayer, ResponseFuture as ConcurrencyFuture,
};
pub use keyed::{KeyedFuture, KeyedRateLimit, KeyedRateLimitLayer};
pub use rate::{RateLimit, RateLimitLayer};
#[cfg(feature = "http")]
pub use retry::ClassifyHttp;
pub use retry::{Classify, HintRetry};

use crate::bucket::{CheckError, ReserveError};
use crate::{throttled::Status, Throttled};

/// The error type of the layers: the inner service's error or a
/// [`Throttled`], boxed (tower's convention at the edges).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's future,
    /// or a refusal answered without calling it.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    #[derive(Debug)]
    pub struct LimitFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    #[derive(Debug)]
    enum State<F> {
        // The inner service was called.
        Inner {
            #[pin]
            future: F,
        },
        // Refused; the error is handed out at the first poll.
        Refused {
            error: Option<Box<Throttled>>,
        },
    }
}

impl<F> LimitFuture<F> {
    pub(crate) fn inner(future: F) -> Self {
        LimitFuture {
            state: State::Inner { future },
        }
    }

    pub(crate) fn refused(t: Throttled) -> Self {
        Self::refused_boxed(Box::new(t))
    }

    /// A refusal already boxed: a thin pointer, so the future is no wider
    /// than the inner one's and a `Throttled` (three strings) is not moved
    /// with every response.
    pub(crate) fn refused_boxed(error: Box<Throttled>) -> Self {
        LimitFuture {
            state: State::Refused { error: Some(error) },
        }
    }
}

impl<F, T, E> Future for LimitFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx).map_err(Into::into),
            StateProj::Refused { error } => {
                Poll::Ready(Err(error.take().unwrap_or_else(polled_after_refusal)))
            }
        }
    }
}

/// A refused `LimitFuture` polled again: an error rather than a panic.
/// Out of line, so the future's `poll` stays small enough to inline.
#[cold]
#[inline(never)]
fn polled_after_refusal() -> Box<Throttled> {
    Box::new(Throttled::new(
        Status::RateLimited,
        "rate",
        "polled after completion",
    ))
}

/// A refusal of our own rate limit, from a check.
#[cold]
pub(crate) fn rate_limited_check(e: CheckError, scope: &str) -> Throttled {
    let t = Throttled::new(
        Status::RateLimited,
        scope,
        match e {
            CheckError::TooManyKeys { .. } => "the rate limiter tracks too many keys; retry later",
            _ => "over the rate limit; retry after the wait",
        },
    );
    match e.wait() {
        Some(w) => t.with_retry_after(w),
        None => t,
    }
}

/// A refusal of our own rate limit, from a reservation over the budget.
#[cold]
pub(crate) fn rate_limited_reserve(e: ReserveError, scope: &str) -> Throttled {
    let t = Throttled::new(
        Status::RateLimited,
        scope,
        "over the rate limit for longer than this call may wait; retry after the wait",
    );
    match e.retry_after() {
        Some(w) => t.with_retry_after(w),
        None => t,
    }
}
