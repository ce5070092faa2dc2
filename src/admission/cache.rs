//! A per-thread cache in front of the two registries `admit` reads on
//! every call (tools, credentials). Each registry keeps its own
//! `thread_local!` of a [`Cache`]; this file knows neither.
//!
//! Both registries are copy-on-write maps behind an `ArcSwap`: a lookup
//! is a load (the hybrid strategy's debt slot: a few sequentially
//! consistent operations, and one more when the guard drops), a hash and a
//! compare. A thread that admits calls for the same few tools and
//! credentials does not need any of it: it remembers the last few
//! `(registry version, name) -> state` it looked up, and a hit costs a
//! load of the registry's version, a string compare and a
//! `Weak::upgrade` (the clone the ticket needs anyway).
//!
//! # Why a hit is as good as a registry load
//!
//! Every registry write (a new tool or credential, an eviction) stores
//! the new map and then a new [`Generation`]: a number unique across
//! every registry of the process, so an entry cached from one layer never
//! matches another's. A hit therefore means the registry was not written
//! since the entry was filled, or was written and its new generation is
//! not yet visible: exactly the snapshot a racing `ArcSwap` load could
//! return. A write never replaces a name's state with another in one step
//! (it adds names and evicts idle ones), so the state found is the one the
//! map holds or held. An evicted tool reached this way is as harmless as
//! one cloned from the map just before its eviction (see
//! `ToolState::is_idle`).
//!
//! The cache keeps `Weak`s, so it does not keep a tool from being evicted
//! (eviction reads the strong count), and a state evicted meanwhile fails
//! to upgrade: a miss.

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::thread::LocalKey;

use crate::sync::{AtomicU64, Ordering};

/// Entries per thread and registry kind: a thread alternating between a
/// few tools (or credentials) still hits.
const WAYS: usize = 4;

/// The source of generations: every value is handed out once per process.
/// A plain `std` atomic: a counter, not a synchronization protocol (and a
/// `static`, which loom's atomics cannot be).
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next() -> u64 {
    // Relaxed: only uniqueness matters, which the read-modify-write gives.
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A registry's version (see the module docs).
pub(crate) struct Generation(AtomicU64);

impl Generation {
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(next()))
    }

    /// Called by the registry's writer after it stored the new map.
    pub(crate) fn bump(&self) {
        // Release: pairs with the Acquire in `current`; a reader that sees
        // the new generation sees the new map too.
        self.0.store(next(), Ordering::Release);
    }

    /// The version now.
    #[inline]
    pub(crate) fn current(&self) -> u64 {
        // Acquire: pairs with the Release in `bump`.
        self.0.load(Ordering::Acquire)
    }
}

/// The last few states a thread looked up in registries of one kind.
pub(crate) struct Cache<T> {
    entries: [Option<Entry<T>>; WAYS],
    /// The way the next fill replaces (round robin).
    next: usize,
}

struct Entry<T> {
    generation: u64,
    name: Arc<str>,
    state: Weak<T>,
}

impl<T> Cache<T> {
    /// An empty cache, for a registry's `thread_local!`.
    pub(crate) const fn new() -> Self {
        Self {
            entries: [const { None }; WAYS],
            next: 0,
        }
    }

    fn get(&self, generation: u64, name: &str) -> Option<Arc<T>> {
        self.entries
            .iter()
            .flatten()
            .find(|e| e.generation == generation && same(&e.name, name))
            .and_then(|e| e.state.upgrade())
    }

    fn fill(&mut self, generation: u64, name: Arc<str>, state: &Arc<T>) {
        let entry = Entry {
            generation,
            name,
            state: Arc::downgrade(state),
        };
        // The same name again (a newer generation) takes its own way back.
        let way = self
            .entries
            .iter()
            .position(|e| e.as_ref().is_some_and(|e| *e.name == *entry.name))
            .unwrap_or_else(|| {
                let way = self.next;
                self.next = (way + 1) % WAYS;
                way
            });
        self.entries[way] = Some(entry);
    }
}

/// `a == b`, inline for the short names tools and credentials have (a
/// `memcmp` call costs more than the compare).
#[inline]
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    if a.len() > 16 {
        return a == b;
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// `name`'s state in the registry versioned by `generation`: from this
/// thread's cache, or from `lookup`, whose answer is cached when it comes
/// with the interned name (the registry holds the state).
#[inline]
pub(crate) fn lookup<T: 'static, E>(
    cache: &'static LocalKey<RefCell<Cache<T>>>,
    generation: &Generation,
    name: &str,
    lookup: impl FnOnce() -> Result<(Arc<T>, Option<Arc<str>>), E>,
) -> Result<Arc<T>, E> {
    // Read before the lookup: an entry filled under a generation the
    // registry has left behind is never hit.
    let generation = generation.current();
    // `try_with`/`try_borrow`: during the thread's teardown, or (never
    // expected) re-entered, the registry answers directly.
    let hit = cache
        .try_with(|c| c.try_borrow().ok().and_then(|c| c.get(generation, name)))
        .ok()
        .flatten();
    if let Some(state) = hit {
        return Ok(state);
    }
    miss(cache, generation, lookup)
}

#[cold]
fn miss<T: 'static, E>(
    cache: &'static LocalKey<RefCell<Cache<T>>>,
    generation: u64,
    lookup: impl FnOnce() -> Result<(Arc<T>, Option<Arc<str>>), E>,
) -> Result<Arc<T>, E> {
    let (state, interned) = lookup()?;
    if let Some(interned) = interned {
        let _ = cache.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                c.fill(generation, interned, &state);
            }
        });
    }
    Ok(state)
}
