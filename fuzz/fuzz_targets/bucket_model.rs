#![no_main]
//! Drives the token bucket with a byte string and diffs it against a
//! u128 reference model (see `tests/fuzz_models/bucket_model.rs`, which the
//! library compiles as `backpressure::fuzzing` under `--cfg fuzzing`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| backpressure::fuzzing::bucket_model(data));
