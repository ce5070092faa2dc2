//! Changes of a shared quota that reach the calls already sleeping on it.
//! Each shared quota of a credential has a [`Watch`]: the period in force
//! as last seen and a [`Rescales`] log; each round trip refreshes it, and
//! a change wakes the sleepers to move their instants as the limiter moved
//! its cells. Approximate: see ARCHITECTURE.md, "A wrong first quota".

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::rescales::{Rescales, Turn};
use crate::bucket::gcra::{Rescale, EPOCH_MAX};
use crate::bucket::Quota;

#[derive(Default)]
pub(crate) struct Watch {
    pub(crate) rescales: Rescales,
    seen: Mutex<Seen>,
}

#[derive(Default, Clone, Copy)]
struct Seen {
    /// The period in force (0: none seen yet).
    period: u64,
    epoch: u32,
    /// When a round trip last brought `period` (layer clock): a change to
    /// the next happened after this.
    confirmed_at: u64,
}

impl Watch {
    /// Looks at the quota in force after a round trip at `now`; a new period
    /// is logged and wakes the sleepers. The limiter's change happened some
    /// time since `confirmed_at`: a slowdown is logged as of then (moving
    /// instants no earlier than the limiter's), a speedup as of `now`.
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

    /// The turn of a cell usable at `ready_at`, under the quota last observed.
    pub(crate) fn turn(&self, ready_at: u64) -> Turn {
        self.rescales.turn(ready_at, self.seen.lock().epoch)
    }
}

/// The [`Watch`]es of every credential's shared quotas, by credential and
/// quota name (a resolver may build a new limiter per call). Unheld ones
/// are forgotten once the map is full.
#[derive(Default)]
pub(crate) struct Watches(Mutex<Watched>);

#[derive(Default)]
struct Watched {
    by_credential: HashMap<String, Named>,
    /// The count at which a new credential sweeps, keeping sweeps a quarter
    /// of the map apart.
    sweep_at: usize,
    #[cfg(all(test, not(feature = "loom")))]
    sweeps: usize,
}

type Named = Vec<(String, Arc<Watch>)>;

/// Credentials watched before unheld ones are forgotten.
const MAX_WATCHED: usize = super::learned::MAX_LEARNED;

impl Watches {
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
        // Half the rate, stored since the 50 ms trip: the 2.5 cells left past
        // 50 ms take twice as long from there.
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
        // Stored in (0, 100 ms]: as of 100 ms, the 2.5 cells left take half as long.
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

    /// Watches of credentials nobody uses are forgotten.
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

    /// With every watch held, sweeps stay a quarter of the map apart.
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

    /// Below the bound an unheld watch keeps the period it saw.
    #[test]
    fn below_the_bound_an_unheld_watch_keeps_what_it_saw() {
        let watches = Watches::default();
        watches.of("a", "requests").observe(per_second(10.0), 0);
        drop(watches.of("b", "requests"));
        assert_ne!(watches.of("a", "requests").seen.lock().period, 0);
    }
}
