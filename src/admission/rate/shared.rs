//! Limits that live outside the process: a credential whose quota is
//! shared with other processes (a `RedisBucket`, or any
//! [`RateLimiter`]) is admitted through it instead of a local bucket.

use core::future::Future;
use core::pin::Pin;
use core::time::Duration;

use std::collections::HashMap;
use std::sync::Arc;

use std::borrow::Cow;

use super::held::{Reserved, Source};
use super::refusal::Refusal;
use crate::admission::spec::CallSpec;
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
    /// Takes `n` cells usable within `max_wait`; returns the wait.
    fn reserve_n(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> SharedFuture<'_, Result<Duration, ReserveError>>;

    /// Holds every process back for `retry_after` (a 429 seen here).
    fn penalize_all(&self, retry_after: Duration) -> SharedFuture<'_, ()>;

    /// Settles cells taken earlier: `delta > 0` more are charged, `delta
    /// < 0` given back.
    fn settle(&self, delta: i64) -> SharedFuture<'_, ()>;
}

impl<L: RateLimiter> SharedLimiter for L {
    fn reserve_n(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> SharedFuture<'_, Result<Duration, ReserveError>> {
        Box::pin(self.reserve(n, max_wait))
    }

    fn penalize_all(&self, retry_after: Duration) -> SharedFuture<'_, ()> {
        Box::pin(self.penalize(retry_after))
    }

    fn settle(&self, delta: i64) -> SharedFuture<'_, ()> {
        let n = u32::try_from(delta.unsigned_abs()).unwrap_or(u32::MAX);
        if delta > 0 {
            Box::pin(self.charge(n))
        } else {
            Box::pin(self.refund(n))
        }
    }
}

/// Finds the shared limiter of a credential not registered by name (see
/// [`Builder::shared_quotas`](crate::admission::Builder::shared_quotas)).
pub(crate) type SharedResolver = dyn Fn(&str) -> Option<Arc<dyn SharedLimiter>> + Send + Sync;

/// A weighted quota's name and the shared limiter that keeps it.
pub(crate) type SharedCost = (String, Arc<dyn SharedLimiter>);

/// The credentials admitted through a shared limiter: by name, then through
/// the resolver; and the weighted quotas of a credential that live in a
/// shared limiter, with the settles not yet sent to them.
#[derive(Default)]
pub(in crate::admission) struct Shared {
    pub(in crate::admission) by_name: HashMap<String, Arc<dyn SharedLimiter>>,
    pub(in crate::admission) resolver: Option<Box<SharedResolver>>,
    /// A credential's weighted quotas kept in a shared limiter, by name
    /// (see `Builder::shared_resource`).
    pub(in crate::admission) resources: HashMap<String, Vec<SharedCost>>,
    /// Settles queued for those quotas, by credential: the net cells to
    /// charge (> 0) or give back (< 0) per quota name. Queued where no
    /// `.await` is possible (`Ticket::settle`, a dropped `admit`), sent by
    /// the next push for the credential.
    settles: parking_lot::Mutex<HashMap<String, Vec<(String, i64)>>>,
}

impl Shared {
    /// `credential`'s weighted quotas kept in a shared limiter (empty for
    /// most credentials).
    #[inline]
    pub(in crate::admission) fn resources_of(&self, credential: &str) -> &[SharedCost] {
        if self.resources.is_empty() {
            return &[];
        }
        self.resources.get(credential).map_or(&[], Vec::as_slice)
    }

    /// Whether `credential`'s quota `name` lives in a shared limiter.
    #[inline]
    pub(in crate::admission) fn has_resource(&self, credential: &str, name: &str) -> bool {
        self.resources_of(credential).iter().any(|(n, _)| n == name)
    }

    /// Queues `delta` cells (charged if > 0, given back if < 0) for
    /// `credential`'s shared quota `name`; sent by the next push.
    pub(in crate::admission) fn queue_settle(&self, credential: &str, name: &str, delta: i64) {
        if delta == 0 {
            return;
        }
        let mut settles = self.settles.lock();
        let queued = settles.entry(credential.to_string()).or_default();
        match queued.iter_mut().find(|(n, _)| n == name) {
            Some((_, d)) => *d = d.saturating_add(delta),
            None => queued.push((name.to_string(), delta)),
        }
    }

    /// Whether settles are queued for `credential`.
    pub(in crate::admission) fn settles_queued(&self, credential: &str) -> bool {
        !self.resources.is_empty() && self.settles.lock().contains_key(credential)
    }

    /// Sends `credential`'s queued settles to their shared limiters, each
    /// once: taken from the queue before the round trip, never sent again
    /// (see `RateLimiter::charge` for what a failed one costs).
    pub(in crate::admission) async fn push_settles(&self, credential: &str) {
        if self.resources.is_empty() {
            return;
        }
        let Some(queued) = self.settles.lock().remove(credential) else {
            return;
        };
        for (name, delta) in queued {
            let limiter = self
                .resources_of(credential)
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, l)| l.clone());
            if let Some(limiter) = limiter
                && delta != 0
            {
                limiter.settle(delta).await;
            }
        }
    }

    /// The credentials with settles queued.
    fn settling(&self) -> Vec<String> {
        if self.resources.is_empty() {
            return Vec::new();
        }
        self.settles.lock().keys().cloned().collect()
    }

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
    /// their shared limiters, so other processes hold back too, and the
    /// settles queued for weighted quotas kept in a shared limiter
    /// ([`Builder::shared_resource`](crate::admission::Builder::shared_resource)).
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
        let shared = &self.inner.rates.shared;
        let credentials: Vec<String> = self.inner.rates.pending.lock().keys().cloned().collect();
        for credential in credentials {
            if let Some(limiter) = shared.get(&credential) {
                self.push_penalty(&credential, limiter.as_ref()).await;
            }
        }
        for credential in shared.settling() {
            shared.push_settles(&credential).await;
        }
    }

    /// Sends `credential`'s queued settles, if any (a lock, and nothing
    /// more, for a credential with none).
    pub(in crate::admission) async fn push_settles(&self, credential: &str) {
        let shared = &self.inner.rates.shared;
        if shared.settles_queued(credential) {
            shared.push_settles(credential).await;
        }
    }

    /// Pushes `credential`'s pending shared hold and queued settles, if
    /// any.
    pub(in crate::admission) async fn push_shared(&self, credential: &str) {
        if let Some(shared) = self.inner.rates.shared.get(credential) {
            self.push_penalty(credential, shared.as_ref()).await;
        }
        self.inner.rates.shared.push_settles(credential).await;
    }

    /// Reserves the call's cost on each of `limiters` (its credential's
    /// weighted quotas kept in a shared limiter), within `max_wait`; keeps
    /// them in `reserved`, which queues their refund if the call is not
    /// admitted. Returns the longest wait, or the first refusal.
    pub(super) async fn reserve_shared_costs(
        &self,
        spec: &CallSpec,
        limiters: &[SharedCost],
        max_wait: Duration,
        reserved: &mut Reserved<'_, S, C>,
    ) -> Result<Duration, Refusal> {
        let resources = &self.inner.rates.resources;
        let mut wait = Duration::ZERO;
        for (name, limiter) in limiters {
            let cells = spec.cost_of(name).unwrap_or(0);
            let Some(i) = resources.iter().position(|r| r.name == *name) else {
                continue;
            };
            if cells == 0 {
                continue;
            }
            match limiter.reserve_n(cells, max_wait).await {
                Ok(w) => {
                    wait = wait.max(w);
                    reserved.push_shared(Source::Resource(i), cells);
                }
                Err(e) => {
                    return Err(Refusal {
                        e,
                        scope: Cow::Owned(format!("quota:{name}")),
                        period: 0,
                    })
                }
            }
        }
        Ok(wait)
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
