//! What `admit` needs to know about a call: [`CallSpec`], and
//! `concurrency_for` to size a pool from a rate and a latency.

use core::time::Duration;
use std::borrow::Cow;

use super::lanes::Priority;

/// The name of the request quota in [`CallSpec::cost`].
pub(crate) const REQUESTS: &str = "requests";

/// What `admit` needs to know about a call.
///
/// # Examples
///
/// ```
/// use backpressure::admission::CallSpec;
/// use std::time::Duration;
///
/// let spec = CallSpec::new("search_tickets", "org-key").deadline(Duration::from_secs(30));
/// assert_eq!(spec.tool, "search_tickets");
/// assert!(!spec.write); // a read: identical ones may share one request
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallSpec {
    /// The tool (downstream endpoint) called.
    pub tool: String,
    /// The credential the call is sent with: what the server throttles.
    pub credential: String,
    /// Whether the call has effects: a write is never coalesced or cached,
    /// and, unless [`idempotent`](Self::idempotent), never sent again once its
    /// request may have reached the server's handler (a 429 or 503 the server
    /// sent instead of running it is still retried). `false`: a read.
    pub write: bool,
    /// Whether a write may run twice with one effect (a `PUT`, an
    /// idempotency key, an LLM completion): then it is retried after a fault
    /// like a read, though never coalesced.
    pub idempotent: bool,
    /// What the call costs against each named quota of its credential, as
    /// (quota, units). `"requests"` defaults to 1, other quotas to 0.
    pub costs: Vec<(Cow<'static, str>, u32)>,
    /// How long the call may wait to be admitted (through
    /// [`Runner`](super::Runner), every retry and backoff is charged to it).
    /// A slot is waited for up to the deadline; a rate-limit wait is slept
    /// only while it also fits [`Builder::inline_wait`](super::Builder::inline_wait),
    /// else returned at once as `rate_limited`.
    pub deadline: Duration,
    /// Which calls go first when waiting for slots, with
    /// [`Builder::priority_lanes`](super::Builder::priority_lanes):
    /// [`Priority::INTERACTIVE`] (default), [`Priority::BACKGROUND`], or any level.
    pub priority: Priority,
}

impl CallSpec {
    /// A read with a 30 s deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::CallSpec;
    /// let spec = CallSpec::new("get_usage", "key");
    /// assert!(!spec.write);
    /// ```
    pub fn new(tool: impl Into<String>, credential: impl Into<String>) -> Self {
        Self {
            tool: tool.into(),
            credential: credential.into(),
            write: false,
            idempotent: false,
            costs: Vec::new(),
            deadline: Duration::from_secs(30),
            priority: Priority::INTERACTIVE,
        }
    }

    /// Marks the call a write: it has effects, so it is never coalesced
    /// with an identical call or cached.
    pub fn write(mut self) -> Self {
        self.write = true;
        self
    }

    /// Marks the call idempotent: a write that may run twice with one
    /// effect (see [`idempotent`](Self::idempotent)), retried after a
    /// fault like a read.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// The call's priority (see
    /// [`Builder::priority_lanes`](super::Builder::priority_lanes)).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets what the call costs against the quota `name` of its credential
    /// (replacing an earlier cost for it), e.g. an LLM call's estimated tokens;
    /// [`Ticket::settle`](super::Ticket::settle) reconciles it later. A name
    /// that is no quota of the layer makes `admit` refuse the call as
    /// `quota_exhausted`: a misspelt cost is never admitted free.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::CallSpec;
    /// let spec = CallSpec::new("complete", "key").cost("tokens", 1_800);
    /// assert_eq!(spec.cost_of("tokens"), Some(1_800));
    /// assert_eq!(spec.cost_of("requests"), None); // 1 by default
    /// ```
    pub fn cost(mut self, name: impl Into<Cow<'static, str>>, units: u32) -> Self {
        set_units(&mut self.costs, name.into(), units);
        self
    }

    /// The cost set for the quota `name`, if any.
    pub fn cost_of(&self, name: &str) -> Option<u32> {
        self.costs.iter().find(|(n, _)| n == name).map(|(_, u)| *u)
    }

    /// Sets the deadline (see
    /// [`CallSpec::deadline`](struct.CallSpec.html#structfield.deadline)).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// See [`Builder::concurrency_for`](super::Builder::concurrency_for).
pub(super) fn concurrency_for(rate_per_sec: f64, latency: Duration) -> u32 {
    let n = rate_per_sec * latency.as_secs_f64();
    if n == f64::INFINITY {
        u32::MAX
    } else if n.is_finite() && n > 1.0 {
        // Subtract a hair so that 10 x 0.4 = 4.000000000000001 gives 4.
        (n - 1e-9).ceil().min(u32::MAX as f64) as u32
    } else {
        1
    }
}

/// Sets `name`'s units in a list of named quantities, replacing any earlier value.
pub(super) fn set_units(
    list: &mut Vec<(Cow<'static, str>, u32)>,
    name: Cow<'static, str>,
    units: u32,
) {
    match list.iter_mut().find(|(n, _)| *n == name) {
        Some(slot) => slot.1 = units,
        None => list.push((name, units)),
    }
}
