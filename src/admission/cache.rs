//! A per-thread cache in front of the registries `admit` reads on every
//! call (tools, credentials): the last few `(generation, name) -> Weak`
//! lookups. Correctness: every registry write stores the new map, then a
//! process-unique [`Generation`]; a hit means the registry was not written
//! since (or the write is not yet visible), exactly what a racing load
//! could return. Writes only add names or evict idle states, and `Weak`s
//! neither keep a state from eviction nor upgrade after it.

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::thread::LocalKey;

use crate::sync::{AtomicU64, Ordering};

/// Entries per thread and registry kind.
const WAYS: usize = 4;

/// The source of generations, each handed out once per process. A plain
/// `std` atomic: a counter, and a `static` (which loom's cannot be).
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

    pub(crate) fn bump(&self) {
        // Release: pairs with the Acquire in `current`; a reader that sees
        // the new generation sees the new map too.
        self.0.store(next(), Ordering::Release);
    }

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

/// `a == b`, inline for short names (a `memcmp` call costs more).
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

/// `name`'s state: from this thread's cache, or from `lookup`, whose
/// answer is cached when it comes with the interned name.
#[inline]
pub(crate) fn lookup<T: 'static, E>(
    cache: &'static LocalKey<RefCell<Cache<T>>>,
    generation: &Generation,
    name: &str,
    lookup: impl FnOnce() -> Result<(Arc<T>, Option<Arc<str>>), E>,
) -> Result<Arc<T>, E> {
    // Read before the lookup: an entry filled under a stale generation is
    // never hit.
    let generation = generation.current();
    // `try_with`/`try_borrow`: during teardown or re-entry, go direct.
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
