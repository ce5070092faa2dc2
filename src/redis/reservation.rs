//! `RedisReservation`: cells taken from a `RedisBucket`.

use core::fmt;
use core::time::Duration;

use super::script::Refund;
use super::RedisBucket;
use crate::bucket::Reservation;
use crate::clock::saturating_nanos;

/// Cells taken from a [`RedisBucket`], usable after
/// [`wait`](RedisReservation::wait).
///
/// # Dropping it
///
/// A reservation dropped **after** its wait has passed keeps its cells.
/// One dropped **before** it gives them back, at most once: cells from
/// this process's lease or the fail-open fallback at once, in `Drop`;
/// cells taken in Redis are queued (at most
/// [`MAX_QUEUED_REFUNDS`](super::RedisBucket::MAX_QUEUED_REFUNDS), the
/// oldest forgotten first) and sent with the bucket's **next round trip**,
/// whatever its operation. No task is spawned: without a further call (or
/// if that call fails) they count as used until the key refills. Redis
/// applies each as [`cancel`](RedisReservation::cancel) does; counted in
/// [`RedisStats::refunded`](super::RedisStats::refunded).
///
/// To let the reservation go before using the cells (say, to sleep
/// elsewhere), call [`keep`](RedisReservation::keep).
/// [`cancel`](RedisReservation::cancel) gives them back now and says
/// whether it could.
///
/// # Examples
///
/// ```no_run
/// use backpressure::{Quota, RedisBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
///     .build().unwrap();
/// let r = bucket.reserve(1, Duration::from_secs(5)).await.unwrap();
/// // The caller's plans changed.
/// r.cancel().await;
/// # }
/// ```
#[must_use = "a RedisReservation dropped before its wait gives its cells back; sleep `wait()` holding it, or `keep()` it"]
pub struct RedisReservation<'a> {
    bucket: &'a RedisBucket,
    wait: Duration,
    /// When the cells become usable, on the bucket's clock.
    ready_at: u64,
    /// The bucket's generation when taken (see `State::generation`).
    generation: u64,
    source: Source<'a>,
}

/// Where the cells came from.
pub(super) enum Source<'a> {
    /// Zero cells, or cells already given back or kept.
    Nothing,
    /// `n` cells from this process's lease.
    Lease(u32),
    /// Cells taken in Redis.
    Remote(Refund),
    /// The fail-open fallback bucket.
    Local(Reservation<'a>),
}

impl<'a> RedisReservation<'a> {
    pub(super) fn new(bucket: &'a RedisBucket, wait: Duration, source: Source<'a>) -> Self {
        let now = bucket.clock.now_nanos();
        RedisReservation {
            bucket,
            wait,
            ready_at: now.saturating_add(saturating_nanos(wait)),
            generation: bucket.state.lock().generation,
            source,
        }
    }

    /// How long the caller must wait before using the cells, measured from
    /// the moment `reserve` returned (never earlier than Redis's schedule).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether the fail-open fallback, not Redis, granted these cells.
    pub fn is_fallback(&self) -> bool {
        matches!(self.source, Source::Local(_))
    }

    /// Keeps the cells taken (the call will run after the wait) and
    /// returns the wait: dropping the reservation early would give them
    /// back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN)).build().unwrap();
    /// let wait = bucket.reserve(1, Duration::from_secs(1)).await.unwrap().keep();
    /// tokio::time::sleep(wait).await; // then call the API
    /// # }
    /// ```
    pub fn keep(mut self) -> Duration {
        self.source = Source::Nothing;
        self.wait
    }

    /// Gives the cells back if that cannot let the bucket exceed its burst
    /// (no later take was stacked on them); returns whether it did. A
    /// remote refund takes one round trip, bounded by the bucket's
    /// timeout; if Redis does not answer, the cells stay taken.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN)).build().unwrap();
    /// let first = bucket.reserve(1, Duration::from_secs(5)).await.unwrap();
    /// let second = bucket.reserve(1, Duration::from_secs(5)).await.unwrap();
    /// assert!(!first.cancel().await); // `second` is stacked on it
    /// assert!(second.cancel().await);
    /// # }
    /// ```
    pub async fn cancel(mut self) -> bool {
        let bucket = self.bucket;
        if !self.current() {
            // Reset or given a new quota since: as the local bucket, the
            // cells are no longer this reservation's to give back.
            self.source = Source::Nothing;
            return false;
        }
        match core::mem::replace(&mut self.source, Source::Nothing) {
            Source::Nothing => false,
            Source::Lease(n) => {
                bucket.unlease(n);
                true
            }
            Source::Remote(refund) => {
                let refunded = bucket.remote_cancel(refund, u64::MAX).await;
                if refunded {
                    bucket.unadmit(refund.n);
                }
                refunded
            }
            Source::Local(r) => r.cancel(),
        }
    }
}

impl RedisReservation<'_> {
    /// Whether this process has neither reset the bucket nor changed its quota
    /// since (another's change shows as a failed refund in Redis).
    fn current(&self) -> bool {
        matches!(self.source, Source::Local(_))
            || self.bucket.state.lock().generation == self.generation
    }
}

impl Drop for RedisReservation<'_> {
    fn drop(&mut self) {
        if matches!(self.source, Source::Nothing) || !self.current() {
            return;
        }
        if self.bucket.clock.now_nanos() >= self.ready_at {
            // Used (or usable): keep the cells.
            return;
        }
        match core::mem::replace(&mut self.source, Source::Nothing) {
            Source::Nothing => {}
            Source::Lease(n) => self.bucket.unlease(n),
            Source::Remote(refund) => {
                // Checked again under the lock `reset` and `set_quota`
                // bump the generation under: never queued across one.
                let mut state = self.bucket.state.lock();
                if state.generation == self.generation {
                    state.queue_refund(refund);
                }
            }
            Source::Local(r) => {
                r.cancel();
            }
        }
    }
}

impl fmt::Debug for RedisReservation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = match &self.source {
            Source::Nothing => "nothing",
            Source::Lease(_) => "lease",
            Source::Remote(_) => "redis",
            Source::Local(_) => "fallback",
        };
        f.debug_struct("RedisReservation")
            .field("wait", &self.wait)
            .field("from", &from)
            .finish()
    }
}
