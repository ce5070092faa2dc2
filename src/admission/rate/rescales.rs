//! Changes of a learned rate that reach calls already sleeping towards a
//! cell: the bucket rescales queued cells, the change is logged here, and
//! each sleeper is woken to move its instant the same way. Invariant:
//! every such sleeper must follow, or it would send one request too many.

use std::collections::VecDeque;
use std::task::Waker;

// From `crate::sync`, so the log's loom model runs this protocol
// (`loom-tests/rescales.rs`).
use crate::sync::{AtomicU64, Mutex, Ordering};

use core::task::Poll;
use core::time::Duration;

use crate::admission::Admission;
use crate::bucket::gcra::{epoch_distance, Rescale, EPOCH_HALF};
use crate::clock::Clock;
use crate::sleep::Sleeper;

/// Changes kept; a sleeper that misses more than this while unpolled keeps
/// its earlier instant.
const LOG: usize = 64;

/// One credential's learned rate changes.
pub(crate) struct Rescales {
    /// Changes ever logged: a sleeper that saw this count is up to date.
    logged: AtomicU64,
    log: Mutex<VecDeque<Rescale>>,
    /// The calls sleeping towards a cell, by sleeper id, woken (and dropped)
    /// by the next change; a sleep that ends takes its entry back.
    wakers: Mutex<Vec<(u64, Waker)>>,
}

impl Default for Rescales {
    fn default() -> Self {
        Self {
            logged: AtomicU64::new(0),
            log: Mutex::new(VecDeque::new()),
            wakers: Mutex::new(Vec::new()),
        }
    }
}

/// Names each sleep on a log, so it can take its waker back (std's: only
/// a name, and a loom atomic cannot be a static).
static SLEEPERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A sleep on some logs: on drop, its wakers leave them.
struct Asleep<'t, 'r> {
    turns: &'t mut [(&'r Rescales, Turn)],
    id: u64,
}

impl Drop for Asleep<'_, '_> {
    fn drop(&mut self) {
        for (log, _) in self.turns.iter() {
            log.forget(self.id);
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Turn {
    /// When its cell may be used, on the bucket's clock.
    pub(crate) ready_at: u64,
    /// The bucket epoch its cell was reserved under, or moved to.
    epoch: u32,
    seen: u64,
}

impl Rescales {
    pub(crate) fn push(&self, change: Rescale) {
        for waker in self.log_change(change) {
            waker.wake();
        }
    }

    /// Logs `change`; returns the sleepers' wakers, to wake once no lock is held.
    #[must_use = "the sleepers must be woken"]
    pub(crate) fn log_change(&self, change: Rescale) -> Vec<Waker> {
        {
            let mut log = self.log.lock();
            if log.len() == LOG {
                log.pop_front();
            }
            log.push_back(change);
            // Release: pairs with the Acquire in `changed`; the lock orders
            // the log itself.
            self.logged.fetch_add(1, Ordering::Release);
        }
        // After the count: a sleeper registering from now sees it (`changed`
        // reads it under this lock); one registered before is woken.
        let wakers = core::mem::take(&mut *self.wakers.lock());
        wakers.into_iter().map(|(_, w)| w).collect()
    }

    /// Whether a change was logged since `turn` last caught up; if not,
    /// `waker` replaces sleeper `id`'s waker for the next one.
    pub(crate) fn changed(&self, turn: &Turn, id: u64, waker: &Waker) -> bool {
        let mut wakers = self.wakers.lock();
        // Acquire: see `push`. Read under the lock `push` drains under, so
        // a change counted after this read wakes the waker pushed here.
        if self.logged.load(Ordering::Acquire) != turn.seen {
            return true;
        }
        match wakers.iter_mut().find(|(of, _)| *of == id) {
            Some((_, w)) => w.clone_from(waker),
            None => wakers.push((id, waker.clone())),
        }
        false
    }

    fn forget(&self, id: u64) {
        let mut wakers = self.wakers.lock();
        if let Some(i) = wakers.iter().position(|(of, _)| *of == id) {
            wakers.swap_remove(i);
        }
    }

    #[cfg(all(test, not(feature = "loom")))]
    pub(crate) fn sleepers(&self) -> usize {
        self.wakers.lock().len()
    }

    pub(crate) fn turn(&self, ready_at: u64, epoch: u32) -> Turn {
        Turn {
            ready_at,
            epoch,
            // Not a count yet: the first `catch_up` reads the log, and the epochs
            // tell which changes came after the cell.
            seen: u64::MAX,
        }
    }

    /// Moves `turn` by every change after its cell's epoch; whether it moved.
    pub(crate) fn catch_up(&self, turn: &mut Turn) -> bool {
        // Acquire: see `push`.
        let logged = self.logged.load(Ordering::Acquire);
        if logged == turn.seen {
            return false;
        }
        let before = turn.ready_at;
        for change in self.log.lock().iter() {
            if after(change.epoch, turn.epoch) {
                turn.ready_at = change.moved(turn.ready_at);
                turn.epoch = change.epoch;
            }
        }
        turn.seen = logged;
        turn.ready_at != before
    }
}

/// How a sleep towards a turn that may move ended.
pub(super) enum Slept {
    /// At the turn's instant.
    To(u64),
    /// The layer closed.
    Closed,
    /// A cut moved the turn past the call's deadline.
    PastDeadline,
}

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// Sleeps towards the latest of `turns` (cells whose rate may change) and
    /// `others_at`, moving each turn by every logged change. Returns the
    /// instant slept to, or why it stopped: closed, or a cut moved a turn past
    /// `deadline_at`. A cut may stretch a wait past the inline threshold: the
    /// threshold is a preference, the deadline a promise.
    pub(super) async fn sleep_turns(
        &self,
        turns: &mut [(&Rescales, Turn)],
        others_at: u64,
        planned: u64,
        deadline_at: u64,
    ) -> Slept {
        let inner = &*self.inner;
        let mut ready_at = planned;
        // Relaxed: a name, unique by the atomic add alone.
        let id = SLEEPERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let asleep = Asleep { turns, id };
        loop {
            let now = inner.clock.now_nanos();
            if now >= ready_at {
                return Slept::To(ready_at);
            }
            if ready_at > deadline_at {
                return Slept::PastDeadline;
            }
            let mut sleep =
                core::pin::pin!(inner.sleeper.sleep(Duration::from_nanos(ready_at - now)));
            let mut closed = core::pin::pin!(inner.closed_signal.acquire());
            let woke = core::future::poll_fn(|cx| {
                // The signal never has a permit: it completes only when closed.
                if closed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                if asleep
                    .turns
                    .iter()
                    .any(|(log, turn)| log.changed(turn, id, cx.waker()))
                {
                    return Poll::Ready(Some(false));
                }
                sleep.as_mut().poll(cx).map(|()| Some(true))
            })
            .await;
            match woke {
                None => return Slept::Closed,
                Some(true) => return Slept::To(ready_at),
                Some(false) => {}
            }
            ready_at = others_at;
            for (log, turn) in asleep.turns.iter_mut() {
                log.catch_up(turn);
                ready_at = ready_at.max(turn.ready_at);
            }
        }
    }
}

/// Whether epoch `a` comes after `b` (by less than half the circle).
fn after(a: u32, b: u32) -> bool {
    let d = epoch_distance(a, b);
    d != 0 && d < EPOCH_HALF
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn change(at: u64, old_ms: u64, new_ms: u64, epoch: u32) -> Rescale {
        Rescale {
            at: at * MS,
            old_period: old_ms * MS,
            new_period: new_ms * MS,
            epoch,
        }
    }

    /// No waker of a finished or cancelled sleeper stays in the log.
    #[test]
    fn no_waker_of_a_finished_or_cancelled_sleeper_stays_in_the_log() {
        use crate::admission::{Admission, CallSpec};
        use crate::clock::ManualClock;
        use core::future::Future;
        use core::task::Context;

        let clock = ManualClock::new();
        let admission = Admission::builder()
            .clock(clock.clone())
            .sleeper(clock.clone())
            .build();
        let spec = CallSpec::new("search", "k").deadline(Duration::from_secs(60));
        // A waker of its own per call (one waker would register once anyway).
        struct Own;
        impl futures::task::ArcWake for Own {
            fn wake_by_ref(_: &std::sync::Arc<Self>) {}
        }
        let waker = || futures::task::waker(std::sync::Arc::new(Own));
        let log = |a: &Admission<ManualClock, ManualClock>| {
            a.inner.rates.credential("k", 0).rescales.sleepers()
        };
        let mut first = Box::pin(admission.admit(&spec));
        let Poll::Ready(Ok(first)) = first.as_mut().poll(&mut Context::from_waker(&waker())) else {
            panic!("the first call is admitted at once");
        };
        drop(first);

        // Three calls asleep towards their cells, then dropped.
        let mut asleep: Vec<_> = (0..3).map(|_| Box::pin(admission.admit(&spec))).collect();
        for call in &mut asleep {
            assert!(call
                .as_mut()
                .poll(&mut Context::from_waker(&waker()))
                .is_pending());
        }
        assert_eq!(log(&admission), 3);
        drop(asleep);
        assert_eq!(log(&admission), 0, "cancelled sleepers keep their wakers");

        // One asleep until its timer fires, polled twice on the way.
        let mut call = Box::pin(admission.admit(&spec));
        let own = waker();
        let mut cx = Context::from_waker(&own);
        assert!(call.as_mut().poll(&mut cx).is_pending());
        assert!(call.as_mut().poll(&mut cx).is_pending());
        assert_eq!(log(&admission), 1, "a sleeper polled again registers once");
        clock.advance(Duration::from_secs(10));
        assert!(matches!(call.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
        assert_eq!(
            log(&admission),
            0,
            "a sleeper whose timer fired keeps its waker"
        );
    }

    #[test]
    fn a_turn_moves_by_the_changes_after_its_epoch_only() {
        let changes = Rescales::default();
        let mut early = changes.turn(800 * MS, 3);
        changes.push(change(0, 100, 50, 4));
        let mut late = changes.turn(500 * MS, 4);
        changes.push(change(100, 50, 25, 5));
        assert!(changes.catch_up(&mut early));
        // 8 cells at 100 ms → 400 ms at 50 ms, then 6 past 100 ms at 25 ms → 250.
        assert_eq!(early.ready_at, 250 * MS);
        assert!(changes.catch_up(&mut late));
        assert_eq!(late.ready_at, 300 * MS);
        // Nothing new: nothing moves.
        assert!(!changes.catch_up(&mut early));
        assert_eq!(early.ready_at, 250 * MS);
    }

    #[test]
    fn a_cut_moves_a_turn_later() {
        let changes = Rescales::default();
        let mut turn = changes.turn(300 * MS, 1);
        changes.push(change(100, 50, 100, 2));
        assert!(changes.catch_up(&mut turn));
        assert_eq!(turn.ready_at, 500 * MS);
    }

    #[test]
    fn an_instant_before_the_change_stays() {
        let changes = Rescales::default();
        let mut turn = changes.turn(80 * MS, 1);
        changes.push(change(100, 100, 10, 2));
        assert!(!changes.catch_up(&mut turn));
        assert_eq!(turn.ready_at, 80 * MS);
    }

    #[test]
    fn a_change_that_fell_out_of_the_log_leaves_the_turn_where_it_was() {
        let changes = Rescales::default();
        let mut turn = changes.turn(10_000 * MS, 0);
        changes.push(change(0, 100, 50, 1));
        for e in 2..=(LOG as u32 + 1) {
            changes.push(change(0, 100, 100, e));
        }
        // The change that would have moved it is gone: it stays, never earlier.
        changes.catch_up(&mut turn);
        assert_eq!(turn.ready_at, 10_000 * MS);
        assert!(after(0, crate::bucket::gcra::EPOCH_MAX));
        assert!(!after(crate::bucket::gcra::EPOCH_MAX, 0));
        assert!(!after(7, 7));
    }
}
