//! The harness gate: every call asks [`Admission::admit`] before it starts
//! and gets a [`Ticket`] (go) or a [`Throttled`] (not now, and why).
//!
//! Four limits, checked in this order:
//!
//! 1. **run budget**: at most N calls per run (optionally per tool);
//! 2. **concurrency**: a per-tool pool, then the global pool (see
//!    [`SlotPolicy`] for what a call does when its tool is full);
//! 3. **rate**: the credential's token bucket (and the bucket of any server
//!    scope the tool was seen to fall under); a wait up to the inline
//!    threshold is slept inside `admit`, a longer one is returned at once as
//!    `rate_limited` without consuming a token;
//! 4. **the deadline**: no wait ever runs past the call's deadline.
//!
//! Slots are taken before the rate token, so a call starts at the instant
//! its token was reserved for instead of bunching up behind a slot.
//! [`Ticket::observe`] feeds the server's answer (429, `Retry-After`,
//! `remaining: 0`) back to the credential's or server scope's limit.

pub(crate) mod attempt;
pub(crate) mod breaker;
mod budget;
mod builder;
mod cache;
mod circuit;
pub(crate) mod identity;
pub(crate) mod lanes;
#[cfg(feature = "metrics")]
mod metrics_out;
pub(crate) mod pools;
pub(crate) mod rate;
mod runner;
mod slots;
mod spec;
mod stagger;
mod stats;
mod ticket;
mod tools;

use core::fmt;
use core::future::Future;
use core::time::Duration;
use std::sync::Arc;

use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::semaphore::Semaphore;
use crate::sleep::{DefaultSleeper, Sleeper};
use crate::sync::{AtomicBool, AtomicUsize, Ordering};

pub use crate::failure::CallFailure;
use crate::throttled::{Status, Throttled};
pub use breaker::CircuitBreaker;
pub use builder::Builder;
pub use lanes::Priority;
pub use pools::SlotPolicy;
pub use rate::Provider;
pub use runner::{Call, CallResult, Reply, Runner};
pub use spec::CallSpec;
pub use stats::{AdmissionStats, CredentialStats, ToolStats};
pub use ticket::Ticket;

use tools::ToolState;

/// The layer's state, one field per stage.
struct Inner<S, C: Clock> {
    sleeper: S,
    clock: C,
    closed: AtomicBool,
    /// Never holds a permit: `close` closes it, waking every sleeping call.
    closed_signal: Semaphore,
    budget: budget::RunBudget,
    slots: slots::Slots,
    rates: rate::Rates<C>,
    totals: stats::Totals,
    /// Retry instants told to refused calls, per limit.
    told: stagger::Stagger,
    breakers: Option<breaker::Breakers>,
    /// Background calls sleeping for their turn (counted by `waiting`).
    turns_waiting: AtomicUsize,
}

/// What a call being admitted holds so far (tool, budget units, slots);
/// dropped before [`keep`](Taken::keep), it gives them all back.
struct Taken<'a, S: Sleeper, C: Clock> {
    admission: &'a Admission<S, C>,
    /// A background call's turn in its share of the credential's rate.
    turn: Option<(&'a str, rate::Kept)>,
    tool: Arc<ToolState>,
    /// Released if the call is not admitted after all.
    pass: Option<breaker::Pass>,
    units: budget::Units,
    slots: bool,
    priority: Priority,
}

impl<S: Sleeper, C: Clock> Taken<'_, S, C> {
    /// Hands the slots, budget units and circuit trial to the ticket of a
    /// call started at `at`, holding `held`.
    #[inline]
    fn keep(
        self,
        credential: Arc<rate::learned::CredentialState>,
        held: rate::Held,
        at: u64,
    ) -> Ticket<S, C> {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so each field is
        // moved out exactly once, and the others (a reference, plain
        // counts) need no drop.
        let (tool, pass) = unsafe { (core::ptr::read(&this.tool), core::ptr::read(&this.pass)) };
        let trial = pass.is_some_and(breaker::Pass::keep);
        Ticket {
            admission: this.admission.clone(),
            credential,
            started_at: ticket::stamp(at, this.priority, trial),
            held,
            tool,
        }
    }
}

impl<S: Sleeper, C: Clock> Drop for Taken<'_, S, C> {
    fn drop(&mut self) {
        let inner = &*self.admission.inner;
        if self.slots {
            inner.slots.give_back(&self.tool, self.priority);
        }
        inner.budget.give_back(&self.tool, self.units);
        if let Some((credential, kept)) = &self.turn {
            self.admission.give_back_turn(credential, kept);
        }
    }
}

/// The admission layer: concurrency pools, per-credential rate limits, a
/// bounded wait queue and a run budget, answering every call with a
/// [`Ticket`] or a [`Throttled`]. Cheap to clone (shared).
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, CallSpec};
/// use backpressure::Status;
///
/// # futures::executor::block_on(async {
/// let admission = Admission::builder().run_budget(1).build();
/// let ticket = admission.admit(&CallSpec::new("search", "key")).await.unwrap();
/// // ... send the request while holding `ticket` ...
/// drop(ticket);
/// let refused = admission.admit(&CallSpec::new("search", "key")).await.unwrap_err();
/// assert_eq!(refused.status, Status::BudgetExhausted);
/// # });
/// ```
pub struct Admission<S = DefaultSleeper, C: Clock = DefaultClock> {
    inner: Arc<Inner<S, C>>,
}

impl<S, C: Clock> Clone for Admission<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl Admission {
    /// A builder with the documented defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// let admission = Admission::builder().global_concurrency(4).build();
    /// # let _ = admission;
    /// ```
    pub fn builder() -> Builder {
        Builder::new()
    }
}

impl<S, C> Admission<S, C>
where
    S: Sleeper,
    C: Clock,
{
    /// Admits `spec`'s call, waiting (inside this future) for a slot up to
    /// the call's deadline and for a rate-limit token up to the inline
    /// threshold.
    ///
    /// # Errors
    ///
    /// A [`Throttled`] saying why the call may not start now:
    /// `budget_exhausted`, `shed` (queue full, or a fail-fast tool is busy),
    /// `timed_out`, `rate_limited`, `quota_exhausted` or `closed`. Nothing
    /// is consumed for a refused call: no slot, no token, no budget.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back everything taken so far (slots, the
    /// reserved token, the budget unit) and leaves the queues in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec, SlotPolicy};
    /// use backpressure::Status;
    ///
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().tool("refund", 1, SlotPolicy::FailFast).build();
    /// let first = admission.admit(&CallSpec::new("refund", "k")).await.unwrap();
    /// let second = admission.admit(&CallSpec::new("refund", "k")).await.unwrap_err();
    /// assert_eq!(second.status, Status::Shed);
    /// assert_eq!(second.scope, "tool:refund");
    /// # drop(first);
    /// # });
    /// ```
    // Not an `async fn`, so an immediate admission is not wrapped in a second
    // state machine.
    #[inline]
    pub fn admit(&self, spec: &CallSpec) -> impl Future<Output = Result<Ticket<S, C>, Throttled>> {
        self.admit_within(spec, spec.deadline, Duration::ZERO, None)
    }

    /// [`admit`](Self::admit) with `deadline` in place of the spec's, sleeping
    /// a rate wait of up to `inline` even past the layer's inline threshold
    /// (the retry of a capacity answer, whose wait the retry policy judged).
    /// `now`, if the caller just read the clock, saves reading it again.
    pub(crate) async fn admit_within(
        &self,
        spec: &CallSpec,
        deadline: Duration,
        inline: Duration,
        now: Option<u64>,
    ) -> Result<Ticket<S, C>, Throttled> {
        let started = now.unwrap_or_else(|| self.inner.clock.now_nanos());
        // Anything to wait for goes down the boxed staged path, so the future of
        // a call admitted at once stays small.
        let waiting = match self.admit_now(spec, deadline, started) {
            Ok(decided) => {
                self.record(spec, started, &decided);
                return decided;
            }
            Err(taken) => Box::pin(self.stages(spec, deadline, started, inline, taken)),
        };
        let admitted = waiting.await;
        self.record(spec, started, &admitted);
        admitted
    }

    /// Counts the decision (and traces it).
    #[inline]
    fn record(&self, spec: &CallSpec, started: u64, admitted: &Result<Ticket<S, C>, Throttled>) {
        let inner = &*self.inner;
        match admitted {
            Ok(ticket) => {
                inner.totals.admitted();
                ticket.tool.counters.admitted();
                ticket.credential.counters.admitted();
                #[cfg(feature = "metrics")]
                metrics_out::admitted(&ticket.tool.name, started, ticket.started());
                #[cfg(feature = "tracing")]
                tracing::event!(
                    tracing::Level::DEBUG,
                    tool = %spec.tool,
                    waited_ms = (ticket.started().saturating_sub(started) / 1_000_000),
                    "backpressure: admitted"
                );
            }
            Err(t) => {
                #[cfg(feature = "metrics")]
                metrics_out::refused(&spec.tool, t.status);
                inner.totals.refused(t.status);
                if let Some(tool) = inner.slots.peek_tool(&spec.tool) {
                    tool.counters.refused(t.status);
                }
                if let Some(credential) = inner.rates.peek_credential(&spec.credential) {
                    credential.counters.refused(t.status);
                }
                #[cfg(feature = "tracing")]
                tracing::event!(
                    tracing::Level::DEBUG,
                    tool = %spec.tool,
                    scope = %t.scope,
                    status = t.status.as_str(),
                    retry_after_ms = t.retry_after_ms,
                    "backpressure: refused"
                );
            }
        }
        #[cfg(not(any(feature = "tracing", feature = "metrics")))]
        let _ = started;
    }

    /// The stages the fast path could not finish. What `taken` holds is given
    /// back if a stage refuses or the future is dropped.
    async fn stages<'a>(
        &'a self,
        spec: &'a CallSpec,
        deadline: Duration,
        started: u64,
        inline: Duration,
        mut taken: Taken<'a, S, C>,
    ) -> Result<Ticket<S, C>, Throttled> {
        let inner = &*self.inner;
        let deadline_at = started.saturating_add(saturating_nanos(deadline));

        // A background call's turn in its class's share of the rate.
        if spec.priority.is_background() && taken.turn.is_none() && !taken.slots {
            self.wait_turn(spec, deadline_at, inline, &mut taken)
                .await?;
        }

        // 3. Slots: the tool's, then the global one, until the deadline.
        // Where the rate stage starts from: `started` unless a slot was waited for.
        let mut rate_from = Some(started);
        if !taken.slots {
            rate_from = None;
            let remaining =
                Duration::from_nanos(deadline_at.saturating_sub(inner.clock.now_nanos()));
            let timeout = core::pin::pin!(inner.sleeper.sleep(remaining));
            inner
                .slots
                .take(&taken.tool, spec.priority, &spec.credential, timeout)
                .await
                .map_err(|(e, which)| self.slot_refusal(spec, &taken.tool, e, which))?;
            taken.slots = true;
        }

        // A slot freed only at the deadline leaves no time for the rate: timed out.
        if rate_from.is_none() && inner.clock.now_nanos() >= deadline_at {
            return Err(Throttled::new(
                Status::TimedOut,
                format!("tool:{}", spec.tool),
                "a slot came free only at the call's deadline, with no time left to send it; \
                 retry with a longer deadline or later",
            ));
        }

        // 4. Rate: every quota the call draws on, all or nothing.
        let credential = inner
            .rates
            .credential(&spec.credential, inner.clock.now_nanos());
        let (held, started_at) = self
            .take_rate(
                spec,
                &taken.tool,
                &credential,
                deadline_at,
                rate_from,
                inline,
            )
            .await?;
        Ok(taken.keep(credential, held, started_at))
    }

    /// The stages with no wait allowed: the decision, or (`Err`) what was
    /// taken before a stage would wait or need the staged path, which
    /// [`stages`](Self::stages) continues from.
    #[inline]
    fn admit_now<'a>(
        &'a self,
        spec: &'a CallSpec,
        deadline: Duration,
        started: u64,
    ) -> Result<Result<Ticket<S, C>, Throttled>, Taken<'a, S, C>> {
        let inner = &*self.inner;
        // A cost on a quota the layer lacks would go unmetered: refuse it.
        if !spec.costs.is_empty()
            && let Some(refused) = inner.rates.unknown_cost(spec)
        {
            return Ok(Err(refused));
        }
        // 1. Open: the layer is not closed, and the tool has a place.
        let tool = match self.open_tool(spec) {
            Ok(tool) => tool,
            Err(refused) => return Ok(Err(refused)),
        };
        // The circuit: a server that keeps failing is sent nothing.
        let pass = match inner.breakers.as_ref() {
            None => None,
            Some(breakers) => match self.circuit(breakers, spec, deadline, &tool, started) {
                Ok(pass) => Some(pass),
                Err(refused) => return Ok(Err(refused)),
            },
        };
        // 2. Budget: the run's and the tool's, given back unless kept.
        let units = match inner.budget.claim(&tool, &spec.tool) {
            Ok(units) => units,
            Err(refused) => return Ok(Err(refused)),
        };
        let mut taken = Taken {
            admission: self,
            turn: None,
            tool,
            pass,
            units,
            slots: false,
            priority: spec.priority,
        };
        // A background call's turn, if it is now; otherwise wait before slots.
        if spec.priority.is_background() && !self.turn_now(spec, started, &mut taken) {
            return Err(taken);
        }
        // 3. Slots, if both are free now.
        if !inner.slots.try_take(&taken.tool, spec.priority) {
            return Err(taken);
        }
        taken.slots = true;
        // Relaxed: only decides which path runs; the staged path loads it
        // again with Acquire before reading the scope.
        if taken.tool.scoped.load(Ordering::Relaxed) || inner.rates.is_remote(&spec.credential) {
            return Err(taken);
        }
        // 4. Rate, no wait allowed. As of `started`, the ticket's send time, so a
        // controller created now still learns from this request.
        let credential = inner.rates.credential(&spec.credential, started);
        let at = rate::Instant {
            now: started,
            max_wait: Duration::ZERO,
            left: Duration::MAX,
        };
        let mut reserved = rate::Reserved::new(self, &spec.credential, None);
        if self
            .reserve_local(spec, &credential, true, None, at, &mut reserved)
            .is_err()
        {
            return Err(taken);
        }
        Ok(Ok(taken.keep(credential, reserved.keep(), started)))
    }

    /// Stage 1: refuses when closed; else the tool's state.
    #[inline]
    fn open_tool(&self, spec: &CallSpec) -> Result<Arc<ToolState>, Throttled> {
        let inner = &*self.inner;
        // Relaxed: a flag; a call racing `close` may still be admitted.
        if inner.closed.load(Ordering::Relaxed) {
            return Err(self.closed_refusal());
        }
        let tool = inner.slots.tool(&spec.tool)?;
        // Again: a tool created after `close` walked the map was not closed by it,
        // but the map's lock orders its creation after `close`'s store.
        if inner.closed.load(Ordering::Relaxed) {
            return Err(self.closed_refusal());
        }
        Ok(tool)
    }

    /// Starts a new run: the run budget and the per-tool budgets count from
    /// zero again.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().run_budget(1).build();
    /// drop(admission.admit(&CallSpec::new("t", "k")).await.unwrap());
    /// assert!(admission.admit(&CallSpec::new("t", "k")).await.is_err());
    /// admission.reset_run();
    /// assert!(admission.admit(&CallSpec::new("t", "k")).await.is_ok());
    /// # });
    /// ```
    pub fn reset_run(&self) {
        self.inner.budget.reset();
        self.inner.slots.reset_budgets();
    }

    /// Refuses every later call with `closed`. Admitted tickets stay valid.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::Status;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().build();
    /// admission.close();
    /// let err = admission.admit(&CallSpec::new("t", "k")).await.unwrap_err();
    /// assert_eq!(err.status, Status::Closed);
    /// # });
    /// ```
    pub fn close(&self) {
        let inner = &*self.inner;
        // Relaxed: the tools map's lock orders this store before any tool created
        // later (`open_tool` checks again); the semaphores carry their own ordering.
        inner.closed.store(true, Ordering::Relaxed);
        inner.slots.close();
        inner.closed_signal.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        // Relaxed: advisory, as in `admit`.
        self.inner.closed.load(Ordering::Relaxed)
    }

    /// Sleeps for `d` unless closed first; false if closed.
    pub(crate) async fn sleep_unless_closed(&self, d: Duration) -> bool {
        let inner = &*self.inner;
        let mut sleep = core::pin::pin!(inner.sleeper.sleep(d));
        let mut closed = core::pin::pin!(inner.closed_signal.acquire());
        core::future::poll_fn(|cx| {
            // The signal never has a permit: it completes only when closed.
            if closed.as_mut().poll(cx).is_ready() {
                return core::task::Poll::Ready(false);
            }
            sleep.as_mut().poll(cx).map(|()| true)
        })
        .await
    }

    pub(super) fn closed_refusal(&self) -> Throttled {
        Throttled::new(Status::Closed, "admission", "the admission layer is closed")
    }

    /// The rate (requests per second) the layer has learned for
    /// `credential`, or `None` if it keeps a fixed quota (adaptive rates off
    /// with [`Builder::fixed_rates`], a shared quota, or no call made yet).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().build();
    /// assert_eq!(admission.learned_rate("key"), None);
    /// drop(admission.admit(&CallSpec::new("search", "key")).await.unwrap());
    /// assert_eq!(admission.learned_rate("key"), Some(10.0)); // the starting guess
    /// # });
    /// ```
    pub fn learned_rate(&self, credential: &str) -> Option<f64> {
        self.inner.rates.learned_rate(credential)
    }

    /// How many units of the quota `name` (`"requests"`, or a weighted
    /// quota given to [`Builder::resource`]) `credential` could take now
    /// without waiting; `None` for a quota the layer does not have, or for
    /// the requests of a credential whose quota is shared across processes.
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
    /// drop(admission.admit(&CallSpec::new("t", "key").cost("tokens", 300)).await.unwrap());
    /// assert_eq!(admission.available("key", "tokens"), Some(700));
    /// assert_eq!(admission.available("key", "bytes"), None);
    /// # });
    /// ```
    pub fn available(&self, credential: &str, name: &str) -> Option<u32> {
        self.inner.rates.available(credential, name)
    }

    /// The clock the layer's rate limits and deadlines run on.
    pub(crate) fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// The layer's timer.
    pub(crate) fn sleeper(&self) -> &S {
        &self.inner.sleeper
    }

    /// Whether [`Builder::provider`] was called: then an HTTP `POST` is a
    /// completion and may be sent again.
    #[cfg(any(feature = "reqwest", feature = "tower"))]
    pub(crate) fn told_provider(&self) -> bool {
        self.inner.rates.told_provider()
    }

    /// Calls waiting right now: queued for a slot, or (background calls)
    /// sleeping for their turn in their class's share of a rate.
    pub fn waiting(&self) -> usize {
        // Relaxed: advisory, a snapshot of two counters.
        self.inner.slots.waiting() + self.inner.turns_waiting.load(Ordering::Relaxed)
    }
}

impl<S, C: Clock> fmt::Debug for Admission<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (global_cap, queue_capacity) = self.inner.slots.bounds();
        f.debug_struct("Admission")
            .field("global_cap", &global_cap)
            .field("waiting", &self.inner.slots.waiting())
            .field("queue_capacity", &queue_capacity)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod taken;
