//! [`RetryPolicy`]: a failed attempt and the server's hint in, a
//! [`Decision`] out. The one owner of retry decisions.

use std::time::Duration;

use std::sync::Arc;

use super::budget::{Allowance, RetryBudget};
use super::{Backoff, Deadline};
use crate::throttled::{Human, Status, Throttled};
use crate::{headers::ServerHint, Clock};

/// How a [`RetryPolicy`] classes one attempt's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ReplyClass {
    /// 2xx.
    Success,
    /// The server's capacity: a 429, or a 503 with `Retry-After`. Retried
    /// after the server's wait; if retries run out, `rate_limited`.
    Capacity,
    /// A fault that may pass: a 408, another 5xx, or a transport error.
    /// Retried after the backoff (or the server's wait, if given).
    Transient,
    /// Retrying cannot change it: any other status (other 4xx, 1xx, 3xx).
    Final,
}

/// What to do after a failed attempt.
///
/// When the policy will not retry now, it says why as a [`Throttled`]:
/// `rate_limited` (the server's wait does not fit, or a capacity answer
/// outlasted the retries) or `timed_out` (the deadline).
///
/// # Examples
///
/// ```
/// use backpressure::headers::ServerHint;
/// use backpressure::retry::{Deadline, Decision, RetryPolicy};
/// use backpressure::ManualClock;
/// use std::time::Duration;
///
/// let mut policy = RetryPolicy::default().max_retries(1);
/// let mut deadline = Deadline::after(ManualClock::new(), Duration::from_secs(30));
/// let none = ServerHint::default();
/// assert!(matches!(policy.decide(&none, &mut deadline), Decision::Retry { .. }));
/// assert_eq!(policy.decide(&none, &mut deadline), Decision::GiveUp);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// A fault (a transport error, a 5xx, a 408): sleep `after`, then try
    /// again; already charged to the deadline.
    Retry {
        /// How long to wait.
        after: Duration,
    },
    /// The server's capacity (a 429, a 503 with `Retry-After`): try again
    /// after the server's wait (jittered), already charged to the deadline.
    Readmit {
        /// How long to wait.
        after: Duration,
    },
    /// The server's capacity, not retried (the wait does not fit, or the
    /// retries are spent): this `rate_limited` is the call's answer.
    Surface(Throttled),
    /// A fault whose retry does not fit: the last answer stands, and this
    /// says why it was not retried.
    NotRetried(Throttled),
    /// The attempt cap is reached on a fault (a capacity answer is
    /// [`Surface`](Self::Surface)d as `rate_limited` instead).
    GiveUp,
    /// Nothing to retry: the answer was a success, or final.
    Stop,
}

/// Decides, after each failed attempt of one call, whether and when to
/// retry. [`Runner`](crate::admission::Runner) asks it after every attempt
/// that did not succeed.
///
/// [`decide_reply`](Self::decide_reply) sees the whole answer (a status or
/// a transport error, and the headers):
///
/// | answer | class | decision |
/// | --- | --- | --- |
/// | 2xx | success | [`Stop`](Decision::Stop) |
/// | 429, or 503 with `Retry-After` | capacity | [`Readmit`](Decision::Readmit) after the server's wait ([`BARE_429_HOLD`](Self::BARE_429_HOLD) if it gave none); [`Surface`](Decision::Surface) `rate_limited` when the wait does not fit the clamp or the deadline, or the retries are spent |
/// | 408, other 5xx, transport error | transient | as [`decide`](Self::decide): [`Retry`](Decision::Retry), [`NotRetried`](Decision::NotRetried) or [`GiveUp`](Decision::GiveUp) |
/// | anything else | final | [`Stop`](Decision::Stop) |
///
/// [`decide`](Self::decide) (a fault), in order: past the attempt cap,
/// [`GiveUp`](Decision::GiveUp); past the deadline,
/// [`NotRetried`](Decision::NotRetried) `timed_out`; a server wait
/// ([`ServerHint::wait`]) longer than the clamp or the deadline left,
/// `NotRetried` `rate_limited`; otherwise the server's wait plus a jitter of
/// up to `base`, or without one the [`Backoff`] delay (`timed_out` if it
/// does not fit). A retry's wait is charged to the deadline.
///
/// A surfaced [`Throttled`]'s scope is `server:<name>` when the server
/// named its limit, else `api_key`; `deadline` for `timed_out`.
///
/// One policy per call (it counts attempts); [`fork`](Self::fork) makes
/// another. Defaults: backoff 100 ms doubling to 10 s with full jitter, at
/// most 5 retries, server waits honoured up to 60 s (the clamp).
///
/// # Examples
///
/// ```
/// use backpressure::headers::ServerHint;
/// use backpressure::retry::{Backoff, Deadline, Decision, RetryPolicy};
/// use backpressure::ManualClock;
/// use std::time::{Duration, SystemTime};
///
/// let clock = ManualClock::new();
/// let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(30));
/// let mut policy = RetryPolicy::new(Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).seed(1))
///     .max_retries(3)
///     .clamp(Duration::from_secs(20));
///
/// // A 429 with Retry-After: 2 -> wait 2 s (plus at most 100 ms of jitter).
/// let hint = ServerHint::from_headers([("retry-after", "2")], SystemTime::now());
/// let Decision::Readmit { after } = policy.decide_reply(Some(429), &hint, &mut deadline) else { panic!() };
/// assert!(after >= Duration::from_secs(2) && after <= Duration::from_millis(2_100));
/// ```
#[derive(Debug)]
pub struct RetryPolicy {
    backoff: Backoff,
    max_retries: u32,
    /// The longest server wait slept; a longer one is surfaced.
    clamp: Duration,
    /// Retries decided so far.
    retries: u32,
    /// Shared by every call forked from this policy.
    budget: Option<Arc<dyn Allowance>>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::new(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(10),
        ))
    }
}

impl RetryPolicy {
    /// The wait assumed for a capacity answer that gave none (a bare 429):
    /// one second, the hold [`Ticket::observe`](crate::admission::Ticket::observe)
    /// puts on the credential.
    pub const BARE_429_HOLD: Duration = Duration::from_secs(1);

    /// A policy with `backoff`, 5 retries and a 60 s clamp.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::{Backoff, RetryPolicy};
    /// use std::time::Duration;
    /// let policy = RetryPolicy::new(Backoff::new(Duration::from_millis(50), Duration::from_secs(2)));
    /// assert_eq!(policy.retries(), 0);
    /// ```
    pub fn new(backoff: Backoff) -> RetryPolicy {
        RetryPolicy {
            backoff,
            max_retries: 5,
            clamp: Duration::from_secs(60),
            retries: 0,
            budget: None,
        }
    }

    /// Replaces the backoff, keeping the cap and the clamp.
    pub fn backoff(mut self, backoff: Backoff) -> RetryPolicy {
        self.backoff = backoff;
        self
    }

    /// At most `n` retries (after the first attempt).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::retry::{Deadline, Decision, RetryPolicy};
    /// use backpressure::ManualClock;
    /// use std::time::Duration;
    /// let mut p = RetryPolicy::default().max_retries(0);
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(1));
    /// assert_eq!(p.decide(&ServerHint::default(), &mut d), Decision::GiveUp);
    /// ```
    pub fn max_retries(mut self, n: u32) -> RetryPolicy {
        self.max_retries = n;
        self
    }

    /// The longest server wait this policy sleeps through; a longer one is
    /// surfaced as `rate_limited` with the server's full wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::retry::{Deadline, Decision, RetryPolicy};
    /// use backpressure::Status;
    /// use backpressure::ManualClock;
    /// use std::time::{Duration, SystemTime};
    /// let mut p = RetryPolicy::default().clamp(Duration::from_secs(1));
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(60));
    /// let hint = ServerHint::from_headers([("retry-after", "5")], SystemTime::now());
    /// let Decision::NotRetried(t) = p.decide(&hint, &mut d) else { panic!() };
    /// assert_eq!(t.status, Status::RateLimited);
    /// assert_eq!(t.retry_after(), Some(Duration::from_secs(5)));
    /// ```
    pub fn clamp(mut self, max: Duration) -> RetryPolicy {
        self.clamp = max;
        self
    }

    /// Retries decided so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// This policy with another backoff and retry cap.
    pub(crate) fn with_backoff(&self, backoff: Backoff, max_retries: u32) -> RetryPolicy {
        RetryPolicy {
            backoff,
            max_retries,
            clamp: self.clamp,
            retries: 0,
            budget: self.budget.clone(),
        }
    }

    /// A fresh policy (no retries yet) with the same settings and an
    /// independent generator.
    pub fn fork(&self) -> RetryPolicy {
        self.deposit();
        self.fork_unpaid()
    }

    /// A call's first attempt paid into the shared budget (if any): what
    /// [`fork`](Self::fork) does, for a loop that forks only on a retry.
    pub(crate) fn deposit(&self) {
        if let Some(budget) = &self.budget {
            budget.deposit();
        }
    }

    /// [`fork`](Self::fork) without the deposit.
    pub(crate) fn fork_unpaid(&self) -> RetryPolicy {
        self.with_backoff(self.backoff.fork(), self.max_retries)
    }

    /// Shares `budget` among every call forked from this policy (each
    /// [`fork`](Self::fork) deposits into it): a retry the budget refuses is
    /// not made, and the call ends with its last answer (a capacity answer
    /// still as `rate_limited`).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::retry::{Deadline, Decision, RetryBudget, RetryPolicy};
    /// use backpressure::ManualClock;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let budget = Arc::new(RetryBudget::with_clock(0.5, 0, Duration::from_secs(10), clock.clone()));
    /// let template = RetryPolicy::default().budget(budget);
    /// let (mut a, mut b) = (template.fork(), template.fork()); // two calls: one retry
    /// let mut d = Deadline::after(clock, Duration::from_secs(30));
    /// let fault = ServerHint::default();
    /// assert!(matches!(a.decide_reply(Some(503), &fault, &mut d), Decision::Retry { .. }));
    /// assert_eq!(b.decide_reply(Some(503), &fault, &mut d), Decision::GiveUp);
    /// ```
    pub fn budget<C: Clock + Clone + Send + Sync + 'static>(
        mut self,
        budget: Arc<RetryBudget<C>>,
    ) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Whether the shared budget (if any) lets this call retry once more.
    fn budget_allows(&self) -> bool {
        self.budget.as_ref().is_none_or(|b| b.try_withdraw())
    }

    /// Decides what to do after an attempt: `status` is `None` for a
    /// transport error. A retry's wait is charged to `deadline`. See the
    /// table on [`RetryPolicy`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::retry::{Deadline, Decision, RetryPolicy};
    /// use backpressure::Status;
    /// use backpressure::ManualClock;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let mut p = RetryPolicy::default().max_retries(1);
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(30));
    /// let told = ServerHint::from_headers([("retry-after", "1")], SystemTime::now());
    /// assert!(matches!(p.decide_reply(Some(429), &told, &mut d), Decision::Readmit { .. }));
    /// // Out of retries on a 429: a rate limit, never a plain give-up.
    /// let Decision::Surface(t) = p.decide_reply(Some(429), &told, &mut d) else { panic!() };
    /// assert_eq!((t.status, t.scope.as_str()), (Status::RateLimited, "api_key"));
    /// assert_eq!(t.retry_after(), Some(Duration::from_secs(1)));
    /// // A 404 is final; nothing is counted.
    /// assert_eq!(p.decide_reply(Some(404), &ServerHint::default(), &mut d), Decision::Stop);
    /// ```
    pub fn decide_reply<C: Clock>(
        &mut self,
        status: Option<u16>,
        hint: &ServerHint,
        deadline: &mut Deadline<C>,
    ) -> Decision {
        self.decide_class(reply_class(status, hint), status, hint, deadline)
    }

    /// [`decide_reply`](Self::decide_reply) for an answer its caller has
    /// already classed (the attempt loop classes each answer once).
    pub(crate) fn decide_class<C: Clock>(
        &mut self,
        class: ReplyClass,
        status: Option<u16>,
        hint: &ServerHint,
        deadline: &mut Deadline<C>,
    ) -> Decision {
        match class {
            ReplyClass::Success | ReplyClass::Final => Decision::Stop,
            ReplyClass::Transient => self.decide(hint, deadline),
            ReplyClass::Capacity => {
                let wait = hint.wait().unwrap_or(Self::BARE_429_HOLD);
                if self.retries >= self.max_retries {
                    return Decision::Surface(still_throttled(
                        status.unwrap_or(429),
                        wait,
                        hint,
                        self.retries + 1,
                    ));
                }
                self.retries += 1;
                // Even past the deadline this is the server's limit: the
                // clamp surfaces it as `rate_limited`.
                match self.after_server_wait(wait, hint, deadline) {
                    // The shared budget is spent: still the server's limit.
                    Decision::Retry { .. } if !self.budget_allows() => Decision::Surface(
                        still_throttled(status.unwrap_or(429), wait, hint, self.retries),
                    ),
                    Decision::Retry { after } => Decision::Readmit { after },
                    decision => decision,
                }
            }
        }
    }

    /// Decides what to do after a failed attempt that is a fault, charging
    /// a retry's wait to `deadline`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::retry::{Deadline, Decision, RetryPolicy};
    /// use backpressure::Status;
    /// use backpressure::ManualClock;
    /// use std::time::Duration;
    ///
    /// let mut p = RetryPolicy::default();
    /// // No budget left: no retry, not even an immediate one.
    /// let mut d = Deadline::after(ManualClock::new(), Duration::ZERO);
    /// let Decision::NotRetried(t) = p.decide(&ServerHint::default(), &mut d) else { panic!() };
    /// assert_eq!((t.status, t.scope.as_str()), (Status::TimedOut, "deadline"));
    /// ```
    pub fn decide<C: Clock>(&mut self, hint: &ServerHint, deadline: &mut Deadline<C>) -> Decision {
        match self.decide_fault(hint, deadline) {
            // Only a retry the call would make draws on the shared budget.
            Decision::Retry { .. } if !self.budget_allows() => Decision::GiveUp,
            // A fault's retry that does not fit: the fault stands.
            Decision::Surface(t) => Decision::NotRetried(t),
            decision => decision,
        }
    }

    /// [`decide`](Self::decide) before the shared budget is asked.
    fn decide_fault<C: Clock>(
        &mut self,
        hint: &ServerHint,
        deadline: &mut Deadline<C>,
    ) -> Decision {
        if self.retries >= self.max_retries {
            return Decision::GiveUp;
        }
        let attempt = self.retries;
        self.retries += 1;

        if deadline.is_expired() {
            // Checked first: a zero wait would otherwise still "fit".
            return Decision::Surface(expired(
                hint.wait().unwrap_or_else(|| self.backoff.delay(attempt)),
                attempt,
            ));
        }

        if let Some(server) = hint.wait() {
            return self.after_server_wait(server, hint, deadline);
        }

        let wait = self.backoff.delay(attempt);
        let remaining = deadline.remaining();
        match deadline.charge(wait) {
            Ok(()) => Decision::Retry { after: wait },
            Err(_) => Decision::Surface(
                Throttled::new(
                    Status::TimedOut,
                    DEADLINE,
                    format!(
                        "retry {} would wait {} but only {} is left before the deadline",
                        attempt + 1,
                        Human(wait),
                        Human(remaining)
                    ),
                )
                .with_retry_after(wait),
            ),
        }
    }

    /// The server's wait, jittered, if it fits the clamp and the deadline;
    /// else `rate_limited` with the full wait.
    fn after_server_wait<C: Clock>(
        &mut self,
        server: Duration,
        hint: &ServerHint,
        deadline: &mut Deadline<C>,
    ) -> Decision {
        let clamp = self.clamp.min(deadline.remaining());
        if server <= clamp {
            let spread = self.backoff.spread(self.backoff.base);
            let jittered = server.saturating_add(Duration::from_nanos(spread));
            if deadline.charge(jittered).is_ok() {
                return Decision::Retry { after: jittered };
            }
            if deadline.charge(server).is_ok() {
                return Decision::Retry { after: server };
            }
            // Only an expired deadline gets here.
        }
        Decision::Surface(rate_limited(server, hint, clamp))
    }
}

/// The one classification of an answer (see [`ReplyClass`]).
pub(crate) fn reply_class(status: Option<u16>, hint: &ServerHint) -> ReplyClass {
    match status {
        None => ReplyClass::Transient,
        Some(200..=299) => ReplyClass::Success,
        Some(429) => ReplyClass::Capacity,
        Some(503) if hint.retry_after.is_some() => ReplyClass::Capacity,
        Some(408 | 500..=599) => ReplyClass::Transient,
        Some(_) => ReplyClass::Final,
    }
}

/// The scope of a `timed_out` the policy surfaces: the call's own deadline.
const DEADLINE: &str = "deadline";

/// The limit the server's answer is about, named as `Admission` names it.
pub(crate) fn server_scope(hint: &ServerHint) -> String {
    hint.scope
        .as_ref()
        .map_or_else(|| "api_key".to_string(), |s| format!("server:{s}"))
}

#[cold]
fn expired(wait: Duration, attempt: u32) -> Throttled {
    Throttled::new(
        Status::TimedOut,
        DEADLINE,
        format!(
            "retry {} not attempted: the deadline has already passed",
            attempt + 1
        ),
    )
    .with_retry_after(wait)
}

#[cold]
fn rate_limited(server: Duration, hint: &ServerHint, clamp: Duration) -> Throttled {
    Throttled::new(
        Status::RateLimited,
        server_scope(hint),
        format!(
            "the server asked to wait {}, more than the {} this call can wait; retry after that{}",
            Human(server),
            Human(clamp),
            match &hint.scope {
                Some(s) => format!(" (limit scope: {s})"),
                None => String::new(),
            }
        ),
    )
    .with_retry_after(server)
}

/// The call's last answer was "not now" and its retries are spent.
#[cold]
fn still_throttled(status: u16, wait: Duration, hint: &ServerHint, sent: u32) -> Throttled {
    Throttled::new(
        Status::RateLimited,
        server_scope(hint),
        format!(
            "the server still answered {status} after {sent} requests; retry after {}",
            Human(wait)
        ),
    )
    .with_retry_after(wait)
}

#[cfg(all(test, not(feature = "loom")))]
mod classify_tests {
    use super::*;
    use std::time::SystemTime;

    /// Every status (and a transport error) gets its class.
    #[test]
    fn the_policy_classes_every_answer() {
        use ReplyClass::{Capacity, Final, Success, Transient};
        let none = ServerHint::default();
        let told = ServerHint::from_headers([("retry-after", "2")], SystemTime::UNIX_EPOCH);
        let cases = [
            (Some(200), &none, Success),
            (Some(204), &told, Success),
            (Some(429), &none, Capacity),
            (Some(429), &told, Capacity),
            (Some(503), &told, Capacity),
            (Some(503), &none, Transient),
            (Some(500), &told, Transient),
            (Some(408), &none, Transient),
            (Some(599), &none, Transient),
            (None, &none, Transient),
            (Some(400), &none, Final),
            (Some(404), &told, Final),
            (Some(304), &none, Final),
        ];
        for (status, h, want) in cases {
            assert_eq!(reply_class(status, h), want, "{status:?} {h:?}");
        }
    }
}
