//! An async, FIFO, cancellation-safe counting semaphore.
//!
//! [`Semaphore`] has tokio's API (1.54); unlike tokio's, a release with
//! nobody waiting takes no lock. The algorithm is in `raw.rs`.

mod acquire;
mod permit;
mod raw;

use core::fmt;
use std::sync::Arc;

pub(crate) use acquire::{Acquire, AcquireOwned};
pub use permit::{OwnedSemaphorePermit, SemaphorePermit};

pub(crate) use raw::Guess;
use raw::RawSemaphore;

/// A counting semaphore that hands out permits in FIFO order.
///
/// A call to [`acquire`](Self::acquire) waits (asynchronously) until a
/// permit is free; dropping the returned [`SemaphorePermit`] gives it back.
/// Waiters are served strictly in the order they first polled: a queued
/// `acquire_many(3)` is never overtaken by later `acquire()` calls, and
/// [`try_acquire`](Self::try_acquire) fails rather than take permits that a
/// queued waiter is owed.
///
/// A release wakes every waiter it satisfies at once.
///
/// # Examples
///
/// Limit how many requests run at once:
///
/// ```
/// use backpressure::Semaphore;
/// use std::sync::Arc;
///
/// # futures::executor::block_on(async {
/// let semaphore = Arc::new(Semaphore::new(2));
///
/// let first = semaphore.acquire().await.unwrap();
/// let second = semaphore.acquire().await.unwrap();
/// assert_eq!(semaphore.available_permits(), 0);
/// assert!(semaphore.try_acquire().is_err());
///
/// drop(first);
/// assert_eq!(semaphore.available_permits(), 1);
/// # drop(second);
/// # });
/// ```
pub struct Semaphore {
    raw: RawSemaphore,
}

/// Error returned by [`Semaphore::acquire`] and friends: the semaphore was
/// closed.
///
/// # Examples
///
/// ```
/// use backpressure::Semaphore;
///
/// let semaphore = Semaphore::new(1);
/// semaphore.close();
/// let err = futures::executor::block_on(semaphore.acquire()).unwrap_err();
/// assert_eq!(err.to_string(), "semaphore closed");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireError(());

/// Error returned by [`Semaphore::try_acquire`] and friends.
///
/// # Examples
///
/// ```
/// use backpressure::{Semaphore, TryAcquireError};
///
/// let semaphore = Semaphore::new(0);
/// assert_eq!(semaphore.try_acquire().err(), Some(TryAcquireError::NoPermits));
/// semaphore.close();
/// assert_eq!(semaphore.try_acquire().err(), Some(TryAcquireError::Closed));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryAcquireError {
    /// The semaphore has been [closed](Semaphore::close).
    Closed,
    /// Not enough permits were available (or earlier waiters are owed them).
    NoPermits,
}

impl AcquireError {
    pub(crate) fn closed() -> Self {
        AcquireError(())
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("semaphore closed")
    }
}

impl std::error::Error for AcquireError {}

impl TryAcquireError {
    /// Whether the error was caused by a closed semaphore.
    pub fn is_closed(&self) -> bool {
        matches!(self, TryAcquireError::Closed)
    }

    /// Whether the error was caused by a lack of permits.
    pub fn is_no_permits(&self) -> bool {
        matches!(self, TryAcquireError::NoPermits)
    }
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryAcquireError::Closed => f.write_str("semaphore closed"),
            TryAcquireError::NoPermits => f.write_str("no permits available"),
        }
    }
}

impl std::error::Error for TryAcquireError {}

impl Semaphore {
    /// The maximum number of permits a semaphore can hold: `usize::MAX >> 3`.
    ///
    /// Exceeding it panics with tokio's messages: in [`new`](Self::new), an
    /// acquire asking for more, or a release ([`add_permits`](Self::add_permits)
    /// or a permit's drop) whose leftover after serving queued waiters would
    /// push [`available_permits`](Self::available_permits) past it. Unlike
    /// tokio, the count never passes the bound: the release is refused, then
    /// panics (not again while unwinding; the permits are then dropped).
    pub const MAX_PERMITS: usize = raw::MAX_PERMITS;

    /// Creates a semaphore with `permits` permits.
    ///
    /// # Panics
    ///
    /// If `permits` exceeds [`Semaphore::MAX_PERMITS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(3);
    /// assert_eq!(semaphore.available_permits(), 3);
    /// ```
    #[track_caller]
    pub fn new(permits: usize) -> Self {
        raw::assert_max(permits);
        Self {
            raw: RawSemaphore::new(permits),
        }
    }

    /// Creates a semaphore with `permits` permits, in a `const` context.
    ///
    /// # Panics
    ///
    /// If `permits` exceeds [`Semaphore::MAX_PERMITS`] (at compile time in
    /// a `static`).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    ///
    /// static SEMAPHORE: Semaphore = Semaphore::const_new(10);
    /// assert_eq!(SEMAPHORE.available_permits(), 10);
    /// ```
    #[cfg(not(all(test, feature = "loom")))]
    pub const fn const_new(permits: usize) -> Self {
        assert!(permits <= Self::MAX_PERMITS);
        Self {
            raw: RawSemaphore::new(permits),
        }
    }

    /// Returns the number of permits available right now.
    pub fn available_permits(&self) -> usize {
        self.raw.available_permits()
    }

    /// Adds `n` new permits, waking queued waiters that they satisfy (oldest
    /// first). Permits can be added after [`close`](Self::close); they are
    /// counted but never handed out.
    ///
    /// # Panics
    ///
    /// If the permits left after serving the queued waiters would push the
    /// available count past [`Semaphore::MAX_PERMITS`]; the waiters served
    /// are still woken. A panicking waker is resumed here after every other
    /// satisfied waiter is woken and the leftover stored.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(0);
    /// semaphore.add_permits(2);
    /// assert_eq!(semaphore.available_permits(), 2);
    ///
    /// let full = Semaphore::new(Semaphore::MAX_PERMITS);
    /// let overflow = std::panic::catch_unwind(|| full.add_permits(1));
    /// assert!(overflow.is_err());
    /// assert_eq!(full.available_permits(), Semaphore::MAX_PERMITS);
    /// ```
    #[track_caller]
    pub fn add_permits(&self, n: usize) {
        self.raw.add_permits(n);
    }

    /// Removes up to `n` available permits and returns how many were
    /// removed. Permits held by others, or owed to queued waiters, are not
    /// touched. The closed state is kept.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(3);
    /// assert_eq!(semaphore.forget_permits(5), 3);
    /// assert_eq!(semaphore.available_permits(), 0);
    /// ```
    pub fn forget_permits(&self, n: usize) -> usize {
        self.raw.forget_permits(n)
    }

    /// Closes the semaphore: queued and future acquires fail with
    /// [`AcquireError`], `try_acquire` fails with
    /// [`TryAcquireError::Closed`]. Permits already held stay valid.
    ///
    /// # Panics
    ///
    /// Only if a queued waiter's waker panics, and only after every queued
    /// waiter has been failed and woken.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Semaphore, TryAcquireError};
    /// let semaphore = Semaphore::new(1);
    /// semaphore.close();
    /// assert!(semaphore.is_closed());
    /// assert_eq!(semaphore.try_acquire().err(), Some(TryAcquireError::Closed));
    /// ```
    pub fn close(&self) {
        self.raw.close();
    }

    /// Returns whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.raw.is_closed()
    }

    /// Acquires one permit, waiting in FIFO order.
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed (before or while waiting).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back every permit already assigned to it
    /// and wakes the next waiter if that satisfies it; it loses its place in
    /// the queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// # futures::executor::block_on(async {
    /// let semaphore = Semaphore::new(1);
    /// let permit = semaphore.acquire().await.unwrap();
    /// assert_eq!(permit.num_permits(), 1);
    /// # });
    /// ```
    #[inline]
    pub fn acquire(&self) -> Acquire<'_> {
        Acquire::new(self, 1)
    }

    /// Acquires `n` permits at once, waiting in FIFO order. Permits are
    /// assigned to a queued `acquire_many` as they are released, so it is not
    /// starved by small requests. `acquire_many(0)` completes at once (unless
    /// the semaphore is closed).
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire): permits assigned so far are returned.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// # futures::executor::block_on(async {
    /// let semaphore = Semaphore::new(5);
    /// let permit = semaphore.acquire_many(3).await.unwrap();
    /// assert_eq!(semaphore.available_permits(), 2);
    /// # drop(permit);
    /// # });
    /// ```
    #[inline]
    pub fn acquire_many(&self, n: u32) -> Acquire<'_> {
        Acquire::new(self, n)
    }

    /// Acquires one permit if one is free and no earlier waiter is owed it.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] or [`TryAcquireError::NoPermits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Semaphore, TryAcquireError};
    /// let semaphore = Semaphore::new(1);
    /// let permit = semaphore.try_acquire().unwrap();
    /// assert_eq!(semaphore.try_acquire().err(), Some(TryAcquireError::NoPermits));
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<SemaphorePermit<'_>, TryAcquireError> {
        let guess = self.raw.try_acquire(1)?;
        Ok(SemaphorePermit::new(self, 1, guess))
    }

    /// Acquires `n` permits if they are free and no earlier waiter is owed
    /// them.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] or [`TryAcquireError::NoPermits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(4);
    /// let permit = semaphore.try_acquire_many(3).unwrap();
    /// assert!(semaphore.try_acquire_many(2).is_err());
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire_many(&self, n: u32) -> Result<SemaphorePermit<'_>, TryAcquireError> {
        let guess = self.raw.try_acquire(n as usize)?;
        Ok(SemaphorePermit::new(self, n, guess))
    }

    /// Acquires one permit for an `Arc<Semaphore>`; the permit owns a clone
    /// of the `Arc`, so it can move into a spawned task.
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// # futures::executor::block_on(async {
    /// let semaphore = Arc::new(Semaphore::new(1));
    /// let permit = semaphore.clone().acquire_owned().await.unwrap();
    /// std::thread::spawn(move || drop(permit)).join().unwrap();
    /// assert_eq!(semaphore.available_permits(), 1);
    /// # });
    /// ```
    #[inline]
    pub fn acquire_owned(self: Arc<Self>) -> AcquireOwned {
        AcquireOwned::new(self, 1)
    }

    /// Acquires `n` permits for an `Arc<Semaphore>`.
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// # futures::executor::block_on(async {
    /// let semaphore = Arc::new(Semaphore::new(3));
    /// let permit = semaphore.clone().acquire_many_owned(2).await.unwrap();
    /// assert_eq!(permit.num_permits(), 2);
    /// # });
    /// ```
    #[inline]
    pub fn acquire_many_owned(self: Arc<Self>, n: u32) -> AcquireOwned {
        AcquireOwned::new(self, n)
    }

    /// Acquires one permit for an `Arc<Semaphore>` if one is free.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] or [`TryAcquireError::NoPermits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(1));
    /// let permit = semaphore.clone().try_acquire_owned().unwrap();
    /// assert!(semaphore.clone().try_acquire_owned().is_err());
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: Arc<Self>) -> Result<OwnedSemaphorePermit, TryAcquireError> {
        let guess = self.raw.try_acquire(1)?;
        Ok(OwnedSemaphorePermit::new(self, 1, guess))
    }

    /// Acquires `n` permits for an `Arc<Semaphore>` if they are free.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] or [`TryAcquireError::NoPermits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(4));
    /// let permit = semaphore.clone().try_acquire_many_owned(4).unwrap();
    /// assert_eq!(semaphore.available_permits(), 0);
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire_many_owned(
        self: Arc<Self>,
        n: u32,
    ) -> Result<OwnedSemaphorePermit, TryAcquireError> {
        let guess = self.raw.try_acquire(n as usize)?;
        Ok(OwnedSemaphorePermit::new(self, n, guess))
    }

    /// Acquires one permit, blocking the current thread until it is free.
    ///
    /// Must not be called from inside an async task (it would block the
    /// executor's thread); unlike tokio's, it does not detect that.
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    ///
    /// let semaphore = Arc::new(Semaphore::new(1));
    /// let held = semaphore.try_acquire().unwrap();
    /// let sem = semaphore.clone();
    /// let waiter = std::thread::spawn(move || sem.blocking_acquire().unwrap().num_permits());
    /// drop(held);
    /// assert_eq!(waiter.join().unwrap(), 1);
    /// ```
    pub fn blocking_acquire(&self) -> Result<SemaphorePermit<'_>, AcquireError> {
        crate::park::block_on(self.acquire())
    }

    /// Acquires `n` permits, blocking the current thread until they are
    /// free. See [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(3);
    /// let permit = semaphore.blocking_acquire_many(2).unwrap();
    /// assert_eq!(semaphore.available_permits(), 1);
    /// # drop(permit);
    /// ```
    pub fn blocking_acquire_many(&self, n: u32) -> Result<SemaphorePermit<'_>, AcquireError> {
        crate::park::block_on(self.acquire_many(n))
    }

    /// Acquires one permit for an `Arc<Semaphore>`, blocking the current
    /// thread. See [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(1));
    /// let permit = semaphore.clone().blocking_acquire_owned().unwrap();
    /// assert_eq!(semaphore.available_permits(), 0);
    /// # drop(permit);
    /// ```
    pub fn blocking_acquire_owned(self: Arc<Self>) -> Result<OwnedSemaphorePermit, AcquireError> {
        crate::park::block_on(self.acquire_owned())
    }

    /// Acquires `n` permits for an `Arc<Semaphore>`, blocking the current
    /// thread. See [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Errors
    ///
    /// [`AcquireError`] if the semaphore is closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(2));
    /// let permit = semaphore.clone().blocking_acquire_many_owned(2).unwrap();
    /// assert_eq!(permit.num_permits(), 2);
    /// ```
    pub fn blocking_acquire_many_owned(
        self: Arc<Self>,
        n: u32,
    ) -> Result<OwnedSemaphorePermit, AcquireError> {
        crate::park::block_on(self.acquire_many_owned(n))
    }

    /// Takes `n` permits without a permit object; give them back with
    /// [`release`](Self::release) (the tower layer's one-pointer permit).
    #[cfg(feature = "admission")]
    #[inline]
    pub(crate) fn try_take(&self, n: usize) -> Result<(), TryAcquireError> {
        self.raw.try_acquire(n).map(|_| ())
    }

    /// Returns `n` permits; the first CAS expects `guess`.
    #[inline]
    pub(crate) fn release(&self, n: usize, guess: Guess) {
        self.raw.release(n, guess);
    }
}

// Unwind safe like tokio's: bound checks panic before any change, waker
// panics are resumed after the hand-off, and the mutex does not poison.
impl std::panic::UnwindSafe for Semaphore {}
impl std::panic::RefUnwindSafe for Semaphore {}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.raw.fmt(f)
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_word_too_wide_to_guess_is_read() {
        let big = 1usize << 40;
        let sem = Semaphore::new(big);
        let mut p = sem.try_acquire_many(3).unwrap();
        let q = p.split(2).unwrap();
        drop(p);
        assert_eq!(sem.available_permits(), big - 2);
        drop(q);
        assert_eq!(sem.available_permits(), big);
        assert_eq!(raw::Guess::of(big << 2), raw::Guess::NONE);
    }
}
