//! Limits learned from the server: the rate controller, AdaptiveLimiter, and both through the admission layer.
//!
//! One test binary per area (each links once); each module was its own
//! binary before and keeps its own docs.

mod adaptive_admission;
mod adaptive_concurrency;
mod adaptive_rate;
mod algorithms;
mod learned_queue;
