#![no_main]
//! Arbitrary header names and bytes through `ServerHint` and the retry
//! policy: no panic, every duration bounded (see
//! `tests/fuzz_models/headers.rs`).
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_models/main.rs"]
mod models;

fuzz_target!(|data: &[u8]| models::headers(data));
