//! The semaphore wait list's lock: spins a little, then parks.
//!
//! A thread that finds the lock held spins while nobody is parked, for at
//! most ten short rounds (`parking_lot_core`'s `SpinWait`), then parks
//! until an unlock wakes it, so a descheduled holder is not spun against.
//! The unlock is therefore a CAS (it must learn whether a thread parked).
//!
//! # Eventual fairness
//!
//! An unlock that wakes a thread parked for [`FAIR_AFTER`] or longer hands
//! the lock to it (`LOCKED` stays set), so a thread cannot lose the lock to
//! newcomers for ever. Other unlocks let the woken thread race for it,
//! which keeps a busy lock from convoying. The age rides in the park token.
//!
//! # Why not `parking_lot::Mutex`
//!
//! Same protocol (`LOCKED` and `PARKED` bits, parking on `parking_lot_core`'s
//! table keyed by the lock's address), but written on the `sync` shim so the
//! loom models run this code: under loom the table is a loom mutex and
//! condvar per lock (`Lot`) with the same contract.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};

use super::{AtomicU8, MutPtr, Ordering, SpinWait, UnsafeCell};

/// Held by a thread.
const LOCKED: u8 = 1;
/// A thread is parked, or about to park, waiting for the lock: the unlock
/// must wake one.
const PARKED: u8 = 2;

/// How long a parked thread waits before an unlock hands it the lock.
const FAIR_AFTER: core::time::Duration = core::time::Duration::from_micros(500);

/// A lock that spins briefly, then parks. No poisoning: nothing that runs
/// under it can panic half-way through a change.
pub(crate) struct ListLock<T> {
    state: AtomicU8,
    /// Under loom, the parking table of this lock alone.
    #[cfg(all(test, feature = "loom"))]
    lot: lot::Lot,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time,
// so sharing the lock moves `T` between threads but never shares it.
unsafe impl<T: Send> Send for ListLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for ListLock<T> {}

/// Exclusive access to a [`ListLock`]'s contents until dropped.
pub(crate) struct ListGuard<'a, T> {
    lock: &'a ListLock<T>,
    /// Dropped just before the unlock, so that loom sees the access end
    /// while the lock is still held.
    ptr: ManuallyDrop<MutPtr<T>>,
}

impl<T> ListLock<T> {
    #[cfg(not(all(test, feature = "loom")))]
    #[inline]
    pub(crate) const fn new(value: T) -> Self {
        Self {
            state: AtomicU8::new(0),
            value: UnsafeCell::new(value),
        }
    }

    #[cfg(all(test, feature = "loom"))]
    pub(crate) fn new(value: T) -> Self {
        Self {
            state: AtomicU8::new(0),
            lot: lot::Lot::new(),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> ListGuard<'_, T> {
        // Acquire: pairs with the Release of the unlock (`ListGuard::drop`
        // or `unlock_slow`).
        if self
            .state
            .compare_exchange_weak(0, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        ListGuard {
            lock: self,
            ptr: ManuallyDrop::new(self.value.get_mut()),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        let mut backoff = SpinWait::new();
        // When this thread first parked for the lock; read only once it parks.
        let mut since = None;
        // Relaxed (all loads and failed CASes here): a guess at the state;
        // only the Acquire CAS that takes the lock synchronizes.
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & LOCKED == 0 {
                // Acquire: as in `lock`. Keeps `PARKED`: others may sleep.
                match self.state.compare_exchange_weak(
                    state,
                    state | LOCKED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return,
                    Err(now) => state = now,
                }
                continue;
            }
            // Spin only while nobody sleeps (a sleeper means the holder
            // was slow before) and not for long.
            if state & PARKED == 0 && backoff.spin() {
                state = self.state.load(Ordering::Relaxed);
                continue;
            }
            if state & PARKED == 0
                && let Err(now) = self.state.compare_exchange_weak(
                    state,
                    state | PARKED,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
            {
                state = now;
                continue;
            }
            // Sleeps only if, under the table's lock, the lock is still
            // held with `PARKED` set: the unlock that clears it takes the
            // table's lock too, so it finds this thread queued and wakes it.
            let since = *since.get_or_insert_with(lot::now);
            if self.park(since, || {
                self.state.load(Ordering::Relaxed) == LOCKED | PARKED
            }) {
                // Handed the lock by the unlock that woke us; the parking
                // table's lock orders the unlock's writes before this return.
                return;
            }
            backoff = SpinWait::new();
            state = self.state.load(Ordering::Relaxed);
        }
    }

    /// Unlocks a lock some thread parked on: wakes one, and leaves
    /// `PARKED` set if others still sleep. A thread parked for
    /// [`FAIR_AFTER`] is handed the lock (see "Eventual fairness").
    #[cold]
    #[inline(never)]
    fn unlock_slow(&self) {
        self.unpark_one(|woken, more| {
            // Nothing else changes the state meanwhile: `LOCKED` and
            // `PARKED` are both set.
            if woken == Woken::Due {
                // Still `LOCKED`: the woken thread owns it. Relaxed: the
                // parking table's lock orders this thread's writes before
                // the woken one's return, and every other thread takes
                // the lock only after that one's Release unlock.
                if !more {
                    self.state.store(LOCKED, Ordering::Relaxed);
                }
                return true;
            }
            // Release: pairs with the Acquire CAS of the next lock, which
            // sees every write made under the guard.
            self.state
                .store(if more { PARKED } else { 0 }, Ordering::Release);
            false
        });
    }

    /// The key of this lock in `parking_lot_core`'s table: its address,
    /// which only this lock parks on.
    #[cfg(not(all(test, feature = "loom")))]
    fn key(&self) -> usize {
        core::ptr::from_ref(&self.state) as usize
    }

    /// Parks this thread (parked since `since`, see [`lot::now`]) while
    /// `validate` holds; returns whether it was handed the lock.
    #[cfg(not(all(test, feature = "loom")))]
    fn park(&self, since: usize, validate: impl FnOnce() -> bool) -> bool {
        // SAFETY: the key is this lock's own address (see `key`), and
        // `validate` (an atomic load and a compare) neither unwinds nor
        // calls into `parking_lot`.
        let result = unsafe {
            parking_lot_core::park(
                self.key(),
                validate,
                || {},
                |_, _| {},
                parking_lot_core::ParkToken(since),
                None,
            )
        };
        result == parking_lot_core::ParkResult::Unparked(HANDOFF)
    }

    /// Wakes the first parked thread; `callback` (told whether it is due
    /// the lock and whether others still sleep) returns whether it is
    /// handed the lock.
    #[cfg(not(all(test, feature = "loom")))]
    fn unpark_one(&self, callback: impl FnOnce(Woken, bool) -> bool) {
        use parking_lot_core::FilterOp;
        let now = lot::now();
        let woken = core::cell::Cell::new(None);
        // SAFETY: the key is this lock's own address; neither the filter
        // (a compare) nor `callback` (an atomic store) unwinds or calls
        // into `parking_lot`.
        unsafe {
            parking_lot_core::unpark_filter(
                self.key(),
                |parked| {
                    if woken.get().is_some() {
                        return FilterOp::Stop;
                    }
                    woken.set(Some(lot::due(now, parked.0)));
                    FilterOp::Unpark
                },
                |result| {
                    let woken = match woken.get() {
                        Some(w) if result.unparked_threads != 0 => w,
                        _ => Woken::None,
                    };
                    if callback(woken, result.have_more_threads) {
                        HANDOFF
                    } else {
                        parking_lot_core::DEFAULT_UNPARK_TOKEN
                    }
                },
            );
        }
    }

    #[cfg(all(test, feature = "loom"))]
    fn park(&self, _since: usize, validate: impl FnOnce() -> bool) -> bool {
        self.lot.park(validate)
    }

    #[cfg(all(test, feature = "loom"))]
    fn unpark_one(&self, callback: impl FnOnce(Woken, bool) -> bool) {
        self.lot.unpark_one(callback);
    }
}

/// The thread an unlock woke: none, one to race for the lock, or one
/// parked long enough to be handed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Woken {
    None,
    Racing,
    Due,
}

/// The unpark token of a hand-off: the woken thread owns the lock.
#[cfg(not(all(test, feature = "loom")))]
const HANDOFF: parking_lot_core::UnparkToken = parking_lot_core::UnparkToken(1);

impl<T> Deref for ListGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so nothing writes the contents
        // while this borrow lives. A shared reference straight from the
        // pointer: via `&mut T`, two live `&*guard` would invalidate each
        // other.
        self.ptr.with(|p| unsafe { &*p })
    }
}

impl<T> DerefMut for ListGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> Drop for ListGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: dropped once, here; `ptr` is not used after.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        // Release: pairs with the Acquire CAS of the next lock, which then
        // sees every write made under this guard.
        if self
            .lock
            .state
            .compare_exchange(LOCKED, 0, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            self.lock.unlock_slow();
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for ListLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a snapshot for display; the contents are not read.
        let state = self.state.load(Ordering::Relaxed);
        f.debug_struct("ListLock")
            .field("locked", &(state & LOCKED != 0))
            .field("parked", &(state & PARKED != 0))
            .finish_non_exhaustive()
    }
}

/// The clock of a parked thread's age: nanoseconds since the first
/// read, wrapping (only differences under a few seconds are compared).
#[cfg(not(all(test, feature = "loom")))]
mod lot {
    use std::sync::OnceLock;
    use std::time::Instant;

    static EPOCH: OnceLock<Instant> = OnceLock::new();

    pub(super) fn now() -> usize {
        #[allow(clippy::cast_possible_truncation)] // wraps, see above
        let nanos = EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as usize;
        nanos
    }

    /// Whether a thread parked at `since` is due the lock at `now`.
    pub(super) fn due(now: usize, since: usize) -> super::Woken {
        #[allow(clippy::cast_possible_truncation)] // 500 µs fits any usize
        let after = super::FAIR_AFTER.as_nanos() as usize;
        if now.wrapping_sub(since) >= after {
            super::Woken::Due
        } else {
            super::Woken::Racing
        }
    }
}

/// Under loom, `parking_lot_core`'s table for one lock: a mutex and condvar
/// with `park`/`unpark_one`'s contract. Loom has no clock: every other wake
/// is due the lock, so the models run the hand-off and the race alike.
#[cfg(all(test, feature = "loom"))]
mod lot {
    use std::collections::VecDeque;

    use loom::sync::{Condvar, Mutex};

    pub(super) fn now() -> usize {
        0
    }

    #[derive(Debug, Default)]
    struct Queue {
        /// Threads parked and not yet picked by an unpark.
        parked: usize,
        /// Unparks not yet taken by a woken thread: whether each hands
        /// the lock over.
        wakeups: VecDeque<bool>,
        /// Whether the next wake is due the lock.
        due: bool,
    }

    #[derive(Debug)]
    pub(super) struct Lot {
        queue: Mutex<Queue>,
        wake: Condvar,
    }

    impl Lot {
        pub(super) fn new() -> Self {
            Lot {
                queue: Mutex::new(Queue::default()),
                wake: Condvar::new(),
            }
        }

        pub(super) fn park(&self, validate: impl FnOnce() -> bool) -> bool {
            let mut q = self.queue.lock().unwrap();
            if !validate() {
                return false;
            }
            q.parked += 1;
            loop {
                if let Some(handoff) = q.wakeups.pop_front() {
                    return handoff;
                }
                q = self.wake.wait(q).unwrap();
            }
        }

        pub(super) fn unpark_one(&self, callback: impl FnOnce(super::Woken, bool) -> bool) {
            let mut q = self.queue.lock().unwrap();
            let woken = if q.parked > 0 {
                q.parked -= 1;
                q.due = !q.due;
                if q.due {
                    super::Woken::Due
                } else {
                    super::Woken::Racing
                }
            } else {
                super::Woken::None
            };
            let handoff = callback(woken, q.parked > 0);
            if woken != super::Woken::None {
                q.wakeups.push_back(handoff);
            }
            drop(q);
            self.wake.notify_all();
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::ListLock;
    use std::sync::Arc;

    /// Threads that park lose no update and no wake-up.
    #[test]
    fn threads_that_park_lose_no_update() {
        let (threads, per_thread) = if cfg!(miri) { (3, 30) } else { (8, 20_000) };
        let lock = Arc::new(ListLock::new((0usize, Vec::new())));
        let handles: Vec<_> = (0..threads)
            .map(|id| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..per_thread {
                        let mut g = lock.lock();
                        let seen = g.0;
                        std::hint::black_box(&mut g.1).push(id);
                        g.0 = seen + 1;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let g = lock.lock();
        assert_eq!(g.0, threads * per_thread);
        for id in 0..threads {
            assert_eq!(g.1.iter().filter(|&&t| t == id).count(), per_thread);
        }
    }

    /// After a sleeping holder unlocks, every parked thread gets the lock.
    #[test]
    fn a_slow_holder_makes_the_others_park_and_each_is_woken() {
        let lock = Arc::new(ListLock::new(0usize));
        let g = lock.lock();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || *lock.lock() += 1)
            })
            .collect();
        while !format!("{lock:?}").contains("parked: true") {
            std::thread::yield_now();
        }
        drop(g);
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*lock.lock(), 4);
        assert_eq!(
            format!("{lock:?}"),
            "ListLock { locked: false, parked: false, .. }"
        );
    }

    /// A thread parked past `FAIR_AFTER` is handed the lock.
    #[test]
    fn a_thread_parked_past_fair_after_is_handed_the_lock() {
        let lock = Arc::new(ListLock::new(Vec::new()));
        let mut g = lock.lock();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let parked = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                let mut g = lock.lock();
                g.push("parked");
                wait.recv().unwrap();
            })
        };
        while !format!("{lock:?}").contains("parked: true") {
            std::thread::yield_now();
        }
        std::thread::sleep(super::FAIR_AFTER * 40);
        g.push("holder");
        drop(g);
        assert!(format!("{lock:?}").contains("locked: true"));
        go.send(()).unwrap();
        lock.lock().push("holder again");
        parked.join().unwrap();
        assert_eq!(*lock.lock(), ["holder", "parked", "holder again"]);
    }

    /// Two shared borrows of one guard coexist under miri.
    #[test]
    fn two_shared_borrows_of_a_guard_coexist() {
        let lock = ListLock::new(vec![1, 2, 3]);
        let g = lock.lock();
        let a: &Vec<i32> = &g;
        let b: &Vec<i32> = &g;
        assert_eq!(a.len() + b.len(), 6);
        assert_eq!(a[0], b[0]);
    }

    #[test]
    fn a_dropped_guard_unlocks_and_debug_does_not_read_the_contents() {
        let lock = ListLock::new(String::from("secret"));
        {
            let g = lock.lock();
            assert_eq!(
                format!("{lock:?}"),
                "ListLock { locked: true, parked: false, .. }"
            );
            assert_eq!(*g, "secret");
        }
        assert_eq!(
            format!("{lock:?}"),
            "ListLock { locked: false, parked: false, .. }"
        );
        lock.lock().push('!');
        assert_eq!(*lock.lock(), "secret!");
    }
}
