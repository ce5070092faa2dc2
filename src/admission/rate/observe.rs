//! What the server says back: a reply's status and headers become holds,
//! lowered local quotas and food for the learned rate. The one place a
//! server's wait is turned into a hold.

use core::time::Duration;
use std::borrow::Cow;
use std::sync::Arc;

use super::super::spec::REQUESTS;
use super::super::tools::ToolState;
use super::super::Admission;
use super::learned::CredentialState;
use super::{charge, Resource};
use crate::bucket::Quota;
use crate::clock::{saturating_nanos, Clock};
use crate::headers::ServerHint;
use crate::retry::{reply_class, ReplyClass};
use crate::sleep::Sleeper;
use crate::sync::Ordering;

/// The tool of an answer: the state a ticket holds, or a name to look up.
#[derive(Clone, Copy)]
pub(in crate::admission) enum Tool<'a> {
    Held(&'a Arc<ToolState>),
    Named(&'a str),
}

impl<S, C> Admission<S, C>
where
    S: Sleeper,
    C: Clock,
{
    /// Applies a server's answer for `credential` (and `tool`) without a
    /// ticket, e.g. for a call made outside this layer. Returns the hold
    /// applied. See [`Ticket::observe`](crate::admission::Ticket::observe).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::headers::ServerHint;
    /// use std::time::{Duration, SystemTime};
    /// let admission = Admission::builder().build();
    /// let hint = ServerHint::from_headers([("retry-after", "3")], SystemTime::now());
    /// assert_eq!(admission.observe("search", "key", 429, &hint), Some(Duration::from_secs(3)));
    /// ```
    pub fn observe(
        &self,
        tool: &str,
        credential: &str,
        status: u16,
        hint: &ServerHint,
    ) -> Option<Duration> {
        let now = self.inner.clock.now_nanos();
        let class = reply_class(Some(status), hint);
        self.observe_sent(Tool::Named(tool), credential, None, class, hint, now)
    }

    /// [`observe`](Self::observe) for a request sent at `sent_at` (layer
    /// clock): the learned rate ignores 429s sent before its last decrease.
    /// `tool` is the ticket's tool state, or a name to look up; `held` the
    /// ticket's credential state, if there is a ticket (else looked up).
    pub(in crate::admission) fn observe_sent(
        &self,
        tool: Tool<'_>,
        credential: &str,
        held: Option<&CredentialState>,
        class: ReplyClass,
        hint: &ServerHint,
        sent_at: u64,
    ) -> Option<Duration> {
        self.note_silence(hint);
        let hint = self.as_read(hint);
        let hint = &*hint;
        // A 429 for another quota than requests is no verdict on the request
        // rate; it holds that quota alone when the layer has it.
        let capacity = class == ReplyClass::Capacity;
        if let (ReplyClass::Success, Tool::Held(state)) = (class, tool)
            && self.inner.rates.learned.is_adaptive()
        {
            state.note_answered(credential, sent_at);
        }
        let spent = if capacity { spent_quota(hint) } else { None };
        self.learn(credential, held, class, spent.is_some(), hint, sent_at);
        self.note_stated(credential, held, hint, sent_at);
        self.follow_weighted_quotas(credential, hint);
        self.note_shared(credential, spent, hint);
        if capacity {
            self.fit_to_window(credential, spent, hint, sent_at);
        }
        if let Some(policy) = spent
            && let Some(held) = self.hold_spent_quota(credential, policy, hint)
        {
            return Some(held);
        }
        let wait = match request_wait(hint, &self.inner.rates.resources) {
            Some(w) => w,
            // A bare 429: hold the key for the same hold the retry policy waits.
            None if capacity => crate::retry::RetryPolicy::BARE_429_HOLD,
            None => return None,
        };
        Some(self.hold_requests(tool, credential, hint, wait))
    }

    /// Told a provider, counts replies until one states a limit; at the
    /// `SILENT_REPLIES`th without one, warns once (headers are not reaching
    /// the layer).
    fn note_silence(&self, hint: &ServerHint) {
        let rates = &self.inner.rates;
        if rates.provider_window.is_none() {
            return;
        }
        // Relaxed (all): a statistic and a one-time warning.
        if states_limits(hint) {
            rates.unstated.store(u64::MAX, Ordering::Relaxed);
            return;
        }
        let n = rates.unstated.load(Ordering::Relaxed);
        if n >= super::SILENT_REPLIES {
            return;
        }
        let n = rates.unstated.fetch_add(1, Ordering::Relaxed) + 1;
        if n == super::SILENT_REPLIES {
            #[cfg(feature = "tracing")]
            tracing::event!(
                tracing::Level::WARN,
                replies = n,
                "backpressure: told a provider, but none of its replies stated a limit: \
                 no rate or token quota is learned (are the reply's headers reaching the layer?)"
            );
        }
    }

    /// The hint as this layer reads it: the provider's window on unwindowed
    /// limits, and this layer's share of a shared key.
    fn as_read<'h>(&self, hint: &'h ServerHint) -> Cow<'h, ServerHint> {
        let rates = &self.inner.rates;
        let mut hint = Cow::Borrowed(hint);
        if let Some(window) = rates.provider_window
            && needs_window(&hint)
        {
            hint = Cow::Owned(with_window(&hint, window));
        }
        if let Some(share) = rates.key_share
            && states_limits(&hint)
        {
            hint = Cow::Owned(with_share(&hint, share));
        }
        hint
    }

    /// Feeds the learned rate (local credentials only). A 429 for another
    /// quota is no verdict on the rate (status 0).
    fn learn(
        &self,
        credential: &str,
        held: Option<&CredentialState>,
        class: ReplyClass,
        other_quota: bool,
        hint: &ServerHint,
        sent_at: u64,
    ) {
        let inner = &*self.inner;
        if inner.rates.shared.contains(credential) {
            return;
        }
        let class = (!other_quota).then_some(class);
        inner.rates.learned.observe(
            (credential, held),
            class,
            hint,
            sent_at,
            inner.clock.now_nanos(),
            &inner.rates.credentials,
        );
    }

    /// A weighted quota the server reports on: spent, it is held alone until
    /// its reset; with less left than believed (another user of the key), the
    /// difference is charged here. The server's count can only be stale by
    /// requests the local bucket already holds, so taking the smaller never
    /// admits more than the server has left.
    fn follow_weighted_quotas(&self, credential: &str, hint: &ServerHint) {
        let inner = &*self.inner;
        let key = credential;
        for resource in inner.rates.resources.iter() {
            let Some(policy) = hint.policies.iter().find(|p| {
                p.name
                    .as_deref()
                    .is_some_and(|n| same_name(n, &resource.name))
            }) else {
                continue;
            };
            if inner.rates.learned.is_adaptive() || resource.learned {
                lower_to_server(resource, key, policy);
            }
            match (policy.remaining, policy.reset_after) {
                (Some(0), Some(reset)) => {
                    let _ = resource.buckets.penalize_told(
                        key,
                        reset.min(inner.rates.max_retry_after),
                        reset,
                    );
                }
                (Some(left), _) => {
                    let believed = resource.buckets.available(key);
                    let left = u32::try_from(left).unwrap_or(u32::MAX);
                    if left < believed {
                        charge(
                            &resource.buckets,
                            key,
                            believed - left,
                            inner.clock.now_nanos(),
                            inner.rates.max_retry_after,
                        );
                    }
                }
                _ => {}
            }
        }
    }

    /// A 429 for a metered weighted quota holds that quota alone (capped);
    /// `None` if not metered, so the requests are held instead.
    fn hold_spent_quota(
        &self,
        credential: &str,
        policy: &crate::headers::Policy,
        hint: &ServerHint,
    ) -> Option<Duration> {
        let inner = &*self.inner;
        let wait = policy
            .reset_after
            .or(hint.retry_after)
            .unwrap_or(crate::retry::RetryPolicy::BARE_429_HOLD);
        let name = policy.name.as_deref().unwrap_or_default();
        let resource = inner
            .rates
            .resources
            .iter()
            .find(|r| same_name(&r.name, name))?;
        let held = wait.min(inner.rates.max_retry_after);
        let _ = resource.buckets.penalize_told(credential, held, wait);
        Some(held)
    }

    /// Holds the requests for the server's `wait`, capped at
    /// `max_retry_after`; returns the capped hold. A named scope holds only
    /// its calls; a shared credential's hold is pushed by its next admit.
    fn hold_requests(
        &self,
        tool: Tool<'_>,
        credential: &str,
        hint: &ServerHint,
        told: Duration,
    ) -> Duration {
        let inner = &*self.inner;
        let key = credential.to_string();
        let wait = told.min(inner.rates.max_retry_after);
        match &hint.scope {
            Some(scope) => {
                let key = (key, scope.clone());
                let state = match tool {
                    Tool::Held(state) => Some(state.clone()),
                    // A tool the registry cannot hold now learns its scope later.
                    Tool::Named(name) => inner.slots.tool(name).ok(),
                };
                // The limit's own rate, before its hold (a quota change after it
                // would stretch the hold): just under what it let through.
                if let Some(state) = &state
                    && inner.rates.learned.is_adaptive()
                {
                    let now = inner.clock.now_nanos();
                    let period = match state.answered_per_second(credential, now) {
                        0 => told.max(Duration::from_millis(1)),
                        n => Duration::from_secs_f64(1.0 / (0.9 * n as f64)),
                    };
                    let scopes = &inner.rates.server_scopes;
                    if period > scopes.period_of(&key) {
                        let _ = scopes.set_learned_quota(&key, Quota::with_period(period));
                    }
                }
                // A named limit: hold back only the calls under it (this tool's).
                let _ = inner.rates.server_scopes.penalize_told(&key, wait, told);
                if let Some(state) = state {
                    *state.server_scope.write() = Some(scope.clone());
                    // Release: see `take_rate`.
                    state.scoped.store(true, Ordering::Release);
                }
            }
            None if inner.rates.shared.contains(credential) => {
                // Reaching the shared limiter needs an await: the next admit does it.
                let until = inner
                    .clock
                    .now_nanos()
                    .saturating_add(saturating_nanos(wait));
                let mut pending = inner.rates.pending.lock();
                let slot = pending.entry(key).or_insert(0);
                *slot = (*slot).max(until);
            }
            None => {
                let _ = inner.rates.credentials.penalize_told(&key, wait, told);
            }
        }
        wait
    }

    /// Lifts every server hold on `credential` (its request and weighted
    /// quotas start full again; a pending shared hold is dropped), for an
    /// operator who knows the server's wait was wrong. Server-scope holds
    /// run out by themselves.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::headers::ServerHint;
    /// use std::time::SystemTime;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().build();
    /// let hint = ServerHint::from_headers([("retry-after", "999999999")], SystemTime::now());
    /// admission.observe("search", "key", 429, &hint);
    /// assert!(admission.admit(&CallSpec::new("search", "key")).await.is_err());
    /// admission.lift_hold("key");
    /// assert!(admission.admit(&CallSpec::new("search", "key")).await.is_ok());
    /// # });
    /// ```
    pub fn lift_hold(&self, credential: &str) {
        let inner = &*self.inner;
        inner.rates.credentials.reset(credential);
        for resource in inner.rates.resources.iter() {
            resource.buckets.reset(credential);
        }
        inner.rates.pending.lock().remove(credential);
    }
}

/// Whether a policy name and a quota name are the same quota
/// (`input-tokens` is `input_tokens`, in any case).
pub(super) fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes().zip(b.bytes()).all(|(x, y)| {
            let norm = |c: u8| {
                if c == b'-' {
                    b'_'
                } else {
                    c.to_ascii_lowercase()
                }
            };
            norm(x) == norm(y)
        })
}

/// Whether a named limit in `hint` states no window (OpenAI's headers).
fn needs_window(hint: &ServerHint) -> bool {
    hint.policies
        .iter()
        .any(|p| p.name.is_some() && p.quota.is_some() && p.window.is_none())
}

fn states_limits(hint: &ServerHint) -> bool {
    hint.limit.is_some() || hint.policies.iter().any(|p| p.quota.is_some())
}

/// `hint` as this layer's share of the key: each limit `L` becomes
/// `floor(L x share)` (at least 1), and remaining is reduced by the
/// headroom `L - floor(L x share)`, reading 0 once spent below it.
fn with_share(hint: &ServerHint, share: f64) -> ServerHint {
    let part = |limit: u64| -> u64 {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let mine = ((limit as f64) * share).floor() as u64;
        mine.clamp(limit.min(1), limit)
    };
    let mut hint = hint.clone();
    if let Some(limit) = hint.limit {
        let mine = part(limit);
        hint.remaining = hint.remaining.map(|r| r.saturating_sub(limit - mine));
        hint.limit = Some(mine);
    }
    for p in &mut hint.policies {
        if let Some(limit) = p.quota {
            let mine = part(limit);
            p.remaining = p.remaining.map(|r| r.saturating_sub(limit - mine));
            p.quota = Some(mine);
        }
    }
    hint
}

fn with_window(hint: &ServerHint, window: Duration) -> ServerHint {
    let mut hint = hint.clone();
    for p in &mut hint.policies {
        if p.name.is_some() && p.quota.is_some() && p.window.is_none() {
            p.window = Some(window);
        }
    }
    hint
}

/// A weighted quota's stated limit is a ceiling: a configured quota above
/// it is lowered to it (keeping its burst), one below is left alone; a
/// learned quota takes a second's worth of burst.
fn lower_to_server<C: Clock>(resource: &Resource<C>, key: &str, policy: &crate::headers::Policy) {
    let (Some(limit), Some(window)) = (policy.quota, policy.window) else {
        return;
    };
    let current = resource.buckets.quota_of(key);
    if let Some(lowered) = stated_quota(Some(current), (limit, window), resource.learned, false) {
        // Refused only past the registry's cap: the configured quota stays.
        let _ = resource.buckets.set_quota(key, lowered);
    }
}

/// What the stated `limit` per `window` makes of `current`, or `None` if
/// unchanged. Only lowers, unless `learned` and `raise`. A learned or
/// unknown quota takes a second's worth of burst (see `Provider`).
pub(super) fn stated_quota(
    current: Option<Quota>,
    (limit, window): (u64, Duration),
    learned: bool,
    raise: bool,
) -> Option<Quota> {
    if limit == 0 || window.is_zero() {
        return None;
    }
    let server = limit as f64 / window.as_secs_f64();
    let lowers = current.is_none_or(|q| server < 1e9 / q.period().as_nanos().max(1) as f64);
    if !(lowers || learned && raise) {
        return None;
    }
    let burst = match current {
        Some(q) if !learned => q
            .burst()
            .get()
            .min(u32::try_from(limit).unwrap_or(u32::MAX)),
        _ => super::provider::learned_burst(server, limit),
    };
    Quota::new(server, burst)
        .ok()
        .filter(|q| current != Some(*q))
}

/// The quota a 429 says is spent, if not requests: a named policy with
/// nothing left while requests have some; failing that, the policy with
/// the smallest share of its limit left, if not `requests`.
fn spent_quota(hint: &ServerHint) -> Option<&crate::headers::Policy> {
    let is_requests = |p: &crate::headers::Policy| p.name.as_deref() == Some(REQUESTS);
    let requests_left = hint
        .policies
        .iter()
        .find(|p| is_requests(p))
        .and_then(|p| p.remaining);
    if requests_left == Some(0) {
        return None;
    }
    let named = || hint.policies.iter().filter(|p| p.name.is_some());
    if let Some(spent) = named().find(|p| !is_requests(p) && p.remaining == Some(0)) {
        return Some(spent);
    }
    requests_left?;
    let share = |p: &crate::headers::Policy| {
        let of = p.quota.filter(|&q| q > 0)?;
        Some(p.remaining? as f64 / of as f64)
    };
    // Without the requests' limit their share is unknown; an unknown limit
    // counts as a full share.
    let requests_known = named().any(|p| is_requests(p) && share(p).is_some());
    named()
        .filter(|p| requests_known || !is_requests(p))
        .filter_map(|p| Some((share(p).or(p.remaining.map(|_| 1.0))?, p)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, p)| p)
        .filter(|p| !is_requests(p))
}

/// The wait the reply puts on the credential's requests: `Retry-After`,
/// or a spent request limit until its reset (a spent weighted quota holds
/// only itself).
fn request_wait<C: Clock>(hint: &ServerHint, resources: &[Resource<C>]) -> Option<Duration> {
    if hint.retry_after.is_some() {
        return hint.retry_after;
    }
    let is_resource =
        |name: Option<&str>| name.is_some_and(|n| resources.iter().any(|r| r.name == n));
    let top = (hint.remaining == Some(0)
        && !hint
            .policies
            .iter()
            .any(|p| is_resource(p.name.as_deref()) && p.remaining == Some(0)))
    .then_some(hint.reset_after)
    .flatten();
    let policies = hint
        .policies
        .iter()
        .filter(|p| p.remaining == Some(0) && !is_resource(p.name.as_deref()))
        .filter_map(|p| p.reset_after);
    top.into_iter().chain(policies).max()
}

#[cfg(all(test, not(feature = "loom")))]
#[path = "observe_tests.rs"]
mod tests;
