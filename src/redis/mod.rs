//! `RedisBucket`: the [`TokenBucket`] contract enforced in Redis, so every
//! process on one key shares one quota. The GCRA decision runs inside
//! Redis, atomically, in one round trip (`script.rs`), on Redis's clock.

mod admin;
mod breaker;
mod builder;
mod connection;
mod lease;
mod reservation;
mod scoped;
mod script;
mod state;

use core::fmt;
use core::time::Duration;

#[cfg(doc)]
use crate::bucket::TokenBucket;

use crate::bucket::{CheckError, Quota, ReserveError};
use crate::clock::{saturating_nanos, Clock};
use crate::limiter::RateLimiter;
use crate::sync::{Arc, ThreadMutex};

use breaker::Policy;
pub use builder::{FailPolicy, RedisBucketBuilder, RedisBucketError};
use connection::{Connection, Failed};
use lease::Lease;
pub use reservation::RedisReservation;
use reservation::Source;
pub use scoped::{RedisScoped, RedisScopedBuilder};
use script::{Op, Refund, MAX_MICROS};
use state::State;

/// Refunds of dropped reservations queued per bucket, at most.
const MAX_QUEUED_REFUNDS: usize = 1024;

/// Counters of a [`RedisBucket`]'s decisions, for measuring leasing and
/// the failure policy.
///
/// # Examples
///
/// ```
/// use backpressure::RedisStats;
/// let s = RedisStats::default();
/// assert_eq!(s.round_trips_per_admitted(), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Script calls sent to Redis (an `EVAL` after `NOSCRIPT` counts too).
    pub round_trips: u64,
    /// Cells admitted by Redis or from a lease (not by the fallback).
    pub admitted: u64,
    /// Of those, cells admitted from a lease, without a round trip.
    pub leased: u64,
    /// Calls Redis did not decide: no answer within the store
    /// [`timeout`](RedisBucketBuilder::timeout), a connection error, an error
    /// or malformed reply, or skipped after a recent failure.
    pub failures: u64,
    /// [`reserve`](RedisBucket::reserve) calls whose own `max_wait`, shorter
    /// than the store timeout, ran out first. Refused as rate limited; not
    /// failures (no failure policy, no effect on later calls).
    pub out_of_budget: u64,
    /// Decisions made by the fail-open fallback bucket.
    pub fallback: u64,
    /// Cells given back by reservations dropped before their wait had passed
    /// (applied by Redis with a later round trip); no longer in `admitted`.
    pub refunded: u64,
}

impl RedisStats {
    /// Round trips per admitted cell, or `None` before the first one.
    pub fn round_trips_per_admitted(&self) -> Option<f64> {
        (self.admitted > 0).then(|| self.round_trips as f64 / self.admitted as f64)
    }
}

/// A GCRA bucket held in Redis, shared by every process that uses the same
/// key (and quota).
///
/// Each process builds its own `RedisBucket` on the key, all with the same
/// quota. The decision runs in Redis, atomically, in one round trip, on
/// Redis's clock; the key expires when the bucket is full again.
///
/// # A stored quota is advice
///
/// A quota stored with the key ([`set_quota`](RedisBucket::set_quota), or
/// anyone who can write the key) is taken only within this process's
/// bounds: never faster or burstier than its ceiling (its own quota, or
/// one it set higher); never slower than 1/1000 of its own rate; never a
/// burst of more than the stored rate gives in the ceiling's window (at
/// least a second). Outside them it is clamped (logged with `tracing`).
/// With no quota stored, the process is back on its own.
///
/// # Shape of the API
///
/// A decision and a refund are network round trips, so the methods are
/// `async`, as is [`cancel`](RedisReservation::cancel) on the
/// [`RedisReservation`] that [`reserve`](RedisBucket::reserve) returns.
/// Names and error types are [`TokenBucket`]'s; both implement
/// [`RateLimiter`].
///
/// # Leasing
///
/// With [`lease`](RedisBucketBuilder::lease), a decision that reaches Redis
/// takes up to `size` cells in the same round trip (only cells usable now),
/// and later calls are admitted from them locally until they run out or
/// the lease's `ttl` passes. Unused cells go back with the next round trip
/// after the lease expires (or with
/// [`release_lease`](RedisBucket::release_lease)).
///
/// The trade-off: fewer round trips against burstier fairness. Over any
/// window of length `t`, the cells admitted across `P` processes stay
/// within `burst + t / period + P * size` (`size` is capped at the burst).
/// A [`penalize`](RedisBucket::penalize) from another process reaches this
/// one at its next round trip, so up to `size` leased cells may still be
/// spent under it.
///
/// # Failure policy
///
/// Every Redis call has a timeout ([`timeout`](RedisBucketBuilder::timeout),
/// never longer than a [`reserve`](RedisBucket::reserve)'s `max_wait`).
/// When Redis does not answer in the store timeout (or the connection
/// fails, or it answers with an error), the decision follows the
/// [`FailPolicy`]: a local bucket at a share of the rate, or `Unavailable`
/// (nothing consumed). A `max_wait` too short for the round trip is that
/// caller's `RateLimited`, not a failure. After a connection error or a
/// store timeout, decisions skip Redis for
/// [`probe_interval`](RedisBucketBuilder::probe_interval), then try again
/// (the connection reconnects on its own). Nothing here panics or waits
/// without a bound. Failures only ever lose cells, never admit extra ones.
///
/// # Runtime
///
/// The `redis` crate's connections run on tokio: poll these futures inside
/// a tokio runtime. Outside one, every decision takes the failure policy.
///
/// # Examples
///
/// ```no_run
/// use backpressure::{Quota, RedisBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let bucket = RedisBucket::builder(
///     "redis://127.0.0.1:6379",
///     "quota:org-key",
///     Quota::per_second(NonZeroU32::new(50).unwrap())
///         .allow_burst(NonZeroU32::new(5).unwrap()),
/// )
/// .build()
/// .unwrap();
/// match bucket.reserve(1, Duration::from_millis(200)).await {
///     // Sleep holding `r`: dropped before its wait, it gives its cells back.
///     Ok(r) => tokio::time::sleep(r.wait()).await, // then call the API
///     Err(e) => eprintln!("{e}"),                  // surface it, don't sleep
/// };
/// # }
/// ```
pub struct RedisBucket {
    /// The connection, the script, the key and the store timeout.
    conn: Connection,
    lease: Option<Lease>,
    policy: Policy,
    /// Local time: deadlines, leases, the probe interval; and the decision
    /// time itself when the builder was given a clock.
    clock: Arc<dyn Clock>,
    state: ThreadMutex<State>,
}

impl RedisBucket {
    /// Refunds of dropped reservations queued per bucket, at most: a drop
    /// past it forgets the oldest (lowest) one, which could only unwind
    /// after all those above it. See *Dropping it* on [`RedisReservation`].
    pub const MAX_QUEUED_REFUNDS: usize = MAX_QUEUED_REFUNDS;

    /// The Redis key.
    pub fn key(&self) -> &str {
        &self.conn.key
    }

    /// The quota in force: the key's stored quota as this process takes it
    /// (within its bounds; see *A stored quota is advice*) since the last
    /// reply, else its own (exact; a stored one has Redis's whole
    /// microseconds).
    pub fn quota(&self) -> Quota {
        self.state.lock().quota
    }

    /// Cells leased per round trip (0 without leasing).
    pub fn lease_size(&self) -> u32 {
        self.lease.map_or(0, |l| l.size)
    }

    /// The counters so far.
    pub fn stats(&self) -> RedisStats {
        self.state.lock().stats
    }

    /// Admits `n` cells now (from the lease when it has them, else in one
    /// round trip), or says how long until they would fit. A denial
    /// consumes nothing. `n == 0` always succeeds, without a round trip.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotUntil`] and [`CheckError::InsufficientCapacity`] as
    /// [`TokenBucket::try_acquire`]; [`CheckError::Unavailable`] when Redis
    /// does not answer and the policy is [`FailPolicy::FailClosed`] (with
    /// [`FailPolicy::FailOpen`] the fallback bucket answers).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// if bucket.try_acquire(1).await.is_ok() {
    ///     // start the call
    /// }
    /// # }
    /// ```
    pub async fn try_acquire(&self, n: u32) -> Result<(), CheckError> {
        if n == 0 {
            return Ok(());
        }
        self.check_capacity(n)
            .map_err(|capacity| CheckError::InsufficientCapacity {
                requested: n,
                capacity,
            })?;
        if self.take_leased(n) {
            return Ok(());
        }
        match self.take(n, 0, None, 0).await {
            // `max_wait` 0: a grant is usable now.
            Ok(_) => Ok(()),
            Err(Denial::Wait(wait)) => Err(CheckError::NotUntil { wait }),
            Err(Denial::Capacity(capacity)) => Err(CheckError::InsufficientCapacity {
                requested: n,
                capacity,
            }),
            // Without a caller's budget, every failure is the store's.
            Err(Denial::Failed(_)) => match self.fall_back() {
                Ok(fallback) => fallback.try_acquire(n),
                Err(retry_after) => Err(CheckError::Unavailable { retry_after }),
            },
        }
    }

    /// Takes `n` cells usable within `max_wait`, or nothing, in one round
    /// trip (or from the lease). `max_wait` bounds the whole call: the round
    /// trip's timeout too (when not zero), and a wait that no longer fits
    /// once the reply is in is given back and refused.
    ///
    /// # Errors
    ///
    /// As [`TokenBucket::reserve`], plus [`ReserveError::Unavailable`] when
    /// Redis does not answer within the store timeout and the policy is
    /// [`FailPolicy::FailClosed`]. When a `max_wait` shorter than the store
    /// timeout runs out first: [`ReserveError::RateLimited`] with
    /// `retry_after` = `max_wait`, counted in
    /// [`RedisStats::out_of_budget`] (this caller's refusal only: no
    /// failure policy, no effect on other calls).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// let r = bucket.reserve(1, Duration::from_secs(2)).await.unwrap();
    /// tokio::time::sleep(r.wait()).await;
    /// # }
    /// ```
    pub async fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> Result<RedisReservation<'_>, ReserveError> {
        self.reserve_from(n, Duration::ZERO, max_wait).await
    }

    /// [`reserve`](Self::reserve), the cells taken as of `not_before` from
    /// now (see `RateLimiter::reserve_after`; past `max_wait`, refused
    /// without a round trip). A lease's cells are usable now, so a later
    /// call skips the lease.
    async fn reserve_from(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> Result<RedisReservation<'_>, ReserveError> {
        ReserveError::fits_not_before(not_before, max_wait)?;
        if n == 0 {
            return Ok(RedisReservation::new(self, not_before, Source::Nothing));
        }
        self.check_capacity(n)
            .map_err(|capacity| ReserveError::InsufficientCapacity {
                requested: n,
                capacity,
            })?;
        if not_before.is_zero() && self.take_leased(n) {
            return Ok(RedisReservation::new(
                self,
                Duration::ZERO,
                Source::Lease(n),
            ));
        }
        let start = self.clock.now_nanos();
        let budget = saturating_nanos(max_wait);
        // A zero budget still gets one store round trip (a cell usable now).
        let bound = (!max_wait.is_zero()).then_some(max_wait);
        let max_wait_us = (budget / 1000).min(MAX_MICROS);
        let not_before_us = (saturating_nanos(not_before) / 1000).min(max_wait_us);
        match self.take(n, max_wait_us, bound, not_before_us).await {
            Ok(taken) => {
                let wait = Duration::from_micros(taken.wait_us);
                let elapsed = self.clock.now_nanos().saturating_sub(start);
                if taken.wait_us > 0 && elapsed.saturating_add(saturating_nanos(wait)) > budget {
                    // The round trip ate the budget: the wait no longer
                    // fits. Give the cells back (best effort) and refuse.
                    self.unadmit(n);
                    let refund = Refund {
                        before: taken.before,
                        after: taken.after,
                        n,
                    };
                    self.remote_cancel(refund, budget - elapsed.min(budget))
                        .await;
                    return Err(ReserveError::RateLimited { retry_after: wait });
                }
                let source = if taken.granted > n {
                    Source::Lease(n)
                } else {
                    Source::Remote(Refund {
                        n,
                        before: taken.before,
                        after: taken.after,
                    })
                };
                Ok(RedisReservation::new(self, wait, source))
            }
            Err(Denial::Wait(retry_after)) => Err(ReserveError::RateLimited { retry_after }),
            Err(Denial::Capacity(capacity)) => Err(ReserveError::InsufficientCapacity {
                requested: n,
                capacity,
            }),
            Err(Denial::Failed(Failed::Budget)) => Err(ReserveError::RateLimited {
                retry_after: max_wait,
            }),
            Err(Denial::Failed(Failed::Store)) => {
                let fallback = self
                    .fall_back()
                    .map_err(|retry_after| ReserveError::Unavailable { retry_after })?;
                let elapsed = self.clock.now_nanos().saturating_sub(start);
                let left = Duration::from_nanos(budget.saturating_sub(elapsed));
                fallback
                    .reserve_from(n, not_before, left)
                    .map(|r| RedisReservation::new(self, r.wait(), Source::Local(r)))
            }
        }
    }

    /// The server said "not before `retry_after`" (a 429 or 503 with
    /// `Retry-After`): no process on the key is admitted before then, as
    /// [`TokenBucket::penalize`]. This process's unused leased cells go back
    /// in the same round trip; the fail-open fallback is penalized too. If
    /// Redis does not answer, only this process holds back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// bucket.penalize(Duration::from_secs(30)).await;
    /// assert!(bucket.try_acquire(1).await.is_err());
    /// # }
    /// ```
    pub async fn penalize(&self, retry_after: Duration) {
        if let Policy::Open { bucket, .. } = &self.policy {
            bucket.penalize(retry_after);
        }
        let give = self.drain_lease(true);
        let retry = (saturating_nanos(retry_after) / 1000).min(MAX_MICROS);
        // A failure is already counted; there is nothing else to do.
        let _ = self.call(Op::Penalize { retry, give }, None).await;
    }

    /// Takes `n` more cells in Redis now, whatever the wait and the burst:
    /// debt every process waits for. One round trip, which also gives back
    /// this process's unused leased cells; the fail-open fallback is
    /// charged too. If Redis does not answer, the charge goes again with
    /// the next round trip, and Redis applies it once whatever reached it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let tokens = RedisBucket::builder("redis://127.0.0.1/", "tpm", Quota::per_minute(NonZeroU32::new(120_000).unwrap()))
    ///     .build().unwrap();
    /// tokens.try_acquire(1_000).await.unwrap(); // the estimate
    /// tokens.charge(400).await; // the reply used 1,400
    /// # }
    /// ```
    pub async fn charge(&self, n: u32) {
        if n == 0 {
            return;
        }
        if let Policy::Open { bucket, .. } = &self.policy {
            bucket.charge_now(n);
        }
        self.state.lock().queue_settle(i64::from(n));
        let give = self.drain_lease(true);
        let _ = self.call(Op::Give { give }, None).await;
    }

    /// Gives back `n` cells taken earlier and not used, however many other
    /// processes took since: the key refills by `n` cells' worth, never
    /// past full and never into a [`penalize`](Self::penalize) hold. One
    /// round trip, which also gives back unused leased cells. If Redis does
    /// not answer, the refund goes again with the next round trip and is
    /// applied once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let tokens = RedisBucket::builder("redis://127.0.0.1/", "tpm", Quota::per_minute(NonZeroU32::new(120_000).unwrap()))
    ///     .build().unwrap();
    /// tokens.try_acquire(1_000).await.unwrap(); // the estimate
    /// tokens.refund(700).await; // the reply used 300
    /// # }
    /// ```
    pub async fn refund(&self, n: u32) {
        if let Policy::Open { bucket, .. } = &self.policy {
            bucket.give_back(n);
        }
        if n > 0 {
            self.state.lock().queue_settle(-i64::from(n));
        }
        let give = self.drain_lease(true);
        if give > 0 || n > 0 {
            let _ = self.call(Op::Give { give }, None).await;
        }
    }

    /// How many cells [`try_acquire`](RedisBucket::try_acquire) would admit
    /// now, counting this process's leased cells. A peek, one round trip.
    /// When Redis does not answer: the fallback's count when failing open,
    /// 0 when failing closed.
    pub async fn available(&self) -> u32 {
        match self.call(Op::Available, None).await {
            Ok(reply) => {
                let remote = reply.first().copied().unwrap_or(0).max(0) as u64;
                let local = self.valid_leased() as u64;
                (remote + local).min(u32::MAX as u64) as u32
            }
            // A peek, not a decision: not counted as a fallback.
            Err(_) => self.policy.fallback().map_or(0, |f| f.available()),
        }
    }

    /// Gives this process's unused leased cells back to Redis now (say,
    /// before shutting down). Without it they go back with the next round
    /// trip after the lease expires, or, if none comes, count as used
    /// until the bucket refills.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .lease(NonZeroU32::new(5).unwrap(), Duration::from_millis(100))
    ///     .build().unwrap();
    /// bucket.try_acquire(1).await.unwrap(); // leases 5, uses 1
    /// bucket.release_lease().await;          // the other 4 go back
    /// # }
    /// ```
    pub async fn release_lease(&self) {
        // A refund of nothing gives back exactly the lease.
        self.refund(0).await;
    }

    // -- internals ---------------------------------------------------------

    #[inline]
    fn check_capacity(&self, n: u32) -> Result<(), u32> {
        let burst = self.state.lock().params.burst;
        if n > burst {
            Err(burst)
        } else {
            Ok(())
        }
    }

    /// Uncounts `n` admitted cells the caller did not use.
    pub(crate) fn unadmit(&self, n: u32) {
        let mut state = self.state.lock();
        state.stats.admitted = state.stats.admitted.saturating_sub(n as u64);
    }

    /// One take in Redis: gives back whatever the lease no longer uses,
    /// takes `n` (plus a lease's worth when usable now). `bound` is the
    /// caller's budget for the round trip (see [`call`](Self::call)).
    async fn take(
        &self,
        n: u32,
        max_wait_us: u64,
        bound: Option<Duration>,
        not_before: u64,
    ) -> Result<Taken, Denial> {
        // A lease that could not cover `n` is given back whole, live or not.
        let give = self.drain_lease(true);
        let extra = self.lease.map_or(0, |l| l.size.saturating_sub(n));
        let op = Op::Take {
            n,
            max_wait: max_wait_us,
            // Extra cells are usable now: only for a call that is too.
            extra: if not_before == 0 { extra } else { 0 },
            give,
            not_before,
        };
        // On failure the give-back is dropped: it may have been applied, and
        // returning it twice would over-admit.
        let reply = self.call(op, bound).await.map_err(Denial::Failed)?;
        let [granted, wait, before, after] = match reply[..] {
            [g, w, b, a] if g >= 0 && w >= 0 && b >= 0 && a >= 0 => [g, w, b, a].map(|v| v as u64),
            _ => return Err(self.malformed()),
        };
        // The script refuses only a wait longer than `max_wait` (>= 0), so
        // a refusal with no wait, or a grant short of `n`, is not its
        // answer: a store error, never a zero-wait denial to spin on.
        if granted == 0 && wait == 0 {
            // The script's answer to more than the burst in force (a
            // quota another process just lowered).
            let burst = self.state.lock().params.burst;
            if n > burst {
                return Err(Denial::Capacity(burst));
            }
            return Err(self.malformed());
        }
        if granted != 0 && granted < n as u64 {
            return Err(self.malformed());
        }
        if granted == 0 {
            return Err(Denial::Wait(Duration::from_micros(wait)));
        }
        let granted = granted.min(u32::MAX as u64) as u32;
        let mut state = self.state.lock();
        state.stats.admitted += n as u64;
        if let (Some(lease), true) = (self.lease, granted > n) {
            let now = self.clock.now_nanos();
            state.lease.refill(lease, granted - n, now);
        }
        Ok(Taken {
            granted,
            wait_us: wait,
            before,
            after,
        })
    }

    /// A reply the script cannot have sent: counted as a failure (Redis
    /// answered, so the breaker stays closed).
    #[cold]
    fn malformed(&self) -> Denial {
        self.state.lock().stats.failures += 1;
        Denial::Failed(Failed::Store)
    }
}

/// A take Redis granted.
#[derive(Clone, Copy, Debug)]
struct Taken {
    /// `n` plus the cells leased.
    granted: u32,
    wait_us: u64,
    before: u64,
    after: u64,
}

/// A take Redis refused, or could not decide.
#[derive(Debug)]
enum Denial {
    Wait(Duration),
    /// More than the burst in force.
    Capacity(u32),
    Failed(Failed),
}

impl fmt::Debug for RedisBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBucket")
            .field("key", &self.conn.key)
            .field("quota", &self.quota())
            .field("lease", &self.lease)
            .field("timeout", &self.conn.link.timeout)
            .field("policy", &self.policy)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl RateLimiter for RedisBucket {
    fn try_acquire(
        &self,
        n: u32,
    ) -> impl core::future::Future<Output = Result<(), CheckError>> + Send {
        RedisBucket::try_acquire(self, n)
    }

    async fn reserve(&self, n: u32, max_wait: Duration) -> Result<Duration, ReserveError> {
        // Kept: a `RedisReservation` dropped before its wait would give its
        // cells back, and the caller is about to use them.
        RedisBucket::reserve(self, n, max_wait)
            .await
            .map(RedisReservation::keep)
    }

    async fn reserve_after(
        &self,
        n: u32,
        not_before: Duration,
        max_wait: Duration,
    ) -> Result<Duration, ReserveError> {
        self.reserve_from(n, not_before, max_wait)
            .await
            .map(RedisReservation::keep)
    }

    fn penalize(&self, retry_after: Duration) -> impl core::future::Future<Output = ()> + Send {
        RedisBucket::penalize(self, retry_after)
    }

    fn available(&self) -> impl core::future::Future<Output = u32> + Send {
        RedisBucket::available(self)
    }

    fn charge(&self, n: u32) -> impl core::future::Future<Output = ()> + Send {
        RedisBucket::charge(self, n)
    }

    fn refund(&self, n: u32) -> impl core::future::Future<Output = ()> + Send {
        RedisBucket::refund(self, n)
    }

    fn quota(&self) -> Option<Quota> {
        Some(RedisBucket::quota(self))
    }

    async fn set_quota(&self, quota: Quota) {
        // A failure is counted in the stats, and the quota in force stays
        // (see `RedisBucket::set_quota`).
        let _ = RedisBucket::set_quota(self, quota).await;
    }
}
