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
    held: Held,
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
    held: Held,
}

/// A permit's count and what its release's CAS expects the state word to
/// be (see [`Guess`]), in one word: the guess takes the four bytes the
/// pointer's alignment leaves spare.
///
/// One word, not two fields, so that a permit is two scalars (a pointer
/// and a word) and a call returns it in two registers. As three fields it
/// is returned through memory, and the caller's 16-byte load of it waits
/// for the callee's three narrower stores to drain (a failed store
/// forward): perf put a third of an uncontended `acquire().await` + drop
/// on that load.
#[derive(Clone, Copy)]
struct Held(u64);

impl Held {
    #[inline]
    fn new(permits: u32, guess: Guess) -> Self {
        Held(u64::from(permits) | u64::from(guess.to_bits()) << 32)
    }

    #[inline]
    fn permits(self) -> u32 {
        // Truncation intended: the low half is the count.
        self.0 as u32
    }

    #[inline]
    fn guess(self) -> Guess {
        Guess::from_bits((self.0 >> 32) as u32)
    }

    #[inline]
    fn with_permits(self, permits: u32) -> Self {
        Held::new(permits, self.guess())
    }
}

impl<'a> SemaphorePermit<'a> {
    #[inline]
    pub(crate) fn new(sem: &'a Semaphore, permits: u32, guess: Guess) -> Self {
        Self {
            sem,
            held: Held::new(permits, guess),
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
        self.held = self.held.with_permits(0);
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
        let sum = self
            .held
            .permits()
            .checked_add(other.held.permits())
            .expect("number of permits overflowed");
        self.held = self.held.with_permits(sum);
        other.held = other.held.with_permits(0);
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
        let have = self.held.permits();
        let n = u32::try_from(n).ok().filter(|&n| n <= have)?;
        self.held = self.held.with_permits(have - n);
        Some(Self {
            sem: self.sem,
            held: self.held.with_permits(n),
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
        self.held.permits() as usize
    }
}

impl OwnedSemaphorePermit {
    #[inline]
    pub(crate) fn new(sem: Arc<Semaphore>, permits: u32, guess: Guess) -> Self {
        Self {
            sem,
            held: Held::new(permits, guess),
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
        self.held = self.held.with_permits(0);
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
        let sum = self
            .held
            .permits()
            .checked_add(other.held.permits())
            .expect("number of permits overflowed");
        self.held = self.held.with_permits(sum);
        other.held = other.held.with_permits(0);
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
        let have = self.held.permits();
        let n = u32::try_from(n).ok().filter(|&n| n <= have)?;
        self.held = self.held.with_permits(have - n);
        Some(Self {
            sem: self.sem.clone(),
            held: self.held.with_permits(n),
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
        self.held.permits() as usize
    }
}

impl Drop for SemaphorePermit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.sem
            .release(self.held.permits() as usize, self.held.guess());
    }
}

impl Drop for OwnedSemaphorePermit {
    #[inline]
    fn drop(&mut self) {
        self.sem
            .release(self.held.permits() as usize, self.held.guess());
    }
}

impl fmt::Debug for SemaphorePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("sem", &self.sem)
            .field("permits", &self.held.permits())
            .finish()
    }
}

impl fmt::Debug for OwnedSemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedSemaphorePermit")
            .field("sem", &self.sem)
            .field("permits", &self.held.permits())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{Guess, Held};

    #[test]
    fn the_count_and_the_guess_do_not_bleed_into_each_other() {
        for (n, g) in [
            (0, 0),
            (u32::MAX, 0),
            (0, u32::MAX),
            (u32::MAX, u32::MAX),
            (7, 0x5a5a),
        ] {
            let held = Held::new(n, Guess::from_bits(g));
            assert_eq!(held.permits(), n);
            assert_eq!(held.guess(), Guess::from_bits(g));
            let other = if n == 0 { 1 } else { n - 1 };
            let changed = held.with_permits(other);
            assert_eq!(changed.permits(), other);
            assert_eq!(changed.guess(), Guess::from_bits(g), "count {n} -> {other}");
        }
        assert_eq!(Held::new(3, Guess::NONE).guess(), Guess::NONE);
    }
}
