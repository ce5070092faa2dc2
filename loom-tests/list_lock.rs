//! Loom models of the semaphore wait list's lock (`src/sync/lock.rs`).
//!
//! The guard holds loom's `MutPtr` for its whole life, so loom itself
//! reports two guards that overlap, or an access the unlock does not order
//! before the next lock, as a causality violation; the counts below check
//! that no update is lost on top of that.

use loom::sync::Arc;
use loom::thread;

use crate::sync::ListLock;

/// Three threads: two can sleep at once, so the unlock that wakes one
/// must leave `PARKED` set for the other, or it sleeps for ever (loom
/// reports the deadlock).
#[test]
fn every_parked_thread_is_woken() {
    model(|| {
        let lock = Arc::new(ListLock::new(0usize));
        let others: Vec<_> = (0..2)
            .map(|_| {
                let lock = lock.clone();
                thread::spawn(move || *lock.lock() += 1)
            })
            .collect();
        *lock.lock() += 1;
        for t in others {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 3);
    });
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    // Retries of a CAS and the park's condition-variable waits make
    // longer runs than the default bound of 1,000 branches allows.
    b.max_branches = 10_000;
    b.check(f);
}

/// Two threads each make a read-then-write update under the lock: with
/// mutual exclusion and the Acquire/Release pair, none is lost.
#[test]
fn updates_under_the_lock_are_exclusive_and_ordered() {
    model(|| {
        let lock = Arc::new(ListLock::new(0usize));
        let other = lock.clone();
        let t = thread::spawn(move || {
            let mut g = other.lock();
            let seen = *g;
            *g = seen + 1;
        });
        {
            let mut g = lock.lock();
            let seen = *g;
            *g = seen + 1;
        }
        t.join().unwrap();
        assert_eq!(*lock.lock(), 2);
    });
}

/// Data written under the lock but outside the locked value (a plain cell
/// the lock is meant to protect, as the wait list's nodes are) is seen by
/// the next holder.
#[test]
fn the_unlock_publishes_what_the_holder_wrote() {
    use loom::cell::UnsafeCell;
    struct Shared {
        lock: ListLock<()>,
        side: UnsafeCell<usize>,
    }
    // SAFETY: `side` is only touched with `lock` held (the property under
    // test; loom reports it if the lock fails to provide it).
    unsafe impl Sync for Shared {}
    model(|| {
        let s = Arc::new(Shared {
            lock: ListLock::new(()),
            side: UnsafeCell::new(0),
        });
        let s2 = s.clone();
        let t = thread::spawn(move || {
            let _g = s2.lock.lock();
            // SAFETY: the lock is held.
            s2.side.with_mut(|p| unsafe { *p += 1 });
        });
        {
            let _g = s.lock.lock();
            // SAFETY: the lock is held.
            s.side.with_mut(|p| unsafe { *p += 1 });
        }
        t.join().unwrap();
        let _g = s.lock.lock();
        // SAFETY: the lock is held.
        assert_eq!(s.side.with(|p| unsafe { *p }), 2);
    });
}
