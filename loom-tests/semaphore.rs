//! Loom models of the semaphore.
//!
//! tokio's scenarios (basic use, release, close while waiting, concurrent
//! cancel, batch, release during a partly assigned acquire, concurrent
//! permit updates) and the ones tokio lacks: `add_permits` racing `close`,
//! cancelling a partly assigned `acquire_many` during a release, waker
//! replacement on re-poll, the QUEUED bit racing a lock-free release
//! (with the word loaded, and with a permit's guess), guessed releases
//! racing each other, more wakes than one batch (`WAKE_BATCH` is 2 under loom), and
//! concurrent `add_permits` near `MAX_PERMITS` (lock-free and through the
//! wait list), a close after a waiter was handed its permits (the
//! closed hint that lets that waiter skip the state word), a thread told
//! "closed" by `try_acquire` then polling such a waiter, and the
//! thread's `try_acquire` hint gone stale.
//!
//! Every model ends by checking conservation: with every future and permit
//! dropped, `available_permits` equals what was issued.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;

use crate::Semaphore;

/// Runs `f` under loom with a bounded number of preemptions (default 2,
/// overridable with `LOOM_MAX_PREEMPTIONS`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(f);
}

/// A waker that counts wakes in a loom atomic.
struct Counter(AtomicUsize);

impl Wake for Counter {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

fn counter() -> (std::sync::Arc<Counter>, Waker) {
    let c = std::sync::Arc::new(Counter(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}

fn poll<F: Future>(f: Pin<&mut F>, w: &Waker) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(w))
}

#[test]
fn basic_usage_is_mutually_exclusive() {
    model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let inside = Arc::new(AtomicUsize::new(0));
        let ths: Vec<_> = (0..2)
            .map(|_| {
                let (sem, inside) = (sem.clone(), inside.clone());
                thread::spawn(move || {
                    let p = block_on(sem.acquire()).unwrap();
                    assert_eq!(inside.fetch_add(1, SeqCst), 0, "two holders at once");
                    inside.fetch_sub(1, SeqCst);
                    drop(p);
                })
            })
            .collect();
        for t in ths {
            t.join().unwrap();
        }
        assert_eq!(sem.available_permits(), 1);
    });
}

/// The waiter sets QUEUED with a CAS while a release tries its lock-free
/// CAS: either the release lands first (the waiter sees the permit) or it
/// sees QUEUED and hands the permit over under the lock. A lost permit or a
/// lost wake-up deadlocks `block_on`, which loom reports.
#[test]
fn queued_bit_races_lock_free_release() {
    model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.try_acquire().unwrap();
        held.forget(); // the permit is now "out"; `add_permits` returns it
        let s = sem.clone();
        let releaser = thread::spawn(move || s.add_permits(1));
        let p = block_on(sem.acquire()).unwrap();
        releaser.join().unwrap();
        drop(p);
        assert_eq!(sem.available_permits(), 1);
    });
}

/// Two permits dropped at once, each release expecting the word its own
/// acquire left: at most one guess still holds, and the other release's
/// CAS fails and retries on the word it returned. A release that
/// believed its guess would leave fewer than 2 permits.
#[test]
fn guessed_releases_race_each_other() {
    model(|| {
        let sem = Arc::new(Semaphore::new(2));
        let s = sem.clone();
        let t = thread::spawn(move || drop(s.try_acquire().unwrap()));
        drop(sem.try_acquire().unwrap());
        t.join().unwrap();
        assert_eq!(sem.available_permits(), 2);
    });
}

/// The holder's drop expects the word its acquire left (no permits,
/// nothing queued) and tries its CAS without a load, while a waiter may be
/// setting QUEUED: the guess holds (the release lands first) or the CAS
/// fails on the queued word and the permit is handed over under the lock.
/// A release that believed its guess would strand the waiter, and loom
/// reports the deadlock.
#[test]
fn guessed_release_races_a_waiter_queuing() {
    model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.try_acquire().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || drop(block_on(s.acquire()).unwrap()));
        drop(held);
        waiter.join().unwrap();
        assert_eq!(sem.available_permits(), 1);
    });
}

#[test]
fn release_wakes_waiter_across_threads() {
    model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let s = sem.clone();
        let holder = thread::spawn(move || {
            let p = s.try_acquire();
            drop(p);
        });
        let p = block_on(sem.acquire()).unwrap();
        drop(p);
        holder.join().unwrap();
        assert_eq!(sem.available_permits(), 1);
    });
}

#[test]
fn close_while_waiting() {
    model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let s = sem.clone();
        let closer = thread::spawn(move || s.close());
        assert!(block_on(sem.acquire()).is_err());
        closer.join().unwrap();
        assert_eq!(sem.available_permits(), 0);
    });
}

/// On another thread: hands one permit to `sem`'s queued waiter
/// (`add_permits` is exactly a release), then closes `sem`.
fn hand_off_then_close(sem: &Arc<Semaphore>) -> thread::JoinHandle<()> {
    let s = sem.clone();
    thread::spawn(move || {
        s.add_permits(1);
        s.close();
    })
}

/// A waiter is handed the permit, then the semaphore is closed on the
/// other thread before the waiter polls again: like tokio, the waiter
/// fails and the permit goes back. The waiter reads the state word only
/// if the closed hint says a close may have happened, so a close that
/// did not set the hint (or set it where the poll cannot see it) lets
/// this poll succeed, which fails the model. A second waiter polls while
/// the close races it: either answer, but no permit is lost.
#[test]
fn close_after_the_hand_off_fails_the_waiter() {
    model(|| {
        let sem = Arc::new(Semaphore::new(1));
        sem.try_acquire().unwrap().forget();
        let (_, w) = counter();
        let mut first = Box::pin(sem.acquire());
        assert!(poll(first.as_mut(), &w).is_pending());
        let t = hand_off_then_close(&sem);
        t.join().unwrap();
        assert!(matches!(poll(first.as_mut(), &w), Poll::Ready(Err(_))));
        drop(first);
        assert_eq!(sem.available_permits(), 1);

        let sem = Arc::new(Semaphore::new(1));
        sem.try_acquire().unwrap().forget();
        let mut second = Box::pin(sem.acquire());
        assert!(poll(second.as_mut(), &w).is_pending());
        let t = hand_off_then_close(&sem);
        let got = block_on(second.as_mut());
        drop(got);
        t.join().unwrap();
        drop(second);
        assert_eq!(sem.available_permits(), 1);
    });
}

/// Issue #59 item 2: a thread whose `try_acquire` saw the semaphore
/// closed then polls a waiter that was handed its permit before the
/// close. `try_acquire` reads the word Relaxed and the waiter reads the
/// closed hint Relaxed: without an Acquire fence on the closed path, the
/// hint may still read clear, the waiter skips the word, and the thread
/// is told "closed" and then `Ok`.
#[test]
fn a_closed_try_acquire_then_a_handed_off_waiter() {
    model(|| {
        // A std `Arc`: the owned acquire takes one.
        let sem = std::sync::Arc::new(Semaphore::new(1));
        sem.try_acquire().unwrap().forget();
        let (_, w) = counter();
        let mut waiter = Box::pin(sem.clone().acquire_owned());
        assert!(poll(waiter.as_mut(), &w).is_pending());
        let s = sem.clone();
        let t = thread::spawn(move || {
            let saw_closed = matches!(s.try_acquire(), Err(crate::TryAcquireError::Closed));
            let polled = poll(waiter.as_mut(), &w);
            if saw_closed {
                assert!(
                    matches!(polled, Poll::Ready(Err(_))),
                    "told closed, then Ok"
                );
            }
        });
        sem.add_permits(1);
        sem.close();
        t.join().unwrap();
        assert_eq!(sem.available_permits(), 1);
    });
}

/// The thread's `try_acquire` hint (the word it last left the state in)
/// goes stale when another thread moves the word: it is only where the
/// CAS starts. Here this thread's hint says "none left" while the other
/// thread gives both permits back: a hint believed without a CAS would
/// refuse a permit that is there.
#[test]
fn a_stale_try_acquire_hint_is_only_a_first_guess() {
    model(|| {
        // A std `Arc`: the owned permits take one.
        let sem = std::sync::Arc::new(Semaphore::new(2));
        // This thread's hint: 0 left.
        let both = sem.clone().try_acquire_many_owned(2).unwrap();
        let t = thread::spawn(move || drop(both));
        let racing = sem.try_acquire();
        t.join().unwrap();
        // Two permits back, `racing` holds one at most.
        let after = sem.try_acquire();
        assert!(after.is_ok(), "a permit was there: {after:?}");
        drop((racing, after));
        assert_eq!(sem.available_permits(), 2);
    });
}

/// A pending acquire is dropped while another thread releases.
#[test]
fn concurrent_cancel() {
    model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let s = sem.clone();
        let releaser = thread::spawn(move || s.add_permits(2));
        let (_, w) = counter();
        let mut fut = Box::pin(sem.acquire_many(2));
        let first = poll(fut.as_mut(), &w);
        drop(first);
        drop(fut);
        releaser.join().unwrap();
        assert_eq!(sem.available_permits(), 2);
    });
}

/// A partly assigned `acquire_many` is cancelled while a release is
/// assigning it more; a second waiter behind it must get what it needs.
#[test]
fn cancel_partly_assigned_during_release() {
    model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let (_, w) = counter();
        let mut big = Box::pin(sem.acquire_many(3));
        assert!(poll(big.as_mut(), &w).is_pending()); // took 1, owes 2
        let s = sem.clone();
        let second = thread::spawn(move || {
            let p = block_on(s.acquire_many(2)).unwrap();
            drop(p);
        });
        let s = sem.clone();
        let releaser = thread::spawn(move || s.add_permits(1));
        drop(big);
        releaser.join().unwrap();
        second.join().unwrap();
        assert_eq!(sem.available_permits(), 2);
    });
}

/// Two `acquire_many` callers compete; both finish, the count is exact.
#[test]
fn batch() {
    model(|| {
        let sem = Arc::new(Semaphore::new(3));
        let s = sem.clone();
        let t = thread::spawn(move || {
            let p = block_on(s.acquire_many(2)).unwrap();
            assert_eq!(p.num_permits(), 2);
        });
        let p = block_on(sem.acquire_many(2)).unwrap();
        drop(p);
        t.join().unwrap();
        assert_eq!(sem.available_permits(), 3);
    });
}

/// `add_permits` racing `close` with a waiter queued: the waiter fails or
/// succeeds, never hangs, and no permit is lost.
#[test]
fn add_permits_races_close() {
    model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let s1 = sem.clone();
        let adder = thread::spawn(move || s1.add_permits(1));
        let s2 = sem.clone();
        let closer = thread::spawn(move || s2.close());
        let got = block_on(sem.acquire());
        if let Ok(p) = got {
            drop(p);
        }
        adder.join().unwrap();
        closer.join().unwrap();
        assert!(sem.is_closed());
        assert_eq!(sem.available_permits(), 1);
    });
}

/// The waiter re-polls with a new waker while a release completes it:
/// if the re-poll returns Pending, the new waker is the one woken.
#[test]
fn waker_replacement_on_repoll() {
    model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let (c1, w1) = counter();
        let (c2, w2) = counter();
        let mut fut = Box::pin(sem.acquire());
        assert!(poll(fut.as_mut(), &w1).is_pending());
        let s = sem.clone();
        let releaser = thread::spawn(move || s.add_permits(1));
        let second = poll(fut.as_mut(), &w2);
        releaser.join().unwrap();
        if second.is_pending() {
            assert_eq!(c2.0.load(SeqCst), 1, "replaced waker not woken");
            assert_eq!(c1.0.load(SeqCst), 0, "stale waker woken");
            assert!(poll(fut.as_mut(), &w2).is_ready());
        } else {
            assert_eq!(c1.0.load(SeqCst) + c2.0.load(SeqCst), 1);
        }
        drop(second);
        drop(fut);
        assert_eq!(sem.available_permits(), 1);
    });
}

/// Three waiters with `WAKE_BATCH == 2`: the release path unlocks, wakes,
/// relocks and carries on, while a waiter is cancelled concurrently.
#[test]
fn more_wakes_than_one_batch() {
    model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let counters: Vec<_> = (0..3).map(|_| counter()).collect();
        let mut futs: Vec<_> = (0..3).map(|_| Box::pin(sem.acquire())).collect();
        for (f, (_, w)) in futs.iter_mut().zip(&counters) {
            assert!(poll(f.as_mut(), w).is_pending());
        }
        let s = sem.clone();
        let releaser = thread::spawn(move || s.add_permits(3));
        // Cancel the middle waiter while the release runs.
        drop(futs.remove(1));
        releaser.join().unwrap();
        // The survivors were both woken and complete.
        for (i, f) in [0usize, 2].iter().zip(futs.iter_mut()) {
            assert_eq!(counters[*i].0 .0.load(SeqCst), 1, "waiter {i} not woken");
            assert!(poll(f.as_mut(), &counters[*i].1).is_ready());
        }
        drop(futs);
        assert_eq!(sem.available_permits(), 3);
    });
}

/// `forget_permits`, `try_acquire` and a release race on the word.
#[test]
fn concurrent_permit_updates() {
    model(|| {
        let sem = Arc::new(Semaphore::new(2));
        let s = sem.clone();
        let forgetter = thread::spawn(move || s.forget_permits(1));
        let s = sem.clone();
        let taker = thread::spawn(move || {
            if let Ok(p) = s.try_acquire() {
                drop(p);
                1
            } else {
                0
            }
        });
        sem.add_permits(1);
        let forgot = forgetter.join().unwrap();
        let _took = taker.join().unwrap();
        assert_eq!(forgot, 1);
        assert_eq!(sem.available_permits(), 2);
    });
}

/// The models below expect `add_permits` to panic; keep those expected
/// panics out of the output (loom runs each model many times). Any other
/// panic still goes to the previous hook.
fn quiet_overflow_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let expected = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.contains("would overflow MAX_PERMITS"));
            if !expected {
                previous(info);
            }
        }));
    });
}

/// Runs `add_permits(n)` on another thread; the handle yields whether it
/// panicked.
fn add_permits_on_thread(sem: &Arc<Semaphore>, n: usize) -> thread::JoinHandle<bool> {
    let sem = sem.clone();
    thread::spawn(move || catch_unwind(AssertUnwindSafe(|| sem.add_permits(n))).is_err())
}

/// Two lock-free `add_permits` race near `MAX_PERMITS`. The bound is
/// checked on the value each CAS is conditioned on, so they cannot both
/// pass it: exactly one panics, and the count ends at the bound, never
/// past it. (Checking a value read before the CAS loop lets both pass.)
#[test]
fn concurrent_add_permits_near_max() {
    quiet_overflow_panics();
    model(|| {
        const MAX: usize = Semaphore::MAX_PERMITS;
        let sem = Arc::new(Semaphore::new(MAX - 2));
        let adders = [
            add_permits_on_thread(&sem, 2),
            add_permits_on_thread(&sem, 2),
        ];
        let panics = adders
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|p| *p)
            .count();
        assert_eq!(panics, 1);
        assert_eq!(sem.available_permits(), MAX);
    });
}

/// The same race with a waiter queued, so the releases meet the bound on
/// the locked path too: whichever of `add_permits(MAX)` and
/// `add_permits(2)` lands second would pass it and panics; the other feeds
/// the waiter and stores the rest. The waiter is woken either way.
#[test]
fn add_permits_near_max_through_the_wait_list() {
    quiet_overflow_panics();
    model(|| {
        const MAX: usize = Semaphore::MAX_PERMITS;
        let sem = Arc::new(Semaphore::new(0));
        let (c, w) = counter();
        let mut fut = Box::pin(sem.acquire());
        assert!(poll(fut.as_mut(), &w).is_pending());
        let big = add_permits_on_thread(&sem, MAX);
        let small = add_permits_on_thread(&sem, 2);
        let (big, small) = (big.join().unwrap(), small.join().unwrap());
        assert!(big != small, "exactly one must panic");
        let left = if big { 1 } else { MAX - 1 };
        assert_eq!(sem.available_permits(), left);
        assert_eq!(c.0.load(SeqCst), 1, "the waiter was not woken");
        match poll(fut.as_mut(), &w) {
            Poll::Ready(Ok(p)) => p.forget(),
            other => panic!("waiter not served: {:?}", other.map(|r| r.is_ok())),
        };
    });
}
