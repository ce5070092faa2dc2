//! `Reservation`: cells taken now for use at a known instant.

use core::fmt;
use core::time::Duration;

use super::gcra::{Gcra, Reserved, Ticket};
use crate::sync::Arc;

/// Cells taken from a rate limiter, usable from [`ready_at`] (after
/// [`wait`]). Dropping a reservation keeps them taken (sleep for [`wait`],
/// then start the call); a caller that gives up calls [`cancel`].
///
/// [`ready_at`]: Reservation::ready_at
/// [`wait`]: Reservation::wait
/// [`cancel`]: Reservation::cancel
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, Quota, TokenBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// let quota = Quota::per_second(NonZeroU32::new(1).unwrap());
/// let bucket = TokenBucket::with_clock(quota, ManualClock::new());
/// bucket.try_acquire(1).unwrap();
///
/// // The next cell is a second away; we can afford two.
/// let r = bucket.reserve(1, Duration::from_secs(2)).unwrap();
/// assert_eq!(r.wait(), Duration::from_secs(1));
/// assert_eq!(r.ready_at(), 1_000_000_000);
///
/// // The caller's plans changed: give the cell back.
/// assert!(r.cancel());
/// assert_eq!(bucket.reserve(1, Duration::from_secs(2)).unwrap().wait(), Duration::from_secs(1));
/// ```
#[must_use = "dropping a Reservation keeps its cells taken; sleep `wait()` or `cancel()` it"]
pub struct Reservation<'a> {
    ready_at: u64,
    wait: u64,
    refund: Refund<'a>,
}

/// Where and how a reservation can be given back.
enum Refund<'a> {
    /// Nothing to give back (zero cells).
    Nothing,
    Borrowed(&'a Gcra, Ticket),
    /// A `Scoped` entry, which may be evicted while the reservation lives.
    Shared(Arc<Gcra>, Ticket),
}

impl<'a> Reservation<'a> {
    pub(crate) fn borrowed(bucket: &'a Gcra, reserved: Reserved, now: u64) -> Self {
        Self::new(reserved, now, |t| Refund::Borrowed(bucket, t))
    }

    pub(crate) fn shared(bucket: Arc<Gcra>, reserved: Reserved, now: u64) -> Self {
        Self::new(reserved, now, |t| Refund::Shared(bucket, t))
    }

    fn new(reserved: Reserved, now: u64, refund: impl FnOnce(Ticket) -> Refund<'a>) -> Self {
        Reservation {
            ready_at: reserved.ready_at,
            wait: reserved.ready_at - now,
            refund: reserved.ticket.map_or(Refund::Nothing, refund),
        }
    }

    /// How long the caller must wait before using the cells, from the
    /// `reserve` call.
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait)
    }

    /// The instant the cells become usable, in nanoseconds on the limiter's
    /// clock (see [`Clock::now_nanos`](crate::Clock::now_nanos)).
    pub fn ready_at(&self) -> u64 {
        self.ready_at
    }

    /// Gives the cells back if that cannot let the bucket exceed its burst:
    /// nothing was stacked on this one and the bucket was not reset or given
    /// a new quota since. Returns whether it did.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(1).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// let first = bucket.reserve(1, Duration::from_secs(5)).unwrap();
    /// let second = bucket.reserve(1, Duration::from_secs(5)).unwrap();
    /// assert!(!first.cancel()); // `second` is stacked on it
    /// assert!(second.cancel());
    /// ```
    pub fn cancel(self) -> bool {
        self.undo()
    }

    /// [`cancel`](Self::cancel) through a reference; a second undo is refused.
    pub(crate) fn undo(&self) -> bool {
        self.refund.undo()
    }
}

impl Reservation<'_> {
    /// The end of the hold its bucket records (0: none), for a sleeper to
    /// re-check; `None` for zero cells.
    pub(crate) fn held_until(&self) -> Option<u64> {
        match &self.refund {
            Refund::Nothing => None,
            Refund::Borrowed(bucket, _) => Some(bucket.held_until()),
            Refund::Shared(bucket, _) => Some(bucket.held_until()),
        }
    }
}

impl Refund<'_> {
    fn undo(&self) -> bool {
        match self {
            Refund::Nothing => false,
            Refund::Borrowed(bucket, ticket) => bucket.cancel(*ticket),
            Refund::Shared(bucket, ticket) => bucket.cancel(*ticket),
        }
    }
}

impl fmt::Debug for Reservation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("ready_at", &self.ready_at)
            .field("wait", &self.wait())
            .field("refundable", &!matches!(self.refund, Refund::Nothing))
            .finish()
    }
}
