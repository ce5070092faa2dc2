//! The rate stage, and everything the server says back about rates.
//!
//! A call reserves, all or nothing, one cell of its credential's request
//! quota (or what its spec says it costs), its cost against each weighted
//! quota of the credential (`tokens`, ...), and a cell of the server scope
//! its tool was seen under. The wait is slept inline while it fits the
//! inline threshold and the deadline; a longer one is returned at once as
//! `rate_limited`, nothing consumed. A hold the server placed while the call
//! slept towards its instant sends it back to reserve again behind the hold.
//!
//! A hold is stored one way: as a penalty on the bucket it applies to (the
//! credential's, a weighted quota's, a server scope's), whose end the bucket
//! keeps. Credentials shared across processes keep their pending penalty
//! here until it is pushed to the shared limiter.

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
mod rescales;
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

/// Replies from a provider the layer was told, none stating a limit,
/// after which the layer says that every setting that depends on them is
/// off (issue #45: a recipe that hands the layer no headers).
pub(super) const SILENT_REPLIES: u64 = 16;

/// The scope of a credential's own request quota in a [`Throttled`].
pub(super) const API_KEY: &str = "api_key";

/// The scope of the background share of a credential's request quota.
pub(super) const BACKGROUND: &str = "api_key:background";

/// The rate stage's state: every bucket a call draws on, the rates
/// learned per credential, the holds the server placed, and how refused
/// calls are told their turns.
pub(super) struct Rates<C: Clock> {
    /// Each credential's request quota.
    credentials: Scoped<String, C>,
    /// The rates learned per credential (see `learned`).
    learned: learned::Learned,
    /// Weighted quotas every credential has (tokens, ...).
    resources: Vec<Resource<C>>,
    /// A cell per (credential, server scope) a tool was seen under.
    server_scopes: Scoped<(String, String), C>,
    /// The longest rate wait slept inline.
    inline_wait: Duration,
    /// The cap on every hold a server asks for.
    max_retry_after: Duration,
    /// Credentials whose quota is shared with other processes.
    shared: shared::Shared,
    /// Penalties observed for shared credentials, applied (as "until" on
    /// our clock) by the next admit on that credential.
    pending: parking_lot::Mutex<std::collections::HashMap<String, u64>>,
    /// The window of limits the server states without one (the
    /// configured provider's, see `Provider`).
    provider_window: Option<Duration>,
    /// The share of each limit the server states that this layer takes
    /// (`Builder::key_share`).
    key_share: Option<f64>,
    /// Background calls' share of each credential's request rate
    /// (`Builder::priority_lanes`), if below all of it.
    background: Option<background::Background<C>>,
    /// Told a provider: replies observed that stated no limit, until one
    /// does (then `u64::MAX`: see `Admission::note_silence`).
    unstated: crate::sync::AtomicU64,
}

impl<C: Clock> Rates<C> {
    /// The rate stage of a layer (see the fields).
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

    /// Background calls take at most `share` of each credential's request
    /// rate (see `Builder::priority_lanes`).
    pub(super) fn with_background_share(mut self, share: Option<f64>, clock: C) -> Self {
        self.background = share
            .filter(|s| *s < 1.0)
            .map(|s| background::Background::new(s, &self.credentials, clock));
        self
    }

    /// Takes `share` of every limit the server states (see
    /// `Builder::key_share`).
    pub(super) fn with_key_share(mut self, share: Option<f64>) -> Self {
        self.key_share = share;
        self
    }

    /// `name`'s learned state, created on first use (its bucket in
    /// `credentials` too) as of `now`: no later than the instant the
    /// call that asks was started, which is when its request counts as
    /// sent.
    #[inline]
    pub(super) fn credential(
        &self,
        name: &str,
        now: u64,
    ) -> std::sync::Arc<learned::CredentialState> {
        self.learned.ensure(name, &self.credentials, now)
    }

    /// Whether the layer was told its provider.
    #[cfg(any(feature = "reqwest", feature = "tower"))]
    pub(crate) fn told_provider(&self) -> bool {
        self.provider_window.is_some()
    }

    /// Whether a provider was told and its first [`SILENT_REPLIES`]
    /// replies stated no limit (see `Admission::note_silence`).
    pub(super) fn provider_silent(&self) -> bool {
        // Relaxed: a statistic.
        let n = self.unstated.load(Ordering::Relaxed);
        self.provider_window.is_some() && (SILENT_REPLIES..u64::MAX).contains(&n)
    }

    /// `name`'s learned state if it exists; never creates one.
    #[inline]
    pub(super) fn peek_credential(
        &self,
        name: &str,
    ) -> Option<std::sync::Arc<learned::CredentialState>> {
        self.learned.peek(name)
    }

    /// Every credential's learned state (for the stats).
    pub(super) fn all_credentials(&self) -> Vec<std::sync::Arc<learned::CredentialState>> {
        self.learned.all()
    }

    /// The rate learned for `credential`; see `Admission::learned_rate`.
    pub(super) fn learned_rate(&self, credential: &str) -> Option<f64> {
        self.learned.rate(credential)
    }

    /// Whether `credential`'s quota is shared with other processes.
    #[inline]
    pub(super) fn is_shared(&self, credential: &str) -> bool {
        self.shared.contains(credential)
    }

    /// Whether an admit on `credential` makes a round trip: its request
    /// quota or one of its weighted quotas is shared with other processes.
    #[inline]
    pub(super) fn is_remote(&self, credential: &str) -> bool {
        self.shared.contains(credential) || !self.shared.resources_of(credential).is_empty()
    }

    /// See `Admission::available`.
    pub(super) fn available(&self, credential: &str, name: &str) -> Option<u32> {
        let key = credential.to_string();
        if name == REQUESTS {
            return (!self.shared.contains(credential)).then(|| self.credentials.available(&key));
        }
        if self.shared.has_resource(credential, name) {
            return None;
        }
        self.resources
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.buckets.available(&key))
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

    /// The refusal of a spec whose cost names a quota this layer does not
    /// have (a misspelt `tokens`, say), if it does.
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
    /// Declared without a limit (a provider's quota, or only per
    /// credential): each credential's limit is the server's, learned with
    /// a second's worth of burst, and a call never costs it more than
    /// that burst (see `Provider`).
    pub(super) learned: bool,
}

/// What a call's reservations make it wait for.
pub(super) struct Wait {
    /// The longest wait of all.
    pub(super) longest: Duration,
    /// The longest wait of every quota but the request quota.
    pub(super) others: Duration,
    /// The request quota's cell, if one was taken.
    pub(super) requests: Option<RequestCell>,
}

/// A cell of a credential's request quota: when it may be used, and the
/// bucket epoch it was reserved under.
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
    /// Stage 4: reserves every quota the call draws on and sleeps until its
    /// instant (within the inline wait and the deadline), starting from
    /// `now` if the caller has just read the clock. Returns the
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
        let inline_end = now.saturating_add(saturating_nanos(inline));
        // Acquire: pairs with the Release store in `hold_requests`, so the
        // scope written before it is seen.
        let scope = if tool.scoped.load(Ordering::Acquire) {
            tool.server_scope.read().clone()
        } else {
            None
        };
        let scope_key = scope.as_ref().map(|s| (spec.credential.clone(), s.clone()));
        let shared = inner.rates.shared.get(&spec.credential);
        // The weighted quotas this credential keeps in a shared limiter.
        let shared_costs = inner.rates.shared.resources_of(&spec.credential);
        if let Some(why) = shared
            .iter()
            .chain(shared_costs.iter().map(|(_, l)| l))
            .find_map(|l| l.unresolved())
        {
            return Err(Throttled::new(Status::Unavailable, API_KEY, why)
                .with_retry_after(shared::UNRESOLVED_RETRY));
        }
        let mut reserved = Reserved::new(self, &spec.credential, scope_key.as_ref());
        loop {
            // Queued settles first: the cells they give back may be the
            // ones this call needs.
            self.push_owed(&spec.credential).await;
            let left = Duration::from_nanos(deadline_at.saturating_sub(now));
            let max_wait = Duration::from_nanos(inline_end.min(deadline_at).saturating_sub(now));
            // A credential shared across processes is admitted by its
            // shared limiter below, not by a local bucket.
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
            // The cells taken from shared limiters, whose instants move if
            // the quota in force changes while the call sleeps.
            let mut shared_turns = Vec::new();
            // Shared limiters last, so a refusal there cancels the local
            // reservations above (a shared cell cannot be given back
            // without a round trip). Each takes its cells as of the latest
            // instant so far, the call's own: taken before the call goes
            // (its request cell later than its tokens, say, as calls of
            // several processes interleave), they would count refill that
            // a full bucket (the server's) never gets, and calls that
            // another quota releases together would go together.
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
                        // Not admitted: the shared cells taken so far go
                        // back now (the request cell too).
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
            // A hold known before the sleep is already in the reservation
            // (its recorded end may be the server's uncapped word, longer
            // than what the bucket enforces); only one placed during the
            // sleep sends the call back.
            let held_before = self.held_until(&spec.credential, scope_key.as_ref());
            let others_at = now.saturating_add(saturating_nanos(others));
            // The cells whose instants may move while the call sleeps: the
            // request cell of a learned rate (see `rescales`), and those
            // taken from shared limiters (see `shared_turns`).
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
                        // A cut moved a turn past the deadline: ask again
                        // from now, as behind a hold, which refuses it
                        // with an honest wait unless the cell comes back
                        // (a refund holds only for the latest cell: the
                        // others stay unused).
                        now = inner.clock.now_nanos();
                        reserved.cancel_all();
                        continue;
                    }
                }
            };
            now = inner.clock.now_nanos();
            let held = self.held_until(&spec.credential, scope_key.as_ref());
            if held <= ready_at || held == held_before {
                return Ok((reserved.keep(), now));
            }
            // A 429 arrived while we slept and its hold covers our instant:
            // give the reservations back (a penalty usually voids the
            // refund, which errs towards admitting less) and queue again
            // behind the hold, within what is left of the budgets.
            reserved.cancel_all();
        }
    }

    /// The longest rate wait slept inline for a call allowed `inline`.
    pub(super) fn inline_wait(&self, inline: Duration) -> Duration {
        self.inner.rates.inline_wait.max(inline)
    }
}
