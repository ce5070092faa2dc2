//! Leasing: cells taken from Redis ahead of need and handed out locally
//! (see *Leasing* on [`RedisBucket`](super::RedisBucket)).

use super::RedisBucket;

/// The lease configuration.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lease {
    /// Cells per round trip, at most the burst.
    pub(super) size: u32,
    /// Nanoseconds on the bucket's clock.
    pub(super) ttl: u64,
}

/// This process's leased cells. Lives in the bucket's state mutex.
#[derive(Debug, Default)]
pub(super) struct LeaseState {
    /// Leased cells not handed out yet.
    leased: u32,
    /// When they expire, on the bucket's clock.
    expires: u64,
    /// Cells to give back with the next round trip (expired, or over the
    /// lease size after two concurrent refills).
    give_back: u32,
}

impl LeaseState {
    /// Takes `n` cells if the lease is live and holds that many.
    #[inline]
    fn take(&mut self, n: u32, now: u64) -> bool {
        if self.leased >= n && now < self.expires {
            self.leased -= n;
            true
        } else {
            false
        }
    }

    /// Leased cells usable at `now`.
    fn live(&self, now: u64) -> u32 {
        if now < self.expires {
            self.leased
        } else {
            0
        }
    }

    /// Empties the lease into the give-back count and returns that count
    /// (taken: the caller sends it). With `all == false`, a live lease is
    /// kept.
    fn drain(&mut self, all: bool, now: u64) -> u32 {
        if all || now >= self.expires {
            self.give_back = self.give_back.saturating_add(self.leased);
            self.leased = 0;
        }
        core::mem::take(&mut self.give_back)
    }

    /// Puts `n` unused cells back: into a live lease, else into the
    /// give-back count.
    fn put_back(&mut self, n: u32, now: u64) {
        if now < self.expires {
            self.leased += n;
        } else {
            self.give_back = self.give_back.saturating_add(n);
        }
    }

    /// Keeps up to the lease size of `extra` cells Redis just granted, for
    /// `lease.ttl` from `now`; the rest goes back with the next round trip.
    pub(super) fn refill(&mut self, lease: Lease, extra: u32, now: u64) {
        let keep = extra.min(lease.size.saturating_sub(self.leased));
        self.leased += keep;
        self.give_back = self.give_back.saturating_add(extra - keep);
        self.expires = now.saturating_add(lease.ttl);
    }
}

impl RedisBucket {
    /// Takes `n` cells from a live lease.
    #[inline]
    pub(super) fn take_leased(&self, n: u32) -> bool {
        if self.lease.is_none() {
            return false;
        }
        let now = self.clock.now_nanos();
        let mut state = self.state.lock();
        if state.lease.take(n, now) {
            state.stats.admitted += n as u64;
            state.stats.leased += n as u64;
            true
        } else {
            false
        }
    }

    /// Leased cells usable now.
    pub(super) fn valid_leased(&self) -> u32 {
        let now = self.clock.now_nanos();
        self.state.lock().lease.live(now)
    }

    /// As `LeaseState::drain`.
    pub(super) fn drain_lease(&self, all: bool) -> u32 {
        let now = self.clock.now_nanos();
        self.state.lock().lease.drain(all, now)
    }

    /// Puts `n` cells of a cancelled leased reservation back.
    pub(crate) fn unlease(&self, n: u32) {
        let now = self.clock.now_nanos();
        let mut state = self.state.lock();
        state.stats.admitted = state.stats.admitted.saturating_sub(n as u64);
        state.stats.leased = state.stats.leased.saturating_sub(n as u64);
        state.lease.put_back(n, now);
    }
}
