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

/// A permit's count and its release's [`Guess`] in one word, so a permit is
/// returned in two registers:
///
/// | bit 63 | bits 32-62 | bits 0-31 |
/// | --- | --- | --- |
/// | 0 (narrow) | the guess (its bit 31 is 0) | the count |
/// | 1 (wide) | the count's high bits | the count's low bits; no guess |
///
/// A count past `u32::MAX` or a guess with bit 31 set is wide (no guess).
#[derive(Clone, Copy)]
struct Held(u64);

/// The wide form's tag (see [`Held`]).
const WIDE: u64 = 1 << 63;
/// A guess's bit that a narrow form cannot hold.
const GUESS_HIGH: u32 = 1 << 31;

impl Held {
    #[inline]
    fn new(permits: u64, guess: Guess) -> Self {
        let bits = guess.to_bits();
        if permits <= u64::from(u32::MAX) && bits & GUESS_HIGH == 0 {
            Held(permits | u64::from(bits) << 32)
        } else {
            // At most `MAX_PERMITS` (< 2^61): the tag bit is free.
            Held(WIDE | permits)
        }
    }

    #[inline]
    fn permits(self) -> u64 {
        if self.0 & WIDE == 0 {
            u64::from(self.0 as u32)
        } else {
            self.0 & !WIDE
        }
    }

    #[inline]
    fn guess(self) -> Guess {
        if self.0 & WIDE == 0 {
            Guess::from_bits((self.0 >> 32) as u32)
        } else {
            Guess::NONE
        }
    }

    #[inline]
    fn with_permits(self, permits: u64) -> Self {
        Held::new(permits, self.guess())
    }

    /// Moves `other`'s permits into `self`; the sum is at most what a
    /// semaphore can hold.
    #[track_caller]
    fn merge(&mut self, other: &mut Held) {
        let sum = self
            .permits()
            .checked_add(other.permits())
            .filter(|&sum| sum <= super::Semaphore::MAX_PERMITS as u64)
            .expect("number of permits overflowed");
        *self = self.with_permits(sum);
        *other = other.with_permits(0);
    }

    /// Splits `n` of the permits off, if it holds that many.
    fn split(&mut self, n: usize) -> Option<Held> {
        let have = self.permits();
        let n = u64::try_from(n).ok().filter(|&n| n <= have)?;
        *self = self.with_permits(have - n);
        Some(self.with_permits(n))
    }
}

impl<'a> SemaphorePermit<'a> {
    #[inline]
    pub(crate) fn new(sem: &'a Semaphore, permits: u32, guess: Guess) -> Self {
        Self {
            sem,
            held: Held::new(u64::from(permits), guess),
        }
    }

    /// Forgets the permits without releasing them: the semaphore keeps that
    /// many fewer.
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
    /// If the permits come from different semaphores, or the count overflows.
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
        self.held.merge(&mut other.held);
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
        let held = self.held.split(n)?;
        Some(Self {
            sem: self.sem,
            held,
        })
    }

    /// The semaphore the permits belong to.
    pub fn semaphore(&self) -> &Semaphore {
        self.sem
    }

    /// How many permits this guard holds.
    pub fn num_permits(&self) -> usize {
        self.held.permits() as usize
    }
}

impl OwnedSemaphorePermit {
    #[inline]
    pub(crate) fn new(sem: Arc<Semaphore>, permits: u32, guess: Guess) -> Self {
        Self {
            sem,
            held: Held::new(u64::from(permits), guess),
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
    /// If the permits come from different semaphores, or the count overflows.
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
        self.held.merge(&mut other.held);
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
        let held = self.held.split(n)?;
        Some(Self {
            sem: self.sem.clone(),
            held,
        })
    }

    /// The semaphore the permits belong to.
    pub fn semaphore(&self) -> &Arc<Semaphore> {
        &self.sem
    }

    /// How many permits this guard holds.
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
    use super::{Guess, Held, GUESS_HIGH};

    #[test]
    fn the_count_and_the_guess_do_not_bleed_into_each_other() {
        for (n, g) in [
            (0, 0),
            (u64::from(u32::MAX), 0),
            (0, u32::MAX),
            (u64::from(u32::MAX), u32::MAX),
            (7, 0x5a5a),
            (7, 0x7fff_fffc),
            (6_000_000_000, 0x5a5a),
            (1 << 60, 0),
        ] {
            let held = Held::new(n, Guess::from_bits(g));
            assert_eq!(held.permits(), n);
            let want = if g & GUESS_HIGH == 0 && n <= u64::from(u32::MAX) {
                Guess::from_bits(g)
            } else {
                Guess::NONE
            };
            assert_eq!(held.guess(), want);
            let other = if n == 0 { 1 } else { n - 1 };
            let changed = held.with_permits(other);
            assert_eq!(changed.permits(), other);
            if other <= u64::from(u32::MAX) {
                assert_eq!(changed.guess(), want, "count {n} -> {other}");
            }
        }
        assert_eq!(Held::new(3, Guess::NONE).guess(), Guess::NONE);
    }
}
