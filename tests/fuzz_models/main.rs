//! The fuzz crate's models of the semaphore, of `SingleFlight` and of
//! `ServerHint` with the retry policy, driven
//! here by seeded random input (and under miri), and by libFuzzer from
//! `fuzz/fuzz_targets/` (which includes this file by `#[path]`). Each
//! drives one structure with a byte string and diffs it against a simple
//! model; they use only the public API. (`bucket_model.rs`, which reads the
//! bucket's internals, is compiled into the library: see `src/fuzzing/`.)

// Each fuzz target uses one model.
#![allow(dead_code, unused_imports)]

#[cfg(feature = "admission")]
mod headers;
mod semaphore_ops;
mod single_flight_ops;

#[cfg(feature = "admission")]
pub use headers::headers;
pub use semaphore_ops::semaphore_ops;
pub use single_flight_ops::single_flight_ops;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

/// A waker that counts its wakes, for the drivers' wake assertions.
#[derive(Default)]
pub struct CountingWaker(pub AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        // Relaxed: single-threaded drivers; the count is the only datum.
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}
