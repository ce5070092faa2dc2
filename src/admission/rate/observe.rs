//! What the server says back: a reply's status and headers become holds
//! (on the credential, a weighted quota or a server scope), a lowered
//! local quota when the server has less left, and food for the learned
//! rate. The one place a server's wait is turned into a hold.

use core::time::Duration;
use std::borrow::Cow;
use std::sync::Arc;

use super::super::spec::REQUESTS;
use super::super::tools::ToolState;
use super::super::Admission;
use super::{charge, Resource};
use crate::bucket::Quota;
use crate::clock::{saturating_nanos, Clock};
use crate::headers::ServerHint;
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
    /// ticket, e.g. from a response of a call made outside this layer.
    /// Returns the hold applied. See [`Ticket::observe`](crate::admission::Ticket::observe).
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
        self.observe_sent(Tool::Named(tool), credential, status, hint, now)
    }

    /// [`observe`](Self::observe) for a request sent at `sent_at` (on the
    /// layer's clock): the learned rate ignores 429s of requests sent
    /// before its last decrease. `tool` is the call's tool state when the
    /// caller holds it (a ticket does), else it is looked up by name.
    ///
    /// In order: the hint as this layer reads it (the provider's window,
    /// its share of the key), the learned rate, the weighted quotas the
    /// server reports on, a spent weighted quota's hold, then the
    /// requests' hold (on a server scope, a shared credential or the
    /// credential).
    pub(in crate::admission) fn observe_sent(
        &self,
        tool: Tool<'_>,
        credential: &str,
        status: u16,
        hint: &ServerHint,
        sent_at: u64,
    ) -> Option<Duration> {
        self.note_silence(hint);
        let hint = self.as_read(hint);
        let hint = &*hint;
        // A 429 for another quota than requests (tokens spent, requests
        // left) says nothing about the request rate: it is not fed to it,
        // and it holds that quota alone when the layer has it.
        let spent = if status == 429 {
            spent_quota(hint)
        } else {
            None
        };
        self.learn(credential, status, spent.is_some(), hint, sent_at);
        self.note_stated(credential, hint, sent_at);
        self.follow_weighted_quotas(credential, hint);
        self.note_shared(credential, spent, hint);
        if status == 429 {
            self.fit_to_window(credential, spent, hint, sent_at);
        }
        if let Some(policy) = spent
            && let Some(held) = self.hold_spent_quota(credential, policy, hint)
        {
            return Some(held);
        }
        let wait = match request_wait(hint, &self.inner.rates.resources) {
            Some(w) => w,
            // A 429 with no hint: hold the key back (a second) rather than
            // let the next call find out the same way; the retry policy
            // waits the same hold.
            None if status == 429 => crate::retry::RetryPolicy::BARE_429_HOLD,
            None => return None,
        };
        Some(self.hold_requests(tool, credential, hint, wait))
    }

    /// Told a provider, counts its replies until one states a limit; at
    /// the `SILENT_REPLIES`th without one, says once (a `tracing`
    /// warning, and `AdmissionStats::provider_silent`) that the learned
    /// limits and token quotas it was told to expect are off: a recipe
    /// that hands the layer no headers, or a gateway that strips them.
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

    /// The hint as this layer reads it: told the provider, its limits
    /// count per minute; on a key shared with others, this layer's part
    /// of each limit.
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

    /// Feeds the learned rate (a local credential's; a shared one is not
    /// adapted). The new rate is set before any hold (see
    /// `Learned::observe`); a 429 for another quota is no verdict on the
    /// rate (status 0: only a request limit the reply states is taken).
    fn learn(
        &self,
        credential: &str,
        status: u16,
        other_quota: bool,
        hint: &ServerHint,
        sent_at: u64,
    ) {
        let inner = &*self.inner;
        if inner.rates.shared.contains(credential) {
            return;
        }
        let status = if other_quota { 0 } else { status };
        inner.rates.learned.observe(
            credential,
            status,
            hint,
            sent_at,
            inner.clock.now_nanos(),
            &inner.rates.credentials,
        );
    }

    /// A weighted quota the server reports on (a policy of the same
    /// name): spent, it is held until its reset, alone; with less left
    /// than this process believes (another process, or a job, spends the
    /// same key), the difference is charged here, so the next calls wait
    /// for what the server will really allow. The server's count can only
    /// be stale by requests it has not seen yet, which the local bucket
    /// already holds: taking the smaller never admits more than the
    /// server has left.
    fn follow_weighted_quotas(&self, credential: &str, hint: &ServerHint) {
        let inner = &*self.inner;
        let key = credential.to_string();
        for resource in inner.rates.resources.iter() {
            let Some(policy) = hint.policies.iter().find(|p| {
                p.name
                    .as_deref()
                    .is_some_and(|n| same_name(n, &resource.name))
            }) else {
                continue;
            };
            if inner.rates.learned.is_adaptive() || resource.learned {
                lower_to_server(resource, &key, policy);
            }
            match (policy.remaining, policy.reset_after) {
                (Some(0), Some(reset)) => {
                    let _ = resource.buckets.penalize_told(
                        &key,
                        reset.min(inner.rates.max_retry_after),
                        reset,
                    );
                }
                (Some(left), _) => {
                    let believed = resource.buckets.available(&key);
                    let left = u32::try_from(left).unwrap_or(u32::MAX);
                    if left < believed {
                        charge(
                            &resource.buckets,
                            &key,
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

    /// A 429 for a weighted quota the layer meters holds that quota alone
    /// (until its reset, capped): the hold applied. `None` when the layer
    /// does not meter it: holding the requests is then the only way not
    /// to hear the same 429 again at once.
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
        let _ = resource
            .buckets
            .penalize_told(&credential.to_string(), held, wait);
        Some(held)
    }

    /// Holds the requests for the server's `wait`, capped at
    /// `max_retry_after` alike for every hold; the capped hold is what is
    /// returned. A named limit holds only the calls under its scope; a
    /// shared credential's hold is pushed by its next admit.
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
                // The server named the limit: hold back only the calls that
                // fall under it (this tool's, from now on).
                let _ = inner
                    .rates
                    .server_scopes
                    .penalize_told(&(key, scope.clone()), wait, told);
                let state = match tool {
                    Tool::Held(state) => Some(state.clone()),
                    // A tool the registry cannot hold right now learns its
                    // scope on a later reply.
                    Tool::Named(name) => inner.slots.tool(name).ok(),
                };
                if let Some(state) = state {
                    *state.server_scope.write() = Some(scope.clone());
                    // Release: see `take_rate`.
                    state.scoped.store(true, Ordering::Release);
                }
            }
            None if inner.rates.shared.contains(credential) => {
                // Reaching the shared limiter needs an await: the next admit
                // on this credential applies it before reserving.
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

    /// Lifts every server hold on `credential` (its request quota and its
    /// weighted quotas start full again, and a pending hold for its shared
    /// quota is dropped): for an operator who knows the server's wait was
    /// wrong. Holds on server scopes (`server:<name>`) run out by
    /// themselves.
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
        let key = credential.to_string();
        inner.rates.credentials.reset(&key);
        for resource in inner.rates.resources.iter() {
            resource.buckets.reset(&key);
        }
        inner.rates.pending.lock().remove(credential);
    }
}

/// Whether a server's policy name and a quota's name are the same quota:
/// `input-tokens` (Anthropic's headers) is `input_tokens`, in any case.
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

/// Whether `hint` states a limit (a share of it can be taken).
fn states_limits(hint: &ServerHint) -> bool {
    hint.limit.is_some() || hint.policies.iter().any(|p| p.quota.is_some())
}

/// `hint` as this layer's part of the key: each stated limit `L` becomes
/// `floor(L x share)` (at least 1), and what is left of it is what is
/// left beyond the headroom `L - floor(L x share)` kept for the key's
/// other users. Spent below the headroom, it reads 0 left: the layer
/// holds back until the reset before the others are refused.
fn with_share(hint: &ServerHint, share: f64) -> ServerHint {
    let part = |limit: u64| -> u64 {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let mine = ((limit as f64) * share).floor() as u64;
        // A limit of 0 stays 0 (nothing to share); any other keeps at least 1.
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

/// `hint` with `window` on every named limit that states none.
fn with_window(hint: &ServerHint, window: Duration) -> ServerHint {
    let mut hint = hint.clone();
    for p in &mut hint.policies {
        if p.name.is_some() && p.quota.is_some() && p.window.is_none() {
            p.window = Some(window);
        }
    }
    hint
}

/// A weighted quota's limit, stated by the server for this credential
/// (`x-ratelimit-limit-tokens: 120000`, per minute): a ceiling. A quota
/// configured above it is lowered to it for the credential, keeping its
/// burst (no more than the server's whole limit); one below it is left
/// alone (the operator may mean to leave the rest to others). A learned
/// quota (no limit configured) takes a second's worth of burst (see
/// `Provider`).
fn lower_to_server<C: Clock>(
    resource: &Resource<C>,
    key: &String,
    policy: &crate::headers::Policy,
) {
    let (Some(limit), Some(window)) = (policy.quota, policy.window) else {
        return;
    };
    let current = resource.buckets.quota_of(key);
    if let Some(lowered) = stated_quota(Some(current), (limit, window), resource.learned, false) {
        // Refused only past the registry's cap of per-key quotas: the
        // credential then keeps the configured one.
        let _ = resource.buckets.set_quota(key, lowered);
    }
}

/// The quota `limit` per `window`, a limit the server stated, makes of
/// `current` (`None`: not known), or `None` if it leaves it as it is. It
/// only lowers a quota, keeping its burst up to the limit, unless the
/// quota is `learned` (its limit is the server's to say) and may `raise`.
/// A learned or unknown quota takes a second's worth of burst (see
/// `Provider`: a minute's limit is enforced a second at a time).
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

/// The quota a 429 says is spent when it is not the request count: a named
/// policy other than `requests` with nothing left (`x-ratelimit-remaining-tokens: 0`,
/// `anthropic-ratelimit-tokens-remaining: 0`), while the requests policy,
/// if the reply has one, still has some. When nothing reads zero (a call
/// asking 805 tokens with 400 left; a server counting a minute's limit in
/// slices, whose `remaining` is of the minute), the policy with the
/// smallest share of its limit left, if that is not `requests`.
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
    // Without the requests' limit their share is unknown: requests are
    // left, so the scarcest of the rest (an unknown limit: its remaining
    // counts as a full share).
    let requests_known = named().any(|p| is_requests(p) && share(p).is_some());
    named()
        .filter(|p| requests_known || !is_requests(p))
        .filter_map(|p| Some((share(p).or(p.remaining.map(|_| 1.0))?, p)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, p)| p)
        .filter(|p| !is_requests(p))
}

/// The wait the reply puts on the credential's requests: `Retry-After`, or
/// a spent request limit until its reset. A spent *weighted* quota (a
/// policy named like one) holds only that quota (see `observe_sent`).
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
