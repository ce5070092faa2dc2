//! `SingleFlightBuilder`: shard count, TTL cache, clock.

use core::convert::Infallible;
use core::fmt;
use core::marker::PhantomData;
use core::time::Duration;

use super::shard::Shard;
use super::{CacheConfig, SingleFlight};
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::sync::{CachePadded, Mutex};

/// The builder's type parameters, without owning any `K`, `V` or `E`.
type Types<K, V, E> = fn() -> (K, V, E);

/// Configures a [`SingleFlight`]: shard count, TTL cache, clock.
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, SingleFlight};
/// use std::time::Duration;
///
/// let flights: SingleFlight<String, u32, std::io::Error, ManualClock> = SingleFlight::builder()
///     .shards(8)
///     .cache(Duration::from_secs(3), 1_000)
///     .clock(ManualClock::new())
///     .build();
/// assert!(flights.is_empty());
/// ```
pub struct SingleFlightBuilder<K, V, E = Infallible, C = DefaultClock> {
    shards: Option<usize>,
    cache: Option<(Duration, usize)>,
    /// The clock given, or how to make the default one (only if no other
    /// clock is chosen).
    clock: Result<C, fn() -> C>,
    _types: PhantomData<Types<K, V, E>>,
}

impl<K, V, E> SingleFlightBuilder<K, V, E, DefaultClock> {
    pub(super) fn new() -> Self {
        Self {
            shards: None,
            cache: None,
            clock: Err(DefaultClock::new),
            _types: PhantomData,
        }
    }
}

impl<K, V, E, C: Clock> SingleFlightBuilder<K, V, E, C> {
    /// The number of shards, rounded up to a power of two (at most 65,536).
    /// The default is four per available CPU.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Keeps each successful value for `ttl` after its work completes
    /// ([`Provenance::Cached`](super::Provenance::Cached)), at most
    /// `max_entries` (divided among the shards, rounded up; past that a
    /// shard's oldest is evicted). Errors are never cached. A zero `ttl` or
    /// `max_entries` disables the cache; huge ones saturate. Expired values
    /// are reclaimed by later inserts into the same shard, or by
    /// [`clear`](SingleFlight::clear).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Provenance;
    /// use backpressure::SingleFlight;
    /// use std::time::Duration;
    ///
    /// # futures::executor::block_on(async {
    /// let flights: SingleFlight<&str, u32> = SingleFlight::builder()
    ///     .cache(Duration::from_secs(3), 100)
    ///     .build();
    /// flights.run("k", || async { 1 }).await.unwrap();
    /// let (v, how) = flights.run("k", || async { 2 }).await.unwrap();
    /// assert_eq!((v, how), (1, Provenance::Cached));
    /// # });
    /// ```
    pub fn cache(mut self, ttl: Duration, max_entries: usize) -> Self {
        self.cache = Some((ttl, max_entries));
        self
    }

    /// The clock the TTL is measured on (a [`ManualClock`](crate::ManualClock)
    /// in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> SingleFlightBuilder<K, V, E, C2> {
        SingleFlightBuilder {
            shards: self.shards,
            cache: self.cache,
            clock: Ok(clock),
            _types: PhantomData,
        }
    }

    /// Builds the map.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::SingleFlight;
    /// let flights: SingleFlight<String, Vec<u8>> = SingleFlight::builder().build();
    /// assert!(flights.is_empty());
    /// ```
    pub fn build(self) -> SingleFlight<K, V, E, C> {
        let shards = self
            .shards
            .unwrap_or_else(default_shards)
            .clamp(1, 1 << 16)
            .next_power_of_two();
        let cache = match self.cache {
            Some((ttl, max)) if !ttl.is_zero() && max > 0 => Some(CacheConfig {
                ttl: saturating_nanos(ttl),
                per_shard: max.div_ceil(shards),
            }),
            _ => None,
        };
        SingleFlight {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(Shard::new())))
                .collect(),
            mask: shards - 1,
            hasher: ahash::RandomState::new(),
            cache,
            clock: self.clock.unwrap_or_else(|make| make()),
        }
    }
}

fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().saturating_mul(4))
}

impl<K, V, E, C: Clock> fmt::Debug for SingleFlightBuilder<K, V, E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlightBuilder")
            .field("shards", &self.shards)
            .field("cache", &self.cache)
            .field("clock", &self.clock.as_ref().ok())
            .finish()
    }
}
