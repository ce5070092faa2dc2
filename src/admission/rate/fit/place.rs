//! Where a call meets its credential's windows: busy-period tracking,
//! placement, and the instant a refused call is told.

use core::time::Duration;
use std::borrow::Cow;

use super::super::super::spec::{CallSpec, REQUESTS};
use super::super::super::Admission;
use super::super::held::{Reserved, Source};
use super::super::learned::CredentialState;
use super::super::refusal::Refusal;
use super::super::{Instant, API_KEY};
use super::{wait, Fits, Fitted, Shape, FITTED};
use crate::bucket::ReserveError;
use crate::clock::{saturating_nanos, Clock};
use crate::keyed::Scoped;
use crate::sleep::Sleeper;

impl<S: Sleeper, C: Clock> Admission<S, C> {
    fn window_buckets(&self, source: Source) -> &Scoped<String, C> {
        match source {
            Source::Resource(i) => &self.inner.rates.resources[i].buckets,
            _ => &self.inner.rates.credentials,
        }
    }

    /// A bucket's refusal `e` of `cells` on a fitted quota, delayed until the
    /// window lets them through too.
    #[cold]
    #[inline(never)]
    pub(in crate::admission) fn with_window(
        &self,
        credential: &CredentialState,
        source: Source,
        cells: u32,
        now: u64,
        e: ReserveError,
    ) -> ReserveError {
        let (ReserveError::RateLimited { retry_after }, Some(place)) = (e, source.place()) else {
            return e;
        };
        if !credential.fits.is_fitted(place) {
            return e;
        }
        let key: &str = &credential.name;
        let mut alone = Fitted::default();
        alone.add(
            place,
            Shape::of(self.window_buckets(source).quota_of(key)),
            cells,
        );
        let from = now.saturating_add(saturating_nanos(retry_after));
        let at = credential.fits.earliest(&alone, now, from);
        ReserveError::RateLimited {
            retry_after: wait(now, at),
        }
    }

    /// After a call reserved its quotas on a credential with window flags
    /// set: tracks busy periods of stated quotas and places the call in its
    /// windows. Returns the windows' wait.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::admission) fn windows(
        &self,
        spec: &CallSpec,
        credential: &CredentialState,
        mask: u64,
        requests: bool,
        at: Instant,
        longest: Duration,
        reserved: &mut Reserved<'_, S, C>,
    ) -> Result<Duration, Refusal> {
        for (place, kept) in reserved.taken() {
            if Fits::is_stated(mask, place) {
                let period = self
                    .window_buckets(place.source())
                    .period_of(&spec.credential);
                let (stamps, cells) = (kept.stamps(), kept.cells);
                credential
                    .fits
                    .took(place, stamps, cells, saturating_nanos(period), at.now);
            }
        }
        if mask & FITTED == 0 {
            return Ok(Duration::ZERO);
        }
        self.place_in_windows(spec, credential, requests, at, longest, reserved)
    }

    /// Places a reserved call in its windows at one instant (recorded in
    /// `reserved`); refuses if the wait exceeds `at.max_wait`.
    fn place_in_windows(
        &self,
        spec: &CallSpec,
        credential: &CredentialState,
        requests: bool,
        at: Instant,
        longest: Duration,
        reserved: &mut Reserved<'_, S, C>,
    ) -> Result<Duration, Refusal> {
        let key = &spec.credential;
        let request_cells = spec.cost_of(REQUESTS).unwrap_or(1);
        let weighted = self.inner.rates.resources.iter().enumerate();
        let sources =
            core::iter::once((Source::Requests, if requests { request_cells } else { 0 })).chain(
                weighted.map(|(i, r)| (Source::Resource(i), spec.cost_of(&r.name).unwrap_or(0))),
            );
        let mut fitted = Fitted::default();
        for (source, cells) in sources {
            if let Some(place) = source.place()
                && cells > 0
                && credential.fits.is_fitted(place)
            {
                let shape = Shape::of(self.window_buckets(source).quota_of(key));
                fitted.add(place, shape, cells);
            }
        }
        let Some((place, shape, _)) = fitted.first() else {
            return Ok(Duration::ZERO);
        };
        let from = at.now.saturating_add(saturating_nanos(longest));
        let placed = credential.fits.place(&fitted, at.now, from);
        reserved.set_placed(placed);
        let w = wait(at.now, placed.at);
        if w <= at.max_wait {
            return Ok(w);
        }
        Err(Refusal {
            e: ReserveError::RateLimited { retry_after: w },
            scope: match place.source() {
                Source::Resource(i) => {
                    Cow::Owned(format!("quota:{}", self.inner.rates.resources[i].name))
                }
                _ => Cow::Borrowed(API_KEY),
            },
            period: shape.span / u64::from(shape.limit.max(1)),
        })
    }
}
