//! Settling a call's reservation with what the server says it used.

use core::time::Duration;

use super::super::spec::REQUESTS;
use super::super::Admission;
use super::{Held, Kept, Source};
use crate::clock::{saturating_nanos, Clock};
use crate::keyed::Scoped;
use crate::sleep::Sleeper;

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// See [`Ticket::settle`](crate::admission::Ticket::settle).
    pub(in crate::admission) fn settle(
        &self,
        credential: &str,
        held: &mut Held,
        name: &str,
        actual: u32,
    ) -> i64 {
        let inner = &*self.inner;
        let source = if name == REQUESTS {
            Source::Requests
        } else {
            match inner.rates.resources.iter().position(|r| r.name == name) {
                Some(i) => Source::Resource(i),
                None => return 0,
            }
        };
        let buckets = match source {
            Source::Resource(i) => &inner.rates.resources[i].buckets,
            _ => &inner.rates.credentials,
        };
        let Some(place) = source.place() else {
            return 0;
        };
        let h = held.place_mut(place);
        let counted = h.cells;
        if let Source::Resource(i) = source
            && inner.rates.shared.has_resource(credential, name)
        {
            // Shared: settled there exactly, both ways, by the next push; capped
            // as `charge` is.
            let most = charge_cap(
                &inner.rates.resources[i].buckets,
                credential,
                inner.rates.max_retry_after,
            );
            let delta = i64::from(actual) - i64::from(counted);
            let delta = delta.min(i64::try_from(most).unwrap_or(i64::MAX));
            inner.rates.shared.queue_settle(credential, name, delta);
            *h = Kept::settled(actual);
            return delta;
        }
        let (now, cap) = (inner.clock.now_nanos(), inner.rates.max_retry_after);
        if actual > counted {
            charge(buckets, credential, actual - counted, now, cap);
            *h = Kept::settled(actual);
            return i64::from(actual - counted);
        }
        // Stamps undo a reservation at most once: after a refund the bucket may
        // hand the same stamps to another call, so a settled place is never
        // refunded again.
        let refunded = actual < counted && h.refundable() && self.undo(credential, None, source, h);
        if !refunded {
            *h = Kept::settled(counted);
            return 0;
        }
        charge(buckets, credential, actual, now, cap);
        *h = Kept::settled(actual);
        -i64::from(counted - actual)
    }
}

/// Takes `units` from `key`'s bucket now, whatever the wait and burst:
/// debt the next calls wait for. Capped at `cap`'s worth of the rate, so
/// a huge reported usage holds the key no longer than a server hold may.
pub(in crate::admission) fn charge<C: Clock>(
    buckets: &Scoped<String, C>,
    key: &str,
    units: u32,
    now: u64,
    cap: Duration,
) {
    let most = charge_cap(buckets, key, cap);
    let _ = buckets.charge(key, u64::from(units).min(most), now);
}

/// The most one charge takes: `cap`'s worth of the rate, at least 1.
fn charge_cap<C: Clock>(buckets: &Scoped<String, C>, key: &str, cap: Duration) -> u64 {
    let period = saturating_nanos(buckets.period_of(key)).max(1);
    (saturating_nanos(cap) / period).max(1)
}
