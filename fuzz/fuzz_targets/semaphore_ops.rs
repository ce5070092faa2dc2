#![no_main]
//! Drives the semaphore with a byte string and diffs it against a simple
//! model (see `tests/fuzz_models/semaphore_ops.rs`).
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_models/main.rs"]
mod models;

fuzz_target!(|data: &[u8]| models::semaphore_ops(data));
