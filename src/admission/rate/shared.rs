//! Limits that live outside the process: a credential whose quota is
//! shared with other processes is admitted through its [`RateLimiter`].

use core::future::Future;
use core::pin::Pin;
use core::time::Duration;

use std::collections::HashMap;
use std::sync::Arc;

use std::borrow::Cow;

use super::held::{Reserved, Source};
use super::observe::{same_name, stated_quota};
use super::refusal::Refusal;
use super::rescales::Turn;
use super::shared_turns::{Watch, Watches};
use crate::admission::spec::{CallSpec, REQUESTS};
use crate::admission::Admission;
use crate::bucket::{Quota, ReserveError};
use crate::clock::{saturating_nanos, Clock};
use crate::headers::{Policy, ServerHint};
use crate::limiter::RateLimiter;
use crate::sleep::Sleeper;

/// A boxed future borrowing the limiter.
pub(crate) type SharedFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe face of a [`RateLimiter`] kept for a shared
/// credential. A cell reserved by an admit cancelled while sleeping is not
/// given back (that needs a round trip): errs towards admitting less.
pub(crate) trait SharedLimiter: Send + Sync {
    /// Takes `n` cells usable within `max_wait`, as of `not_before` from
    /// now; returns the wait.
    fn reserve_n(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> SharedFuture<'_, Result<Duration, ReserveError>>;

    /// Holds every process back for `retry_after`.
    fn penalize_all(&self, retry_after: Duration) -> SharedFuture<'_, ()>;

    /// Settles cells taken earlier: `delta > 0` charged, `< 0` given back.
    fn settle(&self, delta: i64) -> SharedFuture<'_, ()>;

    fn quota_in_force(&self) -> Option<Quota>;

    /// Stores `quota` for every process (a limit the server stated).
    fn adopt(&self, quota: Quota) -> SharedFuture<'_, ()>;

    /// Why a resolver gave no usable limiter.
    fn unresolved(&self) -> Option<&'static str> {
        None
    }
}

/// A limiter no call may be admitted through (its resolver panicked): the
/// credential's calls are refused, and told why.
#[derive(Debug)]
pub(crate) struct Unresolved;

impl SharedLimiter for Unresolved {
    fn reserve_n(
        &self,
        _: u32,
        _: Duration,
        _: Duration,
    ) -> SharedFuture<'_, Result<Duration, ReserveError>> {
        Box::pin(core::future::ready(Err(ReserveError::Unavailable {
            retry_after: UNRESOLVED_RETRY,
        })))
    }

    fn penalize_all(&self, _: Duration) -> SharedFuture<'_, ()> {
        Box::pin(core::future::ready(()))
    }

    fn settle(&self, _: i64) -> SharedFuture<'_, ()> {
        Box::pin(core::future::ready(()))
    }

    fn quota_in_force(&self) -> Option<Quota> {
        None
    }

    fn adopt(&self, _: Quota) -> SharedFuture<'_, ()> {
        Box::pin(core::future::ready(()))
    }

    fn unresolved(&self) -> Option<&'static str> {
        Some(
            "the resolver of this credential's shared quota panicked; nothing is sent \
             until it returns a limiter",
        )
    }
}

pub(crate) const UNRESOLVED_RETRY: Duration = Duration::from_secs(1);

impl<L: RateLimiter> SharedLimiter for L {
    fn reserve_n(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> SharedFuture<'_, Result<Duration, ReserveError>> {
        Box::pin(self.reserve_after(n, not_before, max_wait))
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

    fn quota_in_force(&self) -> Option<Quota> {
        self.quota()
    }

    fn adopt(&self, quota: Quota) -> SharedFuture<'_, ()> {
        Box::pin(self.set_quota(quota))
    }
}

/// Finds the shared limiter of a credential not registered by name.
pub(crate) type SharedResolver = dyn Fn(&str) -> Option<Arc<dyn SharedLimiter>> + Send + Sync;

pub(crate) type SharedCost = (String, Arc<dyn SharedLimiter>);

/// Credentials and weighted quotas kept in shared limiters, and what
/// this process owes them.
#[derive(Default)]
pub(in crate::admission) struct Shared {
    pub(in crate::admission) by_name: HashMap<String, Arc<dyn SharedLimiter>>,
    pub(in crate::admission) resolver: Option<Box<SharedResolver>>,
    /// Per credential, by `Builder::shared_resource`.
    pub(in crate::admission) resources: HashMap<String, Vec<SharedCost>>,
    /// For other credentials, by `Builder::shared_resources`.
    pub(in crate::admission) resource_resolvers: Vec<(String, Box<SharedResolver>)>,
    /// Owed and not yet sent, by credential and quota name: queued where no
    /// `.await` is possible, sent by the next push for the credential.
    owed: parking_lot::Mutex<HashMap<String, Vec<Owed>>>,
    /// Each shared quota's quota in force as last seen, and its changes.
    pub(in crate::admission) watches: Watches,
}

#[derive(Debug)]
struct Owed {
    name: String,
    /// Net cells to charge (> 0) or give back (< 0).
    delta: i64,
    /// A hold until this instant (layer clock; 0 for none).
    hold_until: u64,
    quota: Option<Quota>,
}

impl Shared {
    /// `credential`'s weighted quotas in shared limiters: named ones first,
    /// then those a resolver finds.
    #[inline]
    pub(in crate::admission) fn resources_of(&self, credential: &str) -> Cow<'_, [SharedCost]> {
        if self.resources.is_empty() && self.resource_resolvers.is_empty() {
            return Cow::Borrowed(&[]);
        }
        let named = self
            .resources
            .get(credential)
            .map_or(&[][..], Vec::as_slice);
        if self.resource_resolvers.is_empty() {
            return Cow::Borrowed(named);
        }
        let mut all = named.to_vec();
        for (name, resolve) in &self.resource_resolvers {
            if all.iter().any(|(n, _)| n == name) {
                continue;
            }
            if let Some(limiter) = resolve(credential) {
                all.push((name.clone(), limiter));
            }
        }
        Cow::Owned(all)
    }

    #[inline]
    pub(in crate::admission) fn has_resource(&self, credential: &str, name: &str) -> bool {
        self.limiter_of_resource(credential, name).is_some()
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.resources.is_empty()
            && self.resource_resolvers.is_empty()
            && self.by_name.is_empty()
            && self.resolver.is_none()
    }

    fn limiter_of(&self, credential: &str, name: &str) -> Option<Arc<dyn SharedLimiter>> {
        if name == REQUESTS {
            return self.get(credential);
        }
        self.limiter_of_resource(credential, name)
    }

    fn limiter_of_resource(&self, credential: &str, name: &str) -> Option<Arc<dyn SharedLimiter>> {
        if self.resources.is_empty() && self.resource_resolvers.is_empty() {
            return None;
        }
        if let Some((_, l)) = self
            .resources
            .get(credential)
            .and_then(|r| r.iter().find(|(n, _)| n == name))
        {
            return Some(l.clone());
        }
        let (_, resolve) = self.resource_resolvers.iter().find(|(n, _)| n == name)?;
        resolve(credential)
    }

    fn owe(&self, credential: &str, name: &str, f: impl FnOnce(&mut Owed)) {
        let mut owed = self.owed.lock();
        let queued = owed.entry(credential.to_string()).or_default();
        let i = match queued.iter().position(|o| o.name == name) {
            Some(i) => i,
            None => {
                queued.push(Owed {
                    name: name.to_string(),
                    delta: 0,
                    hold_until: 0,
                    quota: None,
                });
                queued.len() - 1
            }
        };
        f(&mut queued[i]);
    }

    /// Queues `delta` cells for `credential`'s shared quota `name`.
    pub(in crate::admission) fn queue_settle(&self, credential: &str, name: &str, delta: i64) {
        if delta != 0 {
            self.owe(credential, name, |o| {
                o.delta = o.delta.saturating_add(delta)
            });
        }
    }

    /// Queues a hold of `credential`'s shared quota `name` until `until`.
    pub(in crate::admission) fn queue_hold(&self, credential: &str, name: &str, until: u64) {
        self.owe(credential, name, |o| o.hold_until = o.hold_until.max(until));
    }

    /// Queues a stated limit for `credential`'s shared quota `name`: a
    /// `learned` quota takes it up or down, any other only if lower. Nothing
    /// is queued if already in force, so it is stored once across processes.
    pub(in crate::admission) fn queue_stated(
        &self,
        credential: &str,
        name: &str,
        stated: (u64, Duration),
        learned: bool,
    ) {
        let Some(limiter) = self.limiter_of(credential, name) else {
            return;
        };
        if let Some(quota) = stated_quota(limiter.quota_in_force(), stated, learned, true) {
            self.owe(credential, name, |o| o.quota = Some(quota));
        }
    }

    pub(in crate::admission) fn owes(&self, credential: &str) -> bool {
        !self.is_empty() && self.owed.lock().contains_key(credential)
    }

    /// Sends what `credential`'s shared limiters are owed, each once (taken
    /// from the queue before the round trips). The quota first, so a settle
    /// or hold counts in its cells.
    pub(in crate::admission) async fn push_owed(&self, credential: &str, now: u64) {
        if self.is_empty() {
            return;
        }
        let Some(queued) = self.owed.lock().remove(credential) else {
            return;
        };
        for owed in queued {
            let Some(limiter) = self.limiter_of(credential, &owed.name) else {
                continue;
            };
            if let Some(quota) = owed.quota {
                limiter.adopt(quota).await;
            }
            if owed.delta != 0 {
                limiter.settle(owed.delta).await;
            }
            if owed.hold_until > now {
                limiter
                    .penalize_all(Duration::from_nanos(owed.hold_until - now))
                    .await;
            }
            self.watches
                .of(credential, &owed.name)
                .observe(limiter.quota_in_force(), now);
        }
    }

    fn owing(&self) -> Vec<String> {
        if self.is_empty() {
            return Vec::new();
        }
        self.owed.lock().keys().cloned().collect()
    }

    #[inline]
    pub(in crate::admission) fn get(&self, credential: &str) -> Option<Arc<dyn SharedLimiter>> {
        if let Some(l) = self.by_name.get(credential) {
            return Some(l.clone());
        }
        self.resolver.as_ref().and_then(|r| r(credential))
    }

    #[inline]
    pub(in crate::admission) fn contains(&self, credential: &str) -> bool {
        if self.by_name.is_empty() && self.resolver.is_none() {
            return false;
        }
        self.by_name.contains_key(credential) || self.get(credential).is_some()
    }
}

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// Pushes pending holds and queued settles of shared quotas (see
    /// [`Builder::shared_quota`](crate::admission::Builder::shared_quota) and
    /// [`Builder::shared_resource`](crate::admission::Builder::shared_resource))
    /// to their shared limiters now, so other processes hold back too.
    /// [`Ticket::observe`](crate::admission::Ticket::observe) cannot await and
    /// only queues them; the next `admit` on the credential, or
    /// [`Runner`](crate::admission::Runner), also pushes them.
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
        let now = self.inner.clock.now_nanos();
        for credential in shared.owing() {
            shared.push_owed(&credential, now).await;
        }
    }

    /// Sends what `credential`'s shared limiters are owed, if anything.
    pub(in crate::admission) async fn push_owed(&self, credential: &str) {
        let shared = &self.inner.rates.shared;
        if shared.owes(credential) {
            shared
                .push_owed(credential, self.inner.clock.now_nanos())
                .await;
        }
    }

    /// Pushes `credential`'s pending shared hold and queued settles.
    pub(in crate::admission) async fn push_shared(&self, credential: &str) {
        if let Some(shared) = self.inner.rates.shared.get(credential) {
            self.push_penalty(credential, shared.as_ref()).await;
        }
        self.push_owed(credential).await;
    }

    /// Reserves the call's cost on each shared weighted quota within
    /// `max_wait`, each no earlier than the latest instant so far; records
    /// them in `reserved` (refunded if not admitted) and their turns in
    /// `turns`. Returns the longest wait, or the first refusal.
    pub(super) async fn reserve_shared_costs(
        &self,
        spec: &CallSpec,
        limiters: &[SharedCost],
        not_before: Duration,
        max_wait: Duration,
        reserved: &mut Reserved<'_, S, C>,
        (now, turns): (u64, &mut Vec<(Arc<Watch>, Turn)>),
    ) -> Result<Duration, Refusal> {
        let resources = &self.inner.rates.resources;
        let mut wait = not_before;
        for (name, limiter) in limiters {
            let cells = spec.cost_of(name).unwrap_or(0);
            let Some(i) = resources.iter().position(|r| r.name == *name) else {
                continue;
            };
            if cells == 0 {
                continue;
            }
            match limiter.reserve_n(cells, wait, max_wait).await {
                Ok(w) => {
                    wait = wait.max(w);
                    reserved.push_shared(Source::Resource(i), cells);
                    turns.push(self.shared_turn(&spec.credential, name, limiter.as_ref(), now, w));
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

    /// Queues what a reply says about `credential`'s shared quotas: stated
    /// limits, and a spent weighted quota held until its reset (capped).
    pub(in crate::admission) fn note_shared(
        &self,
        credential: &str,
        spent: Option<&Policy>,
        hint: &ServerHint,
    ) {
        let rates = &self.inner.rates;
        let shared = &rates.shared;
        if shared.is_empty() || hint.policies.is_empty() {
            return;
        }
        // Fixed rates keep a shared request quota fixed, as a local one.
        let adaptive = rates.learned.is_adaptive();
        if let Some(stated) = super::learned::server_limit(hint)
            && adaptive
            && shared.contains(credential)
        {
            shared.queue_stated(credential, REQUESTS, stated, true);
        }
        let now = self.inner.clock.now_nanos();
        for (name, _) in shared.resources_of(credential).iter() {
            let named = |p: &&Policy| p.name.as_deref().is_some_and(|n| same_name(n, name));
            let Some(policy) = hint.policies.iter().find(named) else {
                continue;
            };
            let learned = rates.resources.iter().any(|r| r.name == *name && r.learned);
            if let (Some(limit), Some(window)) = (policy.quota, policy.window)
                && (adaptive || learned)
            {
                shared.queue_stated(credential, name, (limit, window), learned);
            }
            let hold = match (policy.remaining, policy.reset_after) {
                (Some(0), Some(reset)) => Some(reset),
                _ if spent.is_some_and(|s| named(&s)) => Some(
                    policy
                        .reset_after
                        .or(hint.retry_after)
                        .unwrap_or(crate::retry::RetryPolicy::BARE_429_HOLD),
                ),
                _ => None,
            };
            if let Some(wait) = hold {
                let held = saturating_nanos(wait.min(rates.max_retry_after));
                shared.queue_hold(credential, name, now.saturating_add(held));
            }
        }
    }

    /// The turn of cells just taken from `credential`'s shared quota `name`,
    /// usable `wait` after `now`.
    pub(super) fn shared_turn(
        &self,
        credential: &str,
        name: &str,
        limiter: &dyn SharedLimiter,
        now: u64,
        wait: Duration,
    ) -> (Arc<Watch>, Turn) {
        let watch = self.inner.rates.shared.watches.of(credential, name);
        watch.observe(limiter.quota_in_force(), self.inner.clock.now_nanos());
        let turn = watch.turn(now.saturating_add(saturating_nanos(wait)));
        (watch, turn)
    }

    pub(super) async fn push_penalty(&self, credential: &str, shared: &dyn SharedLimiter) {
        let pending = self.inner.rates.pending.lock().remove(credential);
        if let Some(until) = pending {
            let now = self.inner.clock.now_nanos();
            if until > now {
                shared.penalize_all(Duration::from_nanos(until - now)).await;
                let watch = self.inner.rates.shared.watches.of(credential, REQUESTS);
                watch.observe(shared.quota_in_force(), self.inner.clock.now_nanos());
            }
        }
    }
}
