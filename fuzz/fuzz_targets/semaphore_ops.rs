#![no_main]
//! Drives the semaphore with a byte string and diffs it against a simple
//! model (see `src/fuzzing/semaphore_ops.rs`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| backpressure::fuzzing::semaphore_ops(data));
