//! [`Throttled`] and [`Status`] live in `crate::throttled`, below both
//! `backoff` (whose `RetryPolicy` speaks the same vocabulary) and this
//! module; they stay reachable here under their old paths.

pub use crate::throttled::{Status, Throttled};

pub(crate) use crate::throttled::Human;
