//! The semaphore across threads, and the paths a permit's drop guesses
//! its way through; small enough for miri (`.ci/run` runs this module
//! under it).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use backpressure::Semaphore;

/// A waker whose `Arc` strong count says how many clones are alive.
struct Held;

impl Wake for Held {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn threads_acquire_cancel_and_release() {
    let iters = if cfg!(miri) { 20 } else { 2_000 };
    let sem = Arc::new(Semaphore::new(2));
    std::thread::scope(|s| {
        for t in 0..3u32 {
            let sem = sem.clone();
            s.spawn(move || {
                for i in 0..iters {
                    let n = (i + t) % 2 + 1;
                    if i % 3 == 0 {
                        let mut fut = pin!(sem.acquire_many(n));
                        let _ = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()));
                    } else {
                        let p = sem.blocking_acquire_many(n).unwrap();
                        assert_eq!(p.num_permits(), n as usize);
                    }
                }
            });
        }
    });
    assert_eq!(sem.available_permits(), 2);
}

#[test]
fn permits_released_out_of_order_release_exactly() {
    // Each drop's guess is stale, so its first CAS fails and retries.
    let sem = Semaphore::new(3);
    let a = sem.try_acquire().unwrap();
    let b = sem.try_acquire_many(2).unwrap();
    assert_eq!(sem.available_permits(), 0);
    drop(a);
    assert_eq!(sem.available_permits(), 1);
    let c = sem.try_acquire().unwrap();
    drop(b);
    assert_eq!(sem.available_permits(), 2);
    sem.add_permits(5);
    sem.forget_permits(1);
    drop(c);
    assert_eq!(sem.available_permits(), 7);
}

#[test]
fn a_guess_made_before_a_waiter_queued_hands_the_permit_over() {
    let sem = Semaphore::new(1);
    let held = sem.try_acquire().unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    let mut waiting = pin!(sem.acquire());
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    drop(held);
    assert_eq!(sem.available_permits(), 0);
    let Poll::Ready(Ok(p)) = waiting.as_mut().poll(&mut cx) else {
        panic!("the released permit was not handed to the waiter")
    };
    drop(p);
    assert_eq!(sem.available_permits(), 1);
}

#[test]
fn every_waker_a_node_took_is_dropped() {
    // Whichever way the future ends, no waker clone is kept.
    let sem = Semaphore::new(1);
    let (first, second) = (Arc::new(Held), Arc::new(Held));
    let held = sem.try_acquire().unwrap();
    {
        let mut fut = pin!(sem.acquire());
        let waker = Waker::from(first.clone());
        assert!(fut
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        assert_eq!(Arc::strong_count(&first), 3, "the node keeps a clone");
    }
    assert_eq!(Arc::strong_count(&first), 1);
    {
        let mut fut = pin!(sem.acquire());
        let (w1, w2) = (Waker::from(first.clone()), Waker::from(second.clone()));
        assert!(fut
            .as_mut()
            .poll(&mut Context::from_waker(&w1))
            .is_pending());
        assert!(fut
            .as_mut()
            .poll(&mut Context::from_waker(&w2))
            .is_pending());
        assert_eq!(Arc::strong_count(&first), 2, "the old waker went");
        drop(held);
        let Poll::Ready(Ok(p)) = fut.as_mut().poll(&mut Context::from_waker(&w2)) else {
            panic!("the permit was handed over")
        };
        drop(p);
    }
    assert_eq!(Arc::strong_count(&first), 1);
    assert_eq!(Arc::strong_count(&second), 1);
    let waker = Waker::from(first.clone());
    let mut fut = pin!(sem.acquire());
    assert!(fut
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_ready());
    assert_eq!(Arc::strong_count(&first), 2);
    assert_eq!(sem.available_permits(), 1);
}

#[test]
fn a_release_after_close_keeps_its_permits() {
    let sem = Semaphore::new(2);
    let p = sem.try_acquire().unwrap();
    sem.close();
    drop(p); // the guess has no CLOSED bit: the first CAS fails
    assert_eq!(sem.available_permits(), 2);
    assert!(sem.is_closed());
}

#[test]
fn close_from_another_thread_fails_blocked_waiters() {
    let sem = Arc::new(Semaphore::new(0));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let sem = sem.clone();
            std::thread::spawn(move || sem.blocking_acquire().is_err())
        })
        .collect();
    sem.close();
    for w in waiters {
        assert!(w.join().unwrap());
    }
}
