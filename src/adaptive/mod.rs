//! Limits learned from the server's answers instead of configured.
//!
//! * [`AdaptiveRate`] / [`RateController`]: a request rate per credential,
//!   learned from 429s (and from `RateLimit` headers when the server sends
//!   them), handed to the credential's [`TokenBucket`](crate::TokenBucket)
//!   as a [`Quota`](crate::Quota).

mod rate;

pub use rate::*;
