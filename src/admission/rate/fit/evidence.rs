//! The evidence that fits a quota to a rolling window: stated limits, and
//! a 429 at the start of such a quota's busy period.

use super::super::super::Admission;
use super::super::held::Source;
use super::super::learned;
use super::super::observe::same_name;
use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::sleep::Sleeper;

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// The quotas of `credential` whose limits `hint` states have their busy
    /// periods tracked from now on.
    pub(in crate::admission) fn note_stated(
        &self,
        credential: &str,
        held: Option<&learned::CredentialState>,
        hint: &ServerHint,
        sent_at: u64,
    ) {
        let rates = &self.inner.rates;
        if hint.policies.is_empty()
            || !rates.learned.is_adaptive()
            || rates.shared.contains(credential)
        {
            return;
        }
        let mut peeked = None;
        let peek = || rates.peek_credential(credential);
        let Some(state) = learned::held_or(held, &mut peeked, peek) else {
            return;
        };
        let stated = |name: &str| {
            hint.policies.iter().any(|p| {
                p.quota.is_some_and(|q| q > 0)
                    && p.window.is_some()
                    && p.name.as_deref().is_some_and(|n| same_name(n, name))
            })
        };
        if state.is_learned()
            && learned::server_limit(hint).is_some()
            && let Some(place) = Source::Requests.place()
        {
            state.fits.stated(place, sent_at);
        }
        for (i, resource) in rates.resources.iter().enumerate() {
            if let Some(place) = Source::Resource(i).place()
                && stated(&resource.name)
            {
                state.fits.stated(place, sent_at);
            }
        }
    }

    /// A 429 charged to a quota whose rate is the server's stated limit, at
    /// the start of its busy period, means the shape is wrong: that quota
    /// gets a rolling window. `spent` is the weighted quota it is for, if any.
    pub(in crate::admission) fn fit_to_window(
        &self,
        credential: &str,
        spent: Option<&crate::headers::Policy>,
        hint: &ServerHint,
        sent_at: u64,
    ) {
        let rates = &self.inner.rates;
        if rates.shared.contains(credential) || !rates.learned.is_adaptive() {
            return;
        }
        let Some(state) = rates.peek_credential(credential) else {
            return;
        };
        let source = match spent {
            Some(policy) => {
                let stated = policy.quota.is_some_and(|q| q > 0) && policy.window.is_some();
                let name = policy.name.as_deref().unwrap_or_default();
                match rates
                    .resources
                    .iter()
                    .position(|r| same_name(&r.name, name))
                {
                    Some(i) if stated => Source::Resource(i),
                    _ => return,
                }
            }
            // The request rate is the server's only when a request limit is stated.
            None if state.is_learned() && learned::server_limit(hint).is_some() => Source::Requests,
            None => return,
        };
        let buckets = match source {
            Source::Resource(i) => &rates.resources[i].buckets,
            _ => &rates.credentials,
        };
        let span = super::Shape::of(buckets.quota_of(credential)).span;
        if let Some(place) = source.place()
            && state.fits.at_busy_start(place, sent_at, span)
        {
            state.fits.fit(place);
        }
    }
}
