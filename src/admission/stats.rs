//! [`Admission::stats`]: a snapshot per tool and per credential; each
//! counter is one relaxed atomic.

use core::time::Duration;

use super::Admission;
use crate::clock::Clock;
use crate::sleep::Sleeper;
use crate::sync::{AtomicU64, Ordering};
use crate::throttled::Status;

/// The live counters of a tool or a credential.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    admitted: AtomicU64,
    /// Tickets dropped (a credential's in flight is `admitted - finished`).
    finished: AtomicU64,
    /// Refusals, indexed by `Status as usize`.
    refused: [AtomicU64; 7],
}

/// The layer's own totals, counting refusals whether or not their tool or
/// credential was known (its `finished` stays 0).
pub(super) type Totals = Counters;

impl Counters {
    /// A ticket was issued.
    pub(crate) fn admitted(&self) {
        // Relaxed (all counters): statistics; they order no other memory.
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// A ticket was dropped (only counted where in flight is read from here).
    pub(crate) fn finished(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
    }

    /// Tickets issued and not yet dropped (racy; saturates at zero).
    fn in_flight(&self) -> usize {
        let finished = self.finished.load(Ordering::Relaxed);
        let admitted = self.admitted.load(Ordering::Relaxed);
        usize::try_from(admitted.saturating_sub(finished)).unwrap_or(usize::MAX)
    }

    pub(crate) fn refused(&self, status: Status) {
        self.refused[status as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn refusals(&self) -> Refusals {
        let n = |s: Status| self.refused[s as usize].load(Ordering::Relaxed);
        Refusals {
            rate_limited: n(Status::RateLimited),
            shed: n(Status::Shed),
            timed_out: n(Status::TimedOut),
            closed: n(Status::Closed),
            budget_exhausted: n(Status::BudgetExhausted),
            quota_exhausted: n(Status::QuotaExhausted),
            unavailable: n(Status::Unavailable),
        }
    }
}

/// Refused calls, by [`Status`] (read in place from
/// [`AdmissionStats::refused`]).
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, CallSpec};
/// use backpressure::Status;
/// # futures::executor::block_on(async {
/// let admission = Admission::builder().run_budget(0).build();
/// let _ = admission.admit(&CallSpec::new("search", "key")).await;
/// let stats = admission.stats();
/// assert_eq!(stats.refused.budget_exhausted, 1);
/// assert_eq!(stats.refused.get(Status::BudgetExhausted), 1);
/// assert_eq!(stats.refused.total(), 1);
/// # });
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Refusals {
    /// `rate_limited`.
    pub rate_limited: u64,
    /// `shed`.
    pub shed: u64,
    /// `timed_out`.
    pub timed_out: u64,
    /// `closed`.
    pub closed: u64,
    /// `budget_exhausted`.
    pub budget_exhausted: u64,
    /// `quota_exhausted`.
    pub quota_exhausted: u64,
    /// `unavailable` (an open circuit).
    pub unavailable: u64,
}

impl Refusals {
    /// The count for `status`.
    pub fn get(&self, status: Status) -> u64 {
        match status {
            Status::RateLimited => self.rate_limited,
            Status::Shed => self.shed,
            Status::TimedOut => self.timed_out,
            Status::Closed => self.closed,
            Status::BudgetExhausted => self.budget_exhausted,
            Status::QuotaExhausted => self.quota_exhausted,
            Status::Unavailable => self.unavailable,
        }
    }

    /// All refusals.
    pub fn total(&self) -> u64 {
        self.rate_limited
            + self.shed
            + self.timed_out
            + self.closed
            + self.budget_exhausted
            + self.quota_exhausted
            + self.unavailable
    }
}

/// A snapshot of one tool (see [`Admission::stats`]).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ToolStats {
    /// The tool's name.
    pub name: String,
    /// Its concurrency cap.
    pub cap: usize,
    /// Calls holding one of its slots now.
    pub in_flight: usize,
    /// Calls waiting for one of its slots now.
    pub waiting: usize,
    /// Calls admitted since the layer was built.
    pub admitted: u64,
    /// Calls refused, by status.
    pub refused: Refusals,
    /// The running mean of how long a call holds its slot.
    pub mean_hold: Duration,
    /// What a call shed now would be told to wait (Little's law).
    pub drain_estimate: Duration,
}

/// A snapshot of one credential (see [`Admission::stats`]).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct CredentialStats {
    /// The credential, as given in `CallSpec::credential` (redact it if secret).
    pub credential: String,
    /// Calls on it holding a ticket now.
    pub in_flight: usize,
    /// Calls admitted since the layer was built.
    pub admitted: u64,
    /// Calls refused, by status.
    pub refused: Refusals,
    /// The rate learned from the server (requests per second), if any.
    pub learned_rate: Option<f64>,
    /// Requests it could start now without waiting.
    pub available: Option<u32>,
    /// Its quotas the server showed to count over a rolling window, which
    /// now also keep at most a burst in any refill span.
    pub windowed: Vec<String>,
}

/// A snapshot of the whole layer: see [`Admission::stats`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct AdmissionStats {
    /// Calls holding a global slot now.
    pub in_flight: usize,
    /// Calls waiting for a slot now (against the queue capacity).
    pub waiting: usize,
    /// Calls admitted since the layer was built.
    pub admitted: u64,
    /// Calls refused, by status (including those refused before their tool
    /// or credential was known).
    pub refused: Refusals,
    /// Every tool seen, by name.
    pub tools: Vec<ToolStats>,
    /// Every credential seen (up to the registry's cap), by name.
    pub credentials: Vec<CredentialStats>,
    /// Told a provider ([`Builder::provider`](crate::admission::Builder::provider)),
    /// but its first 16 replies stated no limit, so nothing is learned from
    /// them (usually the replies' headers never reach the layer). Also
    /// logged once as a `tracing` warning.
    pub provider_silent: bool,
}

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// A snapshot of the layer, per tool and per credential, sorted by name.
    /// Each number is read on its own, so it is not one instant.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec, SlotPolicy};
    /// use backpressure::Status;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().tool("refund", 1, SlotPolicy::FailFast).build();
    /// let running = admission.admit(&CallSpec::new("refund", "key")).await.unwrap();
    /// let shed = admission.admit(&CallSpec::new("refund", "key")).await.unwrap_err();
    /// assert_eq!(shed.status, Status::Shed);
    ///
    /// let stats = admission.stats();
    /// let refund = stats.tools.iter().find(|t| t.name == "refund").unwrap();
    /// assert_eq!((refund.in_flight, refund.admitted, refund.refused.shed), (1, 1, 1));
    /// assert_eq!(stats.credentials[0].in_flight, 1);
    /// drop(running);
    /// assert_eq!(admission.stats().in_flight, 0);
    /// # });
    /// ```
    pub fn stats(&self) -> AdmissionStats {
        let inner = &*self.inner;
        let now = inner.clock.now_nanos();
        let mut tools: Vec<ToolStats> = inner
            .slots
            .tools()
            .all()
            .into_iter()
            .map(|t| {
                let waiting = t.pool.waiting();
                ToolStats {
                    name: t.name.to_string(),
                    cap: t.pool.cap,
                    in_flight: t.pool.in_flight(),
                    waiting,
                    admitted: t.counters.admitted.load(Ordering::Relaxed),
                    refused: t.counters.refusals(),
                    mean_hold: t.pool.mean_hold(),
                    drain_estimate: t.pool.drain_estimate(waiting, now),
                }
            })
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let mut credentials: Vec<CredentialStats> = inner
            .rates
            .all_credentials()
            .into_iter()
            .map(|c| CredentialStats {
                credential: c.name.to_string(),
                in_flight: c.counters.in_flight(),
                admitted: c.counters.admitted.load(Ordering::Relaxed),
                refused: c.counters.refusals(),
                learned_rate: c.rate(),
                available: self.available(&c.name, super::spec::REQUESTS),
                windowed: inner.rates.windowed(&c),
            })
            .collect();
        credentials.sort_by(|a, b| a.credential.cmp(&b.credential));
        AdmissionStats {
            in_flight: inner.slots.in_flight(),
            waiting: self.waiting(),
            admitted: inner.totals.admitted.load(Ordering::Relaxed),
            refused: inner.totals.refusals(),
            tools,
            credentials,
            provider_silent: inner.rates.provider_silent(),
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    /// In flight is admitted less finished.
    #[test]
    fn in_flight_is_the_tickets_not_yet_dropped() {
        let c = Counters::default();
        c.admitted();
        c.admitted();
        c.admitted();
        c.finished();
        assert_eq!(c.in_flight(), 2);
    }

    /// Each status reads its own count, and the total is their sum.
    #[test]
    fn each_status_reads_its_own_count_and_the_total_sums_them() {
        let refused = Refusals {
            rate_limited: 1,
            shed: 10,
            timed_out: 100,
            closed: 1_000,
            budget_exhausted: 10_000,
            quota_exhausted: 100_000,
            unavailable: 1_000_000,
        };
        let statuses = [
            Status::RateLimited,
            Status::Shed,
            Status::TimedOut,
            Status::Closed,
            Status::BudgetExhausted,
            Status::QuotaExhausted,
            Status::Unavailable,
        ];
        for (i, status) in statuses.into_iter().enumerate() {
            assert_eq!(refused.get(status), 10u64.pow(i as u32), "{status:?}");
        }
        assert_eq!(refused.total(), 1_111_111);
    }
}
