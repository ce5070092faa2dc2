//! Unit tests of the limiter's shared state.
use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};

use super::*;
use crate::adaptive::{AdaptiveLimiter, Aimd};
use crate::ManualClock;

/// Jumps to `on_success` after a success and to `on_drop` after a drop.
#[derive(Debug)]
struct Script {
    limit: usize,
    on_success: usize,
    on_drop: usize,
}

impl LimitAlgorithm for Script {
    fn limit(&self) -> usize {
        self.limit
    }
    fn update(&mut self, sample: &Sample) -> usize {
        match sample.outcome() {
            Outcome::Success => self.limit = self.on_success,
            Outcome::Dropped => self.limit = self.on_drop,
            Outcome::Ignored => {}
        }
        self.limit
    }
}

fn scripted(limit: usize, on_success: usize, on_drop: usize) -> AdaptiveLimiter {
    let script = Script {
        limit,
        on_success,
        on_drop,
    };
    AdaptiveLimiter::with_clock(script, ManualClock::new())
}

/// `available == limit` with nothing held, and no excess left over.
fn assert_quiescent(l: &AdaptiveLimiter) {
    assert_eq!(l.in_flight(), 0);
    assert_eq!(l.excess(), 0);
    assert_eq!(l.available(), l.limit());
}

#[test]
fn handles_cross_threads_and_tasks() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<AdaptiveLimiter>();
    send_sync::<crate::adaptive::AdaptivePermit>();
    send::<crate::adaptive::limiter::AdaptiveAcquire>();
}

#[test]
fn shrink_forgets_free_permits_first_then_withholds() {
    let l = scripted(4, 4, 1);
    let p = l.try_acquire().unwrap();
    let q = l.try_acquire().unwrap();
    q.dropped();
    // 4 -> 1: two free permits forgotten at once, q's own withheld.
    assert_eq!((l.limit(), l.available(), l.excess()), (1, 0, 0));
    assert_eq!(l.in_flight(), 1);
    drop(p);
    assert_quiescent(&l);
}

#[test]
fn resize_keeps_fifo_order_of_waiters() {
    let l = scripted(3, 3, 1);
    let a = l.try_acquire().unwrap();
    let b = l.try_acquire().unwrap();
    let c = l.try_acquire().unwrap();
    let mut w1 = pin!(l.acquire());
    let mut w2 = pin!(l.acquire());
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(w1.as_mut().poll(cx).is_pending());
    assert!(w2.as_mut().poll(cx).is_pending());
    a.dropped(); // 3 -> 1: nothing free, so a and b are withheld
    assert_eq!((l.limit(), l.excess()), (1, 1));
    drop(b);
    assert_eq!(l.excess(), 0);
    assert!(
        w1.as_mut().poll(cx).is_pending(),
        "a withheld permit leaked"
    );
    drop(c); // released: to the oldest waiter
    let Poll::Ready(Ok(p1)) = w1.as_mut().poll(cx) else {
        panic!("w1 must be served first");
    };
    assert!(w2.as_mut().poll(cx).is_pending());
    p1.success(); // 1 -> 3: the new permits go to w2 first
    let Poll::Ready(Ok(p2)) = w2.as_mut().poll(cx) else {
        panic!("w2 must be served by the growth");
    };
    assert_eq!((l.limit(), l.in_flight(), l.available()), (3, 1, 2));
    drop(p2);
    assert_quiescent(&l);
}

#[test]
fn grow_cancels_excess_before_adding_permits() {
    let l = scripted(3, 3, 1);
    let a = l.try_acquire().unwrap();
    let b = l.try_acquire().unwrap();
    let c = l.try_acquire().unwrap();
    a.dropped(); // 3 -> 1, a withheld, one more owed
    assert_eq!(l.excess(), 1);
    b.success(); // 1 -> 3: the owed one is un-marked, one permit added
    assert_eq!(l.excess(), 0);
    assert_eq!((l.limit(), l.available()), (3, 2));
    drop(c);
    assert_quiescent(&l);
}

#[test]
fn proposals_are_clamped_into_one_to_max_limit() {
    let l = scripted(0, usize::MAX, 0);
    assert_eq!(l.limit(), 1);
    l.try_acquire().unwrap().dropped();
    assert_eq!(l.limit(), 1);
    assert_quiescent(&l);
    l.try_acquire().unwrap().success();
    assert_eq!(l.limit(), MAX_LIMIT);
    assert_quiescent(&l);
}

/// 8 requests in flight together all get a 429: AIMD halves once, not 8 times.
#[test]
fn eight_concurrent_429s_through_the_limiter_halve_once() {
    let clock = ManualClock::new();
    let aimd = Aimd::new().with_limits(1, 64, 100).with_backoff(0.5);
    let l = AdaptiveLimiter::with_clock(aimd, clock.clone());
    let permits: Vec<_> = (0..8).map(|_| l.try_acquire().unwrap()).collect();
    clock.advance(core::time::Duration::from_millis(50));
    for p in permits {
        p.dropped();
    }
    assert_eq!(l.limit(), 32);
    // A request sent after the decrease that also gets a 429: again.
    clock.advance(core::time::Duration::from_millis(1));
    let p = l.try_acquire().unwrap();
    clock.advance(core::time::Duration::from_millis(50));
    p.dropped();
    assert_eq!(l.limit(), 16);
    assert_quiescent(&l);
}

/// A drop that finds the algorithm busy is applied by the holder before it unlocks.
#[test]
fn lost_race_drop_signal_is_not_lost() {
    let l = AdaptiveLimiter::with_clock(
        Aimd::new().with_limits(1, 10, 100).with_backoff(0.5),
        ManualClock::new(),
    );
    let shared = &l.shared;
    // Another thread "holds" the algorithm.
    shared.ctl.store(LOCKED, Ordering::Relaxed);
    let p = l.try_acquire().unwrap();
    let q = l.try_acquire().unwrap();
    p.dropped();
    q.dropped();
    assert_eq!(l.limit(), 10, "applied while the lock was held");
    assert_eq!(shared.ctl.load(Ordering::Relaxed), LOCKED | DIRTY);
    // The holder finishes: its unlock sees DIRTY and drains.
    shared.run_locked(None);
    assert_eq!(shared.ctl.load(Ordering::Relaxed), 0);
    assert_eq!(l.limit(), 5, "two drops of one round trip: one halving");
    assert_quiescent(&l);
}

/// Ten successes merged under contention at limit 10 count as one round trip (+1).
#[test]
fn merged_successes_keep_their_count() {
    let l = AdaptiveLimiter::with_clock(Aimd::new().with_limits(1, 10, 100), ManualClock::new());
    let permits: Vec<_> = (0..10).map(|_| l.try_acquire().unwrap()).collect();
    l.shared.ctl.store(LOCKED, Ordering::Relaxed);
    for p in permits {
        p.success();
    }
    l.shared.run_locked(None);
    assert_eq!(l.limit(), 11);
    assert_quiescent(&l);
}

/// Panics on a drop.
#[derive(Debug)]
struct Fragile(usize);

impl LimitAlgorithm for Fragile {
    fn limit(&self) -> usize {
        self.0
    }
    fn update(&mut self, sample: &Sample) -> usize {
        assert_ne!(sample.outcome(), Outcome::Dropped, "fragile");
        self.0 += 1;
        self.0
    }
}

#[test]
fn panicking_algorithm_still_returns_the_permit_and_unlocks() {
    let l = AdaptiveLimiter::with_clock(Fragile(2), ManualClock::new());
    let p = l.try_acquire().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.dropped()));
    assert!(r.is_err());
    assert_eq!(l.shared.ctl.load(Ordering::Relaxed), 0, "lock left held");
    assert_quiescent(&l);
    l.try_acquire().unwrap().success();
    assert_eq!(l.limit(), 3, "later samples are still applied");
    assert_quiescent(&l);
}

#[test]
fn close_fails_waiters_but_held_permits_still_record() {
    let l = scripted(1, 1, 1);
    let held = l.try_acquire().unwrap();
    let mut w = pin!(l.acquire());
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(w.as_mut().poll(cx).is_pending());
    l.close();
    assert!(matches!(w.as_mut().poll(cx), Poll::Ready(Err(_))));
    held.success();
    assert_eq!(l.in_flight(), 0);
}

/// Random outcomes from many threads: afterwards every permit is accounted for.
#[test]
fn threads_resize_and_return_without_losing_permits() {
    let iters = if cfg!(miri) { 30 } else { 3_000 };
    let aimd = Aimd::new().with_limits(1, 4, 16).with_backoff(0.5);
    let l = AdaptiveLimiter::with_clock(aimd, ManualClock::new());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let l = l.clone();
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t);
                for _ in 0..iters {
                    let p = if rng.bool() {
                        futures::executor::block_on(l.acquire()).unwrap()
                    } else {
                        match l.try_acquire() {
                            Ok(p) => p,
                            Err(_) => continue,
                        }
                    };
                    match rng.u8(0..10) {
                        0 => p.dropped(),
                        1 => drop(p),
                        _ => p.success(),
                    }
                }
            });
        }
    });
    let limit = l.limit();
    assert!((1..=16).contains(&limit));
    assert_quiescent(&l);
}
