//! `SingleFlight`: at most one execution per key at a time, every caller
//! gets the result; optionally, a short-TTL cache of completed reads.
//!
//! # Design
//!
//! Power-of-two mutex shards (each on its own cache line) map a key to a
//! *flight*, the `Arc`-shared state of one execution (`flight.rs`). The
//! first caller inserts a flight and **leads**: it runs its own future with
//! no lock held. Later callers **join**: they link a node inside their own
//! future into the flight's intrusive wait list and sleep until the outcome
//! is published.
//!
//! * The leader finishes: it writes the outcome, then under the lock
//!   detaches (or caches) the entry, publishes, and wakes followers after.
//! * The leader is dropped: the oldest follower is `PROMOTED` and runs its
//!   own future; with no follower the entry is removed.
//! * The leader panics: the entry is removed, followers get
//!   `LeaderPanicked`, and the panic resumes in the leader's task.
//!
//! No lock is held while user code runs, except `K::eq` during a lookup
//! and `V::clone` on a cache hit (saving two contended `Arc` writes), so
//! `V::clone` must be cheap and must not call into the same map. A
//! panicking `V::clone` leaves the shard unchanged.

mod builder;
mod flight;
mod outcome;
mod run;
mod shard;

use core::borrow::Borrow;
use core::convert::Infallible;
use core::fmt;
use core::future::Future;
use core::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc as StdArc;

use smallvec::SmallVec;

use crate::clock::{Clock, DefaultClock};
use crate::sync::{Arc, CachePadded, Mutex, MutexGuard, WAKE_BATCH};

use flight::{Flight, FAILED, OK, PANICKED, RUNNING};
use shard::Shard;

pub use builder::SingleFlightBuilder;
pub use outcome::{FlightError, Provenance};
use run::Run;

/// A shard alone on its cache line(s).
type PaddedShard<K, V, E> = CachePadded<Mutex<Shard<K, V, E>>>;

type WakeList = SmallVec<[core::task::Waker; WAKE_BATCH]>;

/// Runs each key's work at most once at a time and shares the result with
/// every caller that asks meanwhile; optionally caches results for a short
/// TTL.
///
/// `K` is the key, `V` the value handed to every caller (cloned, so make it
/// cheap: `Arc<T>`, `Bytes`), `E` the error of [`try_run`](Self::try_run)
/// (shared as `Arc<E>`), and `C` the clock of the cache's TTL.
///
/// # Only coalesce reads
///
/// Calls that share a key share one execution: right for reads, wrong for
/// writes (two writes coalesced are one write lost). Only route reads
/// through it.
///
/// # An unpolled leader
///
/// A leader polled once (so it owns the key) and then neither polled nor
/// dropped stalls its followers, as a slow request would. Nothing is timed
/// out behind your back: a timeout around the leader's call drops it,
/// which promotes a follower; one around a follower's call only gives up
/// that follower. The key is claimed on the first poll.
///
/// # Examples
///
/// ```
/// use backpressure::Provenance;
/// use backpressure::SingleFlight;
/// use std::sync::atomic::{AtomicUsize, Ordering};
///
/// # futures::executor::block_on(async {
/// let flights = SingleFlight::<&str, u64>::new();
/// let requests = AtomicUsize::new(0);
/// let search = || async {
///     requests.fetch_add(1, Ordering::Relaxed);
///     smol::future::yield_now().await; // the request is in flight
///     42
/// };
/// // Two identical reads in one fan-out: one request leaves.
/// let (a, b) = futures::join!(flights.run("refund", search), flights.run("refund", search));
/// assert_eq!(a.unwrap(), (42, Provenance::Leader));
/// assert_eq!(b.unwrap(), (42, Provenance::Joined));
/// assert_eq!(requests.load(Ordering::Relaxed), 1);
/// # });
/// ```
pub struct SingleFlight<K, V, E = Infallible, C: Clock = DefaultClock> {
    shards: Box<[PaddedShard<K, V, E>]>,
    /// `shards.len() - 1`; the length is a power of two.
    mask: usize,
    hasher: ahash::RandomState,
    cache: Option<CacheConfig>,
    clock: C,
}

#[derive(Clone, Copy, Debug)]
struct CacheConfig {
    ttl: u64,
    /// Cached entries allowed per shard.
    per_shard: usize,
}

impl<K, V, E> SingleFlight<K, V, E, DefaultClock> {
    /// A map with the default shard count and no cache.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::SingleFlight;
    /// let flights = SingleFlight::<String, u32>::new();
    /// assert!(flights.is_empty());
    /// ```
    pub fn new() -> Self {
        SingleFlightBuilder::new().build()
    }

    /// A [`SingleFlightBuilder`] for a shard count, a cache or a clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::SingleFlight;
    /// use std::time::Duration;
    /// let flights: SingleFlight<String, u32> = SingleFlight::builder()
    ///     .cache(Duration::from_secs(3), 10_000)
    ///     .build();
    /// # let _ = flights;
    /// ```
    pub fn builder() -> SingleFlightBuilder<K, V, E> {
        SingleFlightBuilder::new()
    }
}

impl<K, V, E> Default for SingleFlight<K, V, E, DefaultClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V, E, C> SingleFlight<K, V, E, C>
where
    K: Hash + Eq,
    V: Clone,
    C: Clock,
{
    /// Runs `make()` for `key` unless a call for `key` is already in flight
    /// (then waits for it) or its value is cached (then returns it).
    ///
    /// Resolves to the value and where it came from. It fails only with
    /// [`FlightError::LeaderPanicked`], or [`FlightError::Failed`] when it
    /// joined a failing [`try_run`](Self::try_run). `make` is called at most
    /// once, and only if this caller leads (at once, or after promotion).
    ///
    /// # Cancel safety
    ///
    /// Dropping a follower just leaves the flight. Dropping the leader drops
    /// its work and promotes the oldest follower, which runs its own `make()`.
    ///
    /// # Panics
    ///
    /// If the work (or `make`) panics, the panic propagates to this caller
    /// after the followers have been released with `LeaderPanicked`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Provenance;
    /// use backpressure::SingleFlight;
    ///
    /// # futures::executor::block_on(async {
    /// let flights = SingleFlight::<String, String>::new();
    /// let (body, how) = flights
    ///     .run("GET /tickets?q=refund".to_string(), || async { "[]".to_string() })
    ///     .await
    ///     .unwrap();
    /// assert_eq!((body.as_str(), how), ("[]", Provenance::Leader));
    /// # });
    /// ```
    pub fn run<F, Fut>(&self, key: K, make: F) -> Run<'_, K, V, E, C, F, Fut>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        Run::new(self, key, make, Ok)
    }

    /// Like [`run`](Self::run) for fallible work: an error is shared with
    /// every follower as `Arc<E>` (and never cached).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    ///
    /// # Errors
    ///
    /// [`FlightError::Failed`] with the work's error, or
    /// [`FlightError::LeaderPanicked`].
    ///
    /// # Panics
    ///
    /// As [`run`](Self::run).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::SingleFlight;
    /// use std::sync::Arc;
    ///
    /// # futures::executor::block_on(async {
    /// let flights = SingleFlight::<u32, String, std::io::Error>::new();
    /// let fail = || async {
    ///     smol::future::yield_now().await;
    ///     Err(std::io::Error::other("503"))
    /// };
    /// let (a, b) = futures::join!(flights.try_run(1, fail), flights.try_run(1, fail));
    /// let (a, b) = (a.unwrap_err(), b.unwrap_err());
    /// // One error, shared.
    /// assert!(Arc::ptr_eq(a.failed().unwrap(), b.failed().unwrap()));
    /// # });
    /// ```
    pub fn try_run<F, Fut>(&self, key: K, make: F) -> Run<'_, K, V, E, C, F, Fut>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        Run::new(self, key, make, core::convert::identity)
    }

    /// Detaches `key`: a call in flight keeps running for its followers, but
    /// later calls start afresh and its result is not cached. A cached value
    /// is dropped. Returns whether there was an entry.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::SingleFlight;
    /// use std::time::Duration;
    ///
    /// # futures::executor::block_on(async {
    /// let flights: SingleFlight<&str, u32> =
    ///     SingleFlight::builder().cache(Duration::from_secs(60), 10).build();
    /// flights.run("k", || async { 1 }).await.unwrap();
    /// assert!(flights.forget("k"));
    /// assert!(!flights.forget("k"));
    /// # });
    /// ```
    pub fn forget<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove(key, false)
    }

    /// Drops the cached value for `key`, if any. A call in flight keeps
    /// running for its followers, but its value (which may predate the
    /// invalidation) is not cached. Returns whether a value was dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Provenance;
    /// use backpressure::SingleFlight;
    /// use std::time::Duration;
    ///
    /// # futures::executor::block_on(async {
    /// let flights: SingleFlight<&str, u32> =
    ///     SingleFlight::builder().cache(Duration::from_secs(60), 10).build();
    /// flights.run("k", || async { 1 }).await.unwrap();
    /// assert!(flights.invalidate("k"));
    /// let (v, how) = flights.run("k", || async { 2 }).await.unwrap();
    /// assert_eq!((v, how), (2, Provenance::Leader));
    /// # });
    /// ```
    pub fn invalidate<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove(key, true)
    }

    fn remove<Q>(&self, key: &Q, cached_only: bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let removed = self.shard(hash).lock().remove_key(hash, key, cached_only);
        // Dropped here, after the lock.
        removed.is_some()
    }

    /// Drops every cached value at once. Calls in flight keep running, but
    /// their values are not cached (as with [`invalidate`](Self::invalidate)).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::SingleFlight;
    /// use std::time::Duration;
    ///
    /// # futures::executor::block_on(async {
    /// let flights: SingleFlight<u32, u32> =
    ///     SingleFlight::builder().cache(Duration::from_secs(60), 100).build();
    /// for k in 0..10 {
    ///     flights.run(k, || async move { k }).await.unwrap();
    /// }
    /// assert_eq!(flights.len(), 10);
    /// flights.clear();
    /// assert!(flights.is_empty());
    /// # });
    /// ```
    pub fn clear(&self) {
        let mut trash = Vec::new();
        for shard in self.shards.iter() {
            shard.lock().clear_cached(&mut trash);
            // Dropped outside the lock.
            trash.clear();
        }
    }
}

impl<K, V, E, C: Clock> SingleFlight<K, V, E, C> {
    /// The number of keys in flight or cached (expired cache entries count
    /// until they are reclaimed).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no key is in flight or cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Mutex<Shard<K, V, E>> {
        // hashbrown uses the low bits and the top seven, so take the middle.
        &self.shards[(hash >> 40) as usize & self.mask]
    }

    fn lock(&self, hash: u64) -> MutexGuard<'_, Shard<K, V, E>> {
        self.shard(hash).lock()
    }

    /// The leader finished with `result`: share it, cache it, wake everyone.
    fn complete(
        &self,
        flight: &Arc<Flight<V, E>>,
        hash: u64,
        result: Result<V, E>,
    ) -> Result<V, FlightError<E>>
    where
        V: Clone,
    {
        let result = result.map_err(StdArc::new);
        let state = if result.is_ok() { OK } else { FAILED };
        if let (Some(cache), Ok(value)) = (self.cache, &result) {
            // User code (the clock, `V::clone`) runs before the outcome is
            // written, so a panic there finds the cell empty; nothing from
            // the write to the publication may panic. The coarse clock is
            // read first, so a descheduled leader makes the coarse expiry
            // earlier, never later; less 1/1024 of the TTL for rate drift.
            // 0 (never live by the coarse check) if there is no coarse time
            // or the TTL is too short for it.
            let coarse = self.clock.coarse_bounds();
            let now = self.clock.now_nanos();
            let fresh_until = coarse.map_or(0, |(earliest, latest)| {
                let lag = latest.saturating_sub(earliest);
                if cache.ttl > lag.saturating_mul(4) {
                    earliest.saturating_add(cache.ttl - cache.ttl / 1024)
                } else {
                    0
                }
            });
            let copy = value.clone();
            // SAFETY: this leader is the only writer and the state is
            // `RUNNING`, so nobody reads the cell yet.
            unsafe { flight.write_outcome(Ok(copy)) };
            let mut trash = Vec::new();
            let mut guard = self.lock(hash);
            guard.cache_flight(
                hash,
                flight,
                now,
                (now.saturating_add(cache.ttl), fresh_until),
                cache.per_shard,
                &mut trash,
            );
            self.publish(guard, flight, hash, state);
            drop(trash);
            return result.map_err(FlightError::Failed);
        }
        let mut guard = self.lock(hash);
        let removed = guard.remove_flight(hash, flight);
        if !flight.has_waiters(&mut *guard) {
            // No follower, and none can come: the value is not cloned.
            drop(guard);
            drop(removed);
            return result.map_err(FlightError::Failed);
        }
        drop(guard);
        drop(removed);
        let copy = match &result {
            Ok(v) => Ok(v.clone()),
            Err(e) => Err(StdArc::clone(e)),
        };
        // SAFETY: as above; the followers still wait for `publish`.
        unsafe { flight.write_outcome(copy) };
        self.publish(self.lock(hash), flight, hash, state);
        result.map_err(FlightError::Failed)
    }

    /// The leader panicked (in its work, `make`, or cloning its value):
    /// free the key and release the followers with `LeaderPanicked`.
    #[cold]
    fn fail_panicked(&self, flight: &Arc<Flight<V, E>>, hash: u64) {
        let mut guard = self.lock(hash);
        // Relaxed would do (the state changes only under this lock).
        if flight.state() != RUNNING {
            // Published already; the panic came later.
            return;
        }
        let removed = guard.remove_flight(hash, flight);
        self.publish(guard, flight, hash, PANICKED);
        drop(removed);
    }

    /// Publishes `state` and wakes every follower in batches, never under
    /// the lock (see [`Waking`] for a panicking waker).
    fn publish<'s>(
        &'s self,
        mut guard: MutexGuard<'s, Shard<K, V, E>>,
        flight: &'s Flight<V, E>,
        hash: u64,
        state: usize,
    ) {
        let mut waking = Waking {
            map: self,
            flight,
            hash,
            wakers: WakeList::new(),
            more: false,
        };
        waking.more = flight.publish(state, &mut waking.wakers, &mut *guard);
        drop(guard);
        waking.wake_all();
    }

    /// The leader (or a promoted follower that never started) went away:
    /// promote the oldest follower, or remove the entry.
    fn resign(
        &self,
        mut guard: MutexGuard<'_, Shard<K, V, E>>,
        flight: &Arc<Flight<V, E>>,
        hash: u64,
    ) {
        debug_assert_eq!(flight.state(), RUNNING);
        match flight.promote_next(&mut *guard) {
            Some(waker) => {
                drop(guard);
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            None => {
                let removed = guard.remove_flight(hash, flight);
                drop(guard);
                drop(removed);
            }
        }
    }
}

/// The followers of a published flight still to be woken. If a waker
/// panics, `Drop` wakes the rest, catching their panics, and the first
/// panic then continues.
struct Waking<'s, K, V, E, C: Clock> {
    map: &'s SingleFlight<K, V, E, C>,
    flight: &'s Flight<V, E>,
    hash: u64,
    /// The current batch, oldest last (so `pop` wakes in FIFO order).
    wakers: WakeList,
    /// Whether followers remain in the flight's list.
    more: bool,
}

impl<K, V, E, C: Clock> Waking<'_, K, V, E, C> {
    /// Wakes every follower, oldest first; a panicking waker unwinds out and
    /// `Drop` finishes the job.
    fn wake_all(&mut self) {
        self.wakers.reverse();
        loop {
            while let Some(waker) = self.wakers.pop() {
                waker.wake();
            }
            if !self.refill() {
                return;
            }
        }
    }

    /// Re-takes the lock and collects the next batch, if any.
    fn refill(&mut self) -> bool {
        if !self.more {
            return false;
        }
        let mut guard = self.map.lock(self.hash);
        self.more = self.flight.drain(&mut self.wakers, &mut *guard);
        drop(guard);
        self.wakers.reverse();
        true
    }
}

impl<K, V, E, C: Clock> Drop for Waking<'_, K, V, E, C> {
    fn drop(&mut self) {
        // Empty unless a wake panicked.
        loop {
            while let Some(waker) = self.wakers.pop() {
                // A second panic's payload is dropped.
                let _ = panic::catch_unwind(AssertUnwindSafe(|| waker.wake()));
            }
            if !self.refill() {
                return;
            }
        }
    }
}

impl<K, V, E, C: Clock> fmt::Debug for SingleFlight<K, V, E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlight")
            .field("shards", &self.shards.len())
            .field("cache_ttl_nanos", &self.cache.map(|c| c.ttl))
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests;
