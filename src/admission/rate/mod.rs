//! The rate stage, and everything the server says back about rates. A
//! call reserves, all or nothing, its credential's request cell, its
//! weighted costs and its server scope's cell; a wait beyond the inline
//! threshold or deadline is refused with nothing consumed. A server hold
//! is stored as a penalty on the bucket it applies to.

use core::time::Duration;
use std::borrow::Cow;

mod background;
mod fit;
mod held;
pub(super) mod learned;
mod local;
mod observe;
mod provider;
mod refusal;
pub(crate) mod rescales;
mod settle;
pub(super) mod shared;
mod shared_turns;

pub(in crate::admission) use held::{Held, Kept, Reserved};
pub(in crate::admission) use observe::Tool;
pub use provider::Provider;
use refusal::Refusal;
use rescales::{Rescales, Turn};
use settle::charge;

use super::spec::{CallSpec, REQUESTS};
use super::tools::ToolState;
use super::Admission;
use crate::clock::{saturating_nanos, Clock};
use crate::keyed::Scoped;
use crate::sleep::Sleeper;
use crate::sync::Ordering;
use crate::throttled::{Status, Throttled};
use held::Source;

/// Silent replies from a told provider after which the layer reports
/// that every setting depending on them is off.
pub(super) const SILENT_REPLIES: u64 = 16;

/// The scope of a credential's own request quota in a [`Throttled`].
pub(super) const API_KEY: &str = "api_key";

/// The scope of the background share of a credential's request quota.
pub(super) const BACKGROUND: &str = "api_key:background";

/// The rate stage's state.
pub(super) struct Rates<C: Clock> {
    credentials: Scoped<String, C>,
    learned: learned::Learned,
    /// Weighted quotas every credential has (tokens, ...).
    resources: Vec<Resource<C>>,
    /// A cell per (credential, server scope) a tool was seen under.
    server_scopes: Scoped<(String, String), C>,
    inline_wait: Duration,
    max_retry_after: Duration,
    shared: shared::Shared,
    /// Penalties for shared credentials (an instant on our clock), applied
    /// by the next admit on that credential.
    pending: parking_lot::Mutex<std::collections::HashMap<String, u64>>,
    /// The window of limits stated without one (the provider's).
    provider_window: Option<Duration>,
    /// `Builder::key_share`.
    key_share: Option<f64>,
    /// Background calls' share of each credential's rate, if below 1.
    background: Option<background::Background<C>>,
    /// Told a provider: replies that stated no limit, until one does (then
    /// `u64::MAX`).
    unstated: crate::sync::AtomicU64,
}

impl<C: Clock> Rates<C> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        credentials: Scoped<String, C>,
        learned: learned::Learned,
        resources: Vec<Resource<C>>,
        server_scopes: Scoped<(String, String), C>,
        inline_wait: Duration,
        max_retry_after: Duration,
        shared: shared::Shared,
        provider_window: Option<Duration>,
    ) -> Self {
        Self {
            credentials,
            learned,
            resources,
            server_scopes,
            inline_wait,
            max_retry_after,
            shared,
            pending: parking_lot::Mutex::new(std::collections::HashMap::new()),
            provider_window,
            key_share: None,
            background: None,
            unstated: crate::sync::AtomicU64::new(0),
        }
    }

    pub(super) fn with_background_share(mut self, share: Option<f64>, clock: C) -> Self {
        self.background = share
            .filter(|s| *s < 1.0)
            .map(|s| background::Background::new(s, &self.credentials, clock));
        self
    }

    pub(super) fn with_key_share(mut self, share: Option<f64>) -> Self {
        self.key_share = share;
        self
    }

    /// `name`'s learned state, created on first use as of `now` (no later
    /// than the asking call's start, when its request counts as sent).
    #[inline]
    pub(super) fn credential(
        &self,
        name: &str,
        now: u64,
    ) -> std::sync::Arc<learned::CredentialState> {
        self.learned.ensure(name, &self.credentials, now)
    }

    #[cfg(any(feature = "reqwest", feature = "tower"))]
    pub(crate) fn told_provider(&self) -> bool {
        self.provider_window.is_some()
    }

    /// Whether a told provider's first [`SILENT_REPLIES`] stated no limit.
    pub(super) fn provider_silent(&self) -> bool {
        // Relaxed: a statistic.
        let n = self.unstated.load(Ordering::Relaxed);
        self.provider_window.is_some() && (SILENT_REPLIES..u64::MAX).contains(&n)
    }

    #[inline]
    pub(super) fn peek_credential(
        &self,
        name: &str,
    ) -> Option<std::sync::Arc<learned::CredentialState>> {
        self.learned.peek(name)
    }

    pub(super) fn all_credentials(&self) -> Vec<std::sync::Arc<learned::CredentialState>> {
        self.learned.all()
    }

    pub(super) fn learned_rate(&self, credential: &str) -> Option<f64> {
        self.learned.rate(credential)
    }

    #[inline]
    pub(super) fn is_shared(&self, credential: &str) -> bool {
        self.shared.contains(credential)
    }

    /// Whether an admit on `credential` makes a round trip (any quota shared).
    #[inline]
    pub(super) fn is_remote(&self, credential: &str) -> bool {
        self.shared.contains(credential) || !self.shared.resources_of(credential).is_empty()
    }

    /// See `Admission::available`.
    pub(super) fn available(&self, credential: &str, name: &str) -> Option<u32> {
        if name == REQUESTS {
            return (!self.shared.contains(credential))
                .then(|| self.credentials.available(credential));
        }
        if self.shared.has_resource(credential, name) {
            return None;
        }
        self.resources
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.buckets.available(credential))
    }

    /// The names of `credential`'s quotas fitted to a rolling window.
    pub(super) fn windowed(&self, credential: &learned::CredentialState) -> Vec<String> {
        let requests = core::iter::once(Source::Requests);
        let weighted = (0..self.resources.len()).map(Source::Resource);
        requests
            .chain(weighted)
            .filter(|s| s.place().is_some_and(|p| credential.fits.is_fitted(p)))
            .map(|s| match s {
                Source::Resource(i) => self.resources[i].name.clone(),
                _ => REQUESTS.to_string(),
            })
            .collect()
    }

    /// The refusal of a spec whose cost names a quota this layer lacks.
    #[cold]
    pub(super) fn unknown_cost(&self, spec: &CallSpec) -> Option<Throttled> {
        let resources = &self.resources;
        let (name, _) = spec
            .costs
            .iter()
            .find(|(name, _)| name != REQUESTS && !resources.iter().any(|r| r.name == *name))?;
        let known: Vec<&str> = core::iter::once(REQUESTS)
            .chain(resources.iter().map(|r| r.name.as_str()))
            .collect();
        Some(Throttled::new(
            Status::QuotaExhausted,
            format!("quota:{name}"),
            format!(
                "this call costs units of \"{name}\", a quota this layer does not have (it has: {}); \
                 it was refused rather than sent unmetered: fix the cost's name or declare the quota",
                known.join(", ")
            ),
        ))
    }
}

/// A weighted quota every credential has (tokens per minute, ...).
pub(super) struct Resource<C: Clock> {
    pub(super) name: String,
    pub(super) buckets: Scoped<String, C>,
    /// Declared without a limit: each credential's limit is the server's,
    /// learned with a second's burst, and no call costs more than that.
    pub(super) learned: bool,
}

/// What a call's reservations make it wait for.
pub(super) struct Wait {
    pub(super) longest: Duration,
    /// The longest wait of every quota but the request quota.
    pub(super) others: Duration,
    pub(super) requests: Option<RequestCell>,
}

/// A request cell: when it may be used, and the bucket epoch it was
/// reserved under.
#[derive(Clone, Copy, Debug)]
pub(super) struct RequestCell {
    pub(super) ready_at: u64,
    pub(super) epoch: u32,
}

/// When a call reserves: `now`, the longest wait it accepts, and what is
/// left of its deadline (to word a refusal).
#[derive(Clone, Copy, Debug)]
pub(super) struct Instant {
    pub(super) now: u64,
    pub(super) max_wait: Duration,
    pub(super) left: Duration,
}

impl<S, C> Admission<S, C>
where
    S: Sleeper,
    C: Clock,
{
    /// Whether [`push_owed`](Self::push_owed) has anything to push.
    pub(in crate::admission) fn owes(&self, credential: &str) -> bool {
        self.inner.rates.shared.owes(credential)
    }

    /// Whether [`push_shared`](Self::push_shared) may have anything to push.
    pub(in crate::admission) fn is_shared(&self, credential: &str) -> bool {
        self.inner.rates.shared.contains(credential) || self.owes(credential)
    }

    /// Stage 4: reserves every quota the call draws on and sleeps until its
    /// instant (within the inline wait and deadline). Returns the
    /// reservations and that instant.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn take_rate(
        &self,
        spec: &CallSpec,
        tool: &ToolState,
        credential: &learned::CredentialState,
        deadline_at: u64,
        now: Option<u64>,
        inline: Duration,
    ) -> Result<(Held, u64), Throttled> {
        let inner = &*self.inner;
        let mut now = now.unwrap_or_else(|| inner.clock.now_nanos());
        let inline = self.inline_wait(inline);
        // A call sent back to the queue (a hold placed while it slept) may
        // wait `inline` again from then: the move is the server's news.
        let mut inline_end = now.saturating_add(saturating_nanos(inline));
        let shared = inner.rates.shared.get(&spec.credential);
        let shared_costs = inner.rates.shared.resources_of(&spec.credential);
        if let Some(why) = shared
            .iter()
            .chain(shared_costs.iter().map(|(_, l)| l))
            .find_map(|l| l.unresolved())
        {
            return Err(Throttled::new(Status::Unavailable, API_KEY, why)
                .with_retry_after(shared::UNRESOLVED_RETRY));
        }
        loop {
            // Read each round: a tool whose own limit refused while this call
            // slept now queues it behind that limit's hold and rate.
            // Acquire: pairs with the Release store in `hold_requests`, so the
            // scope written before it is seen.
            let scope = if tool.scoped.load(Ordering::Acquire) {
                tool.server_scope.read().clone()
            } else {
                None
            };
            let scope_key = scope.as_ref().map(|s| (spec.credential.clone(), s.clone()));
            let mut reserved = Reserved::new(self, &spec.credential, scope_key.as_ref());
            // Queued settles first: they may give back the cells this call needs.
            self.push_owed(&spec.credential).await;
            let left = Duration::from_nanos(deadline_at.saturating_sub(now));
            let max_wait = Duration::from_nanos(inline_end.min(deadline_at).saturating_sub(now));
            // A shared credential is admitted by its shared limiter, not locally.
            let at = Instant {
                now,
                max_wait,
                left,
            };
            let Wait {
                longest,
                others,
                requests,
            } = self
                .reserve_local(
                    spec,
                    credential,
                    shared.is_none(),
                    scope.as_deref(),
                    at,
                    &mut reserved,
                )
                .map_err(|r| self.rate_refusal(r, &spec.credential, at))?;
            let mut wait = longest;
            // Shared cells, whose instants move if the quota changes during sleep.
            let mut shared_turns = Vec::new();
            // Shared limiters last: a refusal there cancels the local reservations
            // (a shared cell cannot be given back without a round trip). Each takes
            // its cells as of the call's own instant, so no refill is counted that
            // the server's bucket never gets.
            if let Some(shared) = &shared {
                self.push_penalty(&spec.credential, shared.as_ref()).await;
                match shared.reserve_n(1, wait, max_wait).await {
                    Ok(w) => {
                        wait = wait.max(w);
                        let turn =
                            self.shared_turn(&spec.credential, REQUESTS, shared.as_ref(), now, w);
                        shared_turns.push(turn);
                    }
                    Err(e) => {
                        let refusal = Refusal {
                            e,
                            scope: Cow::Borrowed(API_KEY),
                            period: 0,
                        };
                        return Err(self.rate_refusal(refusal, &spec.credential, at));
                    }
                }
            }
            if !shared_costs.is_empty() {
                let turns = (now, &mut shared_turns);
                match self
                    .reserve_shared_costs(spec, &shared_costs, wait, max_wait, &mut reserved, turns)
                    .await
                {
                    Ok(w) => wait = wait.max(w),
                    Err(refusal) => {
                        let refused = self.rate_refusal(refusal, &spec.credential, at);
                        // Not admitted: the shared cells taken go back now.
                        drop(reserved);
                        if let Some(shared) = &shared {
                            shared.settle(-1).await;
                        }
                        self.push_owed(&spec.credential).await;
                        return Err(refused);
                    }
                }
            }
            if wait.is_zero() {
                return Ok((reserved.keep(), now));
            }
            let ready_at = now.saturating_add(saturating_nanos(wait));
            // A hold known before the sleep is already in the reservation; only one
            // placed during the sleep sends the call back.
            let held_before = self.held_until(&spec.credential, scope_key.as_ref());
            let others_at = now.saturating_add(saturating_nanos(others));
            // Cells whose instants may move while sleeping: a learned rate's request
            // cell (`rescales`) and shared cells (`shared_turns`).
            let mut turns: Vec<(&Rescales, Turn)> = shared_turns
                .iter()
                .filter(|(_, turn)| turn.ready_at > now)
                .map(|(watch, turn)| (&watch.rescales, *turn))
                .collect();
            if let Some(cell) = requests
                && cell.ready_at > now
                && credential.is_learned()
            {
                let turn = credential.rescales.turn(cell.ready_at, cell.epoch);
                turns.push((&credential.rescales, turn));
            }
            let ready_at = if turns.is_empty() {
                if !self.sleep_unless_closed(wait).await {
                    return Err(self.closed_refusal());
                }
                ready_at
            } else {
                match self
                    .sleep_turns(&mut turns, others_at, ready_at, deadline_at)
                    .await
                {
                    rescales::Slept::To(at) => at,
                    rescales::Slept::Closed => return Err(self.closed_refusal()),
                    rescales::Slept::PastDeadline => {
                        // A cut moved a turn past the deadline: ask again from now, as behind
                        // a hold, which refuses with an honest wait.
                        now = inner.clock.now_nanos();
                        inline_end = now.saturating_add(saturating_nanos(inline));
                        reserved.cancel_all();
                        continue;
                    }
                }
            };
            now = inner.clock.now_nanos();
            let held = self.held_until(&spec.credential, scope_key.as_ref());
            // Relaxed: an early answer only re-queues the call, which reads it
            // again with Acquire.
            let newly_scoped = scope.is_none() && tool.scoped.load(Ordering::Relaxed);
            if !newly_scoped && (held <= ready_at || held == held_before) {
                return Ok((reserved.keep(), now));
            }
            // A hold placed during the sleep covers our instant: give the cells back
            // and queue again behind it.
            inline_end = now.saturating_add(saturating_nanos(inline));
            reserved.cancel_all();
        }
    }

    /// The longest rate wait slept inline for a call allowed `inline`.
    pub(super) fn inline_wait(&self, inline: Duration) -> Duration {
        self.inner.rates.inline_wait.max(inline)
    }
}
