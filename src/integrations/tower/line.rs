//! `Line`: the callers waiting for a rate limit's cells, counted, so each
//! sleeps until the next cell plus one period per caller ahead without
//! holding a cell (a GCRA can only give back the reservation on top, so a
//! waiter cancelled out of order would leave its cell taken). Advice for
//! the sleeps; the bucket decides.

use core::hash::Hash;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// The callers waiting on each key of one layer (`()` for one bucket).
pub(crate) struct Line<K> {
    waiting: Mutex<HashMap<K, usize>>,
}

impl<K> Default for Line<K> {
    fn default() -> Self {
        Line {
            waiting: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone> Line<K> {
    /// Joins the line of `key`: returns how many wait ahead, and the place
    /// that leaves the line when dropped.
    pub(crate) fn join(self: &Arc<Self>, key: &K) -> (usize, Place<K>) {
        let mut waiting = self.waiting.lock();
        let n = waiting.entry(key.clone()).or_insert(0);
        let ahead = *n;
        *n += 1;
        let place = Place {
            line: self.clone(),
            key: Some(key.clone()),
        };
        (ahead, place)
    }

    /// How many wait on `key` now.
    #[cfg(test)]
    fn len(&self, key: &K) -> usize {
        self.waiting.lock().get(key).copied().unwrap_or(0)
    }
}

/// A caller's place in a [`Line`]; dropping it leaves the line.
pub(crate) struct Place<K: Hash + Eq> {
    line: Arc<Line<K>>,
    key: Option<K>,
}

impl<K: Hash + Eq> Drop for Place<K> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let mut waiting = self.line.waiting.lock();
        if let Some(n) = waiting.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&key);
            }
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn places_count_the_callers_ahead_and_leave_on_drop() {
        let line = Arc::new(Line::<&str>::default());
        let (a, pa) = line.join(&"k");
        let (b, pb) = line.join(&"k");
        let (other, _po) = line.join(&"other");
        assert_eq!((a, b, other), (0, 1, 0));
        drop(pa);
        // The one behind stays counted; a newcomer is behind it.
        let (c, _pc) = line.join(&"k");
        assert_eq!(c, 1);
        drop(pb);
        assert_eq!(line.len(&"k"), 1);
    }

    #[test]
    fn an_empty_key_is_forgotten() {
        let line = Arc::new(Line::<u32>::default());
        let (_, p) = line.join(&7);
        drop(p);
        assert!(line.waiting.lock().is_empty());
    }
}
