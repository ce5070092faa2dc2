//! `RedisReservation`: cells taken from a `RedisBucket`.

use core::fmt;
use core::future::Future;
use core::time::Duration;

use super::RedisBucket;
use crate::bucket::Reservation;
use crate::limiter::AsyncReservation;

/// Cells taken from a [`RedisBucket`], usable after
/// [`wait`](RedisReservation::wait).
///
/// As with the local [`Reservation`], dropping it keeps the cells taken.
/// [`cancel`](RedisReservation::cancel) gives them back: to the lease they
/// came from (no round trip), to Redis (one round trip, and only if no
/// other process took cells since), or to the fail-open fallback.
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
#[must_use = "dropping a RedisReservation keeps its cells taken; sleep `wait()` or `cancel()` it"]
pub struct RedisReservation<'a> {
    bucket: &'a RedisBucket,
    wait: Duration,
    refund: Refund<'a>,
}

/// Where the cells came from.
pub(super) enum Refund<'a> {
    /// Zero cells.
    Nothing,
    /// `n` cells from this process's lease.
    Lease(u32),
    /// `n` cells taken in Redis: the `tat` the take found and the one it
    /// wrote (µs).
    Remote { n: u32, before: u64, after: u64 },
    /// The fail-open fallback bucket.
    Local(Reservation<'a>),
}

impl<'a> RedisReservation<'a> {
    pub(super) fn new(bucket: &'a RedisBucket, wait: Duration, refund: Refund<'a>) -> Self {
        RedisReservation {
            bucket,
            wait,
            refund,
        }
    }

    /// How long the caller must wait before using the cells, measured from
    /// the moment `reserve` returned (never earlier than Redis's schedule).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN)).build().unwrap();
    /// let r = bucket.reserve(1, Duration::from_secs(1)).await.unwrap();
    /// tokio::time::sleep(r.wait()).await;
    /// # }
    /// ```
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether the fail-open fallback, not Redis, granted these cells.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN)).build().unwrap();
    /// let r = bucket.reserve(1, Duration::from_secs(1)).await.unwrap();
    /// if r.is_fallback() {
    ///     eprintln!("redis is down; running on the local share");
    /// }
    /// # }
    /// ```
    pub fn is_fallback(&self) -> bool {
        matches!(self.refund, Refund::Local(_))
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
    pub async fn cancel(self) -> bool {
        match self.refund {
            Refund::Nothing => false,
            Refund::Lease(n) => {
                self.bucket.unlease(n);
                true
            }
            Refund::Remote { n, before, after } => {
                let refunded = self.bucket.remote_cancel(before, after, u64::MAX).await;
                if refunded {
                    self.bucket.unadmit(n);
                }
                refunded
            }
            Refund::Local(r) => r.cancel(),
        }
    }
}

impl AsyncReservation for RedisReservation<'_> {
    fn wait(&self) -> Duration {
        self.wait
    }

    fn cancel(self) -> impl Future<Output = bool> + Send {
        RedisReservation::cancel(self)
    }
}

impl fmt::Debug for RedisReservation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = match &self.refund {
            Refund::Nothing => "nothing",
            Refund::Lease(_) => "lease",
            Refund::Remote { .. } => "redis",
            Refund::Local(_) => "fallback",
        };
        f.debug_struct("RedisReservation")
            .field("wait", &self.wait)
            .field("from", &from)
            .finish()
    }
}
