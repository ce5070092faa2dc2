//! Unit tests of the shard bookkeeping that the public API cannot see.

use std::time::Duration;

use super::shard::Shard;
use super::SingleFlight;
use crate::ManualClock;

type Map = SingleFlight<u32, u32, std::convert::Infallible, ManualClock>;

fn map(max: usize) -> Map {
    SingleFlight::builder()
        .shards(1)
        .cache(Duration::from_secs(60), max)
        .clock(ManualClock::new())
        .build()
}

fn run(m: &Map, k: u32) {
    crate::park::block_on(m.run(k, || async move { k })).unwrap();
}

fn with_shard<R>(m: &Map, f: impl FnOnce(&Shard<u32, u32, std::convert::Infallible>) -> R) -> R {
    f(&m.shards[0].lock())
}

#[test]
fn invalidate_churn_keeps_stale_records_bounded() {
    let m = map(4);
    for round in 0..1_000 {
        run(&m, round % 3);
        m.invalidate(&(round % 3));
        let records = with_shard(&m, |s| s.records_len());
        assert!(
            records <= 2 * 4 + 16 + 1,
            "round {round}: {records} records"
        );
    }
    assert_eq!(with_shard(&m, |s| s.cached()), 0);
}

#[test]
fn cached_count_matches_the_table() {
    let m = map(8);
    for k in 0..20 {
        run(&m, k);
        if k % 5 == 0 {
            m.forget(&k);
        }
    }
    let (cached, len) = with_shard(&m, |s| (s.cached(), s.len()));
    assert_eq!(cached, len);
    assert_eq!(cached, 8);
    m.clear();
    assert_eq!(
        with_shard(&m, |s| (s.cached(), s.len(), s.records_len())),
        (0, 0, 0)
    );
}

#[test]
fn shard_count_is_a_power_of_two() {
    let huge = if cfg!(miri) {
        (64, 64)
    } else {
        (usize::MAX, 1 << 16)
    };
    for (asked, got) in [(0, 1), (1, 1), (3, 4), (64, 64), huge] {
        let m: SingleFlight<u8, u8, std::convert::Infallible, ManualClock> =
            SingleFlight::builder()
                .shards(asked)
                .clock(ManualClock::new())
                .build();
        assert_eq!(m.shards.len(), got);
        assert_eq!(m.mask, got - 1);
    }
}

/// `record_bound` saturates for an unbounded cache.
#[test]
fn record_bound_overflow_with_unbounded_cache_neither_panics_nor_compacts_every_insert() {
    assert_eq!(super::shard::record_bound(usize::MAX), usize::MAX);
    assert_eq!(super::shard::record_bound(usize::MAX / 2 + 1), usize::MAX);
    assert_eq!(super::shard::record_bound(4), 2 * 4 + 16);
    for shards in [1, 2] {
        let m: Map = SingleFlight::builder()
            .shards(shards)
            .cache(Duration::from_secs(60), usize::MAX)
            .clock(ManualClock::new())
            .build();
        let records = |m: &Map| -> usize { m.shards.iter().map(|s| s.lock().records_len()).sum() };
        for k in 0..20 {
            run(&m, k);
        }
        for k in 0..10 {
            assert!(m.invalidate(&k));
        }
        run(&m, 100);
        assert_eq!(records(&m), 21, "{shards} shard(s): the stale records stay");
        assert_eq!(m.len(), 11);
    }
}

/// A `V::clone` that panics on a cache hit leaves the shard usable.
#[test]
fn a_panicking_clone_on_a_cache_hit_leaves_the_shard_usable() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static PANIC: AtomicBool = AtomicBool::new(false);
    #[derive(Debug)]
    struct Touchy(u32);
    impl Clone for Touchy {
        fn clone(&self) -> Self {
            if PANIC.load(Ordering::Relaxed) {
                panic!("clone failed");
            }
            Touchy(self.0)
        }
    }
    let m: SingleFlight<u32, Touchy, std::convert::Infallible, ManualClock> =
        SingleFlight::builder()
            .shards(1)
            .cache(Duration::from_secs(60), 4)
            .clock(ManualClock::new())
            .build();
    crate::park::block_on(m.run(1, || async { Touchy(7) })).unwrap();
    PANIC.store(true, Ordering::Relaxed);
    let hit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::park::block_on(m.run(1, || async { Touchy(0) }))
    }));
    assert!(hit.is_err());
    PANIC.store(false, Ordering::Relaxed);
    assert_eq!(m.len(), 1);
    let (v, how) = crate::park::block_on(m.run(1, || async { Touchy(0) })).unwrap();
    assert_eq!(v.0, 7);
    assert_eq!(how, crate::single_flight::Provenance::Cached);
}

/// Every way a follower ends drops the waker its node took.
#[test]
fn every_waker_a_follower_node_took_is_dropped() {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    let noop = &mut Context::from_waker(Waker::noop());
    for (completes, promoted) in [(true, false), (false, false), (true, true)] {
        let m = map(4);
        let counted = Arc::new(crate::fuzzing::CountingWaker::default());
        let waker = Waker::from(counted.clone());
        let gate = Arc::new(crate::Semaphore::new(0));
        {
            let g = gate.clone();
            let mut leader = Box::pin(m.run(1, move || async move {
                drop(g.acquire().await.unwrap());
                1
            }));
            assert!(leader.as_mut().poll(noop).is_pending());
            let mut follower = pin!(m.run(1, || async { 2 }));
            assert!(follower
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            assert_eq!(Arc::strong_count(&counted), 3, "the node holds a clone");
            if !completes {
                // Both futures are dropped here, the follower linked.
            } else if promoted {
                drop(leader);
                let Poll::Ready(out) = follower.as_mut().poll(noop) else {
                    panic!("the promoted follower's work is ready");
                };
                assert_eq!(out.unwrap().0, 2);
            } else {
                gate.add_permits(1);
                let Poll::Ready(out) = leader.as_mut().poll(noop) else {
                    panic!("the leader's work is ready");
                };
                assert_eq!(out.unwrap().0, 1);
                let Poll::Ready(out) = follower.as_mut().poll(noop) else {
                    panic!("the follower is done");
                };
                assert_eq!(out.unwrap().0, 1);
            }
        }
        drop(waker);
        assert_eq!(Arc::strong_count(&counted), 1, "({completes}, {promoted})");
    }
}
