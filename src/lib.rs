//! Lock-free backpressure primitives for programs that fan out many calls at
//! once: agent harnesses running a model's parallel tool calls, crawlers,
//! gateways, batch workers.
//!
//! | question | primitive |
//! | --- | --- |
//! | how many may be in flight now? | [`Semaphore`] (async, FIFO, cancel-safe) |
//! | is this exact read already running? | [`SingleFlight`] (+ short TTL cache) |
//!
//! Everything is runtime-agnostic: futures only use [`core::task::Waker`],
//! so the same types work under tokio, smol/async-io, or a plain
//! `block_on`.
//!
//! # Examples
//!
//! ```
//! use backpressure::Semaphore;
//! use std::sync::Arc;
//!
//! # futures::executor::block_on(async {
//! // At most 4 requests in flight.
//! let limit = Arc::new(Semaphore::new(4));
//! let permit = limit.clone().acquire_owned().await.unwrap();
//! // ... send the request, holding `permit` ...
//! drop(permit);
//! # });
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub,
    clippy::undocumented_unsafe_blocks
)]
#![doc(test(attr(deny(warnings))))]

mod clock;
#[cfg(any(fuzzing, all(test, not(feature = "loom"))))]
#[doc(hidden)]
pub mod fuzzing;
mod park;
mod semaphore;
mod single_flight;
mod sync;
mod wait_list;

pub use clock::{Clock, DefaultClock, ManualClock};
pub use semaphore::{
    Acquire, AcquireError, AcquireOwned, OwnedSemaphorePermit, Semaphore, SemaphorePermit,
    TryAcquireError,
};
pub use single_flight::{FlightError, Provenance, Run, SingleFlight, SingleFlightBuilder};

#[cfg(all(test, feature = "loom"))]
#[path = "../loom-tests/mod.rs"]
mod loom_tests;
