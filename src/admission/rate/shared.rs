//! Limits that live outside the process: a credential whose quota is
//! shared with other processes (a `RedisBucket`, or any
//! [`RateLimiter`]) is admitted through it instead of a local bucket.

use core::future::Future;
use core::pin::Pin;
use core::time::Duration;

use std::collections::HashMap;
use std::sync::Arc;

use crate::admission::Admission;
use crate::bucket::ReserveError;
use crate::clock::Clock;
use crate::limiter::RateLimiter;
use crate::sleep::Sleeper;

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

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// Pushes the penalties observed on credentials with a shared quota
    /// (see [`Builder::shared_quota`](crate::admission::Builder::shared_quota)) to
    /// their shared limiters, so other processes hold back too.
    /// [`Ticket::observe`](crate::admission::Ticket::observe) cannot await, so it
    /// records them; the next `admit` on the same credential pushes them,
    /// and this pushes them all now ([`Runner`](crate::admission::Runner) calls it
    /// after every throttled reply).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::headers::ServerHint;
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::SystemTime;
    ///
    /// let shared = std::sync::Arc::new(TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(5).unwrap()),
    ///     ManualClock::new(),
    /// ));
    /// let admission = Admission::builder().shared_quota("org-key", shared.clone()).build();
    /// let hint = ServerHint::from_headers([("retry-after", "30")], SystemTime::now());
    /// admission.observe("search", "org-key", 429, &hint);
    /// futures::executor::block_on(admission.sync_shared());
    /// assert_eq!(shared.available(), 0); // held back for everyone
    /// ```
    pub async fn sync_shared(&self) {
        let credentials: Vec<String> = self.inner.rates.pending.lock().keys().cloned().collect();
        for credential in credentials {
            if let Some(shared) = self.inner.rates.shared.get(&credential) {
                self.push_penalty(&credential, shared.as_ref()).await;
            }
        }
    }

    /// Pushes `credential`'s pending shared hold, if any.
    pub(in crate::admission) async fn push_shared(&self, credential: &str) {
        if let Some(shared) = self.inner.rates.shared.get(credential) {
            self.push_penalty(credential, shared.as_ref()).await;
        }
    }

    pub(super) async fn push_penalty(&self, credential: &str, shared: &dyn SharedLimiter) {
        let pending = self.inner.rates.pending.lock().remove(credential);
        if let Some(until) = pending {
            let now = self.inner.clock.now_nanos();
            if until > now {
                shared.penalize_all(Duration::from_nanos(until - now)).await;
            }
        }
    }
}
