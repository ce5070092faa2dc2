//! The one place that picks `std` or `loom` primitives.
//!
//! Every other module names atomics, cells and locks through this shim, so
//! the loom models in `loom-tests/` check the code that ships. The switch is
//! `cfg(all(test, feature = "loom"))`, not the feature alone, so `cargo test
//! --features loom` runs the models and the ordinary tests. The std side
//! mirrors loom's API and keeps `const` constructors.

#![allow(dead_code, unused_imports)]

pub(crate) use imp::*;

mod lock;
/// The semaphore's wait-list lock, in the shipped build and under loom alike.
pub(crate) use lock::{ListGuard, ListLock};

/// Blocking primitives for the `ThreadSleeper` timer thread; loom does not
/// model it.
pub(crate) use parking_lot::{Condvar as ThreadCondvar, Mutex as ThreadMutex};

#[cfg(not(all(test, feature = "loom")))]
mod imp {
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use std::sync::Arc;

    /// `std::cell::UnsafeCell` with loom's closure-based access API.
    #[derive(Debug)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        #[inline]
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        /// Runs `f` with a shared pointer to the contents.
        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Runs `f` with a mutable pointer to the contents.
        #[inline]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }

        /// A mutable pointer to the contents (loom's `get_mut`).
        #[inline]
        pub(crate) fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    /// loom's `MutPtr`: here just the pointer.
    #[derive(Debug)]
    pub(crate) struct MutPtr<T>(*mut T);

    impl<T> MutPtr<T> {
        /// Runs `f` with the raw pointer (loom's `MutPtr::with`).
        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0)
        }

        /// # Safety
        ///
        /// The contents are live and nothing else accesses them while the
        /// reference lives.
        #[inline]
        #[allow(clippy::mut_from_ref)]
        pub(crate) unsafe fn deref(&self) -> &mut T {
            // SAFETY: the caller's contract.
            unsafe { &mut *self.0 }
        }
    }

    /// A mutex whose `lock` returns the guard directly (no poisoning).
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        #[inline]
        pub(crate) const fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }

        #[inline]
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// Exponential spin after a failed CAS (crossbeam's `Backoff`).
    pub(crate) type Backoff = crossbeam_utils::Backoff;

    /// How long a thread that finds the wait list's lock held spins before
    /// it parks: `parking_lot_core`'s.
    pub(crate) type SpinWait = parking_lot_core::SpinWait;

    /// A reader-writer lock whose guards are returned directly.
    pub(crate) type RwLock<T> = parking_lot::RwLock<T>;

    /// Wraps a value so it sits alone on its cache line(s).
    pub(crate) type CachePadded<T> = crossbeam_utils::CachePadded<T>;

    /// How many wakers are collected under a lock before it is released.
    pub(crate) const WAKE_BATCH: usize = 32;
}

#[cfg(all(test, feature = "loom"))]
mod imp {
    pub(crate) use loom::cell::{MutPtr, UnsafeCell};
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use loom::sync::Arc;

    /// loom's mutex with the guard returned directly.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap()
        }
    }

    /// Under loom a failed CAS yields, so the model explores the
    /// interleaving that made it fail.
    #[derive(Debug, Default)]
    pub(crate) struct Backoff;

    impl Backoff {
        pub(crate) fn new() -> Self {
            Backoff
        }
        pub(crate) fn spin(&self) {
            loom::hint::spin_loop();
        }
        pub(crate) fn snooze(&self) {
            loom::thread::yield_now();
        }
    }

    pub(crate) type CachePadded<T> = crossbeam_utils::CachePadded<T>;

    /// Under loom a thread that finds the lock held parks at once.
    #[derive(Debug)]
    pub(crate) struct SpinWait;

    impl SpinWait {
        pub(crate) fn new() -> Self {
            SpinWait
        }

        pub(crate) fn spin(&mut self) -> bool {
            false
        }
    }

    /// loom's reader-writer lock with the guards returned directly.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap()
        }
        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap()
        }
    }

    /// Small under loom, so three waiters exercise the unlock-wake-relock path.
    pub(crate) const WAKE_BATCH: usize = 2;
}
