//! Changes of a shared quota that reach the calls already waiting on it.
//!
//! A call takes its cells from a shared limiter (a `RedisBucket` every
//! process of a fleet admits through), then sleeps until they are usable.
//! When the quota in force changes meanwhile, the limiter converts its
//! queued cells to the new rate (`set_quota`), but the sleeping calls'
//! instants are this process's own: without this log they went at the
//! old rate and drew 429s.
//!
//! So each shared quota of a credential has a [`Watch`]: the period in
//! force as last seen here, and a [`Rescales`] log of its changes. Every
//! round trip through the limiter refreshes the quota in force; a change
//! is logged (as of when, see [`Watch::observe`]) and wakes the calls
//! sleeping on that quota, which move their instants the way the limiter
//! moved its cells (`Admission::sleep_turns`).
//!
//! Not exact (see ARCHITECTURE.md, "A wrong first quota"): the instant
//! the limiter moved its cells is only bounded; a process learns of a
//! change at its next round trip; a change of burst alone moves no
//! instant; and a reservation taken under the old quota just after a
//! reply brought the new one keeps its instant (the limiter does not say
//! which quota each reservation was taken under).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::rescales::{Rescales, Turn};
use crate::bucket::gcra::{Rescale, EPOCH_MAX};
use crate::bucket::Quota;

/// One shared quota of one credential, as this process last saw it.
#[derive(Default)]
pub(crate) struct Watch {
    /// Its changes, for the calls sleeping on it.
    pub(crate) rescales: Rescales,
    /// What this process last saw of it.
    seen: Mutex<Seen>,
}

#[derive(Default, Clone, Copy)]
struct Seen {
    /// The period in force (0: none seen yet).
    period: u64,
    /// The epoch of the latest change logged.
    epoch: u32,
    /// When a round trip last brought `period` (layer clock): the change
    /// to the next one happened in the limiter after this, and before the
    /// round trip that brings it.
    confirmed_at: u64,
}

impl Watch {
    /// Looks at the quota in force after a round trip at `now` (layer
    /// clock): a new period is logged, and the calls sleeping on this
    /// quota are woken to move.
    ///
    /// The limiter moved its cells at an instant known only to fall
    /// between the last round trip that brought the old period and this
    /// one. A slower rate is logged as of the earlier end (an instant moves
    /// the further the earlier its change starts), a faster one as of
    /// `now`: logging a slowdown at `now` moved instants early and drew
    /// 429s.
    pub(crate) fn observe(&self, quota: Option<Quota>, now: u64) {
        let Some(quota) = quota else { return };
        let wakers = {
            let mut seen = self.seen.lock();
            let last = *seen;
            if last.period == quota.period || last.period == 0 {
                *seen = Seen {
                    period: quota.period,
                    confirmed_at: now,
                    ..last
                };
                return;
            }
            let epoch = (last.epoch + 1) & EPOCH_MAX;
            *seen = Seen {
                period: quota.period,
                epoch,
                confirmed_at: now,
            };
            let at = if quota.period > last.period {
                last.confirmed_at.min(now)
            } else {
                now
            };
            // Logged under `seen`, so the log's order is the epochs'.
            self.rescales.log_change(Rescale {
                at,
                old_period: last.period,
                new_period: quota.period,
                epoch,
            })
        };
        for waker in wakers {
            waker.wake();
        }
    }

    /// The turn of a cell usable at `ready_at`, taken under the quota
    /// last observed.
    pub(crate) fn turn(&self, ready_at: u64) -> Turn {
        self.rescales.turn(ready_at, self.seen.lock().epoch)
    }
}

/// The [`Watch`]es of every credential's shared quotas, by credential and
/// quota name (not by limiter: a resolver may build a new one per call).
///
/// A watch nobody holds (no call sleeps on its quota) is forgotten once
/// the map is full: the next round trip's period is taken as the first,
/// which moves no turn, and no turn is left to move.
#[derive(Default)]
pub(crate) struct Watches(Mutex<Watched>);

#[derive(Default)]
struct Watched {
    by_credential: HashMap<String, Named>,
    /// The count of credentials at which a new one sweeps: [`MAX_WATCHED`]
    /// (0 before the first), or a quarter above what the last sweep
    /// could not forget, so sweeps stay a quarter of the map apart.
    sweep_at: usize,
    /// Sweeps so far, for the test that bounds them.
    #[cfg(all(test, not(feature = "loom")))]
    sweeps: usize,
}

/// One credential's watches, by quota name (a credential has a few).
type Named = Vec<(String, Arc<Watch>)>;

/// Credentials watched before the ones nobody sleeps on are forgotten:
/// as many as the learned credentials kept (`MAX_LEARNED`).
const MAX_WATCHED: usize = super::learned::MAX_LEARNED;

impl Watches {
    /// `credential`'s quota `name`'s watch.
    pub(crate) fn of(&self, credential: &str, name: &str) -> Arc<Watch> {
        let mut all = self.0.lock();
        if let Some(quotas) = all.by_credential.get(credential)
            && let Some((_, watch)) = quotas.iter().find(|(n, _)| n == name)
        {
            return watch.clone();
        }
        if all.by_credential.len() >= all.sweep_at.max(MAX_WATCHED) {
            all.sweep();
        }
        let watch = Arc::new(Watch::default());
        all.by_credential
            .entry(credential.to_owned())
            .or_default()
            .push((name.to_owned(), watch.clone()));
        watch
    }

    /// Credentials watched now.
    #[cfg(all(test, not(feature = "loom")))]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().by_credential.len()
    }
}

impl Watched {
    /// Forgets the watches nobody holds, and the credentials left with none.
    #[cold]
    fn sweep(&mut self) {
        #[cfg(all(test, not(feature = "loom")))]
        {
            self.sweeps += 1;
        }
        self.by_credential.retain(|_, quotas| {
            quotas.retain(|(_, watch)| Arc::strong_count(watch) > 1);
            !quotas.is_empty()
        });
        let len = self.by_credential.len();
        self.sweep_at = MAX_WATCHED.max(len + len.max(MAX_WATCHED) / 4);
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn per_second(n: f64) -> Option<Quota> {
        Some(Quota::new(n, 1).unwrap())
    }

    #[test]
    fn a_new_period_moves_the_turns_taken_before_it_only() {
        let watch = Watch::default();
        watch.observe(per_second(10.0), 0);
        let mut before = watch.turn(300 * MS);
        // The same quota again, or none known: nothing logged.
        watch.observe(per_second(10.0), 50 * MS);
        watch.observe(None, 60 * MS);
        assert!(!watch.rescales.catch_up(&mut before));
        assert_eq!(before.ready_at, 300 * MS);
        // The round trip at 100 ms brings half the rate, stored in the
        // limiter since the one at 50 ms: the 2.5 cells left past 50 ms
        // take twice as long from there, the latest the limiter's can be.
        watch.observe(per_second(5.0), 100 * MS);
        let mut after = watch.turn(700 * MS);
        assert!(watch.rescales.catch_up(&mut before));
        assert_eq!(before.ready_at, 550 * MS);
        assert!(!watch.rescales.catch_up(&mut after));
        assert_eq!(after.ready_at, 700 * MS);
    }

    #[test]
    fn a_faster_rate_moves_the_turns_as_of_the_round_trip_that_brought_it() {
        let watch = Watch::default();
        watch.observe(per_second(5.0), 0);
        let mut turn = watch.turn(600 * MS);
        // Stored somewhere in (0, 100 ms]: as of 100 ms, the 2.5 cells
        // left take half as long, no earlier than the limiter's.
        watch.observe(per_second(10.0), 100 * MS);
        assert!(watch.rescales.catch_up(&mut turn));
        assert_eq!(turn.ready_at, 350 * MS);
    }

    #[test]
    fn the_first_quota_seen_is_no_change() {
        let watch = Watch::default();
        let mut turn = watch.turn(300 * MS);
        watch.observe(per_second(5.0), 100 * MS);
        assert!(!watch.rescales.catch_up(&mut turn));
        assert_eq!(turn.ready_at, 300 * MS);
    }

    #[test]
    fn a_credentials_quotas_have_a_watch_each() {
        let watches = Watches::default();
        let a = watches.of("key", "requests");
        assert!(Arc::ptr_eq(&a, &watches.of("key", "requests")));
        assert!(!Arc::ptr_eq(&a, &watches.of("key", "tokens")));
        assert!(!Arc::ptr_eq(&a, &watches.of("other", "requests")));
    }

    /// Issue #59 item 4: a watch was kept for every credential ever
    /// shared, so memory grew with credentials long gone.
    #[test]
    fn watches_of_credentials_nobody_uses_are_forgotten() {
        let watches = Watches::default();
        let held = watches.of("busy", "requests");
        for i in 0..20_000 {
            drop(watches.of(&format!("key{i}"), "requests"));
        }
        assert!(watches.len() <= MAX_WATCHED, "{}", watches.len());
        assert!(watches.len() > 1, "{}", watches.len());
        // The watch a call sleeps on is kept, and found again.
        assert!(Arc::ptr_eq(&held, &watches.of("busy", "requests")));
    }

    /// Watches a call holds cannot be forgotten: past the bound, sweeps
    /// still come a quarter of the map apart, not on every new credential.
    #[test]
    fn sweeps_stay_a_quarter_of_the_map_apart_when_nothing_can_go() {
        let watches = Watches::default();
        let held: Vec<_> = (0..MAX_WATCHED)
            .map(|i| watches.of(&format!("held{i}"), "requests"))
            .collect();
        for i in 0..20_000 {
            drop(watches.of(&format!("key{i}"), "requests"));
        }
        let all = watches.0.lock();
        assert!((2..=40).contains(&all.sweeps), "{} sweeps", all.sweeps);
        assert!(all.by_credential.len() <= MAX_WATCHED + MAX_WATCHED / 4);
        drop(held);
    }

    /// Below the bound nothing is forgotten: a watch nobody holds keeps
    /// the period it saw (a sweep on every new credential would lose it).
    #[test]
    fn below_the_bound_an_unheld_watch_keeps_what_it_saw() {
        let watches = Watches::default();
        watches.of("a", "requests").observe(per_second(10.0), 0);
        drop(watches.of("b", "requests"));
        assert_ne!(watches.of("a", "requests").seen.lock().period, 0);
    }
}
