//! [`RetryPolicy`]: a failed attempt and the server's hint in, a
//! [`Decision`] out.

use core::fmt;
use std::time::Duration;

use super::{Backoff, Deadline};
use crate::{Advice, Clamp, Clock, ServerHint};

/// Why a [`Decision`] surfaces the failure instead of retrying.
///
/// # Examples
///
/// ```
/// use backpressure::SurfaceStatus;
/// assert_eq!(SurfaceStatus::RateLimited.as_str(), "rate_limited");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SurfaceStatus {
    /// The server's wait is longer than the clamp or the deadline: the
    /// server is saying stop.
    RateLimited,
    /// Our own backoff would sleep past the deadline, or the deadline has
    /// already passed.
    TimedOut,
}

impl SurfaceStatus {
    /// The status as a stable snake_case string (`rate_limited`,
    /// `timed_out`), as the admission layer reports it.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::SurfaceStatus;
    /// assert_eq!(SurfaceStatus::TimedOut.as_str(), "timed_out");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            SurfaceStatus::RateLimited => "rate_limited",
            SurfaceStatus::TimedOut => "timed_out",
        }
    }
}

impl fmt::Display for SurfaceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to tell the caller when a retry is not worth waiting for.
///
/// # Examples
///
/// ```
/// use backpressure::{Decision, Deadline, ManualClock, RetryPolicy, ServerHint, SurfaceStatus};
/// use std::time::{Duration, SystemTime};
///
/// let mut policy = RetryPolicy::default();
/// let mut deadline = Deadline::after(ManualClock::new(), Duration::from_secs(30));
/// let hint = ServerHint::from_headers(
///     [("retry-after", "3600"), ("x-ratelimit-scope", "user")],
///     SystemTime::now(),
/// );
/// let Decision::Surface(s) = policy.decide(&hint, &mut deadline) else { panic!() };
/// assert_eq!(s.status, SurfaceStatus::RateLimited);
/// assert_eq!(s.retry_after, Some(Duration::from_secs(3600)));
/// assert_eq!(s.scope.as_deref(), Some("user"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Surfaced {
    /// Why.
    pub status: SurfaceStatus,
    /// The limit's scope, as the server named it.
    pub scope: Option<String>,
    /// When a retry could succeed: the server's wait, or the refused backoff.
    pub retry_after: Option<Duration>,
    /// One line for a human or a model to plan with.
    pub hint: String,
}

/// What to do after a failed attempt.
///
/// # Examples
///
/// ```
/// use backpressure::{Decision, Deadline, ManualClock, RetryPolicy, ServerHint};
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
    /// Sleep `after`, then try again; already charged to the deadline.
    Retry {
        /// How long to wait.
        after: Duration,
    },
    /// Do not retry now: hand this to the caller.
    Surface(Surfaced),
    /// The attempt cap is reached.
    GiveUp,
}

/// Decides, after each failed attempt of one call, whether and when to
/// retry.
///
/// In order: past the attempt cap, [`Decision::GiveUp`]. Once the
/// deadline has passed, [`Decision::Surface`] with
/// [`SurfaceStatus::TimedOut`], whatever the wait (even zero). If the server
/// gave a wait ([`ServerHint::wait`]) longer than the clamp or the
/// remaining deadline, [`Decision::Surface`] with
/// [`SurfaceStatus::RateLimited`]; otherwise the server's wait overrides
/// the backoff, plus a jitter of up to `base` (dropped when only the exact
/// wait fits) so clients told the same `Retry-After` do not come back in
/// lockstep, and never earlier than asked. Without a server wait, the
/// [`Backoff`] delay, surfaced as [`SurfaceStatus::TimedOut`] if it does
/// not fit the deadline. A retry's wait is charged to the deadline.
///
/// One policy per call (it counts attempts); [`fork`](Self::fork) makes
/// another with the same settings and an independent generator.
///
/// Defaults: backoff 100 ms doubling to 10 s with full jitter, at most 5
/// retries, server waits honoured up to 60 s.
///
/// # Examples
///
/// ```
/// use backpressure::{Backoff, Clamp, Decision, Deadline, ManualClock, RetryPolicy, ServerHint};
/// use std::time::{Duration, SystemTime};
///
/// let clock = ManualClock::new();
/// let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(30));
/// let mut policy = RetryPolicy::new(Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).seed(1))
///     .max_retries(3)
///     .clamp(Clamp::new(Duration::from_secs(20)));
///
/// // A 429 with Retry-After: 2 -> wait 2 s (plus at most 100 ms of jitter).
/// let hint = ServerHint::from_headers([("retry-after", "2")], SystemTime::now());
/// let Decision::Retry { after } = policy.decide(&hint, &mut deadline) else { panic!() };
/// assert!(after >= Duration::from_secs(2) && after <= Duration::from_millis(2_100));
/// ```
#[derive(Debug)]
pub struct RetryPolicy {
    backoff: Backoff,
    max_retries: u32,
    clamp: Clamp,
    /// Retries decided so far.
    retries: u32,
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
    /// A policy with `backoff`, 5 retries and a 60 s clamp.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Backoff, RetryPolicy};
    /// use std::time::Duration;
    /// let policy = RetryPolicy::new(Backoff::new(Duration::from_millis(50), Duration::from_secs(2)));
    /// assert_eq!(policy.retries(), 0);
    /// ```
    pub fn new(backoff: Backoff) -> RetryPolicy {
        RetryPolicy {
            backoff,
            max_retries: 5,
            clamp: Clamp::new(Duration::from_secs(60)),
            retries: 0,
        }
    }

    /// At most `n` retries (after the first attempt).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Decision, Deadline, ManualClock, RetryPolicy, ServerHint};
    /// use std::time::Duration;
    /// let mut p = RetryPolicy::default().max_retries(0);
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(1));
    /// assert_eq!(p.decide(&ServerHint::default(), &mut d), Decision::GiveUp);
    /// ```
    pub fn max_retries(mut self, n: u32) -> RetryPolicy {
        self.max_retries = n;
        self
    }

    /// The longest server wait this policy sleeps through.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Clamp, Decision, Deadline, ManualClock, RetryPolicy, ServerHint};
    /// use std::time::{Duration, SystemTime};
    /// let mut p = RetryPolicy::default().clamp(Clamp::new(Duration::from_secs(1)));
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(60));
    /// let hint = ServerHint::from_headers([("retry-after", "5")], SystemTime::now());
    /// assert!(matches!(p.decide(&hint, &mut d), Decision::Surface(_)));
    /// ```
    pub fn clamp(mut self, clamp: Clamp) -> RetryPolicy {
        self.clamp = clamp;
        self
    }

    /// Retries decided so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock, RetryPolicy, ServerHint};
    /// let mut p = RetryPolicy::default();
    /// let mut d = Deadline::never(ManualClock::new());
    /// let _ = p.decide(&ServerHint::default(), &mut d);
    /// assert_eq!(p.retries(), 1);
    /// ```
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// A fresh policy (no retries yet) with the same settings and an
    /// independent generator, for another call.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::RetryPolicy;
    /// let mut template = RetryPolicy::default();
    /// let per_call = template.fork();
    /// assert_eq!(per_call.retries(), 0);
    /// ```
    pub fn fork(&mut self) -> RetryPolicy {
        RetryPolicy {
            backoff: self.backoff.fork(),
            max_retries: self.max_retries,
            clamp: self.clamp,
            retries: 0,
        }
    }

    /// Decides what to do after a failed attempt, given what the server
    /// said (`ServerHint::default()` if nothing), charging a retry's wait
    /// to `deadline`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Decision, Deadline, ManualClock, RetryPolicy, ServerHint, SurfaceStatus};
    /// use std::time::Duration;
    ///
    /// let mut p = RetryPolicy::default();
    /// // No budget left: no retry, not even an immediate one.
    /// let mut d = Deadline::after(ManualClock::new(), Duration::ZERO);
    /// let Decision::Surface(s) = p.decide(&ServerHint::default(), &mut d) else { panic!() };
    /// assert_eq!(s.status, SurfaceStatus::TimedOut);
    /// ```
    pub fn decide<C: Clock>(&mut self, hint: &ServerHint, deadline: &mut Deadline<C>) -> Decision {
        if self.retries >= self.max_retries {
            return Decision::GiveUp;
        }
        let attempt = self.retries;
        self.retries += 1;
        let scope = || hint.scope.clone();

        if deadline.is_expired() {
            // Checked first: with no budget left, a zero wait (`Retry-After:
            // 0`, a zero backoff) would otherwise still "fit".
            return Decision::Surface(expired(
                hint.wait().unwrap_or_else(|| self.backoff.delay(attempt)),
                scope(),
                attempt,
            ));
        }

        if let Some(server) = hint.wait() {
            let clamp = Clamp::new(self.clamp.max.min(deadline.remaining()));
            return match clamp.apply(server) {
                Advice::Wait(wait) => {
                    let spread = self.backoff.spread(self.backoff.base);
                    let jittered = wait.saturating_add(Duration::from_nanos(spread));
                    let after = if deadline.charge(jittered).is_ok() {
                        jittered
                    } else if deadline.charge(wait).is_ok() {
                        wait
                    } else {
                        // The clamp is at most `remaining()`, so this is
                        // unreachable; stay honest rather than panic.
                        return Decision::Surface(rate_limited(server, scope(), clamp));
                    };
                    Decision::Retry { after }
                }
                _ => Decision::Surface(rate_limited(server, scope(), clamp)),
            };
        }

        let wait = self.backoff.delay(attempt);
        match deadline.charge(wait) {
            Ok(()) => Decision::Retry { after: wait },
            Err(e) => Decision::Surface(Surfaced {
                status: SurfaceStatus::TimedOut,
                scope: scope(),
                retry_after: Some(wait),
                hint: format!(
                    "retry {} would wait {} but only {} is left before the deadline",
                    attempt + 1,
                    crate::admission::Human(wait),
                    crate::admission::Human(e.remaining())
                ),
            }),
        }
    }
}

#[cold]
fn expired(wait: Duration, scope: Option<String>, attempt: u32) -> Surfaced {
    Surfaced {
        status: SurfaceStatus::TimedOut,
        scope,
        retry_after: Some(wait),
        hint: format!(
            "retry {} not attempted: the deadline has already passed",
            attempt + 1
        ),
    }
}

#[cold]
fn rate_limited(server: Duration, scope: Option<String>, clamp: Clamp) -> Surfaced {
    Surfaced {
        status: SurfaceStatus::RateLimited,
        hint: format!(
            "the server asked to wait {}, more than the {} this call can wait; retry after that{}",
            crate::admission::Human(server),
            crate::admission::Human(clamp.max),
            match &scope {
                Some(s) => format!(" (limit scope: {s})"),
                None => String::new(),
            }
        ),
        scope,
        retry_after: Some(server),
    }
}
