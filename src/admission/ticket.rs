//! [`Ticket`]: the permission to run one call, and the way back for the
//! server's answer.

use core::fmt;
use core::time::Duration;
use std::sync::Arc;

use crate::clock::{Clock, DefaultClock};
use crate::headers::ServerHint;
use crate::retry::{reply_class, ReplyClass};
use crate::sleep::{DefaultSleeper, Sleeper};

use super::breaker;
use super::rate::learned::CredentialState;
use super::rate::Held;
use super::tools::ToolState;
use super::Admission;

/// Permission to run one call: holds its tool slot and its global slot
/// until dropped.
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, CallSpec};
/// use backpressure::headers::ServerHint;
/// use std::time::SystemTime;
/// # futures::executor::block_on(async {
/// let admission = Admission::builder().build();
/// let ticket = admission.admit(&CallSpec::new("search", "key")).await.unwrap();
/// // ... the call returned 200 with `RateLimit-Remaining: 0`, reset in 5 s:
/// let hint = ServerHint::from_headers(
///     [("ratelimit-remaining", "0"), ("ratelimit-reset", "5")],
///     SystemTime::now(),
/// );
/// assert!(ticket.observe(200, &hint).is_some()); // the next call waits for the reset
/// # });
/// ```
#[must_use = "the call's slots are released as soon as the ticket is dropped"]
pub struct Ticket<S = DefaultSleeper, C = DefaultClock>
where
    S: Sleeper,
    C: Clock,
{
    pub(super) admission: Admission<S, C>,
    pub(super) tool: Arc<ToolState>,
    pub(super) credential: Arc<CredentialState>,
    /// When it was admitted (layer clock, ns), with flag bits (see [`stamp`]).
    pub(super) started_at: u64,
    pub(super) held: Held,
    // The tool and global slots are held by the ticket itself (taken and
    // forgotten by `admit`); `Drop` releases them.
}

impl<S: Sleeper, C: Clock> Ticket<S, C> {
    /// Feeds the server's answer back; returns the hold applied, if any.
    ///
    /// * a `Retry-After` holds back every call on this credential (or, with
    ///   a server scope in the headers, under that scope) until then;
    /// * `remaining: 0` with a reset time holds calls until the reset;
    /// * a bare 429 holds the credential for one second.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::headers::ServerHint;
    /// use std::time::{Duration, SystemTime};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().build();
    /// let ticket = admission.admit(&CallSpec::new("search", "key")).await.unwrap();
    /// let hint = ServerHint::from_headers([("retry-after", "60")], SystemTime::now());
    /// assert_eq!(ticket.observe(429, &hint), Some(Duration::from_secs(60)));
    /// drop(ticket);
    /// let next = admission.admit(&CallSpec::new("search", "key")).await.unwrap_err();
    /// assert_eq!(next.scope, "api_key");
    /// # });
    /// ```
    pub fn observe(&self, status: u16, hint: &ServerHint) -> Option<Duration> {
        self.observe_class(status, reply_class(Some(status), hint), hint)
    }

    /// [`observe`](Self::observe) of an answer already classed: the breaker
    /// and the learned rate read the class the attempt loop decides with.
    pub(crate) fn observe_class(
        &self,
        status: u16,
        class: ReplyClass,
        hint: &ServerHint,
    ) -> Option<Duration> {
        self.admission.circuit_outcome(
            &self.tool.name,
            &self.credential.name,
            breaker::outcome(class, Some(status)),
            self.is_trial(),
        );
        self.admission.observe_sent(
            super::rate::Tool::Held(&self.tool),
            &self.credential.name,
            Some(&self.credential),
            class,
            hint,
            self.started(),
        )
    }

    /// The call got no answer (transport error, or dropped at its deadline):
    /// a failure of the (tool, credential)'s circuit, if the layer keeps
    /// circuits ([`Builder::circuit_breaker`](super::Builder::circuit_breaker)).
    /// `Runner` and the reqwest and tower integrations call it for you.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec, CircuitBreaker};
    /// use backpressure::Status;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder()
    ///     .circuit_breaker(CircuitBreaker::new().consecutive_failures(1))
    ///     .build();
    /// let spec = CallSpec::new("search", "key");
    /// admission.admit(&spec).await.unwrap().observe_error(); // connection refused
    /// let refused = admission.admit(&spec).await.unwrap_err();
    /// assert_eq!(refused.status, Status::Unavailable);
    /// # });
    /// ```
    pub fn observe_error(&self) {
        self.admission.circuit_outcome(
            &self.tool.name,
            &self.credential.name,
            breaker::Outcome::Failed,
            self.is_trial(),
        );
    }

    /// [`observe`](Self::observe), and for a credential whose quota is shared
    /// across processes ([`Builder::shared_quota`](super::Builder::shared_quota)),
    /// the hold pushed to the shared limiter before this returns (`observe`
    /// leaves it for the next `admit` or [`Admission::sync_shared`]). Use it
    /// wherever an `.await` is possible.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::headers::ServerHint;
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::sync::Arc;
    /// use std::time::{Duration, SystemTime};
    /// # futures::executor::block_on(async {
    /// let shared = Arc::new(TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(5).unwrap()),
    ///     ManualClock::new(),
    /// ));
    /// let admission = Admission::builder().shared_quota("org-key", shared.clone()).build();
    /// let ticket = admission.admit(&CallSpec::new("search", "org-key")).await.unwrap();
    /// let hint = ServerHint::from_headers([("retry-after", "30")], SystemTime::now());
    /// assert_eq!(ticket.report(429, &hint).await, Some(Duration::from_secs(30)));
    /// assert_eq!(shared.available(), 0); // every process holds back now
    /// # });
    /// ```
    pub async fn report(&self, status: u16, hint: &ServerHint) -> Option<Duration> {
        let held = self.observe(status, hint);
        self.admission.push_shared(&self.credential.name).await;
        held
    }

    /// Reconciles what the call was admitted for on the quota `name` (its
    /// [`CallSpec::cost`](super::CallSpec::cost), or 1 request) with what it
    /// actually used. Returns the units charged (positive) or given back
    /// (negative).
    ///
    /// * Used more: the excess is charged at once as debt.
    /// * Used less: the difference is given back only if no other call
    ///   reserved on that quota since (else nothing, erring towards less).
    ///
    /// A later settle of the same quota only charges further excess. A name
    /// that is no quota of the layer changes nothing. A shared quota
    /// ([`Builder::shared_resource`](super::Builder::shared_resource)) is
    /// settled exactly both ways, at the next push.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::{ManualClock, Quota};
    /// use std::num::NonZeroU32;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder()
    ///     .clock(ManualClock::new())
    ///     .resource("tokens", Quota::per_minute(NonZeroU32::new(1_000).unwrap()))
    ///     .build();
    /// let mut ticket = admission
    ///     .admit(&CallSpec::new("complete", "key").cost("tokens", 500))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(ticket.settle("tokens", 800), 300); // 300 more as debt
    /// assert_eq!(ticket.settle("tokens", 900), 100); // and 100 more
    /// # });
    /// ```
    pub fn settle(&mut self, name: &str, actual: u32) -> i64 {
        self.admission
            .settle(&self.credential.name, &mut self.held, name, actual)
    }

    /// The tool this ticket admits.
    pub fn tool(&self) -> &str {
        &self.tool.name
    }
}

impl<S: Sleeper, C: Clock> Drop for Ticket<S, C> {
    fn drop(&mut self) {
        let now = self.admission.inner.clock.now_nanos();
        let held = now.saturating_sub(self.started());
        self.tool.pool.record_hold(held, now);
        self.credential.counters.finished();
        #[cfg(feature = "metrics")]
        super::metrics_out::finished(&self.tool.name);
        // Release the slots `admit` took and forgot.
        let background = self.started_at & BACKGROUND != 0;
        self.tool.pool.release(background);
        self.admission
            .inner
            .slots
            .release_global(held, now, background);
    }
}

impl<S: Sleeper, C: Clock> fmt::Debug for Ticket<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("tool", &self.tool.name)
            .field("credential", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The top bit of `started_at`: a background call's (an instant reaches
/// it after 292 years). Keeps the ticket at 128 bytes.
pub(super) const BACKGROUND: u64 = 1 << 63;

/// Bit 62 of `started_at`: the call is its circuit's trial.
pub(super) const TRIAL: u64 = 1 << 62;

/// `started_at` for a call admitted at `at`, with its flag bits.
#[inline]
pub(super) fn stamp(at: u64, priority: super::Priority, trial: bool) -> u64 {
    let mut at = at & !(BACKGROUND | TRIAL);
    if priority.is_background() {
        at |= BACKGROUND;
    }
    if trial {
        at |= TRIAL;
    }
    at
}

impl<S: Sleeper, C: Clock> Ticket<S, C> {
    /// When it was admitted (layer clock, ns).
    #[inline]
    pub(super) fn started(&self) -> u64 {
        self.started_at & !(BACKGROUND | TRIAL)
    }

    /// Whether the call is its circuit's trial.
    #[inline]
    fn is_trial(&self) -> bool {
        self.started_at & TRIAL != 0
    }
}
