//! Where an acquire's CAS starts: the word this thread last left the
//! semaphore's state in (see "Acquiring" in the parent module).
//!
//! One slot per thread. A stale word (another semaphore, or one rebuilt at
//! the same address) only costs a failed CAS: it is never more than a CAS's
//! expected value. Under loom the slot is `loom::thread_local!`.

use core::cell::Cell;

#[cfg(not(all(test, feature = "loom")))]
std::thread_local! {
    /// `(semaphore address, word)`; address 0 is no hint.
    static LAST: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

#[cfg(all(test, feature = "loom"))]
loom::thread_local! {
    static LAST: Cell<(usize, usize)> = Cell::new((0, 0));
}

/// The word this thread last left the semaphore at `sem` in, if it was
/// this one.
#[inline]
pub(super) fn get(sem: usize) -> Option<usize> {
    // `try_with`: a hint is not worth a panic.
    match LAST.try_with(Cell::get) {
        Ok((at, word)) if at == sem => Some(word),
        _ => None,
    }
}

/// Records that this thread left the semaphore at `sem` in `word`.
#[inline]
pub(super) fn set(sem: usize, word: usize) {
    let _ = LAST.try_with(|last| last.set((sem, word)));
}

#[cfg(all(test, not(feature = "loom")))]
std::thread_local! {
    /// Counts, per thread, the acquires that loaded the word (no hint).
    static LOADS: Cell<usize> = const { Cell::new(0) };
}

#[cfg(all(test, not(feature = "loom")))]
pub(super) fn loaded() {
    LOADS.with(|n| n.set(n.get() + 1));
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::LOADS;
    use crate::Semaphore;

    /// A thread alone on a semaphore loads its word only at its first acquire.
    #[test]
    fn a_thread_alone_on_a_semaphore_loads_its_word_once() {
        std::thread::spawn(|| {
            let sem = Semaphore::new(4);
            for _ in 0..100 {
                drop(sem.try_acquire().unwrap());
            }
            let other = Semaphore::new(1);
            drop(other.try_acquire().unwrap());
            assert_eq!(LOADS.with(std::cell::Cell::get), 2);
        })
        .join()
        .unwrap();
    }
}
