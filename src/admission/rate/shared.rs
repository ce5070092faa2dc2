//! Limits that live outside the process: a credential whose quota is
//! shared with other processes (a `RedisBucket`, or any
//! [`RateLimiter`]) is admitted through it instead of a local bucket.

use core::future::Future;
use core::pin::Pin;
use core::time::Duration;

use std::collections::HashMap;
use std::sync::Arc;

use crate::bucket::ReserveError;
use crate::limiter::RateLimiter;

/// A boxed future borrowing the limiter.
pub(crate) type SharedFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe face of a [`RateLimiter`] that [`Admission`] keeps for a
/// credential shared across processes; every `RateLimiter` has it.
///
/// A call takes one cell. If the admit is cancelled while it sleeps the
/// reserved wait, the cell is not given back (a shared refund needs a round
/// trip a dropped future cannot make): that errs towards admitting less.
///
/// [`Admission`]: crate::admission::Admission
pub(crate) trait SharedLimiter: Send + Sync {
    /// Takes one cell usable within `max_wait`; returns the wait.
    fn reserve_one(&self, max_wait: Duration) -> SharedFuture<'_, Result<Duration, ReserveError>>;

    /// Holds every process back for `retry_after` (a 429 seen here).
    fn penalize_all(&self, retry_after: Duration) -> SharedFuture<'_, ()>;
}

impl<L: RateLimiter> SharedLimiter for L {
    fn reserve_one(&self, max_wait: Duration) -> SharedFuture<'_, Result<Duration, ReserveError>> {
        Box::pin(self.reserve(1, max_wait))
    }

    fn penalize_all(&self, retry_after: Duration) -> SharedFuture<'_, ()> {
        Box::pin(self.penalize(retry_after))
    }
}

/// Finds the shared limiter of a credential not registered by name (see
/// [`Builder::shared_quotas`](crate::admission::Builder::shared_quotas)).
pub(crate) type SharedResolver = dyn Fn(&str) -> Option<Arc<dyn SharedLimiter>> + Send + Sync;

/// The credentials admitted through a shared limiter: by name, then through
/// the resolver.
#[derive(Default)]
pub(in crate::admission) struct Shared {
    pub(in crate::admission) by_name: HashMap<String, Arc<dyn SharedLimiter>>,
    pub(in crate::admission) resolver: Option<Box<SharedResolver>>,
}

impl Shared {
    /// `credential`'s shared limiter, if it has one.
    #[inline]
    pub(in crate::admission) fn get(&self, credential: &str) -> Option<Arc<dyn SharedLimiter>> {
        if let Some(l) = self.by_name.get(credential) {
            return Some(l.clone());
        }
        self.resolver.as_ref().and_then(|r| r(credential))
    }

    /// Whether `credential` is admitted through a shared limiter.
    #[inline]
    pub(in crate::admission) fn contains(&self, credential: &str) -> bool {
        // Most layers share nothing: no lookup then.
        if self.by_name.is_empty() && self.resolver.is_none() {
            return false;
        }
        self.by_name.contains_key(credential) || self.get(credential).is_some()
    }
}
