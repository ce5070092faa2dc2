//! [`RequestDeadline`]: one request's own admission deadline, carried in
//! its `http::Extensions` (read by the reqwest middleware and by the tower
//! `AdmissionLayer` built with `AdmissionLayer::http`).

use core::time::Duration;

/// A request's own deadline: put it in the request's extensions
/// (`RequestBuilder::with_extension` with reqwest-middleware,
/// `http::Request::extensions_mut` for a tower stack) to override the
/// layer's default. Admission waits (and, in the reqwest middleware,
/// retries and their backoff) are charged to it.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "reqwest")]
/// use backpressure::reqwest::RequestDeadline;
/// # #[cfg(not(feature = "reqwest"))]
/// # use backpressure::tower::RequestDeadline;
/// use std::time::Duration;
/// let d = RequestDeadline(Duration::from_secs(5));
/// assert_eq!(d.0.as_secs(), 5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestDeadline(pub Duration);
