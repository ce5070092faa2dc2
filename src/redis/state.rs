//! A bucket's local half: its lease, breaker, counters, the quota in
//! force beside its own, and the refunds and settles queued for the next
//! round trip.

use std::collections::VecDeque;

use super::breaker::Breaker;
use super::lease::LeaseState;
use super::script::{Bounds, Params, Refund};
use super::{RedisStats, MAX_QUEUED_REFUNDS};
use crate::bucket::Quota;

/// The local half, behind one short-held mutex.
#[derive(Debug)]
pub(super) struct State {
    pub(super) lease: LeaseState,
    pub(super) breaker: Breaker,
    pub(super) stats: RedisStats,
    /// The quota in force: the key's stored one within `bounds()` once a
    /// reply carried it, else `own`.
    pub(super) quota: Quota,
    pub(super) params: Params,
    /// This process's own quota (built with, or last set itself). Sent with
    /// every call, and in force whenever the key states none.
    pub(super) own: Quota,
    pub(super) own_params: Params,
    /// The quota it was built with: with `own`, the ceiling a stored
    /// quota is taken under.
    pub(super) configured: Params,
    /// Refunds of reservations dropped unused, for the next round trip.
    pub(super) refunds: VecDeque<Refund>,
    /// Settles (`+n` charged, `-n` given back) by sequence number, sent
    /// with every round trip until one succeeds: the script applies each
    /// sequence number of this `writer` once.
    pub(super) settles: VecDeque<(u64, i64)>,
    pub(super) writer: u64,
    next_settle: u64,
    /// Bumped by `reset` and `set_quota`: reservations taken before no
    /// longer queue refunds (their `after` is gone from the key).
    pub(super) generation: u64,
}

impl State {
    pub(super) fn new(quota: Quota, params: Params, probe_interval: u64) -> Self {
        State {
            lease: LeaseState::default(),
            breaker: Breaker::new(probe_interval),
            stats: RedisStats::default(),
            quota,
            params,
            own: quota,
            own_params: params,
            configured: params,
            refunds: VecDeque::new(),
            settles: VecDeque::new(),
            writer: fastrand::u64(..),
            next_settle: 1,
            generation: 0,
        }
    }

    /// Queues a settle of `delta` cells (bounded: the oldest goes first,
    /// lost, as a settle never sent is).
    pub(super) fn queue_settle(&mut self, delta: i64) {
        if self.settles.len() >= MAX_QUEUED_REFUNDS {
            self.settles.pop_front();
        }
        self.settles.push_back((self.next_settle, delta));
        self.next_settle += 1;
    }

    /// Forgets the settles up to `seq`: a reply says they are applied.
    pub(super) fn settled(&mut self, seq: u64) {
        while self.settles.front().is_some_and(|(s, _)| *s <= seq) {
            self.settles.pop_front();
        }
    }

    /// Queues the refund of a dropped reservation (bounded: the oldest
    /// goes first).
    pub(super) fn queue_refund(&mut self, refund: Refund) {
        if self.refunds.len() >= MAX_QUEUED_REFUNDS {
            self.refunds.pop_front();
        }
        self.refunds.push_back(refund);
    }

    /// The queued refunds, highest `after` first (the order that unwinds
    /// a stack of them in one pass).
    pub(super) fn take_refunds(&mut self) -> Vec<Refund> {
        if self.refunds.is_empty() {
            return Vec::new();
        }
        let mut refunds: Vec<Refund> = self.refunds.drain(..).collect();
        refunds.sort_unstable_by_key(|r| core::cmp::Reverse(r.after));
        refunds
    }

    /// What a stored quota is taken within (see *Bounds* in `script.rs`).
    pub(super) fn bounds(&self) -> Bounds {
        Bounds::new(self.configured, self.own_params)
    }

    /// Makes `quota` this process's own (a limit it was told); the one in
    /// force follows with the next reply.
    pub(super) fn set_own(&mut self, quota: Quota, params: Params) {
        self.own = quota;
        self.own_params = params;
    }

    /// Takes the quota Redis says is in force: the own one exact to the
    /// nanosecond, any other as the script has it (µs).
    pub(super) fn adopt(&mut self, params: Params) {
        self.params = params;
        self.quota = if params == self.own_params {
            self.own
        } else {
            Quota {
                period: params.period_us.saturating_mul(1000),
                burst: core::num::NonZeroU32::new(params.burst)
                    .unwrap_or(core::num::NonZeroU32::MIN),
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply forgets the settles it carried, and only those.
    #[test]
    fn a_reply_forgets_the_settles_it_carried() {
        let quota = Quota::per_second(core::num::NonZeroU32::MIN);
        let params = Params {
            period_us: 1_000_000,
            burst: 1,
        };
        let mut state = State::new(quota, params, 0);
        for delta in [5, -2, 7] {
            state.queue_settle(delta);
        }
        state.settled(2);
        assert_eq!(state.settles, [(3, 7)]);
        state.settled(3);
        assert!(state.settles.is_empty());
    }
}
