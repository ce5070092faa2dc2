//! `Stagger`: the retry instants told to calls refused together.
//!
//! A bucket refusing six calls in the same millisecond knows the same next
//! slot for all six. Telling each of them that instant makes their callers
//! (a model planning its next turn, a harness sleeping `retry_after_ms`)
//! come back as one burst, which the bucket then refuses again. The honest
//! answer for the k-th call refused on a limit is when *its* turn would
//! come if the k - 1 before it take theirs: the next slot plus k - 1
//! periods of the limit (or, for a full queue, k - 1 drain steps).
//!
//! `Stagger` keeps, per limit, the latest instant it has told; a new
//! refusal is told `max(ready, last + period)`. Once that instant has
//! passed the limit starts afresh from its real next slot. Nothing is
//! reserved: a promise is advice, and a caller that comes back early is
//! simply refused again, later.
//!
//! It sits on the refusal path only (cold): a mutex-guarded map, bounded
//! by pruning the promises already in the past.

use std::collections::HashMap;

use parking_lot::Mutex;

/// At most this many limits are remembered; past it, the promises already
/// in the past are dropped, and if none are, the oldest-told limit goes.
const MAX_LIMITS: usize = 4096;

#[derive(Debug, Default)]
pub(super) struct Stagger {
    /// The latest instant told per limit (layer clock, nanoseconds).
    told: Mutex<HashMap<String, u64>>,
}

impl Stagger {
    /// The instant to tell a call refused now on `limit`, whose own next
    /// chance is `ready`, on a limit that frees one place per `period`
    /// nanoseconds. Never earlier than `ready`.
    pub(super) fn tell(&self, limit: &str, now: u64, ready: u64, period: u64) -> u64 {
        let mut told = self.told.lock();
        if told.len() >= MAX_LIMITS && !told.contains_key(limit) {
            told.retain(|_, at| *at > now);
            if told.len() >= MAX_LIMITS
                && let Some(oldest) = told
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(k, _)| k.clone())
            {
                told.remove(&oldest);
            }
        }
        // A promise still ahead queues this call behind it; one already
        // passed says nothing about the limit now.
        let at = match told.get(limit) {
            Some(&last) if last > now => ready.max(last.saturating_add(period)),
            _ => ready,
        };
        told.insert(limit.to_string(), at);
        at
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn calls_refused_together_are_told_one_period_apart() {
        let s = Stagger::default();
        let told: Vec<u64> = (0..4).map(|_| s.tell("k", 0, 1_000, 250)).collect();
        assert_eq!(told, [1_000, 1_250, 1_500, 1_750]);
        // Another limit has its own queue of promises.
        assert_eq!(s.tell("other", 0, 1_000, 250), 1_000);
    }

    #[test]
    fn a_limit_whose_promises_have_passed_starts_from_its_real_next_slot() {
        let s = Stagger::default();
        assert_eq!(s.tell("k", 0, 1_000, 250), 1_000);
        assert_eq!(s.tell("k", 0, 1_000, 250), 1_250);
        // Once the promises have passed, the limit's own next slot.
        assert_eq!(s.tell("k", 2_000, 3_000, 250), 3_000);
        // A next slot later than the promises is never told earlier.
        assert_eq!(s.tell("k", 2_000, 5_000, 250), 5_000);
        // The clock moves between two refusals: still one period apart.
        assert_eq!(s.tell("k", 2_100, 5_100, 250), 5_250);
    }

    #[test]
    fn the_map_stays_bounded() {
        let s = Stagger::default();
        for i in 0..(MAX_LIMITS as u64 + 10) {
            s.tell(&i.to_string(), i, i + 1_000_000, 1);
        }
        assert!(s.told.lock().len() <= MAX_LIMITS);
    }
}
