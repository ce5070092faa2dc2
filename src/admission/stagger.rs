//! `Stagger`: the retry instants told to calls refused together. The k-th
//! refusal on a limit within one period of the first is told the next
//! slot plus k - 1 periods, so they do not return as one burst; a later
//! refusal starts a new burst at the real next slot. A `spread` limit (an
//! open circuit) cycles over a fixed number of steps instead. Advisory
//! only; refusal path, so a bounded mutex-guarded map.

use std::collections::HashMap;

use parking_lot::Mutex;

/// At most this many limits are remembered; past it, finished bursts are
/// dropped, else the oldest.
const MAX_LIMITS: usize = 4096;

/// One limit's current burst of refusals.
#[derive(Clone, Copy, Debug)]
struct Burst {
    /// When its first refusal was told (layer clock, ns).
    began: u64,
    ready: u64,
    told: u64,
    last: u64,
}

#[derive(Debug, Default)]
pub(super) struct Stagger {
    bursts: Mutex<HashMap<String, Burst>>,
}

impl Stagger {
    /// The instant to tell a call refused now on `limit` (its next chance
    /// `ready`, one place freed per `period` ns): never earlier than `ready`;
    /// with `spread`, at most `spread - 1` periods past it.
    pub(super) fn tell(
        &self,
        limit: &str,
        now: u64,
        ready: u64,
        period: u64,
        spread: Option<u64>,
    ) -> u64 {
        let mut bursts = self.bursts.lock();
        if bursts.len() >= MAX_LIMITS && !bursts.contains_key(limit) {
            bursts.retain(|_, b| now < b.began.saturating_add(period.max(1)));
            if bursts.len() >= MAX_LIMITS
                && let Some(oldest) = bursts
                    .iter()
                    .min_by_key(|(_, b)| b.began)
                    .map(|(k, _)| k.clone())
            {
                bursts.remove(&oldest);
            }
        }
        let burst = match bursts.get(limit) {
            // Within a period of the burst's first refusal: queued behind it.
            Some(b) if now < b.began.saturating_add(period.max(1)) => {
                let told = b.told + 1;
                let last = match spread {
                    Some(n) => b
                        .ready
                        .saturating_add(period.saturating_mul(told % n.max(1))),
                    None => b.last.saturating_add(period),
                };
                Burst {
                    told,
                    last: ready.max(last),
                    ..*b
                }
            }
            _ => Burst {
                began: now,
                ready,
                told: 0,
                last: ready,
            },
        };
        bursts.insert(limit.to_string(), burst);
        burst.last
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn calls_refused_together_are_told_one_period_apart() {
        let s = Stagger::default();
        let told: Vec<u64> = (0..4).map(|_| s.tell("k", 0, 1_000, 250, None)).collect();
        assert_eq!(told, [1_000, 1_250, 1_500, 1_750]);
        assert_eq!(s.tell("other", 0, 1_000, 250, None), 1_000);
    }

    #[test]
    fn a_limit_whose_promises_have_passed_starts_from_its_real_next_slot() {
        let s = Stagger::default();
        assert_eq!(s.tell("k", 0, 1_000, 250, None), 1_000);
        assert_eq!(s.tell("k", 0, 1_000, 250, None), 1_250);
        assert_eq!(s.tell("k", 2_000, 3_000, 250, None), 3_000);
        assert_eq!(s.tell("k", 2_000, 5_000, 250, None), 5_000);
        assert_eq!(s.tell("k", 2_100, 3_100, 250, None), 5_250);
    }

    #[test]
    fn the_map_stays_bounded() {
        let s = Stagger::default();
        for i in 0..(MAX_LIMITS as u64 + 10) {
            s.tell(&i.to_string(), i, i + 1_000_000, 1, None);
        }
        assert!(s.bursts.lock().len() <= MAX_LIMITS);
    }

    /// A full map forgets the oldest live burst, or every finished one.
    #[test]
    fn a_full_map_forgets_the_oldest_live_burst_or_every_burst_that_is_over() {
        let s = Stagger::default();
        let period = 100;
        for i in 0..MAX_LIMITS as u64 + 10 {
            s.tell(&i.to_string(), i % 50, 1_000, period, None);
        }
        assert_eq!(
            s.bursts.lock().len(),
            MAX_LIMITS,
            "live bursts: the oldest go"
        );
        // At 148 only the 82 bursts begun at 49 are live.
        s.tell("late", 148, 1_000, period, None);
        assert_eq!(s.bursts.lock().len(), 83);
    }

    /// A refusal on a remembered limit forgets no other burst.
    #[test]
    fn a_full_map_forgets_nothing_for_a_limit_it_remembers() {
        let s = Stagger::default();
        for i in 0..MAX_LIMITS as u64 {
            s.tell(&i.to_string(), 0, 1_000, 100, None);
        }
        assert_eq!(s.tell("7", 1, 1_000, 100, None), 1_100, "still queued");
        assert_eq!(s.bursts.lock().len(), MAX_LIMITS);
    }

    /// A lone caller is told its real next chance each time.
    #[test]
    fn a_lone_caller_is_told_the_cool_down_left_not_a_step_more_per_ask() {
        let s = Stagger::default();
        let (until, step) = (1_000, 100);
        for now in (0..until).step_by(100) {
            assert_eq!(
                s.tell("circuit", now, until, step, Some(10)),
                until,
                "at {now}"
            );
        }
    }

    /// A flood on a spread limit stays within its spread.
    #[test]
    fn a_flood_on_a_spread_limit_stays_within_its_spread() {
        let s = Stagger::default();
        let (until, step) = (1_000, 100);
        let told: Vec<u64> = (0..1_000)
            .map(|i| s.tell("circuit", i / 10, until, step, Some(10)))
            .collect();
        assert!(told
            .iter()
            .all(|&t| (until..until + 10 * step).contains(&t)));
        assert_eq!(
            &told[..11],
            &[1_000, 1_100, 1_200, 1_300, 1_400, 1_500, 1_600, 1_700, 1_800, 1_900, 1_000]
        );
    }
}
