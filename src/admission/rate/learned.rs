//! Learned rates: one [`RateController`] per credential, fed with the
//! server's answers, whose proposals become the credential's quota.
//!
//! The controller is created on the credential's first admit, so its quota
//! is in force before the first token is taken. What it is fed, and in what
//! order the result is applied, is decided here (see [`Learned::observe`]).

use core::time::Duration;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::adaptive::{AdaptiveRate, RateController, RateOutcome};
use crate::bucket::Quota;
use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::keyed::Scoped;

use super::super::cache::{self, Cache, Generation};
use super::super::stats::Counters;

thread_local! {
    /// This thread's last few credential lookups (see `cache.rs`).
    static CREDENTIALS: std::cell::RefCell<Cache<CredentialState>> =
        const { std::cell::RefCell::new(Cache::new()) };
}

/// At most this many credentials are tracked (and learn a rate). Past it,
/// the idle ones (no ticket, no hold, their bucket full again) are
/// forgotten to make room, a batch at a time: one that comes back starts
/// from its configured quota or the starting guess again. Only while every
/// tracked credential is busy does a new one go untracked (its configured
/// quota, nothing learned).
pub(crate) const MAX_LEARNED: usize = 4096;

/// The learned rates of an admission layer (empty with fixed rates).
type KnownMap = HashMap<Arc<str>, Arc<CredentialState>, ahash::RandomState>;

pub(crate) struct Learned {
    /// `None`: fixed rates.
    adaptive: Option<AdaptiveRate>,
    /// The starting rate and ceiling of credentials without a quota by name
    /// (`None`: the adaptive guess, with no ceiling but its own).
    default: Option<Quota>,
    /// Quotas set by name: each one's starting rate and ceiling.
    configured: HashMap<String, Quota>,
    /// Every credential tracked: its interned name (so a ticket names it
    /// without allocating), its controller and its counters. Updated in
    /// place (a new credential costs one insert, not a copy of the map);
    /// most reads are served by the per-thread cache in front of it.
    known: RwLock<KnownMap>,
    /// Replaced after every store to `known`: validates the per-thread
    /// cache (see `cache`).
    generation: Generation,
}

impl Learned {
    pub(crate) fn new(
        adaptive: Option<AdaptiveRate>,
        default: Option<Quota>,
        configured: HashMap<String, Quota>,
    ) -> Self {
        Self {
            adaptive,
            default,
            configured,
            known: RwLock::new(KnownMap::default()),
            generation: Generation::new(),
        }
    }

    /// The interned name of `credential`, registering it on first use: with
    /// adaptive rates, its controller is created and its starting quota
    /// applied to `buckets` (as of `now`: no later than the asking call's
    /// start) before the first token is taken. Past
    /// [`MAX_LEARNED`] credentials a fresh name is returned and nothing is
    /// learned for it. A thread that looked `credential` up lately finds
    /// it in its cache (see `cache`).
    #[inline]
    pub(crate) fn ensure<C: Clock>(
        &self,
        credential: &str,
        buckets: &Scoped<String, C>,
        now: u64,
    ) -> Arc<CredentialState> {
        let found = cache::lookup(&CREDENTIALS, &self.generation, credential, || {
            if let Some(state) = self.known.read().get(credential) {
                let name = state.name.clone();
                return Ok::<_, core::convert::Infallible>((state.clone(), Some(name)));
            }
            Ok(self.create(credential, buckets, now))
        });
        match found {
            Ok(state) => state,
        }
    }

    #[cold]
    fn create<C: Clock>(
        &self,
        credential: &str,
        buckets: &Scoped<String, C>,
        now: u64,
    ) -> (Arc<CredentialState>, Option<Arc<str>>) {
        let mut known = self.known.write();
        if let Some(state) = known.get(credential) {
            return (state.clone(), Some(state.name.clone()));
        }
        let name: Arc<str> = Arc::from(credential);
        if known.len() >= MAX_LEARNED {
            Self::evict_idle(&mut known, buckets, now);
            // Bumped after the map changed: no thread's cache serves a
            // forgotten credential's state.
            self.generation.bump();
        }
        if known.len() >= MAX_LEARNED {
            // Every tracked credential is busy. Not in the registry: not
            // cached either.
            return (Arc::new(CredentialState::new(name, None)), None);
        }
        let controller = self.adaptive.as_ref().and_then(|adaptive| {
            let cfg = match self.configured.get(credential).or(self.default.as_ref()) {
                Some(q) => {
                    let rate = 1e9 / (q.period().as_nanos().max(1) as f64);
                    adaptive
                        .clone()
                        .initial(Some(rate))
                        .max_rate(rate)
                        .burst(q.burst().get())
                }
                None => adaptive.clone(),
            };
            let controller = Arc::new(cfg.controller(now));
            // Refused only past the registry's cap of custom quotas: the
            // credential then keeps the default quota, and learns nothing.
            buckets
                .set_learned_quota(&credential.to_string(), controller.quota())
                .is_ok()
                .then_some(controller)
        });
        let state = Arc::new(CredentialState::new(name.clone(), controller));
        known.insert(name.clone(), state.clone());
        drop(known);
        self.generation.bump();
        (state, Some(name))
    }

    /// Forgets the credentials nothing uses: no ticket or stats snapshot
    /// holds their state (the per-thread caches hold `Weak`s), and their
    /// bucket is full (no debt, no hold) at `now`. Their learned quota is
    /// dropped from `buckets` too, so the custom-quota slots come back.
    #[cold]
    fn evict_idle<C: Clock>(known: &mut KnownMap, buckets: &Scoped<String, C>, now: u64) {
        let default = buckets.default_quota();
        known.retain(|name, state| {
            let key = name.to_string();
            let idle = Arc::strong_count(state) == 1 && buckets.is_full_at(&key, now);
            if idle {
                // Back to the default quota: not stored, the slot is free.
                let _ = buckets.set_quota(&key, default);
            }
            !idle
        });
    }

    /// Feeds one reply on `credential` (a request sent at `sent_at`) to its
    /// controller and applies the new quota, if any, to `buckets`.
    ///
    /// Called before the reply's hold is applied: the new quota first, then
    /// the caller's penalty. Penalizing first would have the quota change
    /// convert the hold's debt at the lower rate and stretch it.
    ///
    /// A change does not reset the bucket. The reservations taken at the
    /// old rate keep their cells, converted to the new rate with the
    /// calls that hold them (see `rescales`): after a cut, those whose
    /// new instant falls inside the hold are absorbed by it (their calls
    /// wake, see the hold and queue again behind it), and those past it
    /// go at their new instant, still counted. A reset would forget the
    /// latter's cells while they still go, and the bucket would admit its
    /// full burst beside them when the hold ends: one more 429 per cut.
    pub(crate) fn observe<C: Clock>(
        &self,
        credential: &str,
        status: u16,
        hint: &ServerHint,
        sent_at: u64,
        now: u64,
        buckets: &Scoped<String, C>,
    ) {
        if self.adaptive.is_none() || hint.scope.is_some() {
            // A scoped limit is the server's, for some tools only: it is
            // held, not learned as the credential's rate.
            return;
        }
        let Some(state) = self.known.read().get(credential).cloned() else {
            return;
        };
        let Some(controller) = &state.controller else {
            return;
        };
        let outcome = outcome(status, hint);
        if let Some(quota) = controller.on_reply(now, sent_at, outcome) {
            let key = credential.to_string();
            // The credential has a custom quota already (set on creation),
            // so this replaces it and cannot be refused for room. A change
            // moves the calls already queued with it (see `rescales`).
            if let Ok(Some(change)) = buckets.rescale_learned_quota(&key, quota) {
                state.rescales.push(change);
            }
        }
    }

    /// Whether rates are learned (not `fixed_rates`).
    pub(crate) fn is_adaptive(&self) -> bool {
        self.adaptive.is_some()
    }

    /// The rate `credential` runs at now, if it is learned.
    pub(crate) fn rate(&self, credential: &str) -> Option<f64> {
        self.known.read().get(credential)?.rate()
    }

    /// The credential `name`, if it is tracked (never registers it).
    pub(crate) fn peek(&self, name: &str) -> Option<Arc<CredentialState>> {
        self.known.read().get(name).cloned()
    }

    /// Every credential tracked, for `Admission::stats`.
    pub(crate) fn all(&self) -> Vec<Arc<CredentialState>> {
        self.known.read().values().cloned().collect()
    }
}

impl Learned {
    /// The period, in nanoseconds, of the rate `credential` is expected to
    /// run at soon (see [`RateController::expected_rate`]), if it is
    /// learned.
    pub(crate) fn expected_period(&self, credential: &str) -> Option<u64> {
        let rate = self.peek(credential)?.controller.as_ref()?.expected_rate();
        Some((1e9 / rate).ceil().max(1.0) as u64)
    }
}

/// One credential the layer has seen.
pub(crate) struct CredentialState {
    pub(crate) name: Arc<str>,
    controller: Option<Arc<RateController>>,
    pub(crate) counters: Counters,
    /// Its learned rate's changes, for the calls waiting on it (see
    /// `rescales`).
    pub(crate) rescales: super::rescales::Rescales,
    /// Its quotas fitted to a server's rolling window (see `fit`).
    pub(crate) fits: super::fit::Fits,
}

impl CredentialState {
    /// Whether its rate is learned (calls sleeping on it then follow its
    /// rate changes).
    pub(crate) fn is_learned(&self) -> bool {
        self.controller.is_some()
    }
}

impl CredentialState {
    fn new(name: Arc<str>, controller: Option<Arc<RateController>>) -> Self {
        Self {
            name,
            controller,
            counters: Counters::default(),
            rescales: super::rescales::Rescales::default(),
            fits: super::fit::Fits::default(),
        }
    }

    /// The rate it runs at now, if it is learned.
    pub(crate) fn rate(&self) -> Option<f64> {
        self.controller.as_ref().map(|c| c.rate())
    }
}

/// What a reply says about the credential's rate.
fn outcome(status: u16, hint: &ServerHint) -> RateOutcome {
    if let Some((limit, window)) = server_limit(hint) {
        return RateOutcome::ServerLimit { limit, window };
    }
    match status {
        429 => RateOutcome::Throttled,
        503 if hint.retry_after.is_some() => RateOutcome::Throttled,
        200..=299 => RateOutcome::Success,
        _ => RateOutcome::Ignored,
    }
}

/// The tightest request quota the server stated (`RateLimit-Policy`), as
/// requests per window. Policies that count something else (a `qu` other
/// than requests, or a per-resource limit such as tokens) are not request
/// rates.
pub(super) fn server_limit(hint: &ServerHint) -> Option<(u64, Duration)> {
    hint.policies
        .iter()
        .filter(|p| p.quota_unit.as_deref().is_none_or(|u| u == "requests"))
        .filter(|p| {
            p.name
                .as_deref()
                .is_none_or(|n| !n.contains("token") && !n.contains("byte"))
        })
        .filter_map(|p| match (p.quota, p.window) {
            (Some(q), Some(w)) if q > 0 && !w.is_zero() => Some((q, w)),
            _ => None,
        })
        .min_by(|a, b| {
            let ra = a.0 as f64 / a.1.as_secs_f64();
            let rb = b.0 as f64 / b.1.as_secs_f64();
            ra.total_cmp(&rb)
        })
}

impl core::fmt::Debug for Learned {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Learned")
            .field("adaptive", &self.adaptive.is_some())
            .field("known", &self.known.read().len())
            .finish()
    }
}
