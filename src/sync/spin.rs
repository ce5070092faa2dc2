//! A spin lock for the semaphore's wait list.
//!
//! # Why not `parking_lot::Mutex`
//!
//! A parking mutex must learn, as it unlocks, whether a thread parked
//! meanwhile, so its unlock is a read-modify-write (`parking_lot`:
//! a compare-and-swap; `std`'s futex mutex: a swap). A lock that never
//! parks unlocks with a plain `Release` store. The semaphore's hand-off
//! takes the lock twice per queued acquisition (the waiter links its node,
//! the releaser unlinks it), so this saves two atomic read-modify-writes
//! per hand-off: on the Intel Xeon VM of `BENCHMARKS.md` each costs
//! 15-18 ns, together about a tenth of a queued acquisition there.
//!
//! # When spinning is right
//!
//! Only for critical sections that are short and run no user code: the
//! wait list is held to link or unlink a node and to move wakers into a
//! batch that is woken after unlocking; waker clones and drops happen
//! outside it. A thread that finds it held spins with backoff and, after
//! a few rounds, yields its time slice (`Backoff::snooze`, as
//! crossbeam-channel's own spin lock does), so a holder preempted by the
//! OS or the hypervisor gets the CPU back instead of being spun against
//! for a whole slice.
//!
//! # Loom
//!
//! Under `cfg(all(test, feature = "loom"))` this same code runs on loom's
//! atomics and cell: the guard holds loom's `MutPtr` for as long as it
//! lives, so loom reports any access to the contents that the lock does
//! not order. `loom-tests/spin_lock.rs` checks it alone; the semaphore's
//! models run on loom's mutex (see `ListLock` in `sync.rs` for why).

use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};

use super::{AtomicBool, Backoff, MutPtr, Ordering, UnsafeCell};

/// A test-and-test-and-set lock that never parks. No poisoning: nothing
/// that runs under it can panic half-way through a change.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time,
// so sharing the lock moves `T` between threads but never shares it.
unsafe impl<T: Send> Send for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// Exclusive access to a [`SpinLock`]'s contents until dropped.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Dropped just before the unlocking store, so that loom sees the
    /// access end while the lock is still held.
    ptr: ManuallyDrop<MutPtr<T>>,
}

impl<T> SpinLock<T> {
    #[cfg(not(all(test, feature = "loom")))]
    #[inline]
    pub(crate) const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[cfg(all(test, feature = "loom"))]
    pub(crate) fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        // Acquire: pairs with the Release store in `SpinGuard::drop`, so
        // this holder sees every write the previous one made.
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        SpinGuard {
            lock: self,
            ptr: ManuallyDrop::new(self.value.get_mut()),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let backoff = Backoff::new();
        loop {
            // Relaxed: spin on a shared read until it looks free; the CAS
            // below is what synchronizes.
            while self.locked.load(Ordering::Relaxed) {
                backoff.snooze();
            }
            // Acquire: as in `lock`.
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
            backoff.spin();
        }
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so nothing writes the contents
        // while this borrow of the guard lives. A shared reference straight
        // from the pointer: going through `&mut T` here would make each of
        // two live `&*guard` invalidate the other.
        self.ptr.with(|p| unsafe { &*p })
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: dropped once, here; `ptr` is not used after.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        // Release: pairs with the Acquire CAS of the next `lock`, which
        // then sees every write made under this guard.
        self.lock.locked.store(false, Ordering::Release);
    }
}

impl<T: fmt::Debug> fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a snapshot for display; the contents are not read (they
        // may be borrowed by the holder).
        f.debug_struct("SpinLock")
            .field("locked", &self.locked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::SpinLock;
    use std::sync::Arc;

    /// Read-then-write updates from two threads: a lock that let two
    /// holders overlap, or did not order one holder's writes before the
    /// next, loses some (and miri reports the race).
    #[test]
    fn two_threads_lose_no_update() {
        let per_thread = if cfg!(miri) { 50 } else { 20_000 };
        let lock = Arc::new(SpinLock::new((0usize, Vec::new())));
        let handles: Vec<_> = (0..2)
            .map(|id| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..per_thread {
                        let mut g = lock.lock();
                        let seen = g.0;
                        g.0 = seen + 1;
                        g.1.push(id);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let g = lock.lock();
        assert_eq!(g.0, 2 * per_thread);
        assert_eq!(g.1.iter().filter(|&&id| id == 0).count(), per_thread);
    }

    /// Two shared borrows of one guard live at once (as `&*guard` twice
    /// would): `Deref` must not make a unique reference for each, which
    /// miri reports as invalidating the first.
    #[test]
    fn two_shared_borrows_of_a_guard_coexist() {
        let lock = SpinLock::new(vec![1, 2, 3]);
        let g = lock.lock();
        let a: &Vec<i32> = &g;
        let b: &Vec<i32> = &g;
        assert_eq!(a.len() + b.len(), 6);
        assert_eq!(a[0], b[0]);
    }

    #[test]
    fn a_dropped_guard_unlocks_and_debug_does_not_read_the_contents() {
        let lock = SpinLock::new(String::from("secret"));
        {
            let g = lock.lock();
            assert_eq!(format!("{lock:?}"), "SpinLock { locked: true, .. }");
            assert_eq!(*g, "secret");
        }
        assert_eq!(format!("{lock:?}"), "SpinLock { locked: false, .. }");
        lock.lock().push('!');
        assert_eq!(*lock.lock(), "secret!");
    }
}
