//! Entry points for the cargo-fuzz targets in `fuzz/` that need the
//! crate's internals (the models of the semaphore and `SingleFlight` use
//! only the public API and live in `tests/fuzz_models/`). Each drives one
//! structure with a byte string and diffs it against a simple model; the
//! unit tests run them on seeded input too. Compiled only with
//! `--cfg fuzzing` or in tests.

mod bucket_model;

pub use bucket_model::bucket_model;

#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(test)]
use std::sync::Arc;
#[cfg(test)]
use std::task::Wake;

/// A waker that counts its wakes, for the unit tests' wake assertions.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct CountingWaker(pub(crate) AtomicUsize);

#[cfg(test)]
impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        // Relaxed: single-threaded drivers; the count is the only datum.
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}
