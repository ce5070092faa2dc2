//! [`Deadline`]: the remaining budget of one call.

use std::time::Duration;

use crate::clock::saturating_nanos;
use crate::throttled::{Status, Throttled};
use crate::Clock;

/// The remaining time budget of one call, on a [`Clock`].
///
/// Waits [`charge`](Self::charge)d but not yet elapsed add up; once the
/// clock passes a charged wait, only the clock counts again.
///
/// # Examples
///
/// ```
/// use backpressure::retry::Deadline;
/// use backpressure::ManualClock;
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(10));
/// assert!(deadline.charge(Duration::from_secs(4)).is_ok());
/// clock.advance(Duration::from_secs(4)); // ... slept
/// assert_eq!(deadline.remaining(), Duration::from_secs(6));
/// let refused = deadline.charge(Duration::from_secs(7)).unwrap_err();
/// assert_eq!(refused.status, backpressure::Status::TimedOut);
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
    /// use backpressure::retry::Deadline;
    /// use backpressure::ManualClock;
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
    /// use backpressure::retry::Deadline;
    /// use backpressure::ManualClock;
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
    /// use backpressure::retry::Deadline;
    /// use backpressure::ManualClock;
    /// use std::time::Duration;
    /// let mut d = Deadline::never(ManualClock::new());
    /// assert!(d.charge(Duration::from_secs(86_400 * 365)).is_ok());
    /// ```
    pub fn never(clock: C) -> Deadline<C> {
        Deadline::at(clock, u64::MAX)
    }

    /// The deadline in the clock's nanoseconds.
    pub fn at_nanos(&self) -> u64 {
        self.at
    }

    /// The clock this deadline reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// When the next wait would start: now, or the end of the charged waits.
    #[inline]
    fn start(&self) -> u64 {
        self.clock.now_nanos().max(self.committed)
    }

    /// The budget left after the waits already charged (zero once passed).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::Deadline;
    /// use backpressure::ManualClock;
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
    pub fn is_expired(&self) -> bool {
        self.start() >= self.at
    }

    /// Accounts for `wait` if it ends at or before the deadline; otherwise
    /// charges nothing. Once the deadline has passed nothing fits, not even
    /// a zero wait.
    ///
    /// # Errors
    ///
    /// A [`Throttled`] `timed_out` (scope `deadline`) if the wait would end
    /// past the deadline, or it has already passed; its hint names the wait
    /// and what was left.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::Deadline;
    /// use backpressure::ManualClock;
    /// use std::time::Duration;
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(5));
    /// assert!(d.charge(Duration::from_secs(3)).is_ok());
    /// assert!(d.charge(Duration::from_secs(3)).is_err()); // 6 s > 5 s
    /// assert!(d.charge(Duration::from_secs(2)).is_ok()); // exactly fits
    /// assert!(d.is_expired());
    /// assert!(d.charge(Duration::ZERO).is_err()); // no budget, no retry
    ///
    /// let mut d = Deadline::after(ManualClock::new(), Duration::from_secs(1));
    /// let refused = d.charge(Duration::from_secs(2)).unwrap_err();
    /// assert_eq!(refused.status, backpressure::Status::TimedOut);
    /// assert_eq!(refused.hint, "a wait of 2s does not fit the 1s left before the deadline");
    /// ```
    pub fn charge(&mut self, wait: Duration) -> Result<(), Throttled> {
        let start = self.start();
        let left = self.at.saturating_sub(start);
        let w = saturating_nanos(wait);
        // `left == 0`: expired; a zero wait would otherwise pass.
        if left == 0 || w > left {
            return Err(timed_out(wait, Duration::from_nanos(left)));
        }
        self.committed = start + w; // w <= at - start: no overflow
        Ok(())
    }
}

/// The refusal of a wait that does not fit.
#[cold]
fn timed_out(wait: Duration, remaining: Duration) -> Throttled {
    Throttled::new(
        Status::TimedOut,
        "deadline",
        format!("a wait of {wait:?} does not fit the {remaining:?} left before the deadline"),
    )
}
