//! A request rate learned from 429s: [`AdaptiveRate`] makes one
//! [`RateController`] per credential, fed every reply, answering with the
//! [`Quota`] for the credential's token bucket. It measures the server's
//! rate and settles just below it instead of AIMD's saw-tooth.
//!
//! A server limiting to `R`/s with burst `b` admits at most `b + R·w` in
//! any window `w`. On a 429, the epoch's successes (since the last
//! decrease, the last 128) give a **floor** (`n` successes within `w`
//! prove `R ≥ (n − b) / w`) and a **ceiling** (the refusal at `t` proves
//! `R < (n_i + 1 − b) / (t − t_i)` for some earlier success `i`). The
//! ceiling is used only when round trips vary by less than one period, the
//! pause before the epoch refilled `b`, and it is above the floor. A 429 at
//! a proven rate grows the assumed `b`.
//!
//! The state sits behind a `parking_lot::Mutex`: fed once per reply, not a
//! hot path.

use core::fmt;
use core::num::NonZeroU32;
use core::time::Duration;
use std::collections::VecDeque;

use parking_lot::Mutex;

use super::algorithm::clamp_f64;
use crate::bucket::Quota;
use crate::clock::saturating_nanos;

mod bounds;
mod config;
mod decrease;

pub use config::{AdaptiveRate, RateOutcome};

use bounds::Sample;

const NANOS_PER_SEC: f64 = 1e9;
/// The lowest rate any setting is clamped to: one request per 1,000 s.
const ABS_MIN_RATE: f64 = 1e-3;
/// The highest rate any setting is clamped to: one request per nanosecond.
const ABS_MAX_RATE: f64 = 1e9;
/// Successes kept for the bounds.
const WINDOW: usize = 128;
/// Round trips kept to judge whether replies can overtake each other.
const RTTS: usize = 32;
/// Successes looked at to tell whether the callers use the rate.
const USE_WINDOW: usize = 8;
/// Below this share of the rate in use, the rate does not grow.
const IN_USE: f64 = 0.5;
/// Timer ticks per second: a sleep shorter than a tick is rounded up.
const TICKS_PER_SEC: f64 = 1_000.0;
/// Slow start's growth per success, in requests per second.
const SLOW_START_STEP: f64 = 1.0;
/// A decrease always lands at least this fraction below the refused rate.
const MIN_CUT: f64 = 0.02;
/// Floor / ceiling at or above this: the estimate is settled.
const SETTLED: f64 = 0.85;
/// Two floors this close (relative): the estimate is settled.
const AGAIN: f64 = 0.05;
/// The growth, per second, of the climb back after a guessed cut.
const CLIMB_GAIN: f64 = 0.5;
/// How fast `Phase::Approach` grows: 3% of its start a second, so a server
/// with one cell more burst than assumed absorbs the excess for seconds.
const APPROACH_GAIN: f64 = 0.03;
/// The longest hold, in seconds, after a guessed cut.
const MAX_TRIAL: f64 = 5.0;
/// A probe waits at least this many successes.
const PROBE_MIN_SUCCESSES: u64 = 100;
/// The probe wait grows up to this multiple of `probe_after`.
const MAX_PROBE_BACKOFF: u32 = 16;
/// The server burst assumption doubles up to this.
const MAX_SERVER_BURST: u32 = 1024;
/// A new quota is handed out when the rate moved by at least this fraction.
const REQUOTA: f64 = 0.01;

/// One credential's adaptive rate. Made by [`AdaptiveRate::controller`].
///
/// # How the rate is learned
///
/// Until the first 429 the rate climbs fast (+1 request/s per success). On
/// a 429 the controller bounds the server's rate from the replies since its
/// last decrease (`n` successes within a window `w` prove `R ≥ (n − b) / w`
/// for a server with burst `b`; the refusal bounds `R` from above) and sets
/// the rate to that floor. When the 429 came too soon to measure anything,
/// it cuts to [`decrease`](AdaptiveRate::decrease) × the ceiling and climbs
/// back halfway. Once the bounds agree it holds for
/// [`probe_after`](AdaptiveRate::probe_after) before probing higher. 429s
/// of requests sent before a decrease, or within
/// [`holdoff`](AdaptiveRate::holdoff) after it, are ignored.
/// [`RateOutcome::ServerLimit`] jumps to the server's own numbers and caps
/// the probes there.
///
/// # Wiring
///
/// For every reply, call [`on_reply`](RateController::on_reply) with the
/// instant the request actually left. Apply a returned quota to the
/// credential's [`TokenBucket`](crate::TokenBucket) with
/// [`set_learned_quota`](crate::TokenBucket::set_learned_quota) **before**
/// any `penalize` for the same reply, so a hold is kept as it is. Do not
/// `reset` the bucket on a cut: reservations past the hold still go, and a
/// reset would admit a full burst beside them.
///
/// # Examples
///
/// ```
/// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
/// use backpressure::{Clock, ManualClock, TokenBucket};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let controller = AdaptiveRate::new().controller(clock.now_nanos());
/// let bucket = TokenBucket::with_clock(controller.quota(), clock.clone());
///
/// // A request sent at 0 is answered 429 at 5 ms.
/// bucket.try_acquire(1).unwrap();
/// clock.advance(Duration::from_millis(5));
/// if let Some(q) = controller.on_reply(clock.now_nanos(), 0, RateOutcome::Throttled) {
///     bucket.set_learned_quota(q); // first the new rate...
/// }
/// bucket.penalize(Duration::from_secs(1)); // ...then the server's hold
/// assert!(controller.rate() < 10.0);
/// ```
pub struct RateController {
    cfg: AdaptiveRate,
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// +1 request/s per success until the first 429.
    SlowStart,
    /// Keep the rate until `until` and `successes` more successes.
    Hold {
        until: u64,
        successes: u64,
        /// `None`: the floor and the ceiling agree, probe slowly next.
        /// `Some(limit)`: the cut was a guess, climb to `limit` next.
        climb_to: Option<f64>,
    },
    /// Climb from `base` at `since` by `CLIMB_GAIN × base` per second, up
    /// to `limit`; past it, probe.
    Climb { since: u64, base: f64, limit: f64 },
    /// Grow from `base` at `since` by `APPROACH_GAIN × base` per second
    /// to `limit`, a floor proven only if the server's burst is the one
    /// assumed; there, hold as settled.
    Approach { since: u64, base: f64, limit: f64 },
    /// Grow from `base` at `since` by `probe_gain` per second,
    /// compounding, until a 429.
    Probe { since: u64, base: f64 },
}

#[derive(Debug)]
struct State {
    /// The rate the controller wants.
    target: f64,
    /// The rate of the last quota handed out.
    applied: f64,
    /// The burst of the last quota handed out.
    applied_burst: NonZeroU32,
    /// No rate above this: `max_rate`, or the server's numbers.
    cap: f64,
    /// The server's last `ServerLimit` numbers.
    server: Option<(u64, Duration)>,
    phase: Phase,
    /// When the rate was last lowered: 429s of requests sent before are
    /// ignored.
    decreased_at: Option<u64>,
    /// Successes of requests sent before this (the controller's creation
    /// or the last decrease) are not evidence for the current epoch.
    epoch_start: u64,
    /// Successes of the current epoch, the last `WINDOW`, in reply order.
    epoch: VecDeque<Sample>,
    /// When the epoch's first recorded success was sent.
    epoch_first: Option<u64>,
    /// The probe wait, in multiples of `probe_after`.
    backoff: u32,
    /// The rate the last settled decrease landed on.
    last_settled: Option<f64>,
    /// The rate held, when the floor proved it.
    proven: Option<f64>,
    /// `proven` was settled by the first 429 out of slow start: the one floor a
    /// larger burst than assumed can still have inflated unseen.
    proven_first: bool,
    /// The floor measured at the last decrease that measured one.
    last_floor: Option<f64>,
    /// The server burst assumed: `server_burst`, doubled each time a
    /// proven rate is refused.
    server_burst: u32,
    /// The round trips of the last `RTTS` replies, any outcome.
    rtts: [u64; RTTS],
    /// Replies seen, all outcomes (the next slot in `rtts`).
    replies: u64,
}

impl RateController {
    /// The quota to start the credential's token bucket with (and, after
    /// any change, the one in force): the current rate, with the
    /// configured burst. Rates that do not divide a second evenly keep
    /// their fraction: the period is in nanoseconds, rounded up.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::AdaptiveRate;
    /// let q = AdaptiveRate::new().initial(Some(4.0)).controller(0).quota();
    /// assert_eq!(q.period().as_millis(), 250);
    /// let q = AdaptiveRate::new().initial(Some(3.0)).controller(0).quota();
    /// assert_eq!(q.period().as_nanos(), 333_333_334);
    /// ```
    pub fn quota(&self) -> Quota {
        let st = self.state.lock();
        quota_for(st.applied, st.applied_burst)
    }

    /// Sets the burst of the starting quota (see [`burst`](Self::burst)).
    pub(super) fn init_burst(&self) {
        let mut st = self.state.lock();
        st.applied_burst = self.burst(st.server_burst, st.applied);
    }

    /// The burst of a quota at `rate`: the configured one, capped at the
    /// configured `server_burst` (the doubled assumption never widens it),
    /// unless the rate sends more than that per 1 ms timer tick.
    fn burst(&self, server_burst: u32, rate: f64) -> NonZeroU32 {
        let per_tick = (rate / TICKS_PER_SEC).ceil() as u32;
        NonZeroU32::new(server_burst.min(self.cfg.server_burst).max(per_tick))
            .unwrap_or(NonZeroU32::MIN)
            .min(self.cfg.burst)
    }

    /// The rate in force, in requests per second (the rate of
    /// [`quota`](RateController::quota)), for stats and logs.
    pub fn rate(&self) -> f64 {
        self.state.lock().applied
    }

    /// The rate the controller expects to run at soon, in requests per
    /// second: after a cut it only guessed (its bounds far apart), the rate
    /// it is climbing back to; otherwise [`rate`](RateController::rate).
    /// Use it to estimate when the k-th waiting call gets its turn.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    /// const MS: u64 = 1_000_000;
    /// let c = AdaptiveRate::new().controller(0);
    /// assert_eq!(c.expected_rate(), c.rate());
    /// // Two successes and a 429 within 200 ms: the rate is below 5/s, and
    /// // a guess is all it can be.
    /// c.on_reply(5 * MS, 0, RateOutcome::Success);
    /// c.on_reply(105 * MS, 100 * MS, RateOutcome::Success);
    /// c.on_reply(205 * MS, 200 * MS, RateOutcome::Throttled);
    /// assert!(c.expected_rate() > c.rate());
    /// ```
    pub fn expected_rate(&self) -> f64 {
        let st = self.state.lock();
        match st.phase {
            Phase::Hold {
                climb_to: Some(limit),
                ..
            }
            | Phase::Climb { limit, .. } => limit.max(st.applied),
            _ => st.applied,
        }
    }

    /// Feeds one reply: `sent_at` is when its request started and `now`
    /// when the reply came, in nanoseconds on one clock. Returns the new
    /// quota when the bucket's should change (apply it with `set_learned_quota`
    /// before any `penalize` for this reply), `None` otherwise.
    ///
    /// A 429 lowers the rate at most once per round trip: 429s of requests
    /// sent before the last decrease are ignored. A `now` before `sent_at`
    /// is taken as `sent_at`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::adaptive::{AdaptiveRate, RateOutcome};
    ///
    /// let c = AdaptiveRate::new().controller(0);
    /// // Eight requests in flight, all refused: the rate falls once.
    /// let first = c.on_reply(1_000_000, 0, RateOutcome::Throttled);
    /// assert!(first.is_some());
    /// let rate = c.rate();
    /// for _ in 0..7 {
    ///     assert_eq!(c.on_reply(2_000_000, 0, RateOutcome::Throttled), None);
    /// }
    /// assert_eq!(c.rate(), rate);
    /// ```
    pub fn on_reply(&self, now: u64, sent_at: u64, outcome: RateOutcome) -> Option<Quota> {
        let now = now.max(sent_at);
        let mut st = self.state.lock();
        if outcome != RateOutcome::Ignored {
            let slot = (st.replies % RTTS as u64) as usize;
            st.rtts[slot] = now - sent_at;
            st.replies += 1;
        }
        let changed = match outcome {
            RateOutcome::Ignored => return None,
            RateOutcome::Success => {
                self.success(&mut st, now, sent_at);
                false
            }
            RateOutcome::Throttled => {
                let holdoff = saturating_nanos(self.cfg.holdoff);
                // A 429 for a request sent past half the holdoff, at a rate the floor
                // had proven, is no echo of the old rate: the server's burst is larger
                // than assumed.
                let disproves = st.proven_first
                    && matches!(st.phase, Phase::Hold { climb_to: None, .. })
                    && st
                        .decreased_at
                        .is_some_and(|d| sent_at >= d.saturating_add(holdoff / 2))
                    && st.proven.is_some_and(|p| st.applied <= p);
                if !disproves
                    && st
                        .decreased_at
                        .is_some_and(|d| sent_at < d.saturating_add(holdoff))
                {
                    return None;
                }
                self.throttled(&mut st, now, sent_at);
                true
            }
            RateOutcome::ServerLimit { limit, window } => {
                let per_sec = limit as f64 / window.as_secs_f64();
                if limit == 0 || window.is_zero() || st.server == Some((limit, window)) {
                    self.success(&mut st, now, sent_at);
                    false
                } else {
                    self.server_limit(&mut st, now, sent_at, (limit, window), per_sec);
                    true
                }
            }
        };
        let rate = st.target;
        let burst = self.burst(st.server_burst, rate);
        let moved = (rate - st.applied).abs() >= REQUOTA * st.applied;
        if burst != st.applied_burst || (rate != st.applied && (changed || moved || rate == st.cap))
        {
            st.applied = rate;
            st.applied_burst = burst;
            Some(quota_for(rate, burst))
        } else {
            None
        }
    }

    fn success(&self, st: &mut State, now: u64, sent_at: u64) {
        if sent_at < st.epoch_start {
            // From before the last decrease: not this epoch's evidence.
            return;
        }
        if st.epoch.len() == WINDOW {
            st.epoch.pop_front();
        }
        st.epoch.push_back(Sample {
            sent: sent_at,
            recv: now,
        });
        st.epoch_first.get_or_insert(sent_at);
        let cfg = &self.cfg;
        let in_use = st.in_use();
        st.phase = match st.phase {
            Phase::SlowStart => {
                if in_use {
                    st.target += SLOW_START_STEP;
                }
                Phase::SlowStart
            }
            Phase::Climb { .. } | Phase::Approach { .. } | Phase::Probe { .. } if !in_use => {
                // The callers do not use the rate: grow from here later.
                st.phase.rebased(now, st.target)
            }
            Phase::Hold {
                until,
                successes,
                climb_to,
            } => {
                let successes = successes.saturating_sub(1);
                if now < until || successes > 0 {
                    Phase::Hold {
                        until,
                        successes,
                        climb_to,
                    }
                } else if let Some(ceiling) = climb_to {
                    Phase::Climb {
                        since: now,
                        base: st.target,
                        limit: ceiling,
                    }
                } else {
                    Phase::Probe {
                        since: now,
                        base: st.target,
                    }
                }
            }
            Phase::Climb { since, base, limit } => {
                let target = base * (1.0 + CLIMB_GAIN * secs_between(since, now));
                if target >= limit {
                    // Back at the ceiling: from here on, probe.
                    st.target = st.target.max(limit);
                    Phase::Probe {
                        since: now,
                        base: st.target,
                    }
                } else {
                    st.target = st.target.max(target);
                    Phase::Climb { since, base, limit }
                }
            }
            Phase::Approach { since, base, limit } => {
                let target = base * (1.0 + APPROACH_GAIN * secs_between(since, now));
                if target >= limit {
                    st.target = st.target.max(limit);
                    st.proven = Some(limit);
                    st.last_settled = Some(limit);
                    Phase::Hold {
                        until: now.saturating_add(
                            saturating_nanos(cfg.probe_after).saturating_mul(st.backoff as u64),
                        ),
                        successes: PROBE_MIN_SUCCESSES,
                        climb_to: None,
                    }
                } else {
                    st.target = st.target.max(target);
                    Phase::Approach { since, base, limit }
                }
            }
            Phase::Probe { since, base } => {
                let target = base * (1.0 + cfg.probe_gain).powf(secs_between(since, now));
                st.target = st.target.max(target);
                Phase::Probe { since, base }
            }
        };
        st.target = st.target.clamp(cfg.min_rate, st.cap);
    }
}

impl State {
    /// Whether the callers send at a good share of the rate, judged from
    /// the last few successes (yes while there are too few to tell).
    fn in_use(&self) -> bool {
        let n = self.epoch.len().min(USE_WINDOW);
        if n < USE_WINDOW / 2 {
            return true;
        }
        let recent = self.epoch.range(self.epoch.len() - n..);
        let (lo, hi) = recent.fold((u64::MAX, 0), |(lo, hi), s| {
            (lo.min(s.sent), hi.max(s.sent))
        });
        let span = (hi - lo) as f64 / NANOS_PER_SEC;
        (n - 1) as f64 >= IN_USE * self.applied * span
    }
}

impl Phase {
    /// The same growth, restarted from `rate` at `now`.
    fn rebased(self, now: u64, rate: f64) -> Phase {
        match self {
            Phase::Climb { limit, .. } => Phase::Climb {
                since: now,
                base: rate,
                limit,
            },
            Phase::Approach { limit, .. } => Phase::Approach {
                since: now,
                base: rate,
                limit,
            },
            Phase::Probe { .. } => Phase::Probe {
                since: now,
                base: rate,
            },
            other => other,
        }
    }
}

fn secs_between(since: u64, now: u64) -> f64 {
    now.saturating_sub(since) as f64 / NANOS_PER_SEC
}

fn quota_for(rate: f64, burst: NonZeroU32) -> Quota {
    // `rate` is within [ABS_MIN_RATE, ABS_MAX_RATE]: the period is at
    // least 1 ns and at most 10¹² ns.
    let period = (NANOS_PER_SEC / rate).ceil().max(1.0) as u64;
    Quota::with_period(Duration::from_nanos(period)).allow_burst(burst)
}

fn clamp_rate(rate: f64, default: f64) -> f64 {
    clamp_f64(rate, ABS_MIN_RATE, ABS_MAX_RATE, default)
}

impl fmt::Debug for RateController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("RateController")
            .field("rate", &st.applied)
            .field("phase", &st.phase)
            .field("cap", &st.cap)
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn quota_for_keeps_the_fraction() {
        let q = quota_for(4.3, NonZeroU32::MIN);
        assert_eq!(q.period().as_nanos(), 232_558_140);
        assert_eq!(
            quota_for(ABS_MAX_RATE, NonZeroU32::MIN).period().as_nanos(),
            1
        );
        assert_eq!(
            quota_for(ABS_MIN_RATE, NonZeroU32::MIN).period().as_secs(),
            1000
        );
    }
}
