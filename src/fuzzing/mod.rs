//! Entry points for the cargo-fuzz targets in `fuzz/` that need the
//! crate's internals, compiled only with `--cfg fuzzing` or in tests. The
//! bucket's model reads its raw `tat` and `Quota::clamped`, so it lives
//! with the other models in `tests/fuzz_models/` but is compiled here (as
//! `loom-tests/` is); its unit test runs it on seeded input.

#[path = "../../tests/fuzz_models/bucket_model.rs"]
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
