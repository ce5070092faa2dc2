//! Jittered exponential backoff, deadline accounting, and a retry policy
//! that turns a failure (plus the server's hint) into a decision.
//!
//! * [`Backoff`]: `min(cap, base * 2^attempt)` with [`Jitter`] (none, full,
//!   equal, decorrelated), from a seedable RNG; saturating, so any attempt
//!   number is fine.
//! * [`Deadline`]: the remaining budget of a call on a [`Clock`].
//!   [`charge`](Deadline::charge) accepts a wait only if it fits: a retry
//!   that would sleep past the deadline is refused with [`TimedOut`]
//!   instead of sleeping.
//! * [`RetryPolicy`]: the server's hint (clamped) overrides the computed
//!   backoff; an attempt cap; the answer is a [`Decision`] value.

use core::fmt;
use std::time::Duration;

use crate::clock::saturating_nanos;
use crate::{Advice, Clamp, Clock, ServerHint};

/// How a backoff delay is randomised. With `v = min(cap, base * 2^attempt)`:
///
/// # Examples
///
/// ```
/// use backpressure::{Backoff, Jitter};
/// use std::time::Duration;
///
/// let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
///     .jitter(Jitter::Equal)
///     .seed(7);
/// let d = b.delay(3); // v = 800 ms
/// assert!(d >= Duration::from_millis(400) && d <= Duration::from_millis(800));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// Exactly `v`. Synchronised clients stay synchronised: use only when
    /// there is one client.
    None,
    /// Uniform in `[0, v]`: the least total work for competing clients
    /// (mean `v / 2`).
    #[default]
    Full,
    /// Uniform in `[v / 2, v]`: never retries almost at once (mean `3v / 4`).
    Equal,
    /// `min(cap, uniform(base, 3 * previous))`, `previous` starting at
    /// `base`: grows from the last delay rather than the attempt number.
    Decorrelated,
}

/// Exponential backoff with jitter from a seedable RNG.
///
/// Deliberately not `Clone`: two copies of one generator draw the same
/// "random" delays and retry in lockstep, which is what jitter exists to
/// prevent. Use [`fork`](Self::fork) for an independent generator.
///
/// # Examples
///
/// ```
/// use backpressure::{Backoff, Jitter};
/// use std::time::Duration;
///
/// let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).seed(1);
/// assert_eq!(b.ceiling(0), Duration::from_millis(100));
/// assert_eq!(b.ceiling(2), Duration::from_millis(400));
/// assert_eq!(b.ceiling(1_000_000), Duration::from_secs(5)); // never overflows
/// assert!(b.delay(2) <= Duration::from_millis(400));
/// ```
#[derive(Debug)]
pub struct Backoff {
    base: u64,
    cap: u64,
    jitter: Jitter,
    rng: fastrand::Rng,
    /// The last decorrelated delay (nanoseconds).
    previous: u64,
}

impl Backoff {
    /// Backoff from `base` doubling up to `cap`, with [`Jitter::Full`] and
    /// an RNG seeded from the thread's generator (so two backoffs made
    /// this way draw independently). A `cap` below `base` caps every delay.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Backoff;
    /// use std::time::Duration;
    /// let b = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    /// assert_eq!(b.ceiling(10), Duration::from_secs(1));
    /// ```
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        let base = saturating_nanos(base);
        Backoff {
            base,
            cap: saturating_nanos(cap),
            jitter: Jitter::default(),
            rng: fastrand::Rng::new(),
            previous: base,
        }
    }

    /// Sets the jitter.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Backoff, Jitter};
    /// use std::time::Duration;
    /// let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60)).jitter(Jitter::None);
    /// assert_eq!(b.delay(3), Duration::from_secs(8));
    /// ```
    pub fn jitter(mut self, jitter: Jitter) -> Backoff {
        self.jitter = jitter;
        self
    }

    /// Seeds the RNG, making the delays deterministic (for tests).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Backoff;
    /// use std::time::Duration;
    /// let make = || Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).seed(42);
    /// let (mut a, mut b) = (make(), make());
    /// assert_eq!(a.delay(4), b.delay(4));
    /// ```
    pub fn seed(mut self, seed: u64) -> Backoff {
        self.rng.seed(seed);
        self
    }

    /// A backoff with the same settings and an independent generator seeded
    /// from this one (deterministic if this one is seeded). Use one per
    /// concurrent call.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Backoff;
    /// use std::time::Duration;
    /// let mut parent = Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).seed(3);
    /// let mut a = parent.fork();
    /// let mut b = parent.fork();
    /// assert_ne!(a.delay(20), b.delay(20)); // up to 1 s apart, not in lockstep
    /// ```
    pub fn fork(&mut self) -> Backoff {
        Backoff {
            base: self.base,
            cap: self.cap,
            jitter: self.jitter,
            rng: self.rng.fork(),
            previous: self.base,
        }
    }

    /// `min(cap, base * 2^attempt)`, saturating: the un-jittered delay.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Backoff;
    /// use std::time::Duration;
    /// let b = Backoff::new(Duration::from_nanos(3), Duration::MAX);
    /// assert_eq!(b.ceiling(u32::MAX), Duration::from_nanos(u64::MAX));
    /// ```
    pub fn ceiling(&self, attempt: u32) -> Duration {
        Duration::from_nanos(self.ceiling_nanos(attempt))
    }

    #[inline]
    fn ceiling_nanos(&self, attempt: u32) -> u64 {
        let grown = 1u64
            .checked_shl(attempt)
            .and_then(|f| self.base.checked_mul(f))
            .unwrap_or(u64::MAX);
        // `base == 0` stays 0 even when the shift overflows.
        let grown = if self.base == 0 { 0 } else { grown };
        grown.min(self.cap)
    }

    /// The delay before retry number `attempt` (0 for the first retry).
    ///
    /// For [`Jitter::Decorrelated`] the delay depends on the previous one,
    /// which this backoff remembers; `attempt == 0` restarts that chain
    /// from `base`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Backoff, Jitter};
    /// use std::time::Duration;
    /// let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
    ///     .jitter(Jitter::Decorrelated)
    ///     .seed(9);
    /// for attempt in 0..20 {
    ///     let d = b.delay(attempt);
    ///     assert!(d >= Duration::from_millis(100) && d <= Duration::from_secs(2));
    /// }
    /// ```
    pub fn delay(&mut self, attempt: u32) -> Duration {
        let v = self.ceiling_nanos(attempt);
        let nanos = match self.jitter {
            Jitter::None => v,
            Jitter::Full => self.rng.u64(0..=v),
            Jitter::Equal => {
                let half = v / 2;
                half + self.rng.u64(0..=v - half)
            }
            Jitter::Decorrelated => {
                if attempt == 0 {
                    self.previous = self.base;
                }
                let lo = self.base.min(self.cap);
                let hi = self.previous.saturating_mul(3).min(self.cap).max(lo);
                let d = self.rng.u64(lo..=hi);
                self.previous = d;
                d
            }
        };
        Duration::from_nanos(nanos)
    }

    /// A uniform draw in `[0, max]` from this backoff's generator.
    fn spread(&mut self, max: u64) -> u64 {
        self.rng.u64(0..=max)
    }
}

/// The remaining time budget of one call, on a [`Clock`].
///
/// Waits [`charge`](Self::charge)d but not yet elapsed add up: charging
/// 2 s and then 3 s before sleeping needs 5 s of budget. Once the clock
/// passes a charged wait, only the clock counts again.
///
/// # Examples
///
/// ```
/// use backpressure::{Deadline, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(10));
/// assert!(deadline.charge(Duration::from_secs(4)).is_ok());
/// clock.advance(Duration::from_secs(4)); // ... slept
/// assert_eq!(deadline.remaining(), Duration::from_secs(6));
/// let err = deadline.charge(Duration::from_secs(7)).unwrap_err();
/// assert_eq!(err.remaining(), Duration::from_secs(6));
/// assert_eq!(deadline.remaining(), Duration::from_secs(6)); // a refused wait costs nothing
/// ```
#[derive(Clone, Debug)]
pub struct Deadline<C: Clock> {
    clock: C,
    /// The deadline, in the clock's nanoseconds.
    at: u64,
    /// The end of the waits charged so far, in the clock's nanoseconds.
    committed: u64,
}

impl<C: Clock> Deadline<C> {
    /// A deadline `budget` from the clock's now (saturating).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// use std::time::Duration;
    /// let d = Deadline::after(ManualClock::starting_at(5), Duration::from_nanos(10));
    /// assert_eq!(d.at_nanos(), 15);
    /// ```
    pub fn after(clock: C, budget: Duration) -> Deadline<C> {
        let now = clock.now_nanos();
        let at = now.saturating_add(saturating_nanos(budget));
        Deadline::at(clock, at)
    }

    /// A deadline at `nanos` on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// use std::time::Duration;
    /// let d = Deadline::at(ManualClock::new(), 1_000);
    /// assert_eq!(d.remaining(), Duration::from_nanos(1_000));
    /// ```
    pub fn at(clock: C, nanos: u64) -> Deadline<C> {
        Deadline {
            clock,
            at: nanos,
            committed: 0,
        }
    }

    /// A deadline that never comes (`u64::MAX` nanoseconds).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// use std::time::Duration;
    /// let mut d = Deadline::never(ManualClock::new());
    /// assert!(d.charge(Duration::from_secs(86_400 * 365)).is_ok());
    /// ```
    pub fn never(clock: C) -> Deadline<C> {
        Deadline::at(clock, u64::MAX)
    }

    /// The deadline in the clock's nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// assert_eq!(Deadline::at(ManualClock::new(), 9).at_nanos(), 9);
    /// ```
    pub fn at_nanos(&self) -> u64 {
        self.at
    }

    /// The clock this deadline reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Clock, Deadline, ManualClock};
    /// let d = Deadline::at(ManualClock::starting_at(4), 9);
    /// assert_eq!(d.clock().now_nanos(), 4);
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// When the next wait would start: now, or the end of the waits
    /// charged and not yet elapsed.
    #[inline]
    fn start(&self) -> u64 {
        self.clock.now_nanos().max(self.committed)
    }

    /// The budget left after the waits already charged (zero once passed).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let d = Deadline::after(clock.clone(), Duration::from_secs(1));
    /// clock.advance(Duration::from_secs(5));
    /// assert_eq!(d.remaining(), Duration::ZERO);
    /// ```
    pub fn remaining(&self) -> Duration {
        Duration::from_nanos(self.at.saturating_sub(self.start()))
    }

    /// Whether no budget is left.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// assert!(Deadline::at(ManualClock::starting_at(3), 3).is_expired());
    /// ```
    pub fn is_expired(&self) -> bool {
        self.start() >= self.at
    }

    /// Accounts for a wait of `wait` if it fits in the remaining budget
    /// (ending at or before the deadline); otherwise charges nothing.
    ///
    /// # Errors
    ///
    /// [`TimedOut`] if the wait would end past the deadline: the caller
    /// should stop now rather than sleep into a timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// use std::time::Duration;
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(5));
    /// assert!(d.charge(Duration::from_secs(3)).is_ok());
    /// assert!(d.charge(Duration::from_secs(3)).is_err()); // 6 s > 5 s
    /// assert!(d.charge(Duration::from_secs(2)).is_ok()); // exactly fits
    /// ```
    pub fn charge(&mut self, wait: Duration) -> Result<(), TimedOut> {
        let start = self.start();
        let left = self.at.saturating_sub(start);
        let w = saturating_nanos(wait);
        if w > left {
            return Err(TimedOut {
                wait,
                remaining: Duration::from_nanos(left),
            });
        }
        self.committed = start + w; // w <= at - start: no overflow
        Ok(())
    }
}

/// A wait refused because it would end past the deadline.
///
/// # Examples
///
/// ```
/// use backpressure::{Deadline, ManualClock};
/// use std::time::Duration;
/// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(1));
/// let err = d.charge(Duration::from_secs(2)).unwrap_err();
/// assert_eq!(err.wait(), Duration::from_secs(2));
/// assert_eq!(err.to_string(), "a wait of 2s does not fit the 1s left before the deadline");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut {
    wait: Duration,
    remaining: Duration,
}

impl TimedOut {
    /// The wait that was refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// use std::time::Duration;
    /// let mut d = Deadline::after(ManualClock::new(), Duration::ZERO);
    /// assert_eq!(d.charge(Duration::from_secs(1)).unwrap_err().wait(), Duration::from_secs(1));
    /// ```
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The budget that was left when the wait was refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Deadline, ManualClock};
    /// use std::time::Duration;
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(1));
    /// let err = d.charge(Duration::from_secs(3)).unwrap_err();
    /// assert_eq!(err.remaining(), Duration::from_secs(1));
    /// ```
    pub fn remaining(&self) -> Duration {
        self.remaining
    }
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a wait of {:?} does not fit the {:?} left before the deadline",
            self.wait, self.remaining
        )
    }
}

impl std::error::Error for TimedOut {}

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
    /// Our own backoff would sleep past the deadline.
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
/// In order: past the attempt cap, [`Decision::GiveUp`]. If the server
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
    /// use std::time::Duration;
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
    /// // No budget left: even a short backoff does not fit.
    /// let mut d = Deadline::after(ManualClock::new(), Duration::ZERO);
    /// match p.decide(&ServerHint::default(), &mut d) {
    ///     Decision::Retry { after } => assert_eq!(after, Duration::ZERO),
    ///     Decision::Surface(s) => assert_eq!(s.status, SurfaceStatus::TimedOut),
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    pub fn decide<C: Clock>(&mut self, hint: &ServerHint, deadline: &mut Deadline<C>) -> Decision {
        if self.retries >= self.max_retries {
            return Decision::GiveUp;
        }
        let attempt = self.retries;
        self.retries += 1;
        let scope = || hint.scope.clone();

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
                    "retry {} would wait {:?} but only {:?} is left before the deadline",
                    attempt + 1,
                    wait,
                    e.remaining()
                ),
            }),
        }
    }
}

#[cold]
fn rate_limited(server: Duration, scope: Option<String>, clamp: Clamp) -> Surfaced {
    Surfaced {
        status: SurfaceStatus::RateLimited,
        hint: format!(
            "the server asked to wait {:?}, more than the {:?} this call can wait; retry after that{}",
            server,
            clamp.max,
            match &scope {
                Some(s) => format!(" (limit scope: {s})"),
                None => String::new(),
            }
        ),
        scope,
        retry_after: Some(server),
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use crate::ManualClock;

    #[test]
    fn ceiling_saturates_for_any_attempt() {
        let b = Backoff::new(Duration::from_nanos(u64::MAX / 2 + 1), Duration::MAX);
        assert_eq!(b.ceiling(0), Duration::from_nanos(u64::MAX / 2 + 1));
        assert_eq!(b.ceiling(1), Duration::from_nanos(u64::MAX));
        for attempt in [2, 63, 64, 65, 1_000, u32::MAX] {
            assert_eq!(b.ceiling(attempt), Duration::from_nanos(u64::MAX));
        }
        let zero = Backoff::new(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(zero.ceiling(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn cap_below_base_caps_every_jitter() {
        for jitter in [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Decorrelated] {
            let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(1))
                .jitter(jitter)
                .seed(1);
            for attempt in 0..100 {
                assert!(b.delay(attempt) <= Duration::from_secs(1), "{jitter:?}");
            }
        }
    }

    #[test]
    fn stacked_charges_add_up_until_the_clock_passes_them() {
        let clock = ManualClock::new();
        let mut d = Deadline::after(clock.clone(), Duration::from_secs(10));
        d.charge(Duration::from_secs(4)).unwrap();
        d.charge(Duration::from_secs(4)).unwrap();
        assert_eq!(d.remaining(), Duration::from_secs(2));
        clock.advance(Duration::from_secs(3)); // mid-sleep: still 2 s left
        assert_eq!(d.remaining(), Duration::from_secs(2));
        clock.advance(Duration::from_secs(6)); // past the charged waits
        assert_eq!(d.remaining(), Duration::from_secs(1));
        assert!(d.charge(Duration::from_nanos(1_000_000_001)).is_err());
    }

    #[test]
    fn deadline_at_the_end_of_time_never_overflows() {
        let clock = ManualClock::starting_at(u64::MAX - 1);
        let mut d = Deadline::after(clock.clone(), Duration::MAX);
        assert_eq!(d.at_nanos(), u64::MAX);
        d.charge(Duration::from_nanos(1)).unwrap();
        assert!(d.charge(Duration::from_nanos(1)).is_err());
        assert!(d.is_expired());
        assert!(d.charge(Duration::ZERO).is_ok(), "a zero wait always fits");
    }
}
