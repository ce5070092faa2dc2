//! Integration tests for `Semaphore`: tokio parity, FIFO, cancellation,
//! closing, and the same workload on three executors.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use backpressure::{AcquireError, Semaphore, TryAcquireError};

/// A waker that counts how often it was woken.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting_waker() -> (Arc<CountingWaker>, Waker) {
    let c = Arc::new(CountingWaker::default());
    (c.clone(), Waker::from(c))
}

fn poll_once<F: Future>(fut: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(waker))
}

#[test]
fn api_edge_cases_match_tokio() {
    // acquire_many(0) completes at once even with nothing available.
    let sem = Semaphore::new(0);
    let p = futures::executor::block_on(sem.acquire_many(0)).unwrap();
    assert_eq!(p.num_permits(), 0);
    assert_eq!(sem.try_acquire_many(0).unwrap().num_permits(), 0);

    // add_permits after close still counts.
    let sem = Semaphore::new(1);
    sem.close();
    sem.add_permits(2);
    assert_eq!(sem.available_permits(), 3);
    assert_eq!(sem.try_acquire().err(), Some(TryAcquireError::Closed));
    assert_eq!(sem.try_acquire_many(0).err(), Some(TryAcquireError::Closed));
    assert!(futures::executor::block_on(sem.acquire_many(0)).is_err());

    // forget_permits keeps the closed state.
    assert_eq!(sem.forget_permits(2), 2);
    assert!(sem.is_closed());
    assert_eq!(sem.available_permits(), 1);

    // Same answers from tokio, side by side.
    let ours = Semaphore::new(2);
    let theirs = tokio::sync::Semaphore::new(2);
    assert_eq!(ours.forget_permits(5), theirs.forget_permits(5));
    ours.add_permits(1);
    theirs.add_permits(1);
    assert_eq!(ours.available_permits(), theirs.available_permits());
    assert_eq!(
        ours.try_acquire_many(2).err().map(|e| e.to_string()),
        theirs.try_acquire_many(2).err().map(|e| e.to_string())
    );
    ours.close();
    theirs.close();
    assert_eq!(
        ours.try_acquire().err().map(|e| e.to_string()),
        theirs.try_acquire().err().map(|e| e.to_string())
    );
    assert_eq!(
        AcquireError::clone(&futures::executor::block_on(ours.acquire()).unwrap_err()).to_string(),
        "semaphore closed"
    );
}

#[test]
#[should_panic(expected = "a semaphore may not have more than MAX_PERMITS permits")]
fn new_above_max_panics() {
    let _ = Semaphore::new(Semaphore::MAX_PERMITS + 1);
}

#[test]
#[should_panic(expected = "would overflow MAX_PERMITS")]
fn add_permits_overflow_panics() {
    let sem = Semaphore::new(Semaphore::MAX_PERMITS);
    sem.add_permits(1);
}

#[test]
fn add_permits_overflow_leaves_state_intact() {
    let sem = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS - 1));
    let s = sem.clone();
    let r = std::thread::spawn(move || s.add_permits(2)).join();
    assert!(r.is_err());
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS - 1);
}

/// The message of a caught panic, if the closure panicked.
fn panic_message(r: std::thread::Result<()>) -> Option<String> {
    let payload = r.err()?;
    Some(
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    )
}

fn caught(f: impl FnOnce()) -> Option<String> {
    panic_message(catch_unwind(AssertUnwindSafe(f)))
}

/// Issue #10, item 2: `add_permits` checked only the available count and a
/// release never checked, so `new(1)`, hold, `add_permits(MAX)`, drop left
/// `MAX + 1` available with no panic. tokio panics at the drop, with
/// "number of added permits (1) would overflow MAX_PERMITS"; so do we, at
/// the same step, and the count stays at the bound.
#[test]
fn release_past_max_permits_after_add_permits_panics_like_tokio() {
    const MAX: usize = Semaphore::MAX_PERMITS;
    assert_eq!(MAX, tokio::sync::Semaphore::MAX_PERMITS);

    // tokio first, so that a failure below leaves no tokio permit to drop
    // (and panic) while unwinding.
    let theirs = {
        let sem = tokio::sync::Semaphore::new(1);
        let held = sem.try_acquire().unwrap();
        let add = caught(|| sem.add_permits(MAX));
        let release = caught(|| drop(held));
        let too_many = caught(|| tokio::sync::Semaphore::new(0).add_permits(MAX + 1));
        [add, release, too_many]
    };
    let sem = Semaphore::new(1);
    let held = sem.try_acquire().unwrap();
    // Filling the semaphore to the bound while a permit is out is allowed;
    // the permit's drop is what passes the bound.
    let add = caught(|| sem.add_permits(MAX));
    assert_eq!(sem.available_permits(), MAX);
    let release = caught(|| drop(held));
    // tokio is left at MAX + 1; we refuse the addition instead.
    assert_eq!(sem.available_permits(), MAX);
    assert!(!sem.is_closed());
    drop(sem.try_acquire_many(3).unwrap());
    assert_eq!(sem.available_permits(), MAX);
    // More than MAX_PERMITS at once: tokio's other message.
    let empty = Semaphore::new(0);
    let too_many = caught(|| empty.add_permits(MAX + 1));
    assert_eq!(empty.available_permits(), 0);

    let ours = [add, release, too_many];
    assert_eq!(ours, theirs);
    assert_eq!(ours[0], None);
    assert!(ours[1]
        .as_deref()
        .unwrap()
        .starts_with("number of added permits (1) would overflow MAX_PERMITS"));
    assert!(ours[2]
        .as_deref()
        .unwrap()
        .starts_with("cannot add more than MAX_PERMITS permits"));
}

/// Exactly `MAX_PERMITS` added on top of one available permit: the count
/// would pass the bound by one, and the message names the addition (the
/// "more than MAX_PERMITS" one is for a single addition that cannot fit
/// even an empty semaphore). cargo-mutants: `added > MAX_PERMITS` to `>=`
/// in `overflow` survived.
#[test]
fn adding_max_permits_to_a_nonempty_semaphore_panics_like_tokio() {
    const MAX: usize = Semaphore::MAX_PERMITS;
    let theirs = caught(|| tokio::sync::Semaphore::new(1).add_permits(MAX));
    let sem = Semaphore::new(1);
    let ours = caught(|| sem.add_permits(MAX));
    assert_eq!(sem.available_permits(), 1, "the addition is refused whole");
    assert_eq!(ours, theirs);
    assert!(ours.as_deref().unwrap().starts_with(&format!(
        "number of added permits ({MAX}) would overflow MAX_PERMITS"
    )));
}

/// The overflowing drop happens while the thread already unwinds: a second
/// panic would abort the process (tokio's does). The permits are refused
/// quietly and the first panic carries on.
#[test]
fn permit_dropped_while_unwinding_past_max_permits_does_not_abort() {
    let sem = Semaphore::new(1);
    let held = sem.try_acquire().unwrap();
    sem.add_permits(Semaphore::MAX_PERMITS);
    let msg = caught(move || {
        let _held = held;
        panic!("first panic");
    });
    assert_eq!(msg.as_deref(), Some("first panic"));
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS);
}

/// tokio checks the bound only on what is left after serving the queued
/// waiters: `add_permits(MAX + 2)` feeding a waiter owed 2 is fine, one
/// more panics. Same here, and the waiter served is still woken (tokio
/// drops its waker unwoken on that panic).
#[test]
fn add_permits_checks_the_leftover_after_waiters_like_tokio() {
    const MAX: usize = Semaphore::MAX_PERMITS;
    for extra in [2, 3] {
        let theirs = {
            let sem = tokio::sync::Semaphore::new(0);
            let mut fut = pin!(sem.acquire_many(2));
            assert!(poll_once(fut.as_mut(), Waker::noop()).is_pending());
            let msg = caught(|| sem.add_permits(MAX + extra));
            // Keep the served permits out (their drop would pass the bound).
            match poll_once(fut.as_mut(), Waker::noop()) {
                Poll::Ready(Ok(p)) => p.forget(),
                other => panic!("{other:?}"),
            }
            msg
        };
        let sem = Semaphore::new(0);
        let (woken, waker) = counting_waker();
        let mut fut = pin!(sem.acquire_many(2));
        assert!(poll_once(fut.as_mut(), &waker).is_pending());
        let ours = caught(|| sem.add_permits(MAX + extra));
        assert_eq!(ours, theirs, "extra = {extra}");
        assert_eq!(ours.is_some(), extra == 3);
        assert_eq!(
            woken.0.load(Ordering::SeqCst),
            1,
            "the served waiter is woken"
        );
        match poll_once(fut.as_mut(), &waker) {
            Poll::Ready(Ok(p)) => p.forget(),
            other => panic!("{other:?}"),
        }
        let left = if extra == 3 { 0 } else { MAX };
        assert_eq!(sem.available_permits(), left);
    }
}

/// Concurrent `add_permits` that together pass the bound: the old check
/// read the count and then added, so both could pass it. Now the bound is
/// checked on the value the CAS is conditioned on: exactly one panics.
#[test]
fn concurrent_add_permits_cannot_pass_max_permits() {
    let half = Semaphore::MAX_PERMITS / 2 + 1;
    for _ in 0..if cfg!(miri) { 2 } else { 200 } {
        let sem = Semaphore::new(0);
        let start = std::sync::Barrier::new(2);
        let panics = std::thread::scope(|s| {
            let ths: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        catch_unwind(AssertUnwindSafe(|| sem.add_permits(half))).is_err()
                    })
                })
                .collect();
            ths.into_iter()
                .map(|t| usize::from(t.join().unwrap()))
                .sum::<usize>()
        });
        assert_eq!(panics, 1);
        assert_eq!(sem.available_permits(), half);
    }
}

/// A waker that panics the first time it is woken.
#[derive(Default)]
struct PanickingWaker(AtomicUsize);

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("waker panicked on purpose");
        }
    }
}

/// Issue #10, item 13: the release path wakes waiters in batches of 32
/// outside the lock. A waker that panicked dropped the rest of its batch
/// unwoken, and the permits not yet handed out (later waiters, the
/// leftover) were lost. Now the hand-off completes, then the panic goes on.
#[test]
fn panicking_waker_does_not_strand_waiters_or_permits() {
    // 10 waiters, the panicking one, 40 more: two batches, and a leftover.
    let sem = Semaphore::new(0);
    let panicky = Arc::new(PanickingWaker::default());
    let panicky_waker = Waker::from(panicky.clone());
    let counters: Vec<_> = (0..50).map(|_| counting_waker()).collect();
    let mut futs: Vec<_> = (0..51).map(|_| Box::pin(sem.acquire())).collect();
    let waker_of = |i: usize| match i {
        10 => &panicky_waker,
        i if i < 10 => &counters[i].1,
        i => &counters[i - 1].1,
    };
    for (i, f) in futs.iter_mut().enumerate() {
        assert!(poll_once(f.as_mut(), waker_of(i)).is_pending());
    }

    let issued = 51 + 5;
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| sem.add_permits(issued))));
    assert_eq!(msg.as_deref(), Some("waker panicked on purpose"));

    assert_eq!(panicky.0.load(Ordering::SeqCst), 1);
    for (i, (count, _)) in counters.iter().enumerate() {
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "waiter {i} was not woken"
        );
    }
    let held: Vec<_> = futs
        .iter_mut()
        .enumerate()
        .map(|(i, f)| match poll_once(f.as_mut(), waker_of(i)) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("waiter {i}: {other:?}"),
        })
        .collect();
    let held_n: usize = held.iter().map(|p| p.num_permits()).sum();
    assert_eq!(sem.available_permits() + held_n, issued);
    drop(held);
    assert_eq!(sem.available_permits(), issued);
}

/// Same bug through a permit's drop, with a partly assigned `acquire_many`
/// behind the panicking waiter: it must get its share, and the count must
/// stay exact (available + held + assigned == issued).
#[test]
fn panicking_waker_on_permit_drop_still_hands_off_every_permit() {
    let sem = Semaphore::new(4);
    let permit = sem.try_acquire_many(4).unwrap();
    let panicky_waker = Waker::from(Arc::new(PanickingWaker::default()));
    let (first_count, first) = counting_waker();
    let (big_count, big_waker) = counting_waker();
    let mut p = pin!(sem.acquire());
    let mut a = pin!(sem.acquire());
    let mut big = pin!(sem.acquire_many(5));
    assert!(poll_once(p.as_mut(), &panicky_waker).is_pending());
    assert!(poll_once(a.as_mut(), &first).is_pending());
    assert!(poll_once(big.as_mut(), &big_waker).is_pending());

    let mut permit = Some(permit);
    let r = catch_unwind(AssertUnwindSafe(|| drop(permit.take())));
    assert!(r.is_err());
    assert_eq!(first_count.0.load(Ordering::SeqCst), 1);
    assert_eq!(
        big_count.0.load(Ordering::SeqCst),
        0,
        "owed 3 more, not woken"
    );
    // 1 + 1 handed out, 2 assigned to `big`, none available.
    assert_eq!(sem.available_permits(), 0);
    let held_p = match poll_once(p.as_mut(), &panicky_waker) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("{other:?}"),
    };
    let held_a = match poll_once(a.as_mut(), &first) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("{other:?}"),
    };
    sem.add_permits(3);
    assert_eq!(big_count.0.load(Ordering::SeqCst), 1);
    let held_big = match poll_once(big.as_mut(), &big_waker) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!(held_big.num_permits(), 5);
    drop((held_p, held_a, held_big));
    assert_eq!(sem.available_permits(), 4 + 3);
}

/// `close` wakes in batches too: a panicking waker must not leave the other
/// waiters asleep forever.
#[test]
fn panicking_waker_in_close_does_not_strand_waiters() {
    let sem = Semaphore::new(0);
    let panicky_waker = Waker::from(Arc::new(PanickingWaker::default()));
    let counters: Vec<_> = (0..40).map(|_| counting_waker()).collect();
    let mut p = Box::pin(sem.acquire());
    assert!(poll_once(p.as_mut(), &panicky_waker).is_pending());
    let mut futs: Vec<_> = (0..40).map(|_| Box::pin(sem.acquire())).collect();
    for (f, (_, w)) in futs.iter_mut().zip(&counters) {
        assert!(poll_once(f.as_mut(), w).is_pending());
    }
    assert!(catch_unwind(AssertUnwindSafe(|| sem.close())).is_err());
    for (i, ((count, w), f)) in counters.iter().zip(&mut futs).enumerate() {
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "waiter {i} was not woken"
        );
        assert!(matches!(poll_once(f.as_mut(), w), Poll::Ready(Err(_))));
    }
    assert!(matches!(
        poll_once(p.as_mut(), &panicky_waker),
        Poll::Ready(Err(_))
    ));
}

#[test]
fn permit_merge_split_forget() {
    let sem = Semaphore::new(5);
    let mut a = sem.try_acquire_many(2).unwrap();
    a.merge(sem.try_acquire().unwrap());
    assert_eq!(a.num_permits(), 3);
    let b = a.split(2).unwrap();
    assert!(a.split(2).is_none());
    assert_eq!((a.num_permits(), b.num_permits()), (1, 2));
    b.forget();
    assert_eq!(sem.available_permits(), 2);
    drop(a);
    assert_eq!(sem.available_permits(), 3);
}

/// A `try_acquire` starts from the word its thread last left the
/// semaphore in; what other threads did since must still decide.
#[test]
fn an_acquire_starts_from_this_threads_last_word_but_never_believes_it() {
    let sem = Arc::new(Semaphore::new(4));
    let other = Semaphore::new(2);
    // This thread last saw 4 available.
    drop(sem.try_acquire().unwrap());
    let elsewhere = |f: fn(&Semaphore)| {
        let sem = sem.clone();
        std::thread::spawn(move || f(&sem)).join().unwrap();
    };
    elsewhere(|s| assert_eq!(s.forget_permits(3), 3));
    assert_eq!(
        sem.try_acquire_many(2).map(drop),
        Err(TryAcquireError::NoPermits)
    );
    // The last word seen is now 1 available: two other semaphores' words
    // in between do not leak into this one.
    let held = sem.try_acquire().unwrap();
    let o = other.try_acquire_many(2).unwrap();
    assert_eq!(sem.try_acquire().map(drop), Err(TryAcquireError::NoPermits));
    drop(o);
    // Left last: this thread's word for `sem` says 1 available.
    drop(held);
    assert_eq!((sem.available_permits(), other.available_permits()), (1, 2));
    elsewhere(|s| s.add_permits(5));
    let six = sem.try_acquire_many(6).unwrap();
    assert_eq!(sem.available_permits(), 0);
    drop(six);
    elsewhere(|s| s.close());
    assert_eq!(sem.try_acquire().map(drop), Err(TryAcquireError::Closed));
    assert_eq!(
        sem.try_acquire_many(0).map(drop),
        Err(TryAcquireError::Closed)
    );
    assert_eq!(sem.available_permits(), 6);
}

#[test]
#[should_panic(expected = "merging permits from different semaphore instances")]
fn merge_from_other_semaphore_panics() {
    let s1 = Semaphore::new(1);
    let s2 = Semaphore::new(1);
    let mut a = s1.try_acquire().unwrap();
    a.merge(s2.try_acquire().unwrap());
}

#[test]
fn fifo_acquire_many_is_not_overtaken() {
    let sem = Semaphore::new(0);
    let (wa, a_waker) = counting_waker();
    let (wb, b_waker) = counting_waker();
    let mut a = pin!(sem.acquire_many(3));
    let mut b = pin!(sem.acquire());
    assert!(poll_once(a.as_mut(), &a_waker).is_pending());
    assert!(poll_once(b.as_mut(), &b_waker).is_pending());

    for _ in 0..2 {
        sem.add_permits(1);
        // The permit went to `a` (partially), not to `b` or the counter.
        assert_eq!(sem.available_permits(), 0);
        assert!(sem.try_acquire().is_err());
        assert_eq!(wb.0.load(Ordering::SeqCst), 0);
        assert!(poll_once(b.as_mut(), &b_waker).is_pending());
    }
    assert_eq!(wa.0.load(Ordering::SeqCst), 0);
    sem.add_permits(1);
    assert_eq!(wa.0.load(Ordering::SeqCst), 1);
    let pa = match poll_once(a.as_mut(), &a_waker) {
        Poll::Ready(Ok(p)) => p,
        other => panic!(
            "a not ready: {:?}",
            other.map(|r| r.map(|p| p.num_permits()))
        ),
    };
    assert_eq!(pa.num_permits(), 3);
    assert!(poll_once(b.as_mut(), &b_waker).is_pending());
    drop(pa);
    assert_eq!(wb.0.load(Ordering::SeqCst), 1);
    assert!(matches!(
        poll_once(b.as_mut(), &b_waker),
        Poll::Ready(Ok(_))
    ));
    assert_eq!(sem.available_permits(), 3);
}

#[test]
fn cancelled_partial_acquire_returns_permits_and_wakes_next() {
    let sem = Semaphore::new(0);
    let (_, a_waker) = counting_waker();
    let (wb, b_waker) = counting_waker();
    let mut a = Box::pin(sem.acquire_many(3));
    let mut b = pin!(sem.acquire_many(2));
    assert!(poll_once(a.as_mut(), &a_waker).is_pending());
    assert!(poll_once(b.as_mut(), &b_waker).is_pending());
    sem.add_permits(2); // both assigned to `a`
    assert_eq!(wb.0.load(Ordering::SeqCst), 0);
    drop(a); // gives 2 back: exactly what `b` needs
    assert_eq!(wb.0.load(Ordering::SeqCst), 1);
    let p = match poll_once(b.as_mut(), &b_waker) {
        Poll::Ready(Ok(p)) => p,
        _ => panic!("b should be ready"),
    };
    assert_eq!(p.num_permits(), 2);
    drop(p);
    assert_eq!(sem.available_permits(), 2);
}

#[test]
fn waker_replacement_wakes_the_latest_waker() {
    let sem = Semaphore::new(0);
    let (w1, waker1) = counting_waker();
    let (w2, waker2) = counting_waker();
    let mut a = pin!(sem.acquire());
    assert!(poll_once(a.as_mut(), &waker1).is_pending());
    assert!(poll_once(a.as_mut(), &waker2).is_pending());
    sem.add_permits(1);
    assert_eq!(w1.0.load(Ordering::SeqCst), 0);
    assert_eq!(w2.0.load(Ordering::SeqCst), 1);
    assert!(matches!(poll_once(a.as_mut(), &waker2), Poll::Ready(Ok(_))));
}

#[test]
fn close_fails_waiters_and_returns_partial_permits() {
    let sem = Semaphore::new(1);
    let (wa, a_waker) = counting_waker();
    let mut a = pin!(sem.acquire_many(3));
    assert!(poll_once(a.as_mut(), &a_waker).is_pending());
    assert_eq!(sem.available_permits(), 0); // the one permit is assigned to `a`
    sem.close();
    assert_eq!(wa.0.load(Ordering::SeqCst), 1);
    assert!(matches!(
        poll_once(a.as_mut(), &a_waker),
        Poll::Ready(Err(_))
    ));
    // The assigned permit is back in the counter.
    assert_eq!(sem.available_permits(), 1);
}

#[test]
fn close_after_full_assignment_still_fails_like_tokio() {
    let sem = Semaphore::new(0);
    let (_, waker) = counting_waker();
    let mut a = pin!(sem.acquire_many(2));
    assert!(poll_once(a.as_mut(), &waker).is_pending());
    sem.add_permits(2);
    sem.close();
    assert!(matches!(poll_once(a.as_mut(), &waker), Poll::Ready(Err(_))));
    assert_eq!(sem.available_permits(), 2);

    let theirs = tokio::sync::Semaphore::new(0);
    let mut t = pin!(theirs.acquire_many(2));
    assert!(poll_once(t.as_mut(), &waker).is_pending());
    theirs.add_permits(2);
    theirs.close();
    assert!(matches!(poll_once(t.as_mut(), &waker), Poll::Ready(Err(_))));
    assert_eq!(theirs.available_permits(), 2);
}

#[test]
fn many_waiters_past_one_wake_batch() {
    // 100 waiters are more than one wake batch (32): all must be woken.
    let sem = Semaphore::new(0);
    let (w, waker) = counting_waker();
    let mut futs: Vec<_> = (0..100).map(|_| Box::pin(sem.acquire())).collect();
    for f in &mut futs {
        assert!(poll_once(f.as_mut(), &waker).is_pending());
    }
    sem.add_permits(100);
    assert_eq!(w.0.load(Ordering::SeqCst), 100);
    let permits: Vec<_> = futs
        .iter_mut()
        .map(|f| match poll_once(f.as_mut(), &waker) {
            Poll::Ready(Ok(p)) => p,
            _ => panic!("not ready"),
        })
        .collect();
    assert_eq!(sem.available_permits(), 0);
    drop(permits);
    assert_eq!(sem.available_permits(), 100);

    // And closing with 100 waiters wakes all of them.
    let (w, waker) = counting_waker();
    let mut futs: Vec<_> = (0..100).map(|_| Box::pin(sem.acquire_many(101))).collect();
    for f in &mut futs {
        assert!(poll_once(f.as_mut(), &waker).is_pending());
    }
    sem.close();
    assert_eq!(w.0.load(Ordering::SeqCst), 100);
    drop(futs);
    assert_eq!(sem.available_permits(), 100);
}

#[test]
fn types_are_send_sync_and_not_bigger_than_tokio() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let sem = Arc::new(Semaphore::new(1));
    send_sync(&*sem);
    send_sync(&sem.acquire());
    send_sync(&sem.clone().acquire_owned());
    send_sync(&sem.try_acquire().unwrap());
    send_sync(&sem.clone().try_acquire_owned().unwrap());

    // Like tokio's, so `catch_unwind(|| sem.add_permits(n))` compiles.
    fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>(_: &T) {}
    unwind_safe(&*sem);
    unwind_safe(&sem);
    unwind_safe(&sem.try_acquire().unwrap());
    unwind_safe(&sem.clone().try_acquire_owned().unwrap());
    let theirs = Arc::new(tokio::sync::Semaphore::new(1));
    unwind_safe(&*theirs);
    unwind_safe(&theirs.try_acquire().unwrap());
    unwind_safe(&theirs.clone().try_acquire_owned().unwrap());

    let ours_size = std::mem::size_of_val(&sem.acquire());
    let their_size = std::mem::size_of_val(&theirs.acquire());
    assert!(
        ours_size <= their_size,
        "Acquire is {ours_size} bytes, tokio's {their_size}"
    );
    let ours_owned = std::mem::size_of_val(&sem.clone().acquire_owned());
    let their_owned = std::mem::size_of_val(&theirs.clone().acquire_owned());
    assert!(ours_owned <= their_owned, "{ours_owned} vs {their_owned}");

    // On 64-bit targets the permit is a pointer and one 8-byte word, as
    // tokio's: two scalars, which a call returns in registers (not through
    // memory, where the caller's wide load would wait for the callee's
    // narrow stores).
    #[cfg(target_pointer_width = "64")]
    {
        use std::mem::size_of;
        assert_eq!(size_of::<backpressure::SemaphorePermit<'_>>(), 16);
        assert_eq!(
            size_of::<Result<backpressure::SemaphorePermit<'_>, backpressure::AcquireError>>(),
            16
        );
        assert_eq!(size_of::<backpressure::OwnedSemaphorePermit>(), 16);
        assert_eq!(
            size_of::<backpressure::SemaphorePermit<'_>>(),
            size_of::<tokio::sync::SemaphorePermit<'_>>()
        );
        // The state word, the wait list's lock and its head share one
        // 32-byte block, aligned so that it never straddles two cache
        // lines (each operation would then move two lines between cores).
        assert_eq!(size_of::<Semaphore>(), 32);
        assert_eq!(std::mem::align_of::<Semaphore>(), 32);
        assert_eq!(Arc::as_ptr(&sem) as usize % 32, 0);
    }
}

#[test]
fn blocking_acquire_parks_until_released() {
    let sem = Arc::new(Semaphore::new(1));
    let held = sem.try_acquire_many(1).unwrap();
    let order = Arc::new(AtomicUsize::new(0));
    let (s, o) = (sem.clone(), order.clone());
    let t = std::thread::spawn(move || {
        let p = s.blocking_acquire_owned().unwrap();
        // The holder released before we got here.
        assert_eq!(o.load(Ordering::SeqCst), 1);
        p.num_permits()
    });
    // Give the thread a chance to queue; correctness does not depend on it.
    std::thread::yield_now();
    order.store(1, Ordering::SeqCst);
    drop(held);
    assert_eq!(t.join().unwrap(), 1);
    assert_eq!(sem.available_permits(), 1);
}

/// Runs `tasks` tasks that each acquire 1..=3 permits, hold them briefly,
/// and record the max number of permits held at once.
async fn workload(sem: Arc<Semaphore>, held: Arc<AtomicUsize>, max: Arc<AtomicUsize>, n: u32) {
    let p = sem.acquire_many(n).await.unwrap();
    let now = held.fetch_add(n as usize, Ordering::SeqCst) + n as usize;
    max.fetch_max(now, Ordering::SeqCst);
    futures::future::ready(()).await;
    std::thread::yield_now();
    held.fetch_sub(n as usize, Ordering::SeqCst);
    drop(p);
}

const PERMITS: usize = 4;
const TASKS: usize = 200;

fn check_workload(sem: &Semaphore, max: &AtomicUsize, done: usize) {
    assert_eq!(done, TASKS);
    assert!(max.load(Ordering::SeqCst) <= PERMITS);
    assert!(max.load(Ordering::SeqCst) >= 1);
    assert_eq!(sem.available_permits(), PERMITS);
}

#[test]
fn workload_on_tokio_multi_thread() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let sem = Arc::new(Semaphore::new(PERMITS));
    let (held, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let done = rt.block_on(async {
        let handles: Vec<_> = (0..TASKS)
            .map(|i| {
                tokio::spawn(workload(
                    sem.clone(),
                    held.clone(),
                    max.clone(),
                    (i % 3 + 1) as u32,
                ))
            })
            .collect();
        let mut done = 0;
        for h in handles {
            h.await.unwrap();
            done += 1;
        }
        done
    });
    check_workload(&sem, &max, done);
}

#[test]
fn workload_on_smol() {
    let sem = Arc::new(Semaphore::new(PERMITS));
    let (held, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let ex = Arc::new(smol::Executor::new());
    let (stop, shutdown) = smol::channel::unbounded::<()>();
    let done = std::thread::scope(|s| {
        for _ in 0..2 {
            let ex = ex.clone();
            let shutdown = shutdown.clone();
            s.spawn(move || smol::block_on(ex.run(shutdown.recv())));
        }
        let done = smol::block_on(async {
            let tasks: Vec<_> = (0..TASKS)
                .map(|i| {
                    ex.spawn(workload(
                        sem.clone(),
                        held.clone(),
                        max.clone(),
                        (i % 3 + 1) as u32,
                    ))
                })
                .collect();
            let mut done = 0;
            for t in tasks {
                t.await;
                done += 1;
            }
            done
        });
        drop(stop);
        done
    });
    check_workload(&sem, &max, done);
}

#[test]
fn workload_on_plain_threads_with_block_on() {
    let sem = Arc::new(Semaphore::new(PERMITS));
    let (held, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (sem, held, max, done) = (sem.clone(), held.clone(), max.clone(), &done);
            s.spawn(move || {
                for i in 0..TASKS / 4 {
                    futures::executor::block_on(workload(
                        sem.clone(),
                        held.clone(),
                        max.clone(),
                        ((i + t) % 3 + 1) as u32,
                    ));
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    check_workload(&sem, &max, done.load(Ordering::SeqCst));
}

/// Many tasks acquire random counts and are dropped at random points
/// (before polling, while queued, partly assigned, or after completion);
/// after every seeded round every permit is back.
#[test]
fn cancellation_storm_conserves_permits() {
    const START: usize = 6;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let rounds = std::env::var("BACKPRESSURE_STORM_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200u64);
    for seed in 0..rounds {
        let sem = Arc::new(Semaphore::new(START));
        let completed = Arc::new(AtomicUsize::new(0));
        rt.block_on(async {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut handles = Vec::new();
            for _ in 0..64 {
                let sem = sem.clone();
                let completed = completed.clone();
                let n = rng.u32(1..=START as u32);
                let yields_before_cancel = rng.usize(0..6);
                let hold_yields = rng.usize(0..3);
                handles.push(tokio::spawn(async move {
                    let acquire = sem.acquire_many(n);
                    let cancel = async {
                        for _ in 0..yields_before_cancel {
                            tokio::task::yield_now().await;
                        }
                    };
                    tokio::select! {
                        biased;
                        permit = acquire => {
                            let permit = permit.unwrap();
                            assert_eq!(permit.num_permits(), n as usize);
                            for _ in 0..hold_yields {
                                tokio::task::yield_now().await;
                            }
                            completed.fetch_add(1, Ordering::SeqCst);
                        }
                        _ = cancel => {}
                    }
                }));
            }
            for h in handles {
                h.await.unwrap();
            }
        });
        assert_eq!(sem.available_permits(), START, "seed {seed}: permits lost");
        // The semaphore is still fully usable afterwards.
        assert!(sem.try_acquire_many(START as u32).is_ok());
    }
}

/// `Debug` shows the state word's three parts and a future's phase, so a
/// stuck program's dump says who waits for what (cargo-mutants: the
/// semaphore's and the waiter's `Debug` were untested).
#[test]
fn debug_shows_permits_closed_queued_and_the_waiters_phase() {
    let sem = Semaphore::new(3);
    assert_eq!(
        format!("{sem:?}"),
        "Semaphore { permits: 3, closed: false, queued: false }"
    );
    // A word of 0 is neither closed nor queued.
    assert_eq!(
        format!("{:?}", Semaphore::new(0)),
        "Semaphore { permits: 0, closed: false, queued: false }"
    );
    let held = sem.try_acquire_many(2).unwrap();
    let mut waiting = pin!(sem.acquire_many(2));
    assert_eq!(
        format!("{waiting:?}"),
        "Acquire { sem: Semaphore { permits: 1, closed: false, queued: false }, \
         waiter: Waiter { needed: 2, phase: Idle } }"
    );
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(waiting.as_mut().poll(cx).is_pending());
    // The one available permit went to the waiter, which is owed one more.
    assert_eq!(
        format!("{waiting:?}"),
        "Acquire { sem: Semaphore { permits: 0, closed: false, queued: true }, \
         waiter: Waiter { needed: 2, phase: Queued } }"
    );
    sem.close();
    // The waiter's one permit comes back when it hears of the close.
    assert_eq!(
        format!("{sem:?}"),
        "Semaphore { permits: 0, closed: true, queued: false }"
    );
    drop(held);
    assert!(matches!(waiting.as_mut().poll(cx), Poll::Ready(Err(_))));
    assert_eq!(sem.available_permits(), 3);
}

/// Issue #40 item 1: since a permit packed its count into 32 bits,
/// merging two permits of 3,000,000,000 panicked ("number of permits
/// overflowed"), where tokio's `usize` counts hold the sum.
#[test]
fn tokio_parity_lost_past_u32_max_permits_is_fixed() {
    let sem = Arc::new(Semaphore::new(6_000_000_000));
    let mut a = sem.try_acquire_many(3_000_000_000).unwrap();
    let b = sem.try_acquire_many(3_000_000_000).unwrap();
    assert_eq!(sem.available_permits(), 0);
    a.merge(b);
    assert_eq!(a.num_permits(), 6_000_000_000);
    let c = a.split(1_000_000_000).unwrap();
    assert_eq!(
        (a.num_permits(), c.num_permits()),
        (5_000_000_000, 1_000_000_000)
    );
    drop(c);
    assert_eq!(sem.available_permits(), 1_000_000_000);
    drop(a);
    assert_eq!(sem.available_permits(), 6_000_000_000);

    // The owned permits, the same.
    let mut a = sem.clone().try_acquire_many_owned(3_000_000_000).unwrap();
    a.merge(sem.clone().try_acquire_many_owned(3_000_000_000).unwrap());
    assert_eq!(a.num_permits(), 6_000_000_000);
    assert_eq!(sem.available_permits(), 0);
    drop(a);
    assert_eq!(sem.available_permits(), 6_000_000_000);
}
