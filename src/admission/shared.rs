//! Limits that live outside the process: a credential whose quota is
//! shared with other processes (a `RedisBucket`, or any
//! [`AsyncRateLimiter`]) is admitted through it instead of a local bucket.

use core::future::Future;
use core::pin::Pin;
use core::time::Duration;

use std::collections::HashMap;
use std::sync::Arc;

use crate::bucket::ReserveError;
use crate::limiter::{AsyncRateLimiter, AsyncReservation};

/// A boxed future borrowing the limiter.
pub type SharedFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe face of an [`AsyncRateLimiter`] that [`Admission`]
/// uses for a credential shared across processes. Implemented for every
/// `AsyncRateLimiter` (so for `RedisBucket` and `TokenBucket`); there is no
/// need to implement it by hand.
///
/// A call takes one cell. If the admit is cancelled while it sleeps the
/// reserved wait, the cell is not given back (a shared refund needs a round
/// trip a dropped future cannot make): that errs towards admitting less.
///
/// [`Admission`]: crate::admission::Admission
///
/// # Examples
///
/// ```
/// use backpressure::admission::SharedLimiter;
/// use backpressure::{ManualClock, Quota, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// # futures::executor::block_on(async {
/// let bucket = TokenBucket::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), ManualClock::new());
/// assert_eq!(bucket.reserve_one(Duration::ZERO).await, Ok(Duration::ZERO));
/// assert!(bucket.reserve_one(Duration::ZERO).await.is_err());
/// # });
/// ```
pub trait SharedLimiter: Send + Sync {
    /// Takes one cell usable within `max_wait`; returns the wait.
    ///
    /// # Errors
    ///
    /// As [`AsyncRateLimiter::reserve`].
    fn reserve_one(&self, max_wait: Duration) -> SharedFuture<'_, Result<Duration, ReserveError>>;

    /// Holds every process back for `retry_after` (a 429 seen here).
    fn penalize_all(&self, retry_after: Duration) -> SharedFuture<'_, ()>;
}

impl<L: AsyncRateLimiter> SharedLimiter for L {
    fn reserve_one(&self, max_wait: Duration) -> SharedFuture<'_, Result<Duration, ReserveError>> {
        Box::pin(async move {
            // Keep the cells: the call is about to use them.
            self.reserve(1, max_wait).await.map(|r| r.keep())
        })
    }

    fn penalize_all(&self, retry_after: Duration) -> SharedFuture<'_, ()> {
        Box::pin(self.penalize(retry_after))
    }
}

/// Finds the shared limiter of a credential not registered by name (see
/// [`Builder::shared_quotas`](super::Builder::shared_quotas)).
pub type SharedResolver = dyn Fn(&str) -> Option<Arc<dyn SharedLimiter>> + Send + Sync;

/// The credentials admitted through a shared limiter: by name, then through
/// the resolver.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) by_name: HashMap<String, Arc<dyn SharedLimiter>>,
    pub(super) resolver: Option<Box<SharedResolver>>,
}

impl Shared {
    /// `credential`'s shared limiter, if it has one.
    #[inline]
    pub(super) fn get(&self, credential: &str) -> Option<Arc<dyn SharedLimiter>> {
        if let Some(l) = self.by_name.get(credential) {
            return Some(l.clone());
        }
        self.resolver.as_ref().and_then(|r| r(credential))
    }

    /// Whether `credential` is admitted through a shared limiter.
    #[inline]
    pub(super) fn contains(&self, credential: &str) -> bool {
        // Most layers share nothing: no lookup then.
        if self.by_name.is_empty() && self.resolver.is_none() {
            return false;
        }
        self.by_name.contains_key(credential) || self.get(credential).is_some()
    }
}
