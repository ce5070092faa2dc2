//! Tower layers over the crate's primitives (feature `tower`).
//!
//! | layer | primitive | over the limit |
//! | --- | --- | --- |
//! | [`ConcurrencyLimitLayer`] | one shared [`Semaphore`](crate::Semaphore) | queue (FIFO) in `poll_ready`, or shed |
//! | [`RateLimitLayer`] | one shared [`TokenBucket`](crate::TokenBucket) | wait up to a budget in `poll_ready`, or reject |
//! | [`KeyedRateLimitLayer`] | a [`Scoped`](crate::Scoped) registry and a key closure | wait up to a budget in the response future, or reject |
//! | [`AdmissionLayer`] | an [`Admission`](crate::admission::Admission) and a spec closure; the [`Ticket`](crate::admission::Ticket) held by the response future, which observes the response (with `hold_bodies`, by the response body until it ends) | wait up to the request's deadline in the response future, or refuse |
//! | [`HintRetry`] (a `tower::retry::Policy`) | [`RetryPolicy`](crate::retry::RetryPolicy) and [`Deadline`](crate::retry::Deadline) | honours `Retry-After`; gives up with a [`Throttled`] instead of sleeping past the deadline |
//!
//! Every layer's services are `Clone` and share their limiter, so a stack
//! can be cloned per connection or per task and still count as one.
//! A refusal is a [`Throttled`] inside the [`BoxError`]; downcast it to
//! read the status and the retry time (or to hand it, serialized, to a
//! model).
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
mod limit_future;
mod line;
mod poll_semaphore;
mod rate;
mod retry;

// The layers' services, futures and hooks are `pub` types in private
// modules: users never name them.
pub use admission::AdmissionLayer;
#[cfg(feature = "http")]
pub(crate) use admission::Unanswered;
pub use concurrency::ConcurrencyLimitLayer;
pub use keyed::KeyedRateLimitLayer;
pub use rate::RateLimitLayer;
pub use retry::HintRetry;

pub(crate) use limit_future::LimitFuture;

use crate::bucket::{CheckError, ReserveError};
use crate::{throttled::Status, Throttled};

// The layers' error type: the inner error or a `Throttled`, boxed.
pub(crate) use ::tower::BoxError;

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
