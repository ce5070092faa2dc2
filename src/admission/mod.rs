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
//! Slots are taken before the rate token so that a call starts at the
//! instant its token was reserved for: reserving first and then queueing for
//! a slot would let reserved calls bunch up and reach the server as a burst.
//!
//! [`Ticket::observe`] feeds the server's answer back: a 429 or a
//! `Retry-After` holds back every call on that credential (or on that
//! server scope), and `remaining: 0` waits for the reset instead of for the
//! next 429.

mod builder;
pub(crate) mod pools;
mod rates;
mod runner;
mod shared;
mod throttled;
mod ticket;

use core::fmt;
use core::future::Future;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::bucket::{Reservation, ReserveError};
use crate::clock::{Clock, DefaultClock};
use crate::headers::ServerHint;
use crate::keyed::Scoped;
use crate::semaphore::Semaphore;
use crate::sleep::{Sleeper, ThreadSleeper};
use crate::sync::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

pub use builder::Builder;
pub use pools::SlotPolicy;
pub use runner::{AttemptFuture, Call, CallResult, Reply, Runner};
pub use shared::{SharedFuture, SharedLimiter};
pub(crate) use throttled::Human;
pub use throttled::{Status, Throttled};
pub use ticket::Ticket;

use pools::{acquire_both, Pool, SlotError, Which};

/// The scope of a credential's own quota in a [`Throttled`].
const API_KEY: &str = "api_key";

/// Whether a call only reads (safe to coalesce and retry) or writes.
///
/// # Examples
///
/// ```
/// use backpressure::Kind;
/// assert!(Kind::Read.is_read());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Idempotent: identical reads may share one request.
    Read,
    /// Has effects: never coalesced, never cached.
    Write,
}

impl Kind {
    /// Whether this is [`Kind::Read`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Kind;
    /// assert!(!Kind::Write.is_read());
    /// ```
    pub fn is_read(self) -> bool {
        self == Kind::Read
    }
}

/// What `admit` needs to know about a call.
///
/// # Examples
///
/// ```
/// use backpressure::{CallSpec, Kind};
/// use std::time::Duration;
///
/// let spec = CallSpec::new("search_tickets", "org-key")
///     .kind(Kind::Read)
///     .deadline(Duration::from_secs(30));
/// assert_eq!(spec.tool, "search_tickets");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallSpec {
    /// The tool (downstream endpoint) called.
    pub tool: String,
    /// The credential the call is sent with: what the server throttles.
    pub credential: String,
    /// Read or write.
    pub kind: Kind,
    /// How long the call may wait to be admitted, from the `admit` call
    /// (through [`Runner`], from the call's start: every retry and its
    /// backoff is charged to it). A slot is waited for up to the deadline;
    /// a rate-limit wait is slept only while it fits both the deadline and
    /// the layer's inline wait ([`Builder::inline_wait`], 2 s by default):
    /// a longer one is returned at once as `rate_limited` with
    /// `retry_after_ms`, so a long deadline never means a long sleep.
    pub deadline: Duration,
}

impl CallSpec {
    /// A read with a 30 s deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{CallSpec, Kind};
    /// let spec = CallSpec::new("get_usage", "key");
    /// assert_eq!(spec.kind, Kind::Read);
    /// ```
    pub fn new(tool: impl Into<String>, credential: impl Into<String>) -> Self {
        Self {
            tool: tool.into(),
            credential: credential.into(),
            kind: Kind::Read,
            deadline: Duration::from_secs(30),
        }
    }

    /// Sets read or write.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{CallSpec, Kind};
    /// assert_eq!(CallSpec::new("refund", "k").kind(Kind::Write).kind, Kind::Write);
    /// ```
    pub fn kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// Sets the deadline (a budget from the `admit` call; see
    /// [`CallSpec::deadline`](struct.CallSpec.html#structfield.deadline)
    /// for how it meets the inline wait).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::CallSpec;
    /// use std::time::Duration;
    /// let spec = CallSpec::new("t", "k").deadline(Duration::from_secs(5));
    /// assert_eq!(spec.deadline, Duration::from_secs(5));
    /// ```
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// Proposes a concurrency cap from Little's law: in-flight calls = rate x
/// latency, rounded up, at least 1.
///
/// # Examples
///
/// ```
/// use backpressure::concurrency_for;
/// use std::time::Duration;
/// // 10 requests/s at 400 ms each keep 4 in flight.
/// assert_eq!(concurrency_for(10.0, Duration::from_millis(400)), 4);
/// assert_eq!(concurrency_for(f64::NAN, Duration::from_secs(1)), 1);
/// ```
pub fn concurrency_for(rate_per_sec: f64, latency: Duration) -> u32 {
    let n = rate_per_sec * latency.as_secs_f64();
    if n.is_finite() && n > 1.0 {
        // Subtract a hair so that 10 x 0.4 = 4.000000000000001 gives 4.
        (n - 1e-9).ceil().min(u32::MAX as f64) as u32
    } else {
        1
    }
}

/// Configuration of one tool.
#[derive(Clone, Debug)]
struct ToolConfig {
    cap: usize,
    policy: SlotPolicy,
    budget: Option<u32>,
}

struct ToolState {
    /// Created on first use with the defaults (not configured by name):
    /// such a tool may be evicted once idle.
    dynamic: bool,
    pool: Pool,
    policy: SlotPolicy,
    /// Calls admitted in this run, against `budget`.
    used: AtomicU32,
    budget: Option<u32>,
    /// The server scope (from limit headers) this tool was seen to fall
    /// under, if any.
    server_scope: RwLock<Option<String>>,
}

impl ToolState {
    /// Nobody but the registry holds it (no ticket, no admit in progress)
    /// and evicting it loses no budget.
    fn is_idle(self: &Arc<Self>) -> bool {
        // Relaxed: read under the registry's write lock; a new holder must
        // take the lock to get an `Arc`, so the count cannot grow meanwhile.
        Arc::strong_count(self) == 1 && self.used.load(Ordering::Relaxed) == 0
    }

    fn new(cfg: &ToolConfig, expected_latency: Duration, dynamic: bool) -> Self {
        Self {
            dynamic,
            pool: Pool::new(cfg.cap, expected_latency),
            policy: cfg.policy,
            used: AtomicU32::new(0),
            budget: cfg.budget,
            server_scope: RwLock::new(None),
        }
    }
}

struct Inner<S, C: Clock> {
    sleeper: S,
    clock: C,
    global: Pool,
    /// Calls waiting for any slot, against `queue_capacity`.
    waiting: AtomicUsize,
    queue_capacity: usize,
    tools: RwLock<HashMap<String, Arc<ToolState>>>,
    /// At most this many tools created on first use (see `tool_state`).
    max_tools: usize,
    default_tool: ToolConfig,
    credentials: Scoped<String, C>,
    /// The rates learned per credential (see `rates`).
    rates: rates::Rates,
    server_scopes: Scoped<(String, String), C>,
    inline_wait: Duration,
    max_retry_after: Duration,
    expected_latency: Duration,
    run_budget: Option<u32>,
    run_used: AtomicU32,
    closed: AtomicBool,
    /// Never holds a permit: `close` closes it, which wakes every call
    /// sleeping for a rate token or a retry (they race its `acquire`).
    closed_signal: Semaphore,
    /// Credentials whose quota is shared with other processes.
    shared: HashMap<String, Arc<dyn SharedLimiter>>,
    /// Penalties observed for shared credentials, applied (as "until" on
    /// our clock) by the next admit on that credential.
    pending: parking_lot::Mutex<HashMap<String, u64>>,
}

/// The admission layer: concurrency pools, rate limits per credential,
/// a bounded wait queue and a run budget, answering every call with a
/// [`Ticket`] or a structured [`Throttled`]. Cheap to clone (shared).
///
/// # Examples
///
/// ```
/// use backpressure::{Admission, CallSpec, Status};
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
pub struct Admission<S = ThreadSleeper, C: Clock = DefaultClock> {
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
    /// use backpressure::Admission;
    /// let admission = Admission::builder().global_concurrency(4).build();
    /// # let _ = admission;
    /// ```
    pub fn builder() -> Builder {
        Builder::new()
    }
}

/// Takes the run budget; gives it back on drop unless kept.
struct BudgetClaim<'a> {
    run: Option<&'a AtomicU32>,
    tool: Option<&'a AtomicU32>,
}

impl BudgetClaim<'_> {
    fn keep(mut self) {
        self.run = None;
        self.tool = None;
    }
}

impl Drop for BudgetClaim<'_> {
    fn drop(&mut self) {
        // Relaxed: a counter; it guards no other memory.
        if let Some(c) = self.run {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(c) = self.tool {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Takes one unit of `counter` if it is below `limit`.
fn take_below(counter: &AtomicU32, limit: Option<u32>) -> bool {
    let Some(limit) = limit else { return true };
    // Relaxed: a counter; the CAS makes the bound exact.
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            (used < limit).then_some(used + 1)
        })
        .is_ok()
}

/// Cancels the held reservations unless disarmed.
struct Reserved(Vec<Reservation<'static>>);

impl Drop for Reserved {
    fn drop(&mut self) {
        for r in self.0.drain(..) {
            r.cancel();
        }
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
    /// use backpressure::{Admission, CallSpec, SlotPolicy, Status};
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
    pub async fn admit(&self, spec: &CallSpec) -> Result<Ticket<S, C>, Throttled> {
        let inner = &*self.inner;
        let started = inner.clock.now_nanos();
        let deadline_at = started.saturating_add(crate::clock::saturating_nanos(spec.deadline));
        // Relaxed: a flag; a call racing `close` may still be admitted.
        if inner.closed.load(Ordering::Relaxed) {
            return Err(self.closed_refusal(spec));
        }
        let tool = match self.tool_state(&spec.tool) {
            Ok(t) => t,
            Err(refused) => return Err(self.decided(spec, refused)),
        };
        // Again: a tool created after `close` walked the map was not closed
        // by it, but its creation (under the map's write lock) happened
        // after `close`'s store, so this load sees it.
        if inner.closed.load(Ordering::Relaxed) {
            return Err(self.closed_refusal(spec));
        }

        // 1. Budget.
        let mut claim = BudgetClaim {
            run: None,
            tool: None,
        };
        if !take_below(&inner.run_used, inner.run_budget) {
            return Err(self.decided(
                spec,
                Throttled::new(
                    Status::BudgetExhausted,
                    "run",
                    "this run's call budget is spent; finish with what you have",
                ),
            ));
        }
        claim.run = inner.run_budget.map(|_| &inner.run_used);
        if !take_below(&tool.used, tool.budget) {
            return Err(self.decided(
                spec,
                Throttled::new(
                    Status::BudgetExhausted,
                    format!("tool:{}", spec.tool),
                    format!("this run's budget for {} is spent", spec.tool),
                ),
            ));
        }
        claim.tool = tool.budget.map(|_| &tool.used);

        // 2. Slots: the tool's, then the global one, until the deadline.
        let remaining = Duration::from_nanos(deadline_at.saturating_sub(inner.clock.now_nanos()));
        let timeout = core::pin::pin!(inner.sleeper.sleep(remaining));
        let slots = acquire_both(
            &tool.pool,
            &inner.global,
            tool.policy,
            &inner.waiting,
            inner.queue_capacity,
            timeout,
        )
        .await;
        let (tool_slot, global_slot) = match slots {
            Ok(s) => s,
            Err((e, which)) => return Err(self.decided(spec, slot_refusal(spec, e, which))),
        };

        // 3. Rate: the credential's bucket and any server scope's bucket,
        // within the inline wait and the deadline. A hold the server placed
        // while this call slept towards its instant sends it back here.
        let rate_started = inner.clock.now_nanos();
        let inline_end =
            rate_started.saturating_add(crate::clock::saturating_nanos(inner.inline_wait));
        let scope = tool.server_scope.read().clone();
        let scope_key = scope.as_ref().map(|s| (spec.credential.clone(), s.clone()));
        let shared = inner.shared.get(&spec.credential);
        if shared.is_none() {
            inner
                .rates
                .ensure(&spec.credential, &inner.credentials, &inner.clock);
        }
        let mut reserved = Reserved(Vec::with_capacity(2));
        loop {
            let now = inner.clock.now_nanos();
            let left = Duration::from_nanos(deadline_at.saturating_sub(now));
            let max_wait = Duration::from_nanos(inline_end.min(deadline_at).saturating_sub(now));
            let mut wait = Duration::ZERO;
            if shared.is_none() {
                // A credential shared across processes is admitted by its
                // shared limiter below, not by a local bucket.
                match inner.credentials.reserve(&spec.credential, 1, max_wait) {
                    Ok(r) => {
                        wait = wait.max(r.wait());
                        reserved.0.push(r);
                    }
                    Err(e) => {
                        return Err(self.decided(spec, self.rate_refusal(e, API_KEY, left)));
                    }
                }
            }
            if let (Some(key), Some(name)) = (&scope_key, &scope) {
                match inner.server_scopes.reserve(key, 1, max_wait) {
                    Ok(r) => {
                        wait = wait.max(r.wait());
                        reserved.0.push(r);
                    }
                    Err(e) => {
                        let scope = format!("server:{name}");
                        return Err(self.decided(spec, self.rate_refusal(e, &scope, left)));
                    }
                }
            }
            if let Some(shared) = shared {
                // Last, so a refusal here cancels the local reservations
                // above (a shared cell cannot be given back without a round
                // trip).
                self.push_penalty(&spec.credential, shared.as_ref()).await;
                match shared.reserve_one(max_wait).await {
                    Ok(w) => wait = wait.max(w),
                    Err(e) => {
                        return Err(self.decided(spec, self.rate_refusal(e, API_KEY, left)));
                    }
                }
            }
            if wait.is_zero() {
                break;
            }
            let ready_at = now.saturating_add(crate::clock::saturating_nanos(wait));
            if !self.sleep_unless_closed(wait).await {
                return Err(self.closed_refusal(spec));
            }
            if self.held_until(&spec.credential, scope_key.as_ref()) <= ready_at {
                break;
            }
            // A 429 arrived while we slept and its hold covers our instant:
            // give the reservations back (a penalty usually voids the
            // refund, which errs towards admitting less) and queue again
            // behind the hold, within what is left of the budgets.
            for r in reserved.0.drain(..) {
                let _ = r.cancel();
            }
        }
        // The tokens are used now: keep them.
        core::mem::take(&mut reserved.0);
        claim.keep();
        self.decided_ok(
            spec,
            Duration::from_nanos(inner.clock.now_nanos().saturating_sub(rate_started)),
        );
        Ok(Ticket {
            admission: self.clone(),
            tool: tool.clone(),
            tool_name: spec.tool.clone(),
            credential: spec.credential.clone(),
            started_at: inner.clock.now_nanos(),
            _slots: (tool_slot, global_slot),
        })
    }

    fn rate_refusal(&self, e: ReserveError, scope: &str, left: Duration) -> Throttled {
        let inner = &*self.inner;
        if let ReserveError::Unavailable { retry_after } = e {
            // Not a quota: the store that keeps the shared one is down (its
            // fail policy is closed). Say so, with its configured wait.
            return Throttled::new(
                Status::RateLimited,
                scope,
                format!(
                    "the shared quota store did not answer; retry after {}",
                    Human(retry_after)
                ),
            )
            .with_retry_after(retry_after);
        }
        match e.retry_after() {
            Some(after) if after > inner.max_retry_after => Throttled::new(
                Status::QuotaExhausted,
                scope,
                format!(
                    "the limit resets in {}, longer than any retry is worth; tell the operator",
                    Human(after)
                ),
            )
            .with_retry_after(after),
            Some(after) if after > left => Throttled::new(
                Status::RateLimited,
                scope,
                format!(
                    "the next slot is in {}, after this call's deadline ({} left); retry later or drop the call",
                    Human(after),
                    Human(left)
                ),
            )
            .with_retry_after(after),
            Some(after) => Throttled::new(
                Status::RateLimited,
                scope,
                format!(
                    "the next slot is in {}, longer than the {} waited inline; retry after that",
                    Human(after),
                    Human(inner.inline_wait)
                ),
            )
            .with_retry_after(after),
            None => Throttled::new(
                Status::RateLimited,
                scope,
                format!("cannot take a rate-limit slot: {e}"),
            ),
        }
    }

    /// The end of the latest server hold that covers `credential`'s calls
    /// (its own, its shared quota's as last observed here, and the
    /// server scope `scope` it falls under).
    fn held_until(&self, credential: &str, scope: Option<&(String, String)>) -> u64 {
        let inner = &*self.inner;
        let own = inner.credentials.held_until(&credential.to_string());
        let scoped = scope.map_or(0, |k| inner.server_scopes.held_until(k));
        let shared = inner.pending.lock().get(credential).copied().unwrap_or(0);
        own.max(scoped).max(shared)
    }

    /// The state of `tool`, created with the defaults on first use.
    ///
    /// Tools not configured by name are capped at `max_tools`: at the cap,
    /// the idle ones (no call admitted or waiting, no budget used this run)
    /// are evicted first, and a new name is refused only if none is idle.
    /// An evicted tool forgets its hold-time estimate and the server scope
    /// it was seen under; both are learned again.
    fn tool_state(&self, tool: &str) -> Result<Arc<ToolState>, Throttled> {
        let inner = &*self.inner;
        if let Some(t) = inner.tools.read().get(tool) {
            return Ok(t.clone());
        }
        let mut tools = inner.tools.write();
        if let Some(t) = tools.get(tool) {
            return Ok(t.clone());
        }
        let dynamic = tools.values().filter(|t| t.dynamic).count();
        if dynamic >= inner.max_tools {
            tools.retain(|_, t| !(t.dynamic && t.is_idle()));
            let left = tools.values().filter(|t| t.dynamic).count();
            if left >= inner.max_tools {
                return Err(Throttled::new(
                    Status::Shed,
                    format!("tool:{tool}"),
                    format!(
                        "{left} tools not configured by name are in use, the most this layer tracks; \
                         retry once some finish, or configure the tool by name"
                    ),
                ));
            }
        }
        let state = Arc::new(ToolState::new(
            &inner.default_tool,
            inner.expected_latency,
            true,
        ));
        tools.insert(tool.to_string(), state.clone());
        Ok(state)
    }

    /// Pushes the penalties observed on credentials with a shared quota
    /// (see [`Builder::shared_quota`]) to their shared limiters, so other
    /// processes hold back too. [`Ticket::observe`] cannot await, so it
    /// records them; the next `admit` on the same credential pushes them,
    /// and this pushes them all now ([`Runner`] calls it after every
    /// throttled reply).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, ManualClock, Quota, ServerHint, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::SystemTime;
    ///
    /// let shared = std::sync::Arc::new(TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(5).unwrap()),
    ///     ManualClock::new(),
    /// ));
    /// let admission = Admission::builder().shared_quota("org-key", shared.clone()).build();
    /// let hint = ServerHint::from_headers([("retry-after", "30")], SystemTime::now());
    /// admission.observe("search", "org-key", 429, &hint);
    /// futures::executor::block_on(admission.sync_shared());
    /// assert_eq!(shared.available(), 0); // held back for everyone
    /// ```
    pub async fn sync_shared(&self) {
        let credentials: Vec<String> = self.inner.pending.lock().keys().cloned().collect();
        for credential in credentials {
            if let Some(shared) = self.inner.shared.get(&credential) {
                self.push_penalty(&credential, shared.as_ref()).await;
            }
        }
    }

    async fn push_penalty(&self, credential: &str, shared: &dyn SharedLimiter) {
        let pending = self.inner.pending.lock().remove(credential);
        if let Some(until) = pending {
            let now = self.inner.clock.now_nanos();
            if until > now {
                shared.penalize_all(Duration::from_nanos(until - now)).await;
            }
        }
    }

    /// Starts a new run: the run budget and the per-tool budgets count from
    /// zero again.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, CallSpec};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().run_budget(1).build();
    /// drop(admission.admit(&CallSpec::new("t", "k")).await.unwrap());
    /// assert!(admission.admit(&CallSpec::new("t", "k")).await.is_err());
    /// admission.reset_run();
    /// assert!(admission.admit(&CallSpec::new("t", "k")).await.is_ok());
    /// # });
    /// ```
    pub fn reset_run(&self) {
        // Relaxed: counters.
        self.inner.run_used.store(0, Ordering::Relaxed);
        for t in self.inner.tools.read().values() {
            t.used.store(0, Ordering::Relaxed);
        }
    }

    /// Refuses every later call with `closed`. Admitted tickets stay valid.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, CallSpec, Status};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().build();
    /// admission.close();
    /// let err = admission.admit(&CallSpec::new("t", "k")).await.unwrap_err();
    /// assert_eq!(err.status, Status::Closed);
    /// # });
    /// ```
    pub fn close(&self) {
        let inner = &*self.inner;
        // Relaxed: the tools map's lock orders this store before any tool
        // created later (see `admit`, which checks again after creating
        // its tool); the semaphores below carry their own ordering.
        inner.closed.store(true, Ordering::Relaxed);
        for tool in inner.tools.read().values() {
            tool.pool.close();
        }
        inner.global.close();
        inner.closed_signal.close();
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Admission;
    /// let admission = Admission::builder().build();
    /// assert!(!admission.is_closed());
    /// admission.close();
    /// assert!(admission.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        // Relaxed: advisory, as in `admit`.
        self.inner.closed.load(Ordering::Relaxed)
    }

    /// Sleeps for `d` unless the layer is closed first; returns whether the
    /// whole sleep ran (false: closed).
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

    fn closed_refusal(&self, spec: &CallSpec) -> Throttled {
        self.decided(
            spec,
            Throttled::new(Status::Closed, "admission", "the admission layer is closed"),
        )
    }

    /// Applies a server's answer for `credential` (and `tool`) without a
    /// ticket, e.g. from a response of a call made outside this layer.
    /// Returns the hold applied. See [`Ticket::observe`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, ServerHint};
    /// use std::time::{Duration, SystemTime};
    /// let admission = Admission::builder().build();
    /// let hint = ServerHint::from_headers([("retry-after", "3")], SystemTime::now());
    /// assert_eq!(admission.observe("search", "key", 429, &hint), Some(Duration::from_secs(3)));
    /// ```
    pub fn observe(
        &self,
        tool: &str,
        credential: &str,
        status: u16,
        hint: &ServerHint,
    ) -> Option<Duration> {
        let now = self.inner.clock.now_nanos();
        self.observe_sent(tool, credential, status, hint, now)
    }

    /// [`observe`](Self::observe) for a request sent at `sent_at` (on the
    /// layer's clock): the learned rate ignores 429s of requests sent
    /// before its last decrease.
    pub(crate) fn observe_sent(
        &self,
        tool: &str,
        credential: &str,
        status: u16,
        hint: &ServerHint,
        sent_at: u64,
    ) -> Option<Duration> {
        let inner = &*self.inner;
        if !inner.shared.contains_key(credential) {
            // The new rate before the hold (see `Rates::observe`).
            let now = inner.clock.now_nanos();
            inner
                .rates
                .observe(credential, status, hint, sent_at, now, &inner.credentials);
        }
        let wait = match hint.wait() {
            Some(w) => w,
            // A 429 with no hint: hold the key back for a second rather
            // than let the next call find out the same way.
            None if status == 429 => Duration::from_secs(1),
            None => return None,
        };
        match &hint.scope {
            Some(scope) => {
                // The server named the limit: hold back only the calls that
                // fall under it (this tool's, from now on).
                let _ = inner
                    .server_scopes
                    .penalize(&(credential.to_string(), scope.clone()), wait);
                // A tool the registry cannot hold right now learns its
                // scope on a later reply.
                if let Ok(tool) = self.tool_state(tool) {
                    *tool.server_scope.write() = Some(scope.clone());
                }
            }
            None if inner.shared.contains_key(credential) => {
                // Reaching the shared limiter needs an await: the next admit
                // on this credential applies it before reserving.
                let until = inner
                    .clock
                    .now_nanos()
                    .saturating_add(crate::clock::saturating_nanos(wait));
                let mut pending = inner.pending.lock();
                let slot = pending.entry(credential.to_string()).or_insert(0);
                *slot = (*slot).max(until);
            }
            None => {
                let _ = inner.credentials.penalize(&credential.to_string(), wait);
            }
        }
        Some(wait)
    }

    fn decided(&self, spec: &CallSpec, t: Throttled) -> Throttled {
        #[cfg(feature = "tracing")]
        tracing::event!(
            tracing::Level::DEBUG,
            tool = %spec.tool,
            scope = %t.scope,
            status = t.status.as_str(),
            retry_after_ms = t.retry_after_ms,
            "backpressure: refused"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = spec;
        t
    }

    fn decided_ok(&self, spec: &CallSpec, waited: Duration) {
        #[cfg(feature = "tracing")]
        tracing::event!(
            tracing::Level::DEBUG,
            tool = %spec.tool,
            waited_ms = waited.as_millis() as u64,
            "backpressure: admitted"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = (spec, waited);
    }

    /// The rate (requests per second) the layer has learned for
    /// `credential`, or `None` if it keeps a fixed quota (adaptive rates off
    /// with [`Builder::fixed_rates`], a shared quota, or no call made yet).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, CallSpec};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().build();
    /// assert_eq!(admission.learned_rate("key"), None);
    /// drop(admission.admit(&CallSpec::new("search", "key")).await.unwrap());
    /// assert_eq!(admission.learned_rate("key"), Some(10.0)); // the starting guess
    /// # });
    /// ```
    pub fn learned_rate(&self, credential: &str) -> Option<f64> {
        self.inner.rates.rate(credential)
    }

    /// The clock the layer's rate limits and deadlines run on.
    pub(crate) fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// Calls waiting for a slot right now.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Admission;
    /// assert_eq!(Admission::builder().build().waiting(), 0);
    /// ```
    pub fn waiting(&self) -> usize {
        // Relaxed: advisory.
        self.inner.waiting.load(Ordering::Relaxed)
    }
}

fn slot_refusal(spec: &CallSpec, e: SlotError, which: Which) -> Throttled {
    let scope = match which {
        Which::Tool => format!("tool:{}", spec.tool),
        Which::Global => "global".to_string(),
    };
    match e {
        SlotError::Full { estimate } => Throttled::new(
            Status::Shed,
            scope,
            "too many calls are waiting; retry after the drain estimate",
        )
        .with_retry_after(estimate),
        SlotError::TimedOut => Throttled::new(
            Status::TimedOut,
            scope,
            "no slot came free before the call's deadline",
        ),
        SlotError::Closed => Throttled::new(Status::Closed, scope, "the pool is closed"),
    }
}

impl<S, C: Clock> fmt::Debug for Admission<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("global_cap", &self.inner.global.cap)
            .field("waiting", &self.inner.waiting.load(Ordering::Relaxed))
            .field("queue_capacity", &self.inner.queue_capacity)
            .finish_non_exhaustive()
    }
}
