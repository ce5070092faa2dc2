//! Configuring a `RedisBucket`: the builder, the checks `build` makes, and
//! the failure policy it takes.

use core::fmt;
use core::num::NonZeroU32;
use core::time::Duration;

use ::redis::Client;

use super::breaker::Policy;
use super::connection::{cluster_client, Connection, Link, Target};
use super::lease::Lease;
use super::script::{Params, MAX_MICROS};
use super::{RedisBucket, State};
use crate::bucket::{Quota, TokenBucket};
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::sync::{Arc, ThreadMutex};

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
    /// Refuse: [`CheckError::Unavailable`](crate::CheckError::Unavailable) /
    /// [`ReserveError::Unavailable`](crate::ReserveError::Unavailable)
    /// with this `retry_after`, consuming nothing.
    FailClosed {
        /// What to tell callers.
        retry_after: Duration,
    },
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

/// An error with no cause: a bad setting, or Redis not doing what was asked.
pub(super) fn config_error(message: impl Into<String>) -> RedisBucketError {
    RedisBucketError {
        message: message.into(),
        source: None,
    }
}

/// The quota as the script sees it, or why it cannot be shared.
pub(super) fn params_of(quota: Quota) -> Result<Params, RedisBucketError> {
    let period_us = quota.period.div_ceil(1000);
    let burst = quota.burst.get();
    if period_us.saturating_mul(burst as u64) > MAX_MICROS {
        return Err(config_error(format!(
            "quota too long for a shared bucket: burst {burst} times {period_us} µs exceeds 2^51 µs"
        )));
    }
    Ok(Params { period_us, burst })
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
    common: Common,
    key: String,
    quota: Quota,
}

/// The clock a fleet shares ([`RedisBucketBuilder::wall_clock`]):
/// nanoseconds since the UNIX epoch.
#[derive(Debug)]
pub(super) struct WallClock;

impl Clock for WallClock {
    fn now_nanos(&self) -> u64 {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.map_or(0, saturating_nanos)
    }
}

/// What a [`RedisBucketBuilder`] and a
/// [`RedisScopedBuilder`](super::RedisScopedBuilder) share.
#[derive(Debug)]
pub(super) struct Common {
    pub(super) urls: Vec<String>,
    pub(super) cluster: bool,
    pub(super) lease: Option<(NonZeroU32, Duration)>,
    pub(super) timeout: Duration,
    pub(super) probe_interval: Duration,
    pub(super) policy: FailPolicy,
    pub(super) clock: Option<Arc<dyn Clock>>,
}

impl Common {
    /// `url`: one URL (a single node), or several separated by commas (the
    /// seed nodes of a cluster).
    pub(super) fn new(url: &str) -> Self {
        let urls: Vec<String> = url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        Common {
            cluster: urls.len() > 1,
            urls,
            lease: None,
            timeout: Duration::from_millis(50),
            probe_interval: Duration::from_millis(500),
            policy: FailPolicy::FailClosed {
                retry_after: Duration::from_secs(1),
            },
            clock: None,
        }
    }

    /// Checks everything but the quota and makes the shared connection
    /// and clock.
    pub(super) fn link(&self) -> Result<(Arc<Link>, Arc<dyn Clock>), RedisBucketError> {
        let invalid = |e: ::redis::RedisError| RedisBucketError {
            message: format!("invalid redis url: {e}"),
            source: Some(e),
        };
        if self.urls.is_empty() {
            return Err(config_error("invalid redis url: none given"));
        }
        if self.timeout.is_zero() || self.timeout > RedisBucketBuilder::MAX_TIMEOUT {
            return Err(config_error(format!(
                "invalid timeout {:?}: it must be in (0, {:?}]",
                self.timeout,
                RedisBucketBuilder::MAX_TIMEOUT
            )));
        }
        if let FailPolicy::FailOpen { share } = self.policy
            && !(share > 0.0 && share <= 1.0)
        {
            return Err(config_error(format!(
                "invalid fail-open share {share}: it must be in (0, 1]"
            )));
        }
        let target = if self.cluster {
            // Checks each URL as the single-node client would.
            for url in &self.urls {
                Client::open(url.as_str()).map_err(invalid)?;
            }
            Target::Cluster(Box::new(
                cluster_client(&self.urls, self.timeout).map_err(invalid)?,
            ))
        } else {
            Target::Single(Client::open(self.urls[0].as_str()).map_err(invalid)?)
        };
        let (clock, explicit_time): (Arc<dyn Clock>, bool) = match &self.clock {
            Some(clock) => {
                // Before 2001: a monotonic or manual clock, whose origin no
                // other process shares.
                #[cfg(feature = "tracing")]
                if clock.now_nanos() < 1_000_000_000_000_000_000 {
                    tracing::warn!(
                        "backpressure: a Redis quota decides on a clock that is no wall clock; \
                         fine within one process, wrong for a fleet: use `wall_clock()`"
                    );
                }
                (clock.clone(), true)
            }
            None => (Arc::new(DefaultClock::new()), false),
        };
        let link = Link::new(target, self.timeout, self.probe_interval, explicit_time);
        Ok((Arc::new(link), clock))
    }

    /// A bucket on `key` over `link`.
    pub(super) fn bucket(
        &self,
        link: Arc<Link>,
        clock: Arc<dyn Clock>,
        key: String,
        quota: Quota,
    ) -> Result<RedisBucket, RedisBucketError> {
        let params = params_of(quota)?;
        let policy = match self.policy {
            FailPolicy::FailOpen { share } => Policy::Open {
                bucket: Box::new(TokenBucket::with_clock(
                    share_of(quota, share),
                    clock.clone(),
                )),
                share,
            },
            FailPolicy::FailClosed { retry_after } => Policy::Closed(retry_after),
        };
        let key = if link.is_cluster() {
            hash_tagged(key)
        } else {
            key
        };
        Ok(RedisBucket {
            conn: Connection { link, key },
            lease: self.lease.map(|(size, ttl)| Lease {
                size: size.get().min(params.burst),
                ttl: saturating_nanos(ttl),
            }),
            policy,
            clock,
            state: ThreadMutex::new(State::new(
                quota,
                params,
                saturating_nanos(self.probe_interval),
            )),
        })
    }
}

/// `key` as a cluster key: unchanged when it has a hash tag (a non-empty
/// `{...}`), else wrapped whole in one, so one quota hashes to one slot.
pub(super) fn hash_tagged(key: String) -> String {
    if let Some(open) = key.find('{')
        && let Some(close) = key[open + 1..].find('}')
        && close > 0
    {
        return key;
    }
    format!("{{{key}}}")
}

impl RedisBucketBuilder {
    /// The longest [`timeout`](RedisBucketBuilder::timeout) accepted: 60 s.
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
        self.common.lease = Some((size, ttl));
        self
    }

    /// The longest any Redis call may take (connecting included); default
    /// 50 ms. [`build`](RedisBucketBuilder::build) refuses zero and anything
    /// above [`MAX_TIMEOUT`](RedisBucketBuilder::MAX_TIMEOUT) (60 s).
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
        self.common.timeout = timeout;
        self
    }

    /// How long decisions skip Redis after a failed call before trying it
    /// again; default 500 ms.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.common.probe_interval = interval;
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
        self.common.policy = policy;
        self
    }

    /// Decide on `clock`'s time instead of Redis's `TIME` (tests and
    /// simulations, with a [`ManualClock`](crate::ManualClock)). Every
    /// process on the key must share the clock; the key expires an hour
    /// (Redis time) later than it would on Redis's own clock; local
    /// deadlines and leases use it too, so a `reserve`'s `max_wait` no
    /// longer bounds the round trip: only the [`timeout`](Self::timeout)
    /// does.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.common.clock = Some(Arc::new(clock));
        self
    }

    /// Decide on this process's wall clock (`SystemTime`) instead of
    /// Redis's `TIME`: for stores whose scripts may not call `TIME`
    /// (ElastiCache Serverless). Every process on the key must use it and
    /// keep its clock in sync (NTP): a process whose clock runs `s` ahead
    /// of the others takes its cells up to `s` early (the key admits at
    /// most `s` times the rate more, once), one `s` behind waits `s`
    /// longer. A monotonic clock ([`clock`](Self::clock) with the default
    /// one) starts at a different origin in every process: never share a
    /// key on one.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", q).wall_clock().build();
    /// assert!(bucket.is_ok());
    /// ```
    pub fn wall_clock(self) -> Self {
        self.clock(WallClock)
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
        let (link, clock) = self.common.link()?;
        self.common.bucket(link, clock, self.key, self.quota)
    }

    /// Treat the URL as a seed node of a Redis Cluster even when it is the
    /// only one given (several comma-separated URLs always mean a
    /// cluster). On a cluster the key is hash-tagged (wrapped in `{...}`
    /// unless it has a tag), so each quota lives in one slot.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisBucket};
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_second(NonZeroU32::MIN);
    /// let b = RedisBucket::builder("redis://127.0.0.1:7000/", "rl:a", q).cluster().build().unwrap();
    /// assert_eq!(b.key(), "{rl:a}");
    /// let b = RedisBucket::builder("redis://10.0.0.1:7000/,redis://10.0.0.2:7000/", "rl:{b}", q)
    ///     .build().unwrap();
    /// assert_eq!(b.key(), "rl:{b}");
    /// ```
    pub fn cluster(mut self) -> Self {
        self.common.cluster = true;
        self
    }
}

/// `share` of `quota`'s rate and burst: a longer period, rounded up, and
/// at least one cell of burst.
pub(super) fn share_of(quota: Quota, share: f64) -> Quota {
    // `as` saturates: a period past `u64` is `u64::MAX`.
    let period = (quota.period as f64 / share).ceil() as u64;
    let burst = (quota.burst.get() as f64 * share).floor() as u32;
    Quota {
        period: period.max(quota.period),
        burst: NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN),
    }
}

impl RedisBucket {
    /// Starts configuring a bucket on `key` at `url` (`redis://host:port/db`)
    /// with `quota`. Several URLs separated by commas are the seed nodes of
    /// a Redis Cluster (see [`cluster`](RedisBucketBuilder::cluster)).
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
            common: Common::new(url),
            key: key.into(),
            quota,
        }
    }
}
