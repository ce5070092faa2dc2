#![no_main]
//! Drives `SingleFlight` by hand on one thread and diffs it against a model
//! (see `tests/fuzz_models/single_flight_ops.rs`).
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_models/main.rs"]
mod models;

fuzz_target!(|data: &[u8]| models::single_flight_ops(data));
