//! Limits learned from the server's answers instead of configured.
//!
//! * **Rate**: [`AdaptiveRate`] / [`RateController`]: a request rate per
//!   credential, learned from 429s (and from `RateLimit` headers when the
//!   server sends them), handed to the credential's
//!   [`TokenBucket`](crate::TokenBucket) as a [`Quota`](crate::Quota).
//!   [`Admission`](crate::admission::Admission) does this for every credential unless
//!   told [`fixed_rates`](crate::admission::Builder::fixed_rates).
//! * **Concurrency**: a limit that follows what the downstream can take.
//!
//! A [`LimitAlgorithm`] is fed one [`Sample`] per finished request (start,
//! round-trip time, in-flight count at start, [`Outcome`]) and proposes a
//! limit. Two are provided:
//!
//! * [`Aimd`]: additive increase while the window is used, multiplicative
//!   decrease on a drop (TCP Reno). Needs drops (429, 503, timeouts) to
//!   find the limit.
//! * [`Gradient2`]: short-term against long-term RTT, with tolerance and
//!   queue headroom, smoothed. Backs off as latency rises, before the
//!   downstream starts refusing.
//!
//! Both lower the limit at most once per round trip: drops of requests
//! that started before the last decrease are ignored.
//!
//! [`AdaptiveLimiter`] applies the proposals to the crate's FIFO
//! [`Semaphore`](crate::Semaphore) and hands out [`AdaptivePermit`]s whose
//! drop records the sample.
//!
//! # Examples
//!
//! ```
//! use backpressure::adaptive::{AdaptiveLimiter, Aimd};
//!
//! # futures::executor::block_on(async {
//! let limiter = AdaptiveLimiter::new(Aimd::new());
//! let permit = limiter.acquire().await.unwrap();
//! let status = 200; // ... send the request ...
//! match status {
//!     429 | 503 => permit.dropped(),
//!     _ => permit.success(),
//! }
//! # });
//! ```
//!
//! # Resizing and recording
//!
//! A shrink never revokes a held permit: returning permits are forgotten
//! until the shrink is paid, so once everything is back `available ==
//! limit`. A permit's drop never waits for a lock: a sample that finds the
//! algorithm busy is merged into atomic accumulators for the busy thread
//! to feed, so no sample or drop signal is lost. A plain `drop` skips the
//! algorithm.

mod aimd;
mod algorithm;
mod gradient2;
mod limiter;
mod rate;
mod state;

pub use aimd::Aimd;
pub use algorithm::{LimitAlgorithm, Outcome, Sample};
pub use gradient2::Gradient2;
pub use limiter::{AdaptiveLimiter, AdaptivePermit};
pub use rate::*;
