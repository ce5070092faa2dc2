//! Learned rates: one [`RateController`] per credential, created on its
//! first admit (so its quota is in force before the first token), fed
//! with the server's answers.

use core::time::Duration;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::adaptive::{AdaptiveRate, RateController, RateOutcome};
use crate::bucket::Quota;
use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::keyed::Scoped;
use crate::retry::ReplyClass;

use super::super::cache::{self, Cache, Generation};
use super::super::stats::Counters;

thread_local! {
    /// This thread's last few credential lookups (see `cache.rs`).
    static CREDENTIALS: std::cell::RefCell<Cache<CredentialState>> =
        const { std::cell::RefCell::new(Cache::new()) };
}

/// At most this many credentials are tracked. Past it, idle ones (no
/// ticket, no hold, bucket full) are forgotten; only while all are busy
/// does a new one go untracked (configured quota, nothing learned).
pub(crate) const MAX_LEARNED: usize = 4096;

type KnownMap = HashMap<Arc<str>, Arc<CredentialState>, ahash::RandomState>;

pub(crate) struct Learned {
    adaptive: Option<AdaptiveRate>,
    /// Starting rate and ceiling of credentials without a quota by name
    /// (`None`: the adaptive guess).
    default: Option<Quota>,
    configured: HashMap<String, Quota>,
    /// Every credential tracked (interned name, controller, counters);
    /// updated in place, mostly read through the per-thread cache.
    known: RwLock<KnownMap>,
    /// Bumped after every store to `known`: validates the per-thread cache.
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

    /// The interned state of `credential`, registered on first use: with
    /// adaptive rates its starting quota is applied to `buckets` as of `now`.
    /// Past [`MAX_LEARNED`] an untracked state is returned.
    #[inline]
    pub(crate) fn ensure<C: Clock>(
        &self,
        credential: &str,
        buckets: &Scoped<String, C>,
        now: u64,
    ) -> Arc<CredentialState> {
        let Ok(state) = cache::lookup(&CREDENTIALS, &self.generation, credential, || {
            if let Some(state) = self.known.read().get(credential) {
                let name = state.name.clone();
                return Ok::<_, core::convert::Infallible>((state.clone(), Some(name)));
            }
            Ok(self.create(credential, buckets, now))
        });
        state
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
            // Bumped after the map changed: no cache serves a forgotten state.
            self.generation.bump();
        }
        if known.len() >= MAX_LEARNED {
            // Every tracked credential is busy: not registered, so not cached.
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
            // Refused only past the registry's cap: the default quota, nothing learned.
            buckets
                .set_learned_quota(credential, controller.quota())
                .is_ok()
                .then_some(controller)
        });
        let state = Arc::new(CredentialState::new(name.clone(), controller));
        known.insert(name.clone(), state.clone());
        drop(known);
        self.generation.bump();
        (state, Some(name))
    }

    /// Forgets credentials nothing holds (caches hold `Weak`s) whose bucket
    /// is full at `now`, freeing their custom-quota slots.
    #[cold]
    fn evict_idle<C: Clock>(known: &mut KnownMap, buckets: &Scoped<String, C>, now: u64) {
        let default = buckets.default_quota();
        known.retain(|name, state| {
            let key: &str = name;
            let idle = Arc::strong_count(state) == 1 && buckets.is_full_at(key, now);
            if idle {
                let _ = buckets.set_quota(key, default);
            }
            !idle
        });
    }

    /// Feeds one reply (a request sent at `sent_at`) to `credential`'s
    /// controller (its state, if the caller holds it, else looked up) and
    /// applies any new quota to `buckets`.
    ///
    /// Must run before the reply's hold is applied: penalizing first would
    /// have the quota change convert the hold's debt and stretch it. A change
    /// does not reset the bucket: queued reservations are converted with
    /// their calls (see `rescales`); a reset would let a full burst go beside
    /// them when the hold ends.
    pub(crate) fn observe<C: Clock>(
        &self,
        (credential, held): (&str, Option<&CredentialState>),
        class: Option<ReplyClass>,
        hint: &ServerHint,
        sent_at: u64,
        now: u64,
        buckets: &Scoped<String, C>,
    ) {
        if self.adaptive.is_none() || hint.scope.is_some() {
            // A scoped limit is held, not learned as the credential's rate.
            return;
        }
        let mut peeked = None;
        let Some(state) = held_or(held, &mut peeked, || self.peek(credential)) else {
            return;
        };
        let Some(controller) = &state.controller else {
            return;
        };
        let outcome = outcome(class, hint);
        if let Some(quota) = controller.on_reply(now, sent_at, outcome) {
            // Replaces the custom quota set on creation, so never refused for room.
            if let Ok(Some(change)) = buckets.rescale_learned_quota(credential, quota) {
                state.rescales.push(change);
            }
        }
    }

    pub(crate) fn is_adaptive(&self) -> bool {
        self.adaptive.is_some()
    }

    pub(crate) fn rate(&self, credential: &str) -> Option<f64> {
        self.known.read().get(credential)?.rate()
    }

    pub(crate) fn peek(&self, name: &str) -> Option<Arc<CredentialState>> {
        self.known.read().get(name).cloned()
    }

    pub(crate) fn all(&self) -> Vec<Arc<CredentialState>> {
        self.known.read().values().cloned().collect()
    }
}

impl Learned {
    /// The period (ns) of the rate `credential` is expected to run at soon,
    /// if learned.
    pub(crate) fn expected_period(&self, credential: &str) -> Option<u64> {
        let rate = self.peek(credential)?.controller.as_ref()?.expected_rate();
        Some((1e9 / rate).ceil().max(1.0) as u64)
    }
}

/// `held` (a ticket's state, the registered one: a state is forgotten
/// only when nothing holds it), else the state `peek` looks up, kept in
/// `peeked`.
pub(crate) fn held_or<'a>(
    held: Option<&'a CredentialState>,
    peeked: &'a mut Option<Arc<CredentialState>>,
    peek: impl FnOnce() -> Option<Arc<CredentialState>>,
) -> Option<&'a CredentialState> {
    match held {
        Some(state) => Some(state),
        None => {
            *peeked = peek();
            peeked.as_deref()
        }
    }
}

pub(crate) struct CredentialState {
    pub(crate) name: Arc<str>,
    controller: Option<Arc<RateController>>,
    pub(crate) counters: Counters,
    /// Its learned rate's changes, for the calls waiting on it.
    pub(crate) rescales: super::rescales::Rescales,
    pub(crate) fits: super::fit::Fits,
}

impl CredentialState {
    /// Whether its rate is learned.
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

    pub(crate) fn rate(&self) -> Option<f64> {
        self.controller.as_ref().map(|c| c.rate())
    }
}

/// `class` is `None` for a 429 of another quota: no verdict on the rate.
fn outcome(class: Option<ReplyClass>, hint: &ServerHint) -> RateOutcome {
    if let Some((limit, window)) = server_limit(hint) {
        return RateOutcome::ServerLimit { limit, window };
    }
    match class {
        Some(ReplyClass::Capacity) => RateOutcome::Throttled,
        Some(ReplyClass::Success) => RateOutcome::Success,
        _ => RateOutcome::Ignored,
    }
}

/// The tightest request quota the server stated, as requests per window
/// (policies counting tokens, bytes or other units are skipped).
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
