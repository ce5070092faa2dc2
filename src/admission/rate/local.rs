//! Stage 4's local half: the quotas of this process a call reserves all
//! or nothing. Shared limiters are reserved after these, in `take_rate`.

use core::time::Duration;
use std::borrow::Cow;

use super::held::{Reserved, Source};
use super::refusal::Refusal;
use super::{fit, learned, Instant, RequestCell, Wait, API_KEY};
use crate::admission::spec::{CallSpec, REQUESTS};
use crate::admission::Admission;
use crate::bucket::ReserveError;
use crate::clock::{saturating_nanos, Clock};
use crate::keyed::Scoped;
use crate::sleep::Sleeper;

impl<S, C> Admission<S, C>
where
    S: Sleeper,
    C: Clock,
{
    /// Reserves, all or nothing at `at.now`, every local quota the call draws
    /// on (the request quota only if `requests`; shared ones go through their
    /// limiter), each within `at.max_wait`, into `reserved`. Returns the
    /// waits, or the first refusal.
    pub(in crate::admission) fn reserve_local(
        &self,
        spec: &CallSpec,
        credential: &learned::CredentialState,
        requests: bool,
        scope: Option<&str>,
        at: Instant,
        reserved: &mut Reserved<'_, S, C>,
    ) -> Result<Wait, Refusal> {
        let Instant { now, max_wait, .. } = at;
        let inner = &*self.inner;
        let mut wait = Duration::ZERO;
        let mut others = Duration::ZERO;
        let mut cell = None;
        // One load: which quotas have a window (and, `<< 32`, a stated limit).
        let fitted = credential.fits.mask();
        let mut take = |source: Source, buckets: &Scoped<String, C>, cells: u32| {
            let r = buckets.reserve_stamps(&spec.credential, cells, max_wait, now)?;
            let w = Duration::from_nanos(r.ready_at - now);
            wait = wait.max(w);
            match (source, r.ticket) {
                (Source::Requests, Some(ticket)) => {
                    cell = Some(RequestCell {
                        ready_at: r.ready_at,
                        epoch: ticket.epoch,
                    });
                }
                _ => others = others.max(w),
            }
            reserved.push(source, r.ticket, cells);
            Ok::<(), ReserveError>(())
        };
        let period = |buckets: &Scoped<String, C>, cells: u32| {
            saturating_nanos(buckets.period_of(&spec.credential)).saturating_mul(u64::from(cells))
        };
        // Shared weighted quotas are reserved in `reserve_shared_costs`.
        let shared_costs = inner.rates.shared.resources_of(&spec.credential);
        let request_cells = spec.cost_of(REQUESTS).unwrap_or(1);
        if requests
            && request_cells > 0
            && let Err(mut e) = take(Source::Requests, &inner.rates.credentials, request_cells)
        {
            if fitted & fit::FITTED != 0 {
                e = self.with_window(credential, Source::Requests, request_cells, now, e);
            }
            // A learned rate climbing back frees turns faster than its period now.
            let expected = inner
                .rates
                .learned
                .expected_period(&spec.credential)
                .map(|p| p.saturating_mul(u64::from(request_cells)));
            let now_period = period(&inner.rates.credentials, request_cells);
            return Err(Refusal {
                e,
                scope: Cow::Borrowed(API_KEY),
                period: expected.map_or(now_period, |p| p.min(now_period)),
            });
        }
        // Most specs have no costs: skip the weighted quotas.
        let weighted = if spec.costs.is_empty() {
            &[][..]
        } else {
            &inner.rates.resources[..]
        };
        for (i, resource) in weighted.iter().enumerate() {
            let cells = spec.cost_of(&resource.name).unwrap_or(0);
            if cells == 0 || shared_costs.iter().any(|(n, _)| *n == resource.name) {
                continue;
            }
            let mut taken = take(Source::Resource(i), &resource.buckets, cells);
            if let Err(ReserveError::InsufficientCapacity { capacity, .. }) = taken
                && resource.learned
            {
                // A learned burst is only a guess at the server's slice, not a limit:
                // a bigger call waits for a full burst and goes.
                let burst = capacity.max(1);
                taken = take(Source::Resource(i), &resource.buckets, burst);
            }
            if let Err(mut e) = taken {
                if fitted & fit::FITTED != 0 {
                    e = self.with_window(credential, Source::Resource(i), cells, now, e);
                }
                return Err(Refusal {
                    e,
                    scope: Cow::Owned(format!("quota:{}", resource.name)),
                    period: period(&resource.buckets, cells),
                });
            }
        }
        if let Some((key, name)) = reserved.scope.zip(scope) {
            match inner
                .rates
                .server_scopes
                .reserve_stamps(key, 1, max_wait, now)
            {
                Ok(r) => {
                    let w = Duration::from_nanos(r.ready_at - now);
                    wait = wait.max(w);
                    others = others.max(w);
                    reserved.push(Source::Scope, r.ticket, 1);
                }
                Err(e) => {
                    return Err(Refusal {
                        e,
                        scope: Cow::Owned(format!("server:{name}")),
                        period: saturating_nanos(inner.rates.server_scopes.period_of(key)),
                    });
                }
            }
        }
        if fitted != 0 {
            let w = self.windows(spec, credential, fitted, requests, at, wait, reserved)?;
            // Slept like a weighted quota's wait: a rate change does not move it.
            wait = wait.max(w);
            others = others.max(w);
        }
        Ok(Wait {
            longest: wait,
            others,
            requests: cell,
        })
    }
}
