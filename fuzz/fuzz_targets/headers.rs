#![no_main]
//! Arbitrary header names and bytes through `ServerHint`, its clamp and the
//! retry policy: no panic, every duration bounded (see
//! `src/fuzzing/headers.rs`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| backpressure::fuzzing::headers(data));
