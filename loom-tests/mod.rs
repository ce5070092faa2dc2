//! Loom models, compiled into the library's own test binary only under
//! `cfg(all(test, feature = "loom"))` (see `src/lib.rs`).
//!
//! Run them with `cargo test --release --features loom` (the CI does);
//! `LOOM_MAX_PREEMPTIONS` defaults to 2 here via each model's builder.

mod adaptive;
mod admission;
mod breaker;
mod bucket;
mod keyed;
mod lanes;
mod list_lock;
mod rescales;
mod retry_budget;
mod semaphore;
mod single_flight;
