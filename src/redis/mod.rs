//! `RedisBucket`: the [`TokenBucket`] contract enforced in Redis, so that
//! every process on one API key shares one quota.
//!
//! A local bucket stops a process's own bursts, but two processes on one
//! key each run their own and together send twice the key's rate. Here the
//! GCRA decision runs inside Redis, atomically, in one round trip (a Lua
//! script called by hash; see `script.rs` for the arithmetic), on Redis's
//! clock.
//!
//! The public documentation (API shape, leasing, failure policy,
//! runtime) is on [`RedisBucket`].

mod reservation;
mod script;

use core::fmt;
use core::num::NonZeroU32;
use core::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Script};
use tokio::sync::OnceCell;

use crate::bucket::{CheckError, Quota, ReserveError, TokenBucket};
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::limiter::AsyncRateLimiter;
use crate::sync::{Arc, ThreadMutex};

pub use reservation::RedisReservation;
use reservation::Refund;
use script::{Op, Params, MAX_MICROS};

/// What a [`RedisBucket`] does when Redis does not answer in time.
///
/// # Examples
///
/// ```
/// use backpressure::FailPolicy;
/// use std::time::Duration;
///
/// // Keep working at a quarter of the shared rate (say, four processes).
/// let open = FailPolicy::FailOpen { share: 0.25 };
/// // Or refuse, and tell callers to come back in a second.
/// let closed = FailPolicy::FailClosed { retry_after: Duration::from_secs(1) };
/// assert_ne!(open, closed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum FailPolicy {
    /// Decide with a local [`TokenBucket`] at `share` (in `(0, 1]`) of the
    /// quota's rate and burst (at least one cell of burst): with `P`
    /// processes on the key, `1 / P` keeps the total within the quota.
    FailOpen {
        /// The fraction of the shared quota this process may use alone.
        share: f64,
    },
    /// Refuse: [`CheckError::Unavailable`] / [`ReserveError::Unavailable`]
    /// with this `retry_after`, consuming nothing.
    FailClosed {
        /// What to tell callers.
        retry_after: Duration,
    },
}

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
    /// Calls Redis did not answer within the store
    /// [`timeout`](RedisBucketBuilder::timeout), lost to a connection
    /// error, answered with an error or a malformed reply, or that were not
    /// sent because a recent call had failed.
    pub failures: u64,
    /// [`reserve`](RedisBucket::reserve) calls whose own budget
    /// (`max_wait`, shorter than the store timeout) ran out before Redis
    /// answered. Refused as rate limited; not failures: they neither take
    /// the failure policy nor make later calls skip Redis.
    pub out_of_budget: u64,
    /// Decisions made by the fail-open fallback bucket.
    pub fallback: u64,
}

impl RedisStats {
    /// Round trips per admitted cell, or `None` before the first one.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::RedisStats;
    /// assert_eq!(RedisStats::default().round_trips_per_admitted(), None);
    /// ```
    pub fn round_trips_per_admitted(&self) -> Option<f64> {
        (self.admitted > 0).then(|| self.round_trips as f64 / self.admitted as f64)
    }
}

/// Why a [`RedisBucketBuilder`] could not build.
///
/// # Examples
///
/// ```
/// use backpressure::{Quota, RedisBucket};
/// use std::num::NonZeroU32;
/// let err = RedisBucket::builder("not a url", "k", Quota::per_second(NonZeroU32::MIN))
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().starts_with("invalid redis url"));
/// ```
#[derive(Debug)]
pub struct RedisBucketError {
    message: String,
    source: Option<::redis::RedisError>,
}

impl fmt::Display for RedisBucketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RedisBucketError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

fn config_error(message: String) -> RedisBucketError {
    RedisBucketError {
        message,
        source: None,
    }
}

/// Configures a [`RedisBucket`]; see [`RedisBucket::builder`].
///
/// # Examples
///
/// ```
/// use backpressure::{FailPolicy, Quota, RedisBucket};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// let bucket = RedisBucket::builder(
///     "redis://127.0.0.1:6379",
///     "quota:org-key",
///     Quota::per_second(NonZeroU32::new(50).unwrap()),
/// )
/// .lease(NonZeroU32::new(5).unwrap(), Duration::from_millis(100))
/// .timeout(Duration::from_millis(20))
/// .fail_policy(FailPolicy::FailOpen { share: 0.5 })
/// .build()
/// .unwrap(); // connects lazily: no Redis needed here
/// assert_eq!(bucket.key(), "quota:org-key");
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build()`"]
pub struct RedisBucketBuilder {
    url: String,
    key: String,
    quota: Quota,
    lease: Option<(NonZeroU32, Duration)>,
    timeout: Duration,
    probe_interval: Duration,
    policy: FailPolicy,
    clock: Option<Arc<dyn Clock>>,
}

impl RedisBucketBuilder {
    /// The longest [`timeout`](RedisBucketBuilder::timeout) accepted: 60 s.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::RedisBucketBuilder;
    /// use std::time::Duration;
    /// assert_eq!(RedisBucketBuilder::MAX_TIMEOUT, Duration::from_secs(60));
    /// ```
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

    /// Lease up to `size` cells per round trip (capped at the burst), kept
    /// for at most `ttl`. See the trade-off under *Leasing* on [`RedisBucket`].
    /// Off by default.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .lease(NonZeroU32::new(100).unwrap(), Duration::from_millis(50))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(b.lease_size(), 10); // capped at the burst
    /// ```
    pub fn lease(mut self, size: NonZeroU32, ttl: Duration) -> Self {
        self.lease = Some((size, ttl));
        self
    }

    /// The longest any Redis call may take (connecting included); default
    /// 50 ms. It must be in `(0, MAX_TIMEOUT]`
    /// ([`MAX_TIMEOUT`](RedisBucketBuilder::MAX_TIMEOUT) is 60 s):
    /// [`build`](RedisBucketBuilder::build) refuses zero (every call would
    /// fail) and anything longer (`Duration::MAX` would wait forever on a
    /// server that accepts and never answers).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket, RedisBucketBuilder};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let q = Quota::per_second(NonZeroU32::MIN);
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", q)
    ///     .timeout(Duration::from_millis(5))
    ///     .build();
    /// assert!(b.is_ok());
    /// for bad in [Duration::ZERO, RedisBucketBuilder::MAX_TIMEOUT + Duration::from_nanos(1)] {
    ///     let err = RedisBucket::builder("redis://127.0.0.1/", "k", q).timeout(bad).build();
    ///     assert!(err.unwrap_err().to_string().starts_with("invalid timeout"));
    /// }
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long decisions skip Redis after a failed call before trying it
    /// again; default 500 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .probe_interval(Duration::from_millis(100))
    ///     .build();
    /// assert!(b.is_ok());
    /// ```
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// What to do when Redis does not answer; default
    /// [`FailPolicy::FailClosed`] with a one-second `retry_after`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{FailPolicy, Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .fail_policy(FailPolicy::FailOpen { share: 2.0 })
    ///     .build();
    /// assert!(b.is_err()); // a share is in (0, 1]
    /// ```
    pub fn fail_policy(mut self, policy: FailPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Decide on `clock`'s time instead of Redis's `TIME`. Every process on
    /// the key must then share the clock, and the key no longer expires
    /// (its expiry would be in Redis's time). Meant for tests and
    /// simulations, with a [`ManualClock`](crate::ManualClock); the local
    /// deadlines and leases use the same clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .clock(ManualClock::new())
    ///     .build();
    /// assert!(b.is_ok());
    /// ```
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Checks the configuration and builds the bucket. It connects lazily,
    /// on the first decision: building never waits for Redis.
    ///
    /// # Errors
    ///
    /// An unparseable URL, a [`timeout`](RedisBucketBuilder::timeout)
    /// outside `(0, MAX_TIMEOUT]`, a fail-open share outside `(0, 1]`, or a
    /// quota whose tolerance (`burst * period`) exceeds 2^51 µs (71 years).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// assert!(RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build()
    ///     .is_ok());
    /// ```
    pub fn build(self) -> Result<RedisBucket, RedisBucketError> {
        let client = Client::open(self.url.as_str()).map_err(|e| RedisBucketError {
            message: format!("invalid redis url: {e}"),
            source: Some(e),
        })?;
        if self.timeout.is_zero() || self.timeout > Self::MAX_TIMEOUT {
            return Err(config_error(format!(
                "invalid timeout {:?}: it must be in (0, {:?}]",
                self.timeout,
                Self::MAX_TIMEOUT
            )));
        }
        let period_us = self.quota.period.div_ceil(1000);
        let burst = self.quota.burst.get();
        if period_us.saturating_mul(burst as u64) > MAX_MICROS {
            return Err(config_error(format!(
                "quota too long for a shared bucket: burst {burst} times {period_us} µs exceeds 2^51 µs"
            )));
        }
        let (clock, explicit_time): (Arc<dyn Clock>, bool) = match self.clock {
            Some(clock) => (clock, true),
            None => (Arc::new(DefaultClock::new()), false),
        };
        let policy = match self.policy {
            FailPolicy::FailOpen { share } => {
                if !(share > 0.0 && share <= 1.0) {
                    return Err(config_error(format!(
                        "invalid fail-open share {share}: it must be in (0, 1]"
                    )));
                }
                Policy::Open(TokenBucket::with_clock(
                    share_of(self.quota, share),
                    clock.clone(),
                ))
            }
            FailPolicy::FailClosed { retry_after } => Policy::Closed(retry_after),
        };
        Ok(RedisBucket {
            client,
            conn: OnceCell::new(),
            script: Script::new(script::SOURCE),
            key: self.key,
            quota: self.quota,
            params: Params { period_us, burst },
            lease: self.lease.map(|(size, ttl)| Lease {
                size: size.get().min(burst),
                ttl: saturating_nanos(ttl),
            }),
            timeout: self.timeout,
            probe_interval: saturating_nanos(self.probe_interval),
            policy,
            clock,
            explicit_time,
            state: ThreadMutex::new(State::default()),
        })
    }
}

/// `share` of `quota`'s rate and burst: a longer period, rounded up, and
/// at least one cell of burst.
fn share_of(quota: Quota, share: f64) -> Quota {
    let period = (quota.period as f64 / share).ceil();
    let period = if period >= u64::MAX as f64 {
        u64::MAX
    } else {
        period as u64
    };
    let burst = (quota.burst.get() as f64 * share).floor() as u32;
    Quota {
        period: period.max(quota.period),
        burst: NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN),
    }
}

#[derive(Clone, Copy, Debug)]
struct Lease {
    size: u32,
    /// Nanoseconds on the bucket's clock.
    ttl: u64,
}

#[derive(Debug)]
enum Policy {
    Open(TokenBucket<Arc<dyn Clock>>),
    Closed(Duration),
}

/// The local half, behind one short-held mutex.
#[derive(Debug, Default)]
struct State {
    /// Leased cells not handed out yet.
    leased: u32,
    /// When they expire, on the bucket's clock.
    lease_expires: u64,
    /// Cells to give back with the next round trip (expired, or over the
    /// lease size after two concurrent refills).
    give_back: u32,
    /// No Redis calls before this instant (after a failure).
    down_until: u64,
    stats: RedisStats,
}

/// Why a script call produced no decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failed {
    /// Redis did not decide: a connection error, the store timeout, an
    /// error or malformed reply, or a recent failure said not to try.
    /// Counted in `failures`; the failure policy answers.
    Store,
    /// The caller's budget, shorter than the store timeout, ran out before
    /// the reply. Counted in `out_of_budget`; the caller's own refusal,
    /// which says nothing about Redis.
    Budget,
}

/// A GCRA bucket held in Redis, shared by every process that uses the same
/// key (and quota).
///
/// Each process builds its own `RedisBucket` on the key; all of them must
/// use the same quota. The decision runs in Redis, atomically, in one
/// round trip, on Redis's clock (`TIME`, integer microseconds: see the
/// arithmetic in `src/redis/script.rs`); the key expires when the bucket
/// is full again.
///
/// # Shape of the API
///
/// A Redis decision is a network round trip, and so is a refund, so the
/// methods are `async` and [`reserve`](RedisBucket::reserve) returns a
/// [`RedisReservation`] whose [`cancel`](RedisReservation::cancel) is
/// `async` too. Method names and error types are those of
/// [`TokenBucket`]; both implement [`AsyncRateLimiter`], which callers
/// (and the admission layer) take to accept either.
///
/// # Leasing
///
/// With [`lease`](RedisBucketBuilder::lease), a decision that reaches Redis
/// takes up to `size` cells in the same round trip (only cells usable now,
/// and never more than fit), and later calls are admitted from them
/// locally, without a round trip, until they run out or the lease's `ttl`
/// passes. Unused cells go back to Redis with the next round trip after
/// the lease expires (or with [`release_lease`](RedisBucket::release_lease)).
///
/// The trade-off: fewer round trips against burstier fairness. Cells sit
/// in one process while another is refused, and a process may spend the
/// cells it holds after the window they were taken in. Over any window of
/// length `t`, the cells admitted across `P` processes stay within
/// `burst + t / period + P * size`; `size` is capped at the burst. A
/// [`penalize`](RedisBucket::penalize) from another process reaches this
/// one at its next round trip, so up to `size` leased cells may still be
/// spent under a penalty.
///
/// # Failure policy
///
/// Every Redis call has a timeout ([`timeout`](RedisBucketBuilder::timeout),
/// and never longer than a [`reserve`](RedisBucket::reserve) call's
/// `max_wait`). When Redis does not answer within the store timeout (or
/// the connection fails, or Redis answers with an error), the decision
/// follows the [`FailPolicy`]: fall back to a local bucket at a share of
/// the rate, or refuse with `Unavailable` (nothing consumed). A `max_wait`
/// too short for the round trip is that caller's refusal
/// (`RateLimited`), not a failure. After a connection error or a store
/// timeout, decisions skip Redis for
/// [`probe_interval`](RedisBucketBuilder::probe_interval)
/// (so a dead server costs no timeouts), then try again; the connection
/// (a `redis` crate `ConnectionManager`) reconnects on its own. Nothing
/// here panics or waits without a bound. A call that timed out may still
/// be applied by Redis later, and cells being given back with it are
/// dropped rather than sent twice: failures only ever lose cells, never
/// admit extra ones.
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
///     Ok(r) => tokio::time::sleep(r.wait()).await, // then call the API
///     Err(e) => eprintln!("{e}"),                  // surface it, don't sleep
/// }
/// # }
/// ```
pub struct RedisBucket {
    client: Client,
    conn: OnceCell<ConnectionManager>,
    script: Script,
    key: String,
    quota: Quota,
    params: Params,
    lease: Option<Lease>,
    timeout: Duration,
    /// Nanoseconds.
    probe_interval: u64,
    policy: Policy,
    /// Local time: deadlines, leases, the probe interval; and the decision
    /// time itself when `explicit_time`.
    clock: Arc<dyn Clock>,
    explicit_time: bool,
    state: ThreadMutex<State>,
}

impl RedisBucket {
    /// Starts configuring a bucket on `key` at `url` (`redis://host:port/db`)
    /// with `quota`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_second(NonZeroU32::new(5).unwrap());
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", q).build().unwrap();
    /// assert_eq!(b.quota(), q);
    /// ```
    pub fn builder(url: &str, key: impl Into<String>, quota: Quota) -> RedisBucketBuilder {
        RedisBucketBuilder {
            url: url.to_owned(),
            key: key.into(),
            quota,
            lease: None,
            timeout: Duration::from_millis(50),
            probe_interval: Duration::from_millis(500),
            policy: FailPolicy::FailClosed {
                retry_after: Duration::from_secs(1),
            },
            clock: None,
        }
    }

    /// The Redis key.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "rl:a", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// assert_eq!(b.key(), "rl:a");
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The quota (the shared one; Redis rounds its period up to whole
    /// microseconds).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_minute(NonZeroU32::new(600).unwrap());
    /// assert_eq!(RedisBucket::builder("redis://127.0.0.1/", "k", q).build().unwrap().quota(), q);
    /// ```
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Cells leased per round trip (0 without leasing).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// assert_eq!(b.lease_size(), 0);
    /// ```
    pub fn lease_size(&self) -> u32 {
        self.lease.map_or(0, |l| l.size)
    }

    /// The counters so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket, RedisStats};
    /// use std::num::NonZeroU32;
    /// let b = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// assert_eq!(b.stats(), RedisStats::default());
    /// ```
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
        match self.take(n, 0, None).await {
            // `max_wait` 0: a grant is usable now.
            Ok(_) => Ok(()),
            Err(Denial::Wait(wait)) => Err(CheckError::NotUntil { wait }),
            // Without a caller's budget, every failure is the store's.
            Err(Denial::Failed(_)) => match &self.policy {
                Policy::Open(fallback) => {
                    self.state.lock().stats.fallback += 1;
                    fallback.try_acquire(n)
                }
                Policy::Closed(retry_after) => Err(CheckError::Unavailable {
                    retry_after: *retry_after,
                }),
            },
        }
    }

    /// Takes `n` cells usable within `max_wait`, or nothing, in one round
    /// trip (or from the lease). `max_wait` is the caller's budget for the
    /// whole call: the round trip's timeout is at most `max_wait` (when it
    /// is not zero), and a wait that no longer fits once the reply is in
    /// is given back and refused, so sleeping the returned
    /// [`wait`](RedisReservation::wait) never passes the caller's deadline.
    ///
    /// # Errors
    ///
    /// As [`TokenBucket::reserve`], plus [`ReserveError::Unavailable`] when
    /// Redis does not answer within the store timeout and the policy is
    /// [`FailPolicy::FailClosed`]. When a `max_wait` shorter than the store
    /// timeout runs out before Redis answers, the caller could not afford
    /// the round trip: [`ReserveError::RateLimited`] with `retry_after` =
    /// `max_wait` (the earliest an answer could have come), counted in
    /// [`RedisStats::out_of_budget`]. That is this caller's refusal only:
    /// it neither takes the failure policy nor makes other calls skip
    /// Redis.
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
        if n == 0 {
            return Ok(RedisReservation::new(self, Duration::ZERO, Refund::Nothing));
        }
        self.check_capacity(n)
            .map_err(|capacity| ReserveError::InsufficientCapacity {
                requested: n,
                capacity,
            })?;
        if self.take_leased(n) {
            return Ok(RedisReservation::new(
                self,
                Duration::ZERO,
                Refund::Lease(n),
            ));
        }
        let start = self.clock.now_nanos();
        let budget = saturating_nanos(max_wait);
        // A zero budget still gets one store round trip (a cell usable now).
        let bound = (!max_wait.is_zero()).then_some(max_wait);
        let max_wait_us = (budget / 1000).min(MAX_MICROS);
        match self.take(n, max_wait_us, bound).await {
            Ok(taken) => {
                let wait = Duration::from_micros(taken.wait_us);
                let elapsed = self.clock.now_nanos().saturating_sub(start);
                if taken.wait_us > 0 && elapsed.saturating_add(saturating_nanos(wait)) > budget {
                    // The round trip ate the budget: the wait no longer
                    // fits. Give the cells back (best effort) and refuse.
                    self.unadmit(n);
                    self.remote_cancel(taken.before, taken.after, budget - elapsed.min(budget))
                        .await;
                    return Err(ReserveError::RateLimited { retry_after: wait });
                }
                let refund = if taken.granted > n {
                    Refund::Lease(n)
                } else {
                    Refund::Remote {
                        n,
                        before: taken.before,
                        after: taken.after,
                    }
                };
                Ok(RedisReservation::new(self, wait, refund))
            }
            Err(Denial::Wait(retry_after)) => Err(ReserveError::RateLimited { retry_after }),
            Err(Denial::Failed(Failed::Budget)) => Err(ReserveError::RateLimited {
                retry_after: max_wait,
            }),
            Err(Denial::Failed(Failed::Store)) => match &self.policy {
                Policy::Open(fallback) => {
                    self.state.lock().stats.fallback += 1;
                    let elapsed = self.clock.now_nanos().saturating_sub(start);
                    let left = Duration::from_nanos(budget.saturating_sub(elapsed));
                    fallback
                        .reserve(n, left)
                        .map(|r| RedisReservation::new(self, r.wait(), Refund::Local(r)))
                }
                Policy::Closed(retry_after) => Err(ReserveError::Unavailable {
                    retry_after: *retry_after,
                }),
            },
        }
    }

    /// The server said "not before `retry_after`" (a 429 or 503 with
    /// `Retry-After`): no process on the key is admitted before then. At
    /// that instant one cell fits, then one per period, as
    /// [`TokenBucket::penalize`]. This process's unused leased cells go
    /// back in the same round trip, and the fail-open fallback bucket is
    /// penalized too. If Redis does not answer, only this process holds
    /// back (through its fallback when failing open).
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
        if let Policy::Open(fallback) = &self.policy {
            fallback.penalize(retry_after);
        }
        let give = self.drain_lease(true);
        let retry = (saturating_nanos(retry_after) / 1000).min(MAX_MICROS);
        // A failure is already counted; there is nothing else to do.
        let _ = self.call(Op::Penalize { retry, give }, None).await;
    }

    /// How many cells [`try_acquire`](RedisBucket::try_acquire) would admit
    /// now, counting this process's leased cells. A peek, one round trip.
    /// When Redis does not answer: the fallback's count when failing open,
    /// 0 when failing closed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// println!("{} cells free", bucket.available().await);
    /// # }
    /// ```
    pub async fn available(&self) -> u32 {
        match self.call(Op::Available, None).await {
            Ok(reply) => {
                let remote = reply.first().copied().unwrap_or(0).max(0) as u64;
                let local = self.valid_leased() as u64;
                (remote + local).min(u32::MAX as u64) as u32
            }
            Err(_) => match &self.policy {
                Policy::Open(fallback) => fallback.available(),
                Policy::Closed(_) => 0,
            },
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
        let give = self.drain_lease(true);
        if give > 0 {
            let _ = self.call(Op::Give { give }, None).await;
        }
    }

    // -- internals ---------------------------------------------------------

    #[inline]
    fn check_capacity(&self, n: u32) -> Result<(), u32> {
        if n > self.params.burst {
            Err(self.params.burst)
        } else {
            Ok(())
        }
    }

    /// Takes `n` cells from a live lease.
    #[inline]
    fn take_leased(&self, n: u32) -> bool {
        if self.lease.is_none() {
            return false;
        }
        let now = self.clock.now_nanos();
        let mut state = self.state.lock();
        if state.leased >= n && now < state.lease_expires {
            state.leased -= n;
            state.stats.admitted += n as u64;
            state.stats.leased += n as u64;
            true
        } else {
            false
        }
    }

    /// Leased cells usable now.
    fn valid_leased(&self) -> u32 {
        let now = self.clock.now_nanos();
        let state = self.state.lock();
        if now < state.lease_expires {
            state.leased
        } else {
            0
        }
    }

    /// Empties the lease into the give-back count and returns that count
    /// (taken: the caller sends it). With `all == false`, a live lease is
    /// kept.
    fn drain_lease(&self, all: bool) -> u32 {
        let now = self.clock.now_nanos();
        let mut state = self.state.lock();
        if all || now >= state.lease_expires {
            state.give_back = state.give_back.saturating_add(state.leased);
            state.leased = 0;
        }
        core::mem::take(&mut state.give_back)
    }

    /// Uncounts `n` admitted cells the caller did not use.
    pub(crate) fn unadmit(&self, n: u32) {
        let mut state = self.state.lock();
        state.stats.admitted = state.stats.admitted.saturating_sub(n as u64);
    }

    /// Puts `n` cells of a cancelled leased reservation back.
    pub(crate) fn unlease(&self, n: u32) {
        let now = self.clock.now_nanos();
        let mut state = self.state.lock();
        state.stats.admitted = state.stats.admitted.saturating_sub(n as u64);
        state.stats.leased = state.stats.leased.saturating_sub(n as u64);
        if now < state.lease_expires {
            state.leased += n;
        } else {
            state.give_back = state.give_back.saturating_add(n);
        }
    }

    /// One take in Redis: gives back whatever the lease no longer uses,
    /// takes `n` (plus a lease's worth when usable now). `bound` is the
    /// caller's budget for the round trip (see [`call`](Self::call)).
    async fn take(
        &self,
        n: u32,
        max_wait_us: u64,
        bound: Option<Duration>,
    ) -> Result<Taken, Denial> {
        // A lease that could not cover `n` is given back whole, live or not.
        let give = self.drain_lease(true);
        let extra = self.lease.map_or(0, |l| l.size.saturating_sub(n));
        let op = Op::Take {
            n,
            max_wait: max_wait_us,
            extra,
            give,
        };
        // On failure the give-back is dropped: it may have been applied,
        // and returning it twice would over-admit. Lost cells are the safe
        // side.
        let reply = self.call(op, bound).await.map_err(Denial::Failed)?;
        let [granted, wait, before, after] = match reply[..] {
            [g, w, b, a] if g >= 0 && w >= 0 && b >= 0 && a >= 0 => [g, w, b, a].map(|v| v as u64),
            _ => return Err(self.malformed()),
        };
        // The script refuses only a wait longer than `max_wait` (>= 0), so
        // a refusal with no wait, or a grant short of `n`, is not its
        // answer: a store error, never a zero-wait denial to spin on.
        if granted == 0 && wait == 0 || granted != 0 && granted < n as u64 {
            return Err(self.malformed());
        }
        if granted == 0 {
            return Err(Denial::Wait(Duration::from_micros(wait)));
        }
        let granted = granted.min(u32::MAX as u64) as u32;
        let mut state = self.state.lock();
        state.stats.admitted += n as u64;
        if let (Some(lease), true) = (self.lease, granted > n) {
            let extra = granted - n;
            let now = self.clock.now_nanos();
            let keep = extra.min(lease.size.saturating_sub(state.leased));
            state.leased += keep;
            state.give_back = state.give_back.saturating_add(extra - keep);
            state.lease_expires = now.saturating_add(lease.ttl);
        }
        Ok(Taken {
            granted,
            wait_us: wait,
            before,
            after,
        })
    }

    /// A reply the script cannot have sent: counted as a failure (Redis
    /// answered, so later calls still try it).
    #[cold]
    fn malformed(&self) -> Denial {
        self.state.lock().stats.failures += 1;
        Denial::Failed(Failed::Store)
    }

    /// Undoes a remote take, best effort, within `budget` nanoseconds.
    pub(crate) async fn remote_cancel(&self, before: u64, after: u64, budget: u64) -> bool {
        if budget == 0 {
            return false;
        }
        matches!(
            self.call(Op::Cancel { before, after }, Some(Duration::from_nanos(budget))).await,
            Ok(reply) if reply.first() == Some(&1)
        )
    }

    /// Sends `op` to Redis within the store timeout, or within `bound` (the
    /// caller's budget) when that is shorter, unless a recent failure says
    /// not to try yet. Counts round trips, failures and calls out of
    /// budget.
    ///
    /// Only a connection error or the store timeout makes later calls skip
    /// Redis (for the probe interval). Running out of a shorter `bound` is
    /// [`Failed::Budget`]: a caller that could not wait for the round
    /// trip learns nothing about Redis's health, and must not fail the
    /// callers after it. An error reply means Redis is up: a failure for
    /// this call only.
    async fn call(&self, op: Op, bound: Option<Duration>) -> Result<Vec<i64>, Failed> {
        let now = self.clock.now_nanos();
        {
            let mut state = self.state.lock();
            if now < state.down_until {
                state.stats.failures += 1;
                return Err(Failed::Store);
            }
        }
        // The connection and its timer need a tokio runtime; without one,
        // this is a failure, not a panic.
        if tokio::runtime::Handle::try_current().is_err() {
            self.failed(now);
            return Err(Failed::Store);
        }
        let (limit, caller_bound) = match bound {
            Some(b) if b < self.timeout => (b, true),
            _ => (self.timeout, false),
        };
        let now_us = self.explicit_time.then_some(now / 1000);
        let mut trips = 0;
        let result = tokio::time::timeout(limit, async {
            let conn = self
                .conn
                .get_or_try_init(|| {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(self.timeout))
                        .set_number_of_retries(2)
                        .set_max_delay(Duration::from_nanos(self.probe_interval));
                    ConnectionManager::new_with_config(self.client.clone(), config)
                })
                .await?;
            let (reply, n) = script::run(
                &mut conn.clone(),
                &self.script,
                &self.key,
                self.params,
                now_us,
                op,
            )
            .await;
            trips = n;
            reply
        })
        .await;
        let mut state = self.state.lock();
        state.stats.round_trips += trips;
        match result {
            Ok(Ok(reply)) => Ok(reply),
            Err(_elapsed) if caller_bound => {
                state.stats.out_of_budget += 1;
                Err(Failed::Budget)
            }
            Ok(Err(e)) if is_reply(&e) => {
                state.stats.failures += 1;
                Err(Failed::Store)
            }
            _ => {
                drop(state);
                self.failed(self.clock.now_nanos());
                Err(Failed::Store)
            }
        }
    }

    /// A connection error or a store timeout: skip Redis for the probe
    /// interval.
    #[cold]
    fn failed(&self, now: u64) {
        let mut state = self.state.lock();
        state.stats.failures += 1;
        state.down_until = now.saturating_add(self.probe_interval);
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
    Failed(Failed),
}

/// Whether `e` is Redis's answer (an error reply: a script error,
/// `WRONGTYPE`, `BUSY`, `LOADING`, ...) rather than a transport failure:
/// Redis is up and answers at once, so there is no timeout to avoid.
fn is_reply(e: &::redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ::redis::ErrorKind::Server(_)
            | ::redis::ErrorKind::Extension
            | ::redis::ErrorKind::UnexpectedReturnType
    )
}

impl fmt::Debug for RedisBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBucket")
            .field("key", &self.key)
            .field("quota", &self.quota)
            .field("lease", &self.lease)
            .field("timeout", &self.timeout)
            .field("policy", &self.policy)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl AsyncRateLimiter for RedisBucket {
    type Reservation<'a> = RedisReservation<'a>;

    fn try_acquire(
        &self,
        n: u32,
    ) -> impl core::future::Future<Output = Result<(), CheckError>> + Send {
        RedisBucket::try_acquire(self, n)
    }

    fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> impl core::future::Future<Output = Result<RedisReservation<'_>, ReserveError>> + Send {
        RedisBucket::reserve(self, n, max_wait)
    }

    fn penalize(&self, retry_after: Duration) -> impl core::future::Future<Output = ()> + Send {
        RedisBucket::penalize(self, retry_after)
    }

    fn available(&self) -> impl core::future::Future<Output = u32> + Send {
        RedisBucket::available(self)
    }
}
