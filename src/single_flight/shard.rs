//! One shard: a hash table from key to in-flight or cached flight, and the
//! TTL cache's bookkeeping. Runs under the shard's lock, so it calls no
//! user code but `K::eq` and `V::clone`, and drops nothing: removed entries
//! are handed back for the caller to drop after unlocking.
//!
//! # Identity
//!
//! A flight is identified by its `Arc` pointer, not its key, so a leader
//! never removes a newer flight for the same key.
//!
//! # The cache
//!
//! A completed value is cached by turning its entry `InFlight` -> `Cached`
//! in place. Each cached entry has one [`Record`] in `records`, in expiry
//! order; expired entries are reclaimed from the front, a bounded number
//! per insertion. Records of removed entries go stale and are compacted
//! away when they outnumber the live ones.
//!
//! # Invalidation during a flight
//!
//! `invalidate`/`clear` of a key in flight clears [`Entry::cacheable`]: the
//! value goes to the flight's followers but is not cached.
//!
//! # No panics after publication
//!
//! [`Shard::cache_flight`] runs between the leader writing its value and
//! publishing it, so it must not panic (followers would be told
//! `LeaderPanicked`): its arithmetic saturates and its loops always end.

use std::collections::VecDeque;

use hashbrown::hash_table::{Entry as TableEntry, HashTable};

use super::flight::{Flight, OK};
use crate::sync::Arc;

/// Expired records examined per insertion.
const RECLAIM_BUDGET: usize = 16;

/// How many records (live and stale) a shard keeps before compacting;
/// saturating, so an unbounded `capacity` never compacts.
#[inline]
pub(super) const fn record_bound(capacity: usize) -> usize {
    capacity.saturating_mul(2).saturating_add(RECLAIM_BUDGET)
}

pub(super) struct Shard<K, V, E> {
    table: HashTable<Entry<K, V, E>>,
    /// One record per cached entry (plus stale ones), oldest first.
    records: VecDeque<Record>,
    /// Number of `Cached` entries in `table`.
    cached: usize,
    /// Stamps cached entries so a record can tell its entry from a later one.
    next_stamp: u64,
}

pub(super) struct Entry<K, V, E> {
    key: K,
    hash: u64,
    pub(super) slot: Slot<V, E>,
    /// Whether the flight may be cached when it completes: `false` once
    /// `invalidate`/`clear` reached it. Meaningless for `Cached` slots.
    cacheable: bool,
}

pub(super) enum Slot<V, E> {
    /// A leader runs it; callers join.
    InFlight(Arc<Flight<V, E>>),
    /// Completed with a value (state `OK`), served until `expires_at`.
    Cached {
        flight: Arc<Flight<V, E>>,
        expires_at: u64,
        /// The same expiry on the clock's coarse time base
        /// ([`Clock::coarse_bounds`](crate::Clock::coarse_bounds)), measured
        /// from the earliest the value can have been cached (0: none).
        fresh_until: u64,
        stamp: u64,
    },
}

impl<V: Clone, E> Slot<V, E> {
    /// A clone of the cached value if this slot holds one live by `expiry`.
    /// A `Cached` slot is always `OK`; checking anyway lets any other state
    /// be served like an expired one.
    #[inline]
    fn live_value(&self, expiry: Expiry) -> Option<V> {
        let Slot::Cached {
            flight,
            expires_at,
            fresh_until,
            ..
        } = self
        else {
            return None;
        };
        let live = match expiry {
            Expiry::Off => false,
            Expiry::Coarse(latest) => latest < *fresh_until,
            Expiry::Precise(now) => now < *expires_at,
        };
        if !live || flight.state() != OK {
            return None;
        }
        // `OK` was observed with Acquire and the cell is written once before.
        match flight.read_outcome() {
            Some(Ok(value)) => Some(value),
            _ => unreachable!("a flight in state `OK` holds `Ok`"),
        }
    }
}

#[derive(Clone, Copy)]
struct Record {
    hash: u64,
    stamp: u64,
    expires_at: u64,
}

/// How a lookup tells a live cached value from an expired one.
#[derive(Clone, Copy, Debug)]
pub(super) enum Expiry {
    /// No cache.
    Off,
    /// The latest the time can be now on the clock's coarse base: a value
    /// is live if its `fresh_until` is after it; otherwise it is checked
    /// again precisely ([`Lookup::Recheck`]).
    Coarse(u64),
    /// `now_nanos`: a value is live if its `expires_at` is after it.
    Precise(u64),
}

/// What a lookup by key found.
pub(super) enum Lookup<V, E> {
    /// A live cached value, cloned under the lock.
    Cached(V),
    /// A flight to join.
    InFlight(Arc<Flight<V, E>>),
    /// A cached value the coarse check could not call live: look again
    /// with [`Expiry::Precise`]. Nothing was changed.
    Recheck,
    /// Nothing: a new flight was inserted for the caller to lead (an
    /// expired cached entry it replaced is returned for dropping).
    Inserted(Arc<Flight<V, E>>, Option<Slot<V, E>>),
}

impl<K, V, E> Shard<K, V, E> {
    pub(super) fn new() -> Self {
        Self {
            table: HashTable::new(),
            records: VecDeque::new(),
            cached: 0,
            next_stamp: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// The hit path of [`Shard::lookup`] alone, small enough to inline.
    /// Returns the value, not a `Lookup`, to keep it in registers.
    #[inline]
    pub(super) fn live_value(&self, hash: u64, key: &K, expiry: Expiry) -> Option<V>
    where
        K: Eq,
        V: Clone,
    {
        self.table
            .find(hash, |e| e.key == *key)?
            .slot
            .live_value(expiry)
    }

    /// Finds `key`: a live cached value, an in-flight flight, or (after
    /// inserting a new flight) nothing.
    pub(super) fn lookup(&mut self, hash: u64, key: K, expiry: Expiry) -> (Lookup<V, E>, Option<K>)
    where
        K: Eq,
        V: Clone,
    {
        match self.table.entry(hash, |e| e.key == key, |e| e.hash) {
            TableEntry::Occupied(mut occ) => {
                if let Some(value) = occ.get().slot.live_value(expiry) {
                    return (Lookup::Cached(value), Some(key));
                }
                let slot = &mut occ.get_mut().slot;
                match slot {
                    Slot::InFlight(flight) => (Lookup::InFlight(Arc::clone(flight)), Some(key)),
                    Slot::Cached { .. } if matches!(expiry, Expiry::Coarse(_)) => {
                        (Lookup::Recheck, Some(key))
                    }
                    Slot::Cached { .. } => {
                        // Expired: lead a new flight in its place; its
                        // record goes stale.
                        let flight = Arc::new(Flight::new());
                        let old = core::mem::replace(slot, Slot::InFlight(Arc::clone(&flight)));
                        occ.get_mut().cacheable = true;
                        self.cached -= 1;
                        (Lookup::Inserted(flight, Some(old)), Some(key))
                    }
                }
            }
            TableEntry::Vacant(vacant) => {
                let flight = Arc::new(Flight::new());
                vacant.insert(Entry {
                    key,
                    hash,
                    slot: Slot::InFlight(Arc::clone(&flight)),
                    cacheable: true,
                });
                (Lookup::Inserted(flight, None), None)
            }
        }
    }

    /// Removes the entry of `flight` if it is still here, in flight or
    /// (after a panic cut a completion short) cached.
    pub(super) fn remove_flight(
        &mut self,
        hash: u64,
        flight: &Arc<Flight<V, E>>,
    ) -> Option<Entry<K, V, E>> {
        let occ = self
            .table
            .find_entry(hash, |e| match &e.slot {
                Slot::InFlight(f) | Slot::Cached { flight: f, .. } => Arc::ptr_eq(f, flight),
            })
            .ok()?;
        if matches!(occ.get().slot, Slot::Cached { .. }) {
            // Its record goes stale.
            self.cached = self.cached.saturating_sub(1);
        }
        Some(occ.remove().0)
    }

    /// Turns `flight`'s entry, if still in flight here and not invalidated,
    /// into a cached entry, keeping at most `capacity`; an invalidated entry
    /// is removed instead. Removed entries go to `trash`. Returns whether the
    /// value was cached. Never panics (see the module docs).
    pub(super) fn cache_flight(
        &mut self,
        hash: u64,
        flight: &Arc<Flight<V, E>>,
        now: u64,
        (expires_at, fresh_until): (u64, u64),
        capacity: usize,
        trash: &mut Vec<Entry<K, V, E>>,
    ) -> bool {
        self.reclaim(now, trash);
        let stamp = self.next_stamp;
        let Ok(mut occ) = self.table.find_entry(hash, |e| match &e.slot {
            Slot::InFlight(f) => Arc::ptr_eq(f, flight),
            Slot::Cached { .. } => false,
        }) else {
            // Forgotten (or replaced) while running.
            return false;
        };
        let entry = occ.get_mut();
        if !entry.cacheable {
            // Invalidated while running: the value may predate it.
            trash.push(occ.remove().0);
            return false;
        }
        let old = core::mem::replace(
            &mut entry.slot,
            Slot::Cached {
                flight: Arc::clone(flight),
                expires_at,
                fresh_until,
                stamp,
            },
        );
        // A second reference to `flight`: only decrements the count.
        drop(old);
        // Wrapping: a stamp is only compared with the few live records.
        self.next_stamp = self.next_stamp.wrapping_add(1);
        self.cached += 1;
        self.records.push_back(Record {
            hash,
            stamp,
            expires_at,
        });
        while self.cached > capacity {
            if !self.evict_oldest(trash) {
                break;
            }
        }
        if self.records.len() > record_bound(capacity) {
            self.compact();
        }
        true
    }

    /// Removes up to `RECLAIM_BUDGET` expired cached entries from the front.
    pub(super) fn reclaim(&mut self, now: u64, trash: &mut Vec<Entry<K, V, E>>) {
        for _ in 0..RECLAIM_BUDGET {
            match self.records.front() {
                Some(r) if r.expires_at <= now => {
                    let r = *r;
                    self.records.pop_front();
                    if let Some(e) = self.take_record(r) {
                        trash.push(e);
                    }
                }
                _ => return,
            }
        }
    }

    /// Removes the oldest live cached entry; `false` if none is cached.
    fn evict_oldest(&mut self, trash: &mut Vec<Entry<K, V, E>>) -> bool {
        while let Some(r) = self.records.pop_front() {
            if let Some(e) = self.take_record(r) {
                trash.push(e);
                return true;
            }
        }
        false
    }

    /// Removes the cached entry `r` stands for, if it is still there.
    fn take_record(&mut self, r: Record) -> Option<Entry<K, V, E>> {
        let occ = self
            .table
            .find_entry(
                r.hash,
                |e| matches!(e.slot, Slot::Cached { stamp, .. } if stamp == r.stamp),
            )
            .ok()?;
        // Saturating: `cache_flight` must not panic.
        self.cached = self.cached.saturating_sub(1);
        Some(occ.remove().0)
    }

    /// Drops the stale records.
    fn compact(&mut self) {
        let table = &self.table;
        self.records.retain(|r| {
            table
                .find(
                    r.hash,
                    |e| matches!(e.slot, Slot::Cached { stamp, .. } if stamp == r.stamp),
                )
                .is_some()
        });
    }

    /// Removes the entry for `key`, in flight or cached (`cached_only`
    /// restricts it to cached ones).
    pub(super) fn remove_key<Q>(
        &mut self,
        hash: u64,
        key: &Q,
        cached_only: bool,
    ) -> Option<Entry<K, V, E>>
    where
        K: core::borrow::Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let occ = self
            .table
            .find_entry(hash, |e| e.key.borrow() == key)
            .ok()?;
        match occ.get().slot {
            Slot::Cached { .. } => self.cached -= 1,
            Slot::InFlight(_) if cached_only => {
                // `invalidate`: the flight keeps running but is not cached.
                occ.into_mut().cacheable = false;
                return None;
            }
            Slot::InFlight(_) => {}
        }
        Some(occ.remove().0)
    }

    /// Moves every cached entry to `trash`; in-flight entries stay, but
    /// their values will not be cached.
    pub(super) fn clear_cached(&mut self, trash: &mut Vec<Entry<K, V, E>>) {
        trash.extend(self.table.extract_if(|e| match e.slot {
            Slot::Cached { .. } => true,
            Slot::InFlight(_) => {
                e.cacheable = false;
                false
            }
        }));
        self.records.clear();
        self.cached = 0;
    }

    #[cfg(all(test, not(feature = "loom")))]
    pub(super) fn cached(&self) -> usize {
        self.cached
    }

    #[cfg(all(test, not(feature = "loom")))]
    pub(super) fn records_len(&self) -> usize {
        self.records.len()
    }
}
