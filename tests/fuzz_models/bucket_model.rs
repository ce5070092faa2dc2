//! `bucket_model`: the TokenBucket against a reference model.
//!
//! The model is the GCRA specification in plain `u128` arithmetic with a
//! list of outstanding reservations. After each operation every answer and
//! the stored arrival time must agree exactly.
//!
//! It reads the bucket's raw `tat` and the crate-private `Quota::clamped`,
//! so it is not a module of this test target: the library compiles it by
//! `#[path]` (`src/fuzzing/mod.rs`), for its unit tests and the fuzz target.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::{CheckError, ManualClock, Quota, Reservation, ReserveError, TokenBucket};

const MAX: u128 = u64::MAX as u128;
const SLOTS: usize = 4;

const PERIODS: [u64; 8] = [1, 7, 100, 1_000, 1_000_000_000, u64::MAX / 3, u64::MAX, 333];
const BURSTS: [u32; 6] = [1, 2, 3, 5, 100, u32::MAX];
const STARTS: [u64; 4] = [0, 1_000, u64::MAX - 10_000, u64::MAX];
const STEPS: [u64; 8] = [0, 1, 50, 99, 100, 1_000_000_000, u64::MAX / 2, u64::MAX];

#[derive(Clone, Copy, Debug)]
struct Ticket {
    before: u128,
    after: u128,
    epoch: u64,
}

/// The specification.
struct Model {
    now: u128,
    tat: u128,
    period: u128,
    burst: u128,
    epoch: u64,
    /// The end of the latest server hold (0: none).
    held_until: u128,
    /// Whether a quota change's `tat` was capped at `MAX`.
    capped: bool,
}

enum Rule {
    Fits { ready: u128, new_tat: u128 },
    TooMany,
    Never,
}

impl Model {
    /// `burst * period`, capped at `u64::MAX` (the spec's saturation).
    fn tolerance(&self) -> u128 {
        (self.period * self.burst).min(MAX)
    }

    fn rule(&self, n: u32) -> Rule {
        let n = n as u128;
        if n > self.burst {
            return Rule::TooMany;
        }
        let inc = (self.period * n).min(MAX);
        let earliest = self.tat.saturating_sub(self.tolerance() - inc);
        let new_tat = self.tat.max(self.now) + inc;
        if new_tat > MAX {
            return Rule::Never;
        }
        Rule::Fits {
            ready: earliest.max(self.now),
            new_tat,
        }
    }

    fn try_acquire(&mut self, n: u32) -> Result<(), CheckError> {
        if n == 0 {
            return Ok(());
        }
        match self.rule(n) {
            Rule::Fits { ready, new_tat } if ready <= self.now => {
                self.tat = new_tat;
                Ok(())
            }
            Rule::Fits { ready, .. } => Err(CheckError::NotUntil {
                wait: Duration::from_nanos((ready - self.now) as u64),
            }),
            Rule::TooMany => Err(CheckError::InsufficientCapacity {
                requested: n,
                capacity: self.burst as u32,
            }),
            Rule::Never => Err(CheckError::NotUntil {
                wait: Duration::from_nanos(u64::MAX),
            }),
        }
    }

    fn reserve(&mut self, n: u32, max_wait: u64) -> Result<(u64, Option<Ticket>), ReserveError> {
        if n == 0 {
            return Ok((self.now as u64, None));
        }
        match self.rule(n) {
            Rule::Fits { ready, new_tat } if ready - self.now <= max_wait as u128 => {
                let ticket = Ticket {
                    before: self.tat,
                    after: new_tat,
                    epoch: self.epoch,
                };
                self.tat = new_tat;
                Ok((ready as u64, Some(ticket)))
            }
            Rule::Fits { ready, .. } => Err(ReserveError::RateLimited {
                retry_after: Duration::from_nanos((ready - self.now) as u64),
            }),
            Rule::TooMany => Err(ReserveError::InsufficientCapacity {
                requested: n,
                capacity: self.burst as u32,
            }),
            Rule::Never => Err(ReserveError::RateLimited {
                retry_after: Duration::from_nanos(u64::MAX),
            }),
        }
    }

    fn cancel(&mut self, t: Ticket) -> bool {
        if t.epoch == self.epoch && self.tat == t.after {
            self.tat = t.before;
            true
        } else {
            false
        }
    }

    fn penalize(&mut self, d: u64) {
        // "Retry now" holds nothing back and leaves refunds valid.
        if d == 0 {
            return;
        }
        self.held_until = self.held_until.max((self.now + d as u128).min(MAX));
        let target = (self.now + d as u128 + self.tolerance() - self.period).min(MAX);
        // A penalty within the debt voids outstanding refunds instead.
        if self.tat >= target {
            self.epoch += 1;
        } else {
            self.tat = target;
        }
    }

    fn reset(&mut self) {
        self.held_until = 0;
        if self.tat > self.now {
            self.tat = 0;
            self.epoch += 1;
        }
    }

    /// The quota-change spec, from its statement: a full bucket stays full;
    /// under a running hold and past its next cell, the hold's part of the
    /// wait is kept as time and the cells reserved past it are kept; any
    /// other debt stays that many cells (rounded up, none forgiven). Any
    /// change voids refunds.
    fn set_quota(&mut self, period: u128, burst: u128) {
        if (period, burst) == (self.period, self.burst) {
            return;
        }
        let (old_t, old_tau) = (self.period, self.tolerance());
        self.period = period;
        self.burst = burst;
        self.epoch += 1;
        let debt = self.tat.saturating_sub(self.now);
        if debt == 0 {
            return;
        }
        let (new_t, new_tau) = (period, self.tolerance());
        let hold = self.held_until.saturating_sub(self.now);
        // `c` cells of debt at the old period, as time at the new one.
        let cells = |debt: u128| {
            let c = (debt * new_t).div_ceil(old_t);
            assert!(c * old_t >= debt * new_t, "cells lost");
            assert!(c * old_t < debt * new_t + old_t, "cells added");
            c
        };
        let debt = if hold > 0 && debt > old_tau - old_t {
            let wait = debt - (old_tau - old_t);
            let held = wait.min(hold);
            let kept = (new_tau - new_t) + held + cells(wait - held);
            // The hold's end does not move.
            assert!(kept - (new_tau - new_t) >= held);
            kept
        } else {
            cells(debt)
        };
        self.capped |= self.now + debt > MAX;
        self.tat = (self.now + debt).min(MAX);
    }

    fn available(&self) -> u32 {
        let base = self.tat.max(self.now);
        let fit = self.tolerance().saturating_sub(base - self.now) / self.period;
        let room = (MAX - base) / self.period;
        fit.min(room) as u32
    }
}

fn pick<T: Copy>(options: &[T], byte: u8) -> T {
    options[byte as usize % options.len()]
}

/// Runs `data` as operations on a bucket and the model, panicking at the
/// first disagreement.
pub fn bucket_model(data: &[u8]) {
    let [a, b, c, ops @ ..] = data else {
        return;
    };
    let (period, burst) = (pick(&PERIODS, *a), pick(&BURSTS, *b));
    let start = pick(&STARTS, *c);
    let clock = ManualClock::starting_at(start);
    let quota = |p: u64, b: u32| {
        Quota::with_period(Duration::from_nanos(p)).allow_burst(NonZeroU32::new(b).unwrap())
    };
    // The model keeps the burst a bucket keeps (`clamped` is tested apart).
    let clamp = |p: u64, b: u32| (p, quota(p, b).clamped().burst().get());
    let (period, burst) = clamp(period, burst);
    let bucket = TokenBucket::with_clock(quota(period, burst), clock.clone());
    let mut model = Model {
        now: start as u128,
        tat: 0,
        period: period as u128,
        burst: burst as u128,
        epoch: 0,
        held_until: 0,
        capped: false,
    };
    let mut real: Vec<Option<Reservation<'_>>> = (0..SLOTS).map(|_| None).collect();
    let mut spec: Vec<Option<Ticket>> = vec![None; SLOTS];

    for chunk in ops.chunks(2) {
        let op = chunk[0];
        let arg = chunk.get(1).copied().unwrap_or(0);
        let n = match arg % 4 {
            0 => 1,
            1 => 2,
            2 => (arg / 4) as u32 % 7,
            _ => model.burst.min(u32::MAX as u128) as u32,
        };
        match op % 9 {
            0 | 1 => assert_eq!(
                bucket.try_acquire(n),
                model.try_acquire(n),
                "try_acquire({n})"
            ),
            2 | 3 => {
                let slot = arg as usize % SLOTS;
                let max_wait = pick(&STEPS, arg / 4);
                let got = bucket.reserve(n, Duration::from_nanos(max_wait));
                let want = model.reserve(n, max_wait);
                match (got, want) {
                    (Ok(r), Ok((ready, ticket))) => {
                        assert_eq!(r.ready_at(), ready, "reserve({n}) ready_at");
                        assert_eq!(r.wait().as_nanos(), ready as u128 - model.now);
                        real[slot] = Some(r);
                        spec[slot] = ticket;
                    }
                    (Err(got), Err(want)) => assert_eq!(got, want, "reserve({n})"),
                    (got, want) => panic!("reserve({n}): got {got:?}, model {want:?}"),
                }
            }
            4 => {
                let slot = arg as usize % SLOTS;
                let got = real[slot].take().is_some_and(Reservation::cancel);
                let want = spec[slot].take().is_some_and(|t| model.cancel(t));
                assert_eq!(got, want, "cancel slot {slot}");
            }
            5 => {
                let d = pick(&STEPS, arg);
                bucket.penalize(Duration::from_nanos(d));
                model.penalize(d);
            }
            6 => {
                let (p, b) = clamp(pick(&PERIODS, arg), pick(&BURSTS, arg / 8));
                let (home_p, home_b) = (model.period as u64, model.burst as u32);
                let debt = model.tat.saturating_sub(model.now);
                model.capped = false;
                bucket.set_quota(quota(p, b));
                model.set_quota(p as u128, b as u128);
                if arg & 0x80 != 0 {
                    // There and back: no drift. The debt ends at most where
                    // it was, rounded up to a whole cell (plus one cell under
                    // a running hold).
                    for _ in 0..3 {
                        bucket.set_quota(quota(home_p, home_b));
                        model.set_quota(home_p as u128, home_b as u128);
                        bucket.set_quota(quota(p, b));
                        model.set_quota(p as u128, b as u128);
                    }
                    bucket.set_quota(quota(home_p, home_b));
                    model.set_quota(home_p as u128, home_b as u128);
                    let cell = home_p as u128;
                    let after = model.tat.saturating_sub(model.now);
                    let held = model.held_until > model.now;
                    // Exempt: a `tat` capped at u64::MAX on the way.
                    assert!(
                        model.capped
                            || after <= debt.div_ceil(cell) * cell + if held { cell } else { 0 },
                        "round trips took the debt from {debt} to {after}"
                    );
                }
            }
            7 if arg % 8 == 0 => {
                bucket.reset();
                model.reset();
            }
            _ => {
                let d = pick(&STEPS, arg);
                clock.advance(Duration::from_nanos(d));
                model.now = (model.now + d as u128).min(MAX);
            }
        }
        assert_eq!(bucket.raw().tat() as u128, model.tat, "tat after op {op}");
        assert_eq!(
            bucket.available(),
            model.available(),
            "available after op {op}"
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_byte_strings_match_the_model() {
        let mut rng = fastrand::Rng::with_seed(0xb0c7e7);
        let runs = if cfg!(miri) { 30 } else { 5_000 };
        for _ in 0..runs {
            let len = rng.usize(3..200);
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            super::bucket_model(&data);
        }
    }
}
