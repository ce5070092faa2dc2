//! Loom models of `SingleFlight`: joining racing completion (no lost
//! wake-up), a cancelled leader handing off to one of two followers,
//! `forget` racing completion (identity-checked removal), and
//! `invalidate`/`clear` racing completion (no stale value cached).
//!
//! Every execution of the work counts itself in `active` for its duration
//! and asserts it was alone: "at most one execution per key at a time" is
//! checked in every interleaving, not only at the end. A lost wake-up shows
//! as a deadlock, which loom reports.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use crate::clock::ManualClock;
use crate::sync::Arc;
use crate::{Provenance, SingleFlight};

type Map = SingleFlight<u8, u32, Infallible, ManualClock>;

fn map(cache: bool) -> Arc<Map> {
    let b = SingleFlight::builder().shards(1).clock(ManualClock::new());
    let b = if cache {
        b.cache(Duration::from_secs(1), 4)
    } else {
        b
    };
    Arc::new(b.build())
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

/// Returns `Pending` once (waking itself), so the work stays in flight
/// across a scheduling point.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Counters shared by the works of one model.
#[derive(Default)]
struct Works {
    runs: AtomicUsize,
    active: AtomicUsize,
}

impl Works {
    /// A work that yields once and returns `value`, asserting it ran alone.
    async fn run(&self, value: u32) -> u32 {
        self.runs.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            self.active.fetch_add(1, Ordering::SeqCst),
            0,
            "two executions of one key at once"
        );
        YieldOnce(false).await;
        self.active.fetch_sub(1, Ordering::SeqCst);
        value
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

#[test]
fn join_races_completion() {
    model(|| {
        let flights = map(false);
        let works = Arc::new(Works::default());
        let t = {
            let (flights, works) = (flights.clone(), works.clone());
            thread::spawn(move || block_on(flights.run(1, || works.run(7))).unwrap())
        };
        let here = block_on(flights.run(1, || works.run(7))).unwrap();
        let there = t.join().unwrap();
        assert_eq!((here.0, there.0), (7, 7));
        let leaders = [here.1, there.1]
            .iter()
            .filter(|p| **p == Provenance::Leader)
            .count();
        // Either one ran and the other joined, or they ran one after the
        // other; never a follower without a leader.
        assert_eq!(leaders, works.runs());
        assert!(leaders >= 1);
        assert!(flights.is_empty(), "the entry went with the flight");
    });
}

#[test]
fn cancelled_leader_hands_off_to_one_of_two_followers() {
    model(|| {
        let flights = map(false);
        let works = Arc::new(Works::default());
        // The first leader owns the key, then is cancelled.
        let mut leader = Box::pin(flights.run(1, std::future::pending::<u32>));
        let waker = futures::task::noop_waker();
        assert!(leader
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        let followers: Vec<_> = (0..2)
            .map(|_| {
                let (flights, works) = (flights.clone(), works.clone());
                thread::spawn(move || block_on(flights.run(1, || works.run(9))).unwrap())
            })
            .collect();
        drop(leader);
        let outs: Vec<_> = followers.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(
            outs.iter().all(|(v, _)| *v == 9),
            "nobody hangs or loses the value"
        );
        let leaders = outs
            .iter()
            .filter(|(_, p)| *p == Provenance::Leader)
            .count();
        assert_eq!(
            leaders,
            works.runs(),
            "each execution has exactly one leader"
        );
        assert!(flights.is_empty(), "no abandoned entry");
    });
}

#[test]
fn forget_races_completion() {
    model(|| {
        let flights = map(true);
        let works = Arc::new(Works::default());
        let mut old = Box::pin(flights.run(1, || works.run(1)));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(old.as_mut().poll(&mut cx).is_pending());
        let t = {
            let flights = flights.clone();
            thread::spawn(move || {
                flights.forget(&1);
                // The forgotten flight can be neither joined nor served from
                // the cache: this call runs.
                block_on(flights.run(1, || async { 2 })).unwrap()
            })
        };
        let Poll::Ready(out) = old.as_mut().poll(&mut cx) else {
            panic!("the old work finishes on its second poll");
        };
        assert_eq!(out.unwrap(), (1, Provenance::Leader));
        assert_eq!(t.join().unwrap(), (2, Provenance::Leader));
        // Whatever the order, the old flight did not remove or overwrite
        // the new one: the key maps to the new value.
        let (v, how) = block_on(flights.run(1, || async { 3 })).unwrap();
        assert_eq!((v, how), (2, Provenance::Cached));
    });
}

/// `invalidate` (or `clear`) of a key races the completion of its flight,
/// then the invalidating thread calls for the key. Whatever the order, that
/// call never gets the old value from the cache: it joins the old flight
/// (the invalidation came while it ran, so its value is not cached after),
/// or runs its own work (the invalidation dropped the cached value, or the
/// old flight was not cached).
fn invalidation_races_completion(clear: bool) {
    model(move || {
        let flights = map(true);
        let works = Arc::new(Works::default());
        let mut old = Box::pin(flights.run(1, || works.run(1)));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(old.as_mut().poll(&mut cx).is_pending());
        let t = {
            let flights = flights.clone();
            thread::spawn(move || {
                if clear {
                    flights.clear();
                } else {
                    flights.invalidate(&1);
                }
                block_on(flights.run(1, || async { 2 })).unwrap()
            })
        };
        let Poll::Ready(out) = old.as_mut().poll(&mut cx) else {
            panic!("the old work finishes on its second poll");
        };
        assert_eq!(out.unwrap(), (1, Provenance::Leader));
        let got = t.join().unwrap();
        let after = block_on(flights.run(1, || async { 3 })).unwrap();
        match got {
            (1, Provenance::Joined) => {
                assert_eq!(after, (3, Provenance::Leader), "the stale value was cached");
            }
            (2, Provenance::Leader) => assert_eq!(after, (2, Provenance::Cached)),
            other => panic!("the call after the invalidation got {other:?}"),
        }
    });
}

#[test]
fn invalidate_races_completion() {
    invalidation_races_completion(false);
}

#[test]
fn clear_races_completion() {
    invalidation_races_completion(true);
}
