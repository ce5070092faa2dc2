//! Permits: RAII guards that give their permits back on drop.

use core::fmt;
use std::sync::Arc;

use super::{Guess, Semaphore};

/// Permits borrowed from a [`Semaphore`]; dropping it releases them.
///
/// # Examples
///
/// ```
/// use backpressure::Semaphore;
/// let semaphore = Semaphore::new(2);
/// {
///     let _permit = semaphore.try_acquire().unwrap();
///     assert_eq!(semaphore.available_permits(), 1);
/// }
/// assert_eq!(semaphore.available_permits(), 2);
/// ```
#[must_use = "permits are released as soon as they are dropped"]
#[clippy::has_significant_drop]
pub struct SemaphorePermit<'a> {
    sem: &'a Semaphore,
    permits: u32,
    /// What the release's CAS expects the state word to be (in the four
    /// bytes the pointer's alignment leaves spare).
    guess: Guess,
}

/// Permits owned from an `Arc<Semaphore>`; dropping it releases them.
///
/// # Examples
///
/// ```
/// use backpressure::Semaphore;
/// use std::sync::Arc;
/// let semaphore = Arc::new(Semaphore::new(1));
/// let permit = semaphore.clone().try_acquire_owned().unwrap();
/// let task = std::thread::spawn(move || {
///     let _held = permit; // released when the thread ends
/// });
/// task.join().unwrap();
/// assert_eq!(semaphore.available_permits(), 1);
/// ```
#[must_use = "permits are released as soon as they are dropped"]
#[clippy::has_significant_drop]
pub struct OwnedSemaphorePermit {
    sem: Arc<Semaphore>,
    permits: u32,
    /// As in [`SemaphorePermit`].
    guess: Guess,
}

impl<'a> SemaphorePermit<'a> {
    #[inline]
    pub(crate) fn new(sem: &'a Semaphore, permits: u32, guess: Guess) -> Self {
        Self {
            sem,
            permits,
            guess,
        }
    }

    /// Forgets the permits without releasing them: the semaphore has that
    /// many fewer for good.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(3);
    /// semaphore.try_acquire_many(2).unwrap().forget();
    /// assert_eq!(semaphore.available_permits(), 1);
    /// ```
    #[inline]
    pub fn forget(mut self) {
        self.permits = 0;
    }

    /// Merges `other` into `self`; both must come from the same semaphore.
    ///
    /// # Panics
    ///
    /// If the permits come from different semaphores, or the count
    /// overflows.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(3);
    /// let mut a = semaphore.try_acquire().unwrap();
    /// a.merge(semaphore.try_acquire_many(2).unwrap());
    /// assert_eq!(a.num_permits(), 3);
    /// ```
    #[track_caller]
    pub fn merge(&mut self, mut other: Self) {
        assert!(
            std::ptr::eq(self.sem, other.sem),
            "merging permits from different semaphore instances"
        );
        self.permits = self
            .permits
            .checked_add(other.permits)
            .expect("number of permits overflowed");
        other.permits = 0;
    }

    /// Splits `n` permits off into a new permit; `None` if it holds fewer.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(3);
    /// let mut a = semaphore.try_acquire_many(3).unwrap();
    /// let b = a.split(1).unwrap();
    /// assert_eq!((a.num_permits(), b.num_permits()), (2, 1));
    /// assert!(a.split(5).is_none());
    /// ```
    pub fn split(&mut self, n: usize) -> Option<Self> {
        let n = u32::try_from(n).ok().filter(|&n| n <= self.permits)?;
        self.permits -= n;
        Some(Self {
            sem: self.sem,
            permits: n,
            guess: self.guess,
        })
    }

    /// The semaphore the permits belong to.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(1);
    /// let permit = semaphore.try_acquire().unwrap();
    /// assert!(std::ptr::eq(permit.semaphore(), &semaphore));
    /// ```
    pub fn semaphore(&self) -> &Semaphore {
        self.sem
    }

    /// How many permits this guard holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// let semaphore = Semaphore::new(2);
    /// assert_eq!(semaphore.try_acquire_many(2).unwrap().num_permits(), 2);
    /// ```
    pub fn num_permits(&self) -> usize {
        self.permits as usize
    }
}

impl OwnedSemaphorePermit {
    #[inline]
    pub(crate) fn new(sem: Arc<Semaphore>, permits: u32, guess: Guess) -> Self {
        Self {
            sem,
            permits,
            guess,
        }
    }

    /// Forgets the permits without releasing them.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(2));
    /// semaphore.clone().try_acquire_owned().unwrap().forget();
    /// assert_eq!(semaphore.available_permits(), 1);
    /// ```
    #[inline]
    pub fn forget(mut self) {
        self.permits = 0;
    }

    /// Merges `other` into `self`; both must come from the same semaphore.
    ///
    /// # Panics
    ///
    /// If the permits come from different semaphores, or the count
    /// overflows.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(2));
    /// let mut a = semaphore.clone().try_acquire_owned().unwrap();
    /// a.merge(semaphore.clone().try_acquire_owned().unwrap());
    /// assert_eq!(a.num_permits(), 2);
    /// ```
    #[track_caller]
    pub fn merge(&mut self, mut other: Self) {
        assert!(
            Arc::ptr_eq(&self.sem, &other.sem),
            "merging permits from different semaphore instances"
        );
        self.permits = self
            .permits
            .checked_add(other.permits)
            .expect("number of permits overflowed");
        other.permits = 0;
    }

    /// Splits `n` permits off into a new permit; `None` if it holds fewer.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(2));
    /// let mut a = semaphore.clone().try_acquire_many_owned(2).unwrap();
    /// let b = a.split(1).unwrap();
    /// assert_eq!(b.num_permits(), 1);
    /// ```
    pub fn split(&mut self, n: usize) -> Option<Self> {
        let n = u32::try_from(n).ok().filter(|&n| n <= self.permits)?;
        self.permits -= n;
        Some(Self {
            sem: self.sem.clone(),
            permits: n,
            guess: self.guess,
        })
    }

    /// The semaphore the permits belong to.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(1));
    /// let permit = semaphore.clone().try_acquire_owned().unwrap();
    /// assert!(Arc::ptr_eq(permit.semaphore(), &semaphore));
    /// ```
    pub fn semaphore(&self) -> &Arc<Semaphore> {
        &self.sem
    }

    /// How many permits this guard holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Semaphore;
    /// use std::sync::Arc;
    /// let semaphore = Arc::new(Semaphore::new(1));
    /// assert_eq!(semaphore.try_acquire_owned().unwrap().num_permits(), 1);
    /// ```
    pub fn num_permits(&self) -> usize {
        self.permits as usize
    }
}

impl Drop for SemaphorePermit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.sem.release(self.permits as usize, self.guess);
    }
}

impl Drop for OwnedSemaphorePermit {
    #[inline]
    fn drop(&mut self) {
        self.sem.release(self.permits as usize, self.guess);
    }
}

impl fmt::Debug for SemaphorePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("sem", &self.sem)
            .field("permits", &self.permits)
            .finish()
    }
}

impl fmt::Debug for OwnedSemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedSemaphorePermit")
            .field("sem", &self.sem)
            .field("permits", &self.permits)
            .finish()
    }
}
