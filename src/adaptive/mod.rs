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
//! # Resizing without losing a permit
//!
//! * **Grow** by `n`: first un-mark permits that an earlier shrink still
//!   wanted back (they are out, so they count), then `add_permits` the
//!   rest, which go to the oldest waiters first.
//! * **Shrink** by `n`: add `n` to an atomic *excess*, then forget free
//!   permits up to the excess (`forget_permits` never touches permits that
//!   a queued waiter is owed). Each returning permit then CAS-decrements the
//!   excess and is forgotten instead of released, until the excess is paid.
//!
//! So `issued == limit + excess` at all times, the semaphore's wait list is
//! only ever served by its own FIFO hand-off, and once everything is back
//! `available == limit`. A returning permit decides "withhold or release"
//! before releasing, then re-reads the excess with the same RMW that lowers
//! the in-flight count; if a shrink slipped in between, it asks for the
//! free permit to be forgotten. `state.rs` documents the words and why this
//! leaves no permit hiding.
//!
//! # No blocking lock on the fast path
//!
//! The algorithm is `&mut self`, so it needs exclusive access, but a permit
//! drop must never wait for another thread. The algorithm sits behind a
//! *try-lock that nobody waits for*: a drop takes it with one CAS, feeds its
//! sample, applies the new limit and unlocks. A drop that finds it taken
//! adds its sample to lock-free atomic accumulators (count and RTT sum of
//! successes in one word; the latest start of a drop in another) and sets a
//! `DIRTY` bit; the holder's unlock fails on that bit, so it drains the
//! accumulators before leaving, and if it had already left, the `fetch_or`
//! that set the bit took the lock for the late thread instead. No sample is
//! lost and no drop signal is lost; merged samples only lose their
//! individual detail (the algorithm sees their mean RTT, and one drop with
//! the latest start, which is the one that can count under the
//! once-per-round-trip rule).
//!
//! Why not the alternatives: a mutex puts a blocking lock on every permit
//! drop; sampling only one request in N loses drop signals, which are the
//! ones that matter; a lock-free queue of samples allocates per sample. A
//! plain `drop` (an ignored outcome) skips the algorithm entirely and costs
//! one CAS on the semaphore and one RMW on the in-flight word.

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
