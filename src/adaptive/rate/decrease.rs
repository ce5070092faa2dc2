//! What a 429 and a server's stated limit do to the rate: the bounds a
//! 429 proves, the new rate and the phase that follows it.

use super::bounds::{bounds, Sample};
use super::{
    clamp_rate, Phase, RateController, State, AGAIN, MAX_PROBE_BACKOFF, MAX_SERVER_BURST,
    MAX_TRIAL, MIN_CUT, NANOS_PER_SEC, PROBE_MIN_SUCCESSES, RTTS, SETTLED,
};
use crate::clock::saturating_nanos;
use core::time::Duration;

impl RateController {
    pub(super) fn throttled(&self, st: &mut State, now: u64, sent_at: u64) {
        let cfg = &self.cfg;
        // The rate in force when the request left (or just after).
        let refused = st.applied;
        if matches!(
            st.phase,
            Phase::Hold { climb_to: None, .. } | Phase::Approach { .. }
        ) && st.proven.is_some_and(|p| refused <= p)
        {
            // Refused at a rate the floor had proven: the server's burst is larger
            // than assumed. One cell more first, then doubling.
            st.server_burst = if st.server_burst == self.cfg.server_burst {
                st.server_burst.saturating_add(1)
            } else {
                st.server_burst.saturating_mul(2)
            }
            .min(MAX_SERVER_BURST);
        }
        let b = st.server_burst as f64;
        let idle = match (st.decreased_at, st.epoch_first) {
            (Some(d), Some(first)) => first.saturating_sub(d),
            _ => u64::MAX,
        };
        let seen = &st.rtts[..(st.replies as usize).min(RTTS)];
        let spread = seen.iter().max().unwrap_or(&0) - seen.iter().min().unwrap_or(&0);
        let refusal = Sample {
            sent: sent_at,
            recv: now,
        };
        let epoch = st.epoch.make_contiguous();
        let (floor, ceiling) = bounds(epoch, refusal, b, refused, idle, spread);
        let ceiling = ceiling.min(refused);
        // Settled: the bounds agree, or the floor came out the same twice
        // (when the ceiling could not be trusted).
        let again = st
            .last_floor
            .is_some_and(|f| (floor - f).abs() <= AGAIN * f);
        let settled = floor > 0.0 && (floor >= SETTLED * ceiling || again);
        if floor > 0.0 {
            st.last_floor = Some(floor);
        }
        let guess = cfg.decrease * ceiling;
        let mut rate = floor.max(guess).min(refused * (1.0 - MIN_CUT));
        rate = rate.clamp(cfg.min_rate, st.cap);
        st.proven = (floor >= guess && rate <= floor).then_some(rate);
        // The same successes read with one more cell of burst (nginx's
        // `burst=b` passes b + 1 at once). When that floor is close, start from
        // it and approach the other slowly. Only out of slow start.
        let from_slow_start = matches!(st.phase, Phase::SlowStart);
        let wary = (settled && st.proven.is_some() && from_slow_start)
            .then(|| bounds(epoch, refusal, b + 1.0, refused, idle, spread).0)
            .filter(|&f| f >= SETTLED * rate && f < rate)
            .map(|f| f.clamp(cfg.min_rate, st.cap));
        let probe_after = saturating_nanos(cfg.probe_after);
        st.phase = if let Some(wary) = wary {
            // `proven` stays the floor read with the assumed burst: a 429
            // at or below it on the way says the burst is larger.
            let limit = rate;
            rate = wary;
            Phase::Approach {
                since: now,
                base: wary,
                limit,
            }
        } else if settled {
            // A probe that found the same limit again: probe less often.
            if st
                .last_settled
                .is_some_and(|last| (rate - last).abs() <= 0.1 * last)
            {
                st.backoff = (st.backoff * 2).min(MAX_PROBE_BACKOFF);
            } else {
                st.backoff = 1;
            }
            st.last_settled = Some(rate);
            Phase::Hold {
                until: now.saturating_add(probe_after.saturating_mul(st.backoff as u64)),
                successes: PROBE_MIN_SUCCESSES,
                climb_to: None,
            }
        } else if st.epoch.is_empty() {
            // Nothing got through since the last decrease (exhausted quota,
            // outage): what was learned is stale. Start over.
            st.last_settled = None;
            Phase::SlowStart
        } else {
            // A guess: hold long enough for a too-high guess to draw its 429,
            // then climb halfway back to the ceiling.
            st.last_settled = None;
            let trial = ((2.0 * b + 2.0) / rate).min(MAX_TRIAL);
            Phase::Hold {
                until: now.saturating_add((trial * NANOS_PER_SEC) as u64),
                successes: 0,
                climb_to: Some((rate + ceiling) / 2.0),
            }
        };
        st.proven_first = st.proven.is_some() && from_slow_start;
        st.target = rate;
        st.decreased_at = Some(now);
        st.epoch_start = now;
        st.epoch.clear();
        st.epoch_first = None;
    }

    pub(super) fn server_limit(
        &self,
        st: &mut State,
        now: u64,
        sent_at: u64,
        numbers: (u64, Duration),
        per_sec: f64,
    ) {
        let cfg = &self.cfg;
        let cap = clamp_rate(per_sec, cfg.max_rate).clamp(cfg.min_rate, cfg.max_rate);
        st.server = Some(numbers);
        st.proven = None;
        st.cap = cap;
        st.target = cap;
        st.phase = Phase::Hold {
            until: u64::MAX,
            successes: 0,
            climb_to: None,
        };
        self.success(st, now, sent_at);
    }
}
