//! Where an acquire's compare-and-swap starts: the word this thread last
//! left the semaphore's state in (see "Acquiring" in the parent module).
//!
//! One slot per thread: the semaphore's address and the word. A thread
//! that goes between two semaphores loses the hint on each switch and
//! loads instead; a semaphore freed and another built at its address
//! finds a stale word, which costs a failed compare-and-swap. Neither is
//! unsound: the word is only ever a CAS's expected value.
//!
//! Under loom the slot is `loom::thread_local!` (empty in every execution),
//! so the models run the hinted CAS too.

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
    // `try_with`: never fails for a const-initialised slot without a
    // destructor, but a hint is not worth a panic if it ever does.
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

    /// What the hint is for: a thread that acquires and releases on one
    /// semaphore, alone, starts each CAS from the word it left and loads
    /// it once, at its first acquire (every mutant that drops or ignores
    /// the hint loads it each time).
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
