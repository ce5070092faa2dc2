#![no_main]
//! Drives `SingleFlight` by hand on one thread and diffs it against a model
//! (see `src/fuzzing/single_flight_ops.rs`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| backpressure::fuzzing::single_flight_ops(data));
