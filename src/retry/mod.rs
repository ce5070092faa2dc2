//! Retries charged to a deadline.
//!
//! * [`Backoff`]: `min(cap, base * 2^attempt)` with [`Jitter`], from a
//!   seedable RNG; saturating, so any attempt number is fine.
//! * [`Deadline`]: a call's remaining budget on a [`Clock`](crate::Clock);
//!   [`charge`](Deadline::charge) refuses a wait that does not fit.
//! * [`RetryPolicy`]: turns a failure and the server's
//!   [hint](crate::headers::ServerHint) into a [`Decision`].
//! * [`RetryBudget`]: retries as a share of calls, across callers.
//! * [`Attempts`] and [`RequestDeadline`]: the request count a response
//!   carries and one request's own deadline, in `http::Extensions`.
//!
//! ```
//! use backpressure::retry::{Backoff, Jitter};
//! use std::time::Duration;
//!
//! let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
//!     .jitter(Jitter::None);
//! assert_eq!(backoff.delay(3), Duration::from_millis(800));
//! assert_eq!(backoff.delay(60), Duration::from_secs(5));
//! ```

use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::saturating_nanos;

mod budget;
mod deadline;
mod extensions;
mod policy;

pub use budget::RetryBudget;
pub use deadline::Deadline;
pub use extensions::{Attempts, RequestDeadline};
pub(crate) use policy::server_scope;
pub(crate) use policy::{reply_class, ReplyClass};
pub use policy::{Decision, RetryPolicy};

/// How a backoff delay is randomised. With `v = min(cap, base * 2^attempt)`:
///
/// # Examples
///
/// ```
/// use backpressure::retry::{Backoff, Jitter};
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
    /// Exactly `v`. Synchronised clients stay synchronised.
    None,
    /// Uniform in `[0, v]`: the least total work for competing clients.
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
/// Not `Clone`: two copies of one generator retry in lockstep, which jitter
/// exists to prevent. Use [`fork`](Self::fork) for an independent generator.
///
/// # Examples
///
/// ```
/// use backpressure::retry::Backoff;
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
    pub(crate) base: u64,
    cap: u64,
    jitter: Jitter,
    rng: fastrand::Rng,
    /// The last decorrelated delay (nanoseconds).
    previous: u64,
    /// What forks are seeded from.
    seed: u64,
    forks: AtomicU64,
}

impl Backoff {
    /// Backoff from `base` doubling up to `cap`, with [`Jitter::Full`] and an
    /// independently seeded RNG. A `cap` below `base` caps every delay.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::Backoff;
    /// use std::time::Duration;
    /// let b = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    /// assert_eq!(b.ceiling(10), Duration::from_secs(1));
    /// ```
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        let (base, cap) = (saturating_nanos(base), saturating_nanos(cap));
        Backoff::seeded(base, cap, Jitter::default(), fastrand::u64(..))
    }

    fn seeded(base: u64, cap: u64, jitter: Jitter, seed: u64) -> Backoff {
        Backoff {
            base,
            cap,
            jitter,
            rng: fastrand::Rng::with_seed(seed),
            previous: base,
            seed,
            forks: AtomicU64::new(0),
        }
    }

    /// Sets the jitter.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::{Backoff, Jitter};
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
    /// use backpressure::retry::Backoff;
    /// use std::time::Duration;
    /// let make = || Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).seed(42);
    /// let (mut a, mut b) = (make(), make());
    /// assert_eq!(a.delay(4), b.delay(4));
    /// ```
    pub fn seed(mut self, seed: u64) -> Backoff {
        self.rng.seed(seed);
        self.seed = seed;
        self
    }

    /// A backoff with the same settings and an independent generator seeded
    /// from this one's seed and how many forks came before it (deterministic
    /// if this one is seeded). Use one per concurrent call; `&self`, so a
    /// template is shared without a lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::Backoff;
    /// use std::time::Duration;
    /// let parent = Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).seed(3);
    /// let mut a = parent.fork();
    /// let mut b = parent.fork();
    /// assert_ne!(a.delay(20), b.delay(20)); // up to 1 s apart, not in lockstep
    /// ```
    pub fn fork(&self) -> Backoff {
        // Relaxed: the count only makes each fork's seed its own; nothing
        // is published through it.
        let n = self.forks.fetch_add(1, Ordering::Relaxed);
        let seed = self.seed ^ n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Backoff::seeded(self.base, self.cap, self.jitter, seed)
    }

    /// `min(cap, base * 2^attempt)`, saturating: the un-jittered delay.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::Backoff;
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

    /// The delay before retry number `attempt` (0 for the first retry). For
    /// [`Jitter::Decorrelated`], `attempt == 0` restarts the chain from `base`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::{Backoff, Jitter};
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
    pub(crate) fn spread(&mut self, max: u64) -> u64 {
        self.rng.u64(0..=max)
    }
}
