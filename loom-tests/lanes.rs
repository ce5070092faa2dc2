//! Loom model of priority lanes (`admission/lanes.rs`): a mutex around
//! the queues, and the semaphore's own atomics beneath. A slot freed while
//! a call is enqueueing must reach it (no lost wake-up: the call waiting
//! while the semaphore holds the slot), and a slot handed to a waiter that
//! gives up at the same moment must be passed on, never lost.

use core::pin::Pin;
use core::task::{Context, Poll};
use std::future::Future;

use crate::admission::lanes::{Lanes, Priority, Wait};
use crate::semaphore::Semaphore;
use crate::sync::Arc;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b
}

/// One slot, taken.
fn full() -> Arc<(Semaphore, Lanes)> {
    let sem = Semaphore::new(1);
    sem.try_take(1).unwrap();
    Arc::new((sem, Lanes::new(usize::MAX)))
}

fn granted(w: &std::sync::Arc<crate::admission::lanes::Waiter>) -> bool {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    Pin::new(&mut Wait { waiter: w }).poll(&mut cx) == Poll::Ready(Ok(()))
}

#[test]
fn a_slot_freed_while_a_call_enqueues_reaches_it() {
    builder().check(|| {
        let pool = full();
        let other = pool.clone();
        let releaser = loom::thread::spawn(move || other.1.release(&other.0, false));
        let mine = pool.1.take_or_wait(&pool.0, Priority::INTERACTIVE, "k");
        releaser.join().unwrap();
        let holds = match mine {
            Some(Ok(())) => true,
            Some(Err(w)) => granted(&w),
            None => panic!("not closed"),
        };
        assert!(holds, "the freed slot was not handed over");
        assert_eq!(pool.0.available_permits(), 0, "one slot, held once");
    });
}

#[test]
fn a_slot_handed_to_a_waiter_giving_up_is_passed_on() {
    builder().check(|| {
        let pool = full();
        let Some(Err(w)) = pool.1.take_or_wait(&pool.0, Priority::INTERACTIVE, "k") else {
            panic!("waits")
        };
        let other = pool.clone();
        let releaser = loom::thread::spawn(move || other.1.release(&other.0, false));
        pool.1.cancel(&pool.0, &w);
        releaser.join().unwrap();
        // Gone before or after it was handed the slot: either way the slot
        // is back in the semaphore.
        assert_eq!(pool.0.available_permits(), 1, "the slot was lost");
    });
}
