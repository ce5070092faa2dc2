//! Lock-free backpressure primitives for programs that fan out many calls at
//! once: agent harnesses running a model's parallel tool calls, crawlers,
//! gateways, batch workers.
//!
//! | question | primitive |
//! | --- | --- |
//! | how many may be in flight now? | [`Semaphore`] (async, FIFO, cancel-safe) |
//! | how many may start per second? | [`TokenBucket`] (GCRA, one atomic word) |
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
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub,
    clippy::undocumented_unsafe_blocks
)]
#![doc(test(attr(deny(warnings))))]

#[cfg(feature = "admission")]
pub mod adaptive;
#[cfg(feature = "admission")]
pub mod admission;
mod bucket;
mod clock;
#[cfg(feature = "admission")]
mod failure;
#[cfg(any(fuzzing, all(test, not(feature = "loom"))))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "admission")]
pub mod headers;
mod integrations;
mod keyed;
mod limiter;
mod park;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "admission")]
pub mod retry;
mod semaphore;
mod single_flight;
mod sleep;
mod sync;
mod throttled;
mod wait_list;
mod window;

pub use bucket::{CheckError, Quota, QuotaError, Reservation, ReserveError, TokenBucket};
pub use clock::{Clock, ManualClock};
#[cfg(feature = "mcp")]
pub use integrations::mcp;
#[cfg(feature = "reqwest")]
pub use integrations::reqwest;
#[cfg(feature = "testing")]
pub use integrations::testing;
#[cfg(feature = "tower")]
pub use integrations::tower;
pub use keyed::{Scoped, TooManyKeys};
pub use limiter::RateLimiter;
#[cfg(feature = "redis")]
pub use redis::{
    FailPolicy, RedisBucket, RedisBucketBuilder, RedisBucketError, RedisReservation, RedisScoped,
    RedisScopedBuilder, RedisStats,
};
pub use semaphore::{
    AcquireError, OwnedSemaphorePermit, Semaphore, SemaphorePermit, TryAcquireError,
};
pub use sleep::{DefaultSleeper, Sleeper};
pub use throttled::{Status, Throttled};
pub use window::RollingWindow;

/// The README's Rust examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
pub use single_flight::{FlightError, Provenance, SingleFlight, SingleFlightBuilder};

#[cfg(all(test, feature = "loom"))]
#[path = "../loom-tests/mod.rs"]
mod loom_tests;

#[cfg(feature = "admission")]
#[doc = include_str!("guide.md")]
pub mod guide {}
