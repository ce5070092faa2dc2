//! `Scoped`: one rate limiter per key, e.g. per `(tool, credential)`.
//!
//! # Layout
//!
//! A power-of-two number of `CachePadded` `RwLock` shards over `hashbrown`
//! tables of `key -> bucket`. The key is hashed once: bits 32.. pick the
//! shard and the table reuses the hash. An existing key takes only the read
//! lock. A bucket lives in its table slot until the key is `reserve`d; then
//! it moves behind an `Arc` once, under the write lock, so a
//! [`Reservation`] reaches the same bucket after a resize or eviction.
//!
//! # Bounded memory
//!
//! A full bucket is indistinguishable from a fresh one, so it is dropped
//! once full and idle for a grace period, tracked with a second-chance
//! `touched` bit: a shard's sweep, at most once per grace period, drops full
//! entries whose bit is clear and clears the rest. A shard is swept when an
//! insert finds it doubled since its last sweep, or a grace period passed.
//!
//! At most `max_keys` buckets live across all shards (one counter). A new
//! key at the cap sweeps every shard before it is refused (`TooManyKeys`):
//! never admitted unmetered, never by evicting a bucket with debt. Per-key
//! quotas are kept apart (never evicted) and capped the same way.

use core::borrow::Borrow;
use core::fmt;
use core::hash::Hash;
use core::time::Duration;

use hashbrown::HashTable;

mod quota;
mod stamps;
mod table;

use crate::bucket::gcra::Gcra;
use crate::bucket::{CheckError, Quota, Reservation, ReserveError};
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::sleep::Sleeper;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, CachePadded, Ordering, RwLock};

/// A shard is swept at the latest when it has this many entries.
const MIN_SWEEP: usize = 64;

/// The default key limit.
const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// How long a full bucket must stay idle before it may be dropped.
const DEFAULT_IDLE_GRACE: u64 = 1_000_000_000;

/// An insert sweeps its shard for time's sake at most this often (100 ms).
const MIN_SWEEP_INTERVAL: u64 = 100_000_000;

/// A sharded registry of token buckets, one per key, created on first use
/// with the key's quota (or the default), and dropped automatically once
/// idle and full again.
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, Quota, Scoped};
/// use std::num::NonZeroU32;
///
/// // 2 calls per second per (tool, credential).
/// let limits = Scoped::with_clock(
///     Quota::per_second(NonZeroU32::new(2).unwrap()),
///     ManualClock::new(),
/// );
/// let a = ("search", "key-a");
/// let b = ("search", "key-b");
/// assert!(limits.try_acquire(&a, 2).is_ok());
/// assert!(limits.try_acquire(&a, 1).is_err()); // key-a is spent
/// assert!(limits.try_acquire(&b, 1).is_ok()); // key-b is not
/// ```
pub struct Scoped<K, C: Clock = DefaultClock> {
    shards: Box<[CachePadded<RwLock<Shard<K>>>]>,
    mask: usize,
    hasher: ahash::RandomState,
    default_quota: Quota,
    max_keys: usize,
    /// Buckets across shards: at most `max_keys`.
    live_keys: AtomicUsize,
    /// When an insert at the cap last swept every shard.
    full_sweep_at: AtomicU64,
    /// Keys with a quota of their own, across shards: at most `max_keys`.
    custom_quotas: AtomicUsize,
    /// Nanoseconds a full bucket stays before it may be dropped.
    idle_grace: u64,
    clock: C,
}

struct Shard<K> {
    buckets: HashTable<Entry<K>>,
    quotas: HashTable<(K, Quota)>,
    /// Sweep on the insert that finds this many entries.
    sweep_at: usize,
    /// When the last sweep cleared the `touched` bits.
    swept_at: u64,
    /// Past the epoch of every bucket this shard has dropped (mod 2³¹), so
    /// a kept refund never matches the key's next bucket.
    epoch_floor: u32,
}

/// One key's slot, one cache line.
#[repr(align(64))]
struct Entry<K> {
    key: K,
    bucket: Slot,
    /// The second-chance bit (see the module docs).
    touched: AtomicBool,
}

/// Where a key's bucket lives (see the module docs).
enum Slot {
    /// In the table slot: no reservation has been taken on the key.
    Inline(Gcra),
    /// Behind an `Arc` that reservations share.
    Shared(Arc<Gcra>),
}

impl Slot {
    #[inline]
    fn gcra(&self) -> &Gcra {
        match self {
            Slot::Inline(g) => g,
            Slot::Shared(g) => g,
        }
    }

    /// The shared bucket; `None` while it is inline.
    #[inline]
    fn shared(&self) -> Option<&Arc<Gcra>> {
        match self {
            Slot::Inline(_) => None,
            Slot::Shared(g) => Some(g),
        }
    }

    /// Moves an inline bucket behind an `Arc`; the write lock makes the copy
    /// exact.
    fn share(&mut self) -> &Arc<Gcra> {
        if let Slot::Inline(g) = self {
            *self = Slot::Shared(Arc::new(g.duplicate()));
        }
        match self {
            Slot::Shared(g) => g,
            Slot::Inline(_) => unreachable!("just shared"),
        }
    }
}

impl<K> Entry<K> {
    /// Marks the entry used; writes only if the bit is clear.
    #[inline]
    fn touch(&self) {
        // Relaxed (both): the bit orders no other memory; a missed touch only
        // drops a full bucket early.
        if !self.touched.load(Ordering::Relaxed) {
            self.touched.store(true, Ordering::Relaxed);
        }
    }
}

/// The key could not be tracked: the registry is at its key limit and none
/// of its keys is idle.
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, Quota, Scoped};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), ManualClock::new())
///     .with_max_keys(1);
/// // Penalized keys hold debt, so none can be evicted: new keys are refused
/// // once the limit is reached.
/// let err = (0..10_000u32)
///     .find_map(|k| limits.penalize(&k, Duration::from_secs(1)).err())
///     .unwrap();
/// assert_eq!(err.to_string(), "too many keys: the registry is full at 1 keys");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyKeys {
    /// The registry's key limit.
    pub limit: usize,
}

impl fmt::Display for TooManyKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "too many keys: the registry is full at {} keys",
            self.limit
        )
    }
}

impl std::error::Error for TooManyKeys {}

impl<K: Hash + Eq + Clone> Scoped<K, DefaultClock> {
    /// A registry on the default clock, every key starting with
    /// `default_quota`, at most 2²⁰ keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// let limits: Scoped<String> = Scoped::new(Quota::per_second(NonZeroU32::new(10).unwrap()));
    /// assert!(limits.try_acquire(&"tenant-1".to_string(), 1).is_ok());
    /// ```
    pub fn new(default_quota: Quota) -> Self {
        Self::with_clock(default_quota, DefaultClock::new())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Scoped<K, C> {
    /// A registry on `clock`, every key starting with `default_quota`, at
    /// most 2²⁰ keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), ManualClock::new());
    /// assert!(limits.try_acquire(&7u64, 1).is_ok());
    /// ```
    pub fn with_clock(default_quota: Quota, clock: C) -> Self {
        let shards = (std::thread::available_parallelism().map_or(1, usize::from) * 4)
            .next_power_of_two()
            .clamp(4, 256);
        Scoped {
            shards: (0..shards)
                .map(|_| {
                    CachePadded::new(RwLock::new(Shard {
                        buckets: HashTable::new(),
                        quotas: HashTable::new(),
                        sweep_at: MIN_SWEEP,
                        swept_at: 0,
                        epoch_floor: 0,
                    }))
                })
                .collect(),
            mask: shards - 1,
            hasher: ahash::RandomState::new(),
            default_quota,
            max_keys: DEFAULT_MAX_KEYS,
            live_keys: AtomicUsize::new(0),
            full_sweep_at: AtomicU64::new(0),
            custom_quotas: AtomicUsize::new(0),
            idle_grace: DEFAULT_IDLE_GRACE,
            clock,
        }
    }

    /// Sets how long a full bucket must stay idle before it may be dropped
    /// (1 s by default). Dropping a full bucket never changes a decision; the
    /// grace only keeps hot keys from being dropped and re-inserted. An idle
    /// key goes one to two grace periods after its last call (see
    /// [`sweep`](Scoped::sweep)).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), clock.clone())
    ///     .with_idle_grace(Duration::from_secs(10));
    /// limits.try_acquire(&"k", 1).unwrap();
    /// clock.advance(Duration::from_secs(10));
    /// assert_eq!(limits.sweep(), 0); // used in this grace period: kept
    /// clock.advance(Duration::from_secs(10));
    /// assert_eq!(limits.sweep(), 1); // idle for a whole one: dropped
    /// ```
    #[must_use]
    pub fn with_idle_grace(mut self, grace: Duration) -> Self {
        self.idle_grace = saturating_nanos(grace);
        self
    }

    /// Limits the number of keys tracked at once, and the number with a
    /// quota of their own ([`set_quota`](Scoped::set_quota)), to `max_keys`
    /// each. A new key is refused (`TooManyKeys`) only when a sweep of every
    /// shard finds none of the tracked keys idle.
    #[must_use]
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The key limit.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The quota a key gets unless [`set_quota`](Scoped::set_quota) said
    /// otherwise.
    pub fn default_quota(&self) -> Quota {
        self.default_quota
    }

    /// How many keys hold a bucket now (idle ones included until swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().buckets.len()).sum()
    }

    /// Whether no key holds a bucket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Admits `n` cells for `key` now, or says how long until they fit.
    ///
    /// # Errors
    ///
    /// As [`TokenBucket::try_acquire`](crate::TokenBucket::try_acquire), plus
    /// [`CheckError::TooManyKeys`] for a new key when the registry is full.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), ManualClock::new());
    /// assert!(limits.try_acquire(&"k", 1).is_ok());
    /// assert!(limits.try_acquire(&"k", 1).unwrap_err().wait().is_some());
    /// ```
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q, n: u32) -> Result<(), CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_bucket(key, |b, now| b.gcra().try_acquire(n, now))
            .unwrap_or_else(|e| Err(CheckError::TooManyKeys { limit: e.limit }))
    }

    /// Takes `n` cells for `key` if they are usable within `max_wait`, in
    /// one CAS, or nothing.
    ///
    /// # Errors
    ///
    /// As [`TokenBucket::reserve`](crate::TokenBucket::reserve), plus
    /// [`ReserveError::TooManyKeys`] for a new key when the registry is full.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), ManualClock::new());
    /// limits.try_acquire(&"k", 1).unwrap();
    /// let r = limits.reserve(&"k", 1, Duration::from_secs(1)).unwrap();
    /// assert_eq!(r.wait(), Duration::from_secs(1));
    /// assert!(r.cancel());
    /// ```
    #[inline]
    pub fn reserve<Q>(
        &self,
        key: &Q,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation<'static>, ReserveError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.reserve_at(key, n, max_wait, self.clock.now_nanos())
    }

    /// [`reserve`](Self::reserve) at `now`, read from this registry's clock.
    #[inline]
    pub(crate) fn reserve_at<Q>(
        &self,
        key: &Q,
        n: u32,
        max_wait: Duration,
        now: u64,
    ) -> Result<Reservation<'static>, ReserveError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let max_wait = saturating_nanos(max_wait);
        self.with_bucket_at(key, now, true, |b, now| {
            let b = b.shared().expect("a reservation's bucket is shared");
            b.reserve(n, max_wait, now)
                .map(|r| Reservation::shared(b.clone(), r, now))
        })
        .unwrap_or_else(|e| Err(ReserveError::TooManyKeys { limit: e.limit }))
    }

    /// Admits nothing for `key` before `now + retry_after` (a 429 on that
    /// credential). See [`TokenBucket::penalize`](crate::TokenBucket::penalize).
    ///
    /// # Errors
    ///
    /// [`TooManyKeys`] for a new key when the registry is full.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(5).unwrap()), ManualClock::new());
    /// limits.penalize(&"k", Duration::from_secs(10)).unwrap();
    /// assert_eq!(limits.available(&"k"), 0);
    /// assert_eq!(limits.available(&"other"), 5);
    /// ```
    pub fn penalize<Q>(&self, key: &Q, retry_after: Duration) -> Result<(), TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let d = saturating_nanos(retry_after);
        self.with_bucket(key, |b, now| b.gcra().penalize(d, now))
    }

    /// [`penalize`](Self::penalize) for `hold`, recording `told` (the
    /// server's longer ask, before a cap) as the hold's end for refusals.
    #[cfg(feature = "admission")]
    pub(crate) fn penalize_told<Q>(
        &self,
        key: &Q,
        hold: Duration,
        told: Duration,
    ) -> Result<(), TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (hold, told) = (saturating_nanos(hold), saturating_nanos(told));
        self.with_bucket(key, |b, now| b.gcra().penalize_told(hold, told, now))
    }

    /// Makes `key`'s bucket full and voids its outstanding reservations'
    /// refunds, as [`TokenBucket::reset`](crate::TokenBucket::reset) does.
    /// A key with no bucket is full already: nothing is created.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// let limits = Scoped::with_clock(Quota::per_second(NonZeroU32::new(2).unwrap()), ManualClock::new());
    /// limits.try_acquire(&"k", 2).unwrap();
    /// assert_eq!(limits.available(&"k"), 0);
    /// limits.reset(&"k");
    /// assert_eq!(limits.available(&"k"), 2);
    /// ```
    pub fn reset<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now_nanos();
        let shard = self.shard(hash).read();
        if let Some(e) = shard.buckets.find(hash, |e| is(&e.key, key)) {
            e.bucket.gcra().reset(now);
        }
    }

    /// When the latest server hold on `key` ends (0: none, or its bucket
    /// was evicted, which happens only once the hold is over).
    pub(crate) fn held_until<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash).read();
        shard
            .buckets
            .find(hash, |e| is(&e.key, key))
            .map_or(0, |e| e.bucket.gcra().held_until())
    }

    /// How many cells `try_acquire` would admit for `key` now, without
    /// consuming any (and without creating a bucket).
    pub fn available<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now_nanos();
        let shard = self.shard(hash).read();
        if let Some(e) = shard.buckets.find(hash, |e| is(&e.key, key)) {
            return e.bucket.gcra().available(now);
        }
        shard
            .quotas
            .find(hash, |(k, _)| is(k, key))
            .map_or(self.default_quota, |(_, q)| *q)
            .clamped()
            .burst()
            .get()
    }

    /// Waits until `n` cells for `key` are admitted, if that takes at most
    /// `max_wait`; see [`TokenBucket::until_ready`](crate::TokenBucket::until_ready).
    ///
    /// # Errors
    ///
    /// As [`reserve`](Scoped::reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{DefaultSleeper, Quota, Scoped};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let limits = Scoped::new(Quota::per_second(NonZeroU32::new(1000).unwrap()));
    /// futures::executor::block_on(async {
    ///     limits.until_ready(&"k", 1, Duration::from_secs(1), &DefaultSleeper::new()).await.unwrap();
    /// });
    /// ```
    pub async fn until_ready<Q, S: Sleeper>(
        &self,
        key: &Q,
        n: u32,
        max_wait: Duration,
        sleeper: &S,
    ) -> Result<(), ReserveError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        crate::bucket::wait_unless_held(
            &self.clock,
            max_wait,
            || self.held_until(key),
            |left| self.reserve(key, n, left),
            sleeper,
        )
        .await
    }

    /// Now, on the registry's clock.
    #[cfg(feature = "tower")]
    pub(crate) fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    #[inline]
    fn shard(&self, hash: u64) -> &RwLock<Shard<K>> {
        &self.shards[(hash >> 32) as usize & self.mask]
    }

    /// Runs `f` on `key`'s bucket, creating it if needed, at a time read
    /// once the bucket is found (so the clock read overlaps the probe).
    #[inline]
    fn with_bucket<Q, R>(&self, key: &Q, f: impl FnOnce(&Slot, u64) -> R) -> Result<R, TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.find_or_insert(key, || self.clock.now_nanos(), false, f)
    }

    /// As `with_bucket`, at `now`; with `shared`, the bucket is moved behind
    /// an `Arc` first if need be.
    #[inline]
    fn with_bucket_at<Q, R>(
        &self,
        key: &Q,
        now: u64,
        shared: bool,
        f: impl FnOnce(&Slot, u64) -> R,
    ) -> Result<R, TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.find_or_insert(key, || now, shared, f)
    }

    /// Both of the above: `now` is called once, after the probe (the clock is
    /// monotonic and no sweep runs under a read lock).
    #[inline(always)]
    fn find_or_insert<Q, R>(
        &self,
        key: &Q,
        now: impl FnOnce() -> u64,
        shared: bool,
        f: impl FnOnce(&Slot, u64) -> R,
    ) -> Result<R, TooManyKeys>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let guard = shard.read();
            if let Some(e) = guard.buckets.find(hash, |e| is(&e.key, key))
                && (!shared || e.bucket.shared().is_some())
            {
                e.touch();
                return Ok(f(&e.bucket, now()));
            }
        }
        self.insert(shard, hash, key, now(), shared, f)
    }
}

/// Whether `k` is the key `key` looks up (`K: Borrow<Q>`, as `HashMap::get`).
#[inline(always)]
fn is<K: Borrow<Q>, Q: Eq + ?Sized>(k: &K, key: &Q) -> bool {
    k.borrow() == key
}

impl<K, C: Clock> fmt::Debug for Scoped<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scoped")
            .field("shards", &self.shards.len())
            .field("default_quota", &self.default_quota)
            .field("max_keys", &self.max_keys)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
