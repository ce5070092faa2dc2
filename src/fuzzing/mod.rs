//! Entry points for the cargo-fuzz targets in `fuzz/`: each drives one
//! structure with a byte string and diffs it against a simple model. The
//! unit tests run them on seeded input too. Compiled only with
//! `--cfg fuzzing` or in tests.

#[cfg(feature = "admission")]
mod headers;
mod semaphore_ops;

#[cfg(feature = "admission")]
pub use headers::headers;
mod bucket_model;

pub use bucket_model::bucket_model;
pub use semaphore_ops::semaphore_ops;
mod single_flight_ops;
pub use single_flight_ops::single_flight_ops;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

/// A waker that counts its wakes, for the drivers' wake assertions.
#[derive(Default)]
pub(crate) struct CountingWaker(pub(crate) AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        // Relaxed: single-threaded drivers; the count is the only datum.
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}
