//! `RedisScoped`: one shared quota per key (tenant, API key, customer),
//! every key's bucket over one connection, built on first use and dropped
//! when idle.

use core::fmt;
use core::hash::Hash;
use core::time::Duration;
use std::collections::HashMap;

use super::builder::{params_of, Common, RedisBucketError};
use super::connection::Link;
use super::{FailPolicy, RedisBucket};
use crate::bucket::{CheckError, Quota};
use crate::clock::{saturating_nanos, Clock};
use crate::sync::{Arc, ThreadMutex};

/// Per-key shared quotas in Redis: each key (a tenant, an API key, a
/// customer) has its own GCRA key, `prefix + key`, shared by every process
/// that uses the same prefix; all of them go over one connection.
///
/// Each key gets the default quota, or its override
/// ([`quota_for`](RedisScopedBuilder::quota_for) at build time,
/// [`set_quota`](RedisScoped::set_quota) at run time, which also stores it
/// in Redis for every process to adopt within its own bounds: see *A
/// stored quota is advice* on [`RedisBucket`]). Leases, the store timeout
/// and the failure policy are configured once and apply per key.
///
/// # Memory
///
/// A key's bucket is made on first use. When an insert finds the map has
/// doubled since the last sweep, buckets idle for longer than
/// [`idle`](RedisScopedBuilder::idle) (default 60 s) and not held by a
/// caller are dropped (amortized O(1) per insert). The quota lives in
/// Redis, so nothing of it is lost; a dropped bucket's unused leased cells
/// and queued refunds count as used until the key refills. Overrides are
/// kept. In Redis each key expires when its bucket is full again (one
/// window and a minute later when it states a quota).
///
/// # Examples
///
/// ```no_run
/// use backpressure::{Quota, RedisScoped};
/// use std::num::NonZeroU32;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let tenants = RedisScoped::<String>::builder(
///     "redis://127.0.0.1:6379",
///     "quota:",
///     Quota::per_second(NonZeroU32::new(10).unwrap()),
/// )
/// .quota_for("big-customer".to_owned(), Quota::per_second(NonZeroU32::new(100).unwrap()))
/// .build()
/// .unwrap();
/// if tenants.try_acquire(&"acme".to_owned(), 1).await.is_ok() {
///     // serve acme's request
/// }
/// // The full API (reserve, until_ready, penalize, ...) is on the key's bucket.
/// let bucket = tenants.bucket(&"acme".to_owned());
/// let r = bucket.reserve(1, std::time::Duration::from_millis(100)).await;
/// # let _ = r;
/// # }
/// ```
pub struct RedisScoped<K> {
    common: Common,
    link: Arc<Link>,
    clock: Arc<dyn Clock>,
    prefix: String,
    default: Quota,
    overrides: ThreadMutex<HashMap<K, Quota>>,
    map: ThreadMutex<Map<K>>,
    idle: u64,
}

struct Map<K> {
    entries: HashMap<K, Entry>,
    /// Size after the last sweep: the next sweep runs at twice it.
    swept_at: usize,
}

struct Entry {
    bucket: Arc<RedisBucket>,
    last_used: u64,
}

/// Configures a [`RedisScoped`]; see [`RedisScoped::builder`].
///
/// # Examples
///
/// ```
/// use backpressure::{Quota, RedisScoped};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// let s = RedisScoped::<u64>::builder("redis://127.0.0.1/", "rl:", Quota::per_second(NonZeroU32::MIN))
///     .lease(NonZeroU32::new(4).unwrap(), Duration::from_millis(50))
///     .idle(Duration::from_secs(10))
///     .build()
///     .unwrap();
/// assert_eq!(s.len(), 0);
/// ```
#[must_use = "a builder does nothing until `build()`"]
pub struct RedisScopedBuilder<K> {
    common: Common,
    prefix: String,
    default: Quota,
    overrides: HashMap<K, Quota>,
    idle: Duration,
}

impl<K: Hash + Eq + Clone + fmt::Display + Send + Sync> RedisScoped<K> {
    /// Starts configuring per-key quotas under `prefix` at `url` (one URL,
    /// or several comma-separated cluster seeds), each key at `default`
    /// unless overridden.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisScoped};
    /// use std::num::NonZeroU32;
    /// let q = Quota::per_second(NonZeroU32::new(5).unwrap());
    /// let s = RedisScoped::<String>::builder("redis://127.0.0.1/", "rl:", q).build().unwrap();
    /// assert_eq!(s.quota(&"a".to_owned()), q);
    /// ```
    pub fn builder(url: &str, prefix: impl Into<String>, default: Quota) -> RedisScopedBuilder<K> {
        RedisScopedBuilder {
            common: Common::new(url),
            prefix: prefix.into(),
            default,
            overrides: HashMap::new(),
            idle: Duration::from_secs(60),
        }
    }

    /// The bucket of `key`, made on first use: the whole [`RedisBucket`]
    /// API (`reserve`, `until_ready`, `penalize`, `release_lease`,
    /// `stats`, ...) for that key. Holding the `Arc` keeps it from being
    /// dropped as idle.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisScoped};
    /// use std::num::NonZeroU32;
    /// let s = RedisScoped::<u32>::builder("redis://127.0.0.1/", "rl:", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// assert_eq!(s.bucket(&7).key(), "rl:7");
    /// ```
    pub fn bucket(&self, key: &K) -> Arc<RedisBucket> {
        let now = self.clock.now_nanos();
        let mut map = self.map.lock();
        if let Some(entry) = map.entries.get_mut(key) {
            entry.last_used = now;
            return entry.bucket.clone();
        }
        let quota = self.quota(key);
        let bucket = Arc::new(self.make(key, quota));
        map.entries.insert(
            key.clone(),
            Entry {
                bucket: bucket.clone(),
                last_used: now,
            },
        );
        if map.entries.len() >= map.swept_at.max(32) * 2 {
            let idle = self.idle;
            map.entries.retain(|_, e| {
                now.saturating_sub(e.last_used) < idle || Arc::strong_count(&e.bucket) > 1
            });
            map.swept_at = map.entries.len();
        }
        bucket
    }

    fn make(&self, key: &K, quota: Quota) -> RedisBucket {
        let quota = params_of(quota).map_or(self.default, |_| quota);
        self.common
            .bucket(
                self.link.clone(),
                self.clock.clone(),
                format!("{}{}", self.prefix, key),
                quota,
            )
            // Checked by `build`; an override that does not fit falls back above.
            .expect("a checked quota")
    }

    /// `key`'s quota as configured here: its override, or the default (a quota
    /// another process stored shows in its bucket's
    /// [`quota`](RedisBucket::quota) after a round trip).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisScoped};
    /// use std::num::NonZeroU32;
    /// let (d, big) = (Quota::per_second(NonZeroU32::MIN), Quota::per_second(NonZeroU32::new(9).unwrap()));
    /// let s = RedisScoped::builder("redis://127.0.0.1/", "rl:", d).quota_for(1u8, big).build().unwrap();
    /// assert_eq!((s.quota(&1), s.quota(&2)), (big, d));
    /// ```
    pub fn quota(&self, key: &K) -> Quota {
        self.overrides
            .lock()
            .get(key)
            .copied()
            .unwrap_or(self.default)
    }

    /// Admits `n` cells of `key`'s quota now, or says how long until they
    /// would fit: [`RedisBucket::try_acquire`] on `key`'s bucket.
    ///
    /// # Errors
    ///
    /// As [`RedisBucket::try_acquire`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisScoped};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let s = RedisScoped::<&str>::builder("redis://127.0.0.1/", "rl:", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// let _ = s.try_acquire(&"acme", 1).await;
    /// # }
    /// ```
    pub async fn try_acquire(&self, key: &K, n: u32) -> Result<(), CheckError> {
        self.bucket(key).try_acquire(n).await
    }

    /// A 429 for `key`: every process on it holds back for `retry_after`
    /// ([`RedisBucket::penalize`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisScoped};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let s = RedisScoped::<&str>::builder("redis://127.0.0.1/", "rl:", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// s.penalize(&"acme", Duration::from_secs(5)).await;
    /// # }
    /// ```
    pub async fn penalize(&self, key: &K, retry_after: Duration) {
        self.bucket(key).penalize(retry_after).await
    }

    /// Overrides `key`'s quota here and stores it with the key in Redis, so
    /// every process adopts it at its next round trip, within its own
    /// bounds ([`RedisBucket::set_quota`]: debt kept in cells, no burst
    /// opened; the key still expires).
    ///
    /// # Errors
    ///
    /// As [`RedisBucket::set_quota`]; the local override is kept either
    /// way, unless the quota is too long to share.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisScoped};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let s = RedisScoped::<&str>::builder("redis://127.0.0.1/", "rl:", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// s.set_quota(&"acme", Quota::per_second(NonZeroU32::new(50).unwrap())).await.unwrap();
    /// # }
    /// ```
    pub async fn set_quota(&self, key: &K, quota: Quota) -> Result<(), RedisBucketError> {
        params_of(quota)?;
        self.overrides.lock().insert(key.clone(), quota);
        self.bucket(key).set_quota(quota).await
    }

    /// Keys with a bucket in memory now.
    pub fn len(&self) -> usize {
        self.map.lock().entries.len()
    }

    /// Whether no key has a bucket in memory.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Hash + Eq + Clone + fmt::Display + Send + Sync> RedisScopedBuilder<K> {
    /// `key` gets `quota` instead of the default.
    pub fn quota_for(mut self, key: K, quota: Quota) -> Self {
        self.overrides.insert(key, quota);
        self
    }

    /// Each key's bucket leases up to `size` cells per round trip
    /// ([`RedisBucketBuilder::lease`](super::RedisBucketBuilder::lease)).
    pub fn lease(mut self, size: core::num::NonZeroU32, ttl: Duration) -> Self {
        self.common.lease = Some((size, ttl));
        self
    }

    /// The store timeout of every call
    /// ([`RedisBucketBuilder::timeout`](super::RedisBucketBuilder::timeout)).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisScoped};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// assert!(RedisScoped::<u8>::builder("redis://127.0.0.1/", "rl:", Quota::per_second(NonZeroU32::MIN))
    ///     .timeout(Duration::ZERO).build().is_err());
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.common.timeout = timeout;
        self
    }

    /// How long decisions skip Redis after a failed call
    /// ([`RedisBucketBuilder::probe_interval`](super::RedisBucketBuilder::probe_interval));
    /// each key's bucket has its own breaker.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.common.probe_interval = interval;
        self
    }

    /// What each key's bucket does when Redis does not answer; a fail-open
    /// share applies to each key's quota.
    pub fn fail_policy(mut self, policy: FailPolicy) -> Self {
        self.common.policy = policy;
        self
    }

    /// Decide on `clock`'s time instead of Redis's
    /// ([`RedisBucketBuilder::clock`](super::RedisBucketBuilder::clock));
    /// idleness is measured on it too.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.common.clock = Some(Arc::new(clock));
        self
    }

    /// Decide on this process's wall clock instead of Redis's `TIME`
    /// ([`RedisBucketBuilder::wall_clock`](super::RedisBucketBuilder::wall_clock)).
    pub fn wall_clock(self) -> Self {
        self.clock(super::builder::WallClock)
    }

    /// Treat the URL as a cluster seed
    /// ([`RedisBucketBuilder::cluster`](super::RedisBucketBuilder::cluster)).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisScoped};
    /// use std::num::NonZeroU32;
    /// let s = RedisScoped::<u8>::builder("redis://127.0.0.1:7000/", "rl:", Quota::per_second(NonZeroU32::MIN))
    ///     .cluster().build().unwrap();
    /// assert_eq!(s.bucket(&1).key(), "{rl:1}");
    /// ```
    pub fn cluster(mut self) -> Self {
        self.common.cluster = true;
        self
    }

    /// How long a key's bucket may sit unused before a sweep may drop it
    /// from memory; default 60 s.
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// Checks the configuration (as
    /// [`RedisBucketBuilder::build`](super::RedisBucketBuilder::build), for
    /// the default quota and every override) and builds. Connects lazily.
    ///
    /// # Errors
    ///
    /// As [`RedisBucketBuilder::build`](super::RedisBucketBuilder::build).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, RedisScoped};
    /// use std::num::NonZeroU32;
    /// assert!(RedisScoped::<u8>::builder("not a url", "rl:", Quota::per_second(NonZeroU32::MIN))
    ///     .build().is_err());
    /// ```
    pub fn build(self) -> Result<RedisScoped<K>, RedisBucketError> {
        let (link, clock) = self.common.link()?;
        params_of(self.default)?;
        for quota in self.overrides.values() {
            params_of(*quota)?;
        }
        Ok(RedisScoped {
            common: self.common,
            link,
            clock,
            prefix: self.prefix,
            default: self.default,
            overrides: ThreadMutex::new(self.overrides),
            map: ThreadMutex::new(Map {
                entries: HashMap::new(),
                swept_at: 0,
            }),
            idle: saturating_nanos(self.idle),
        })
    }
}

impl<K> fmt::Debug for RedisScoped<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisScoped")
            .field("prefix", &self.prefix)
            .field("default", &self.default)
            .field("keys", &self.map.lock().entries.len())
            .finish_non_exhaustive()
    }
}

impl<K> fmt::Debug for RedisScopedBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisScopedBuilder")
            .field("prefix", &self.prefix)
            .field("default", &self.default)
            .field("overrides", &self.overrides.len())
            .finish_non_exhaustive()
    }
}
