//! What `admit` needs to know about a call: [`CallSpec`] and [`Kind`], and
//! [`concurrency_for`] to size a pool from a rate and a latency.

use core::time::Duration;
use std::borrow::Cow;

/// Whether a call only reads (safe to coalesce and retry) or writes.
///
/// # Examples
///
/// ```
/// use backpressure::admission::Kind;
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
    /// use backpressure::admission::Kind;
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
/// use backpressure::admission::{CallSpec, Kind};
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
    /// What the call costs against each named quota of its credential, as
    /// (quota, units): `("tokens", 1_800)`. `"requests"` defaults to 1;
    /// other quotas to 0. A cost against a quota the layer was not given
    /// ([`Builder::resource`](super::Builder::resource)) is not limited.
    pub costs: Vec<(Cow<'static, str>, u32)>,
    /// How long the call may wait to be admitted, from the `admit` call
    /// (through [`Runner`](super::Runner), from the call's start: every retry and its
    /// backoff is charged to it). A slot is waited for up to the deadline;
    /// a rate-limit wait is slept only while it fits both the deadline and
    /// the layer's inline wait ([`Builder::inline_wait`](super::Builder::inline_wait), 2 s by default):
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
    /// use backpressure::admission::{CallSpec, Kind};
    /// let spec = CallSpec::new("get_usage", "key");
    /// assert_eq!(spec.kind, Kind::Read);
    /// ```
    pub fn new(tool: impl Into<String>, credential: impl Into<String>) -> Self {
        Self {
            tool: tool.into(),
            credential: credential.into(),
            kind: Kind::Read,
            costs: Vec::new(),
            deadline: Duration::from_secs(30),
        }
    }

    /// Sets read or write.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{CallSpec, Kind};
    /// assert_eq!(CallSpec::new("refund", "k").kind(Kind::Write).kind, Kind::Write);
    /// ```
    pub fn kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// Sets what the call costs against the quota `name` of its credential
    /// (replacing an earlier cost for the same quota): an estimate of an
    /// LLM call's tokens, say. [`Ticket::settle`](super::Ticket::settle)
    /// reconciles it with the actual usage after the reply. A name that
    /// is no quota of the layer (`"requests"`, or one declared with
    /// `Builder::resource`) makes `admit` refuse the call as
    /// `quota_exhausted`, naming the quotas it has: a misspelt cost is never
    /// admitted free.
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
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::CallSpec;
    /// assert_eq!(CallSpec::new("t", "k").cost("requests", 2).cost_of("requests"), Some(2));
    /// ```
    pub fn cost_of(&self, name: &str) -> Option<u32> {
        self.costs.iter().find(|(n, _)| n == name).map(|(_, u)| *u)
    }

    /// Sets the deadline (a budget from the `admit` call; see
    /// [`CallSpec::deadline`](struct.CallSpec.html#structfield.deadline)
    /// for how it meets the inline wait).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::CallSpec;
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
/// latency, rounded up, at least 1 and at most `u32::MAX`. An infinite
/// rate (no limit) at a positive latency needs no cap: `u32::MAX`. A rate
/// that is not a number, negative, or met with a zero latency gives 1.
///
/// # Examples
///
/// ```
/// use backpressure::admission::concurrency_for;
/// use std::time::Duration;
/// // 10 requests/s at 400 ms each keep 4 in flight.
/// assert_eq!(concurrency_for(10.0, Duration::from_millis(400)), 4);
/// assert_eq!(concurrency_for(f64::NAN, Duration::from_secs(1)), 1);
/// assert_eq!(concurrency_for(f64::INFINITY, Duration::from_millis(400)), u32::MAX);
/// ```
pub fn concurrency_for(rate_per_sec: f64, latency: Duration) -> u32 {
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

/// Sets `name`'s units in a list of named quantities (a spec's costs, a
/// reply's usage): a name given again replaces its earlier value.
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
