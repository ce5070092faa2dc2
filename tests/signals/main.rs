//! What the server says (headers) and retries charged to a deadline (backoff).
//!
//! One test binary per area (each links once); each module was its own
//! binary before and keeps its own docs.

mod backoff;
mod headers;
#[cfg(feature = "http")]
mod provider_bodies;
mod retry;
