//! What travels in `http::Extensions` beside a request or its response:
//! the request count of a call ([`Attempts`]) and one request's own
//! deadline ([`RequestDeadline`]).

use core::time::Duration;

/// How many requests a call sent, in the extensions of the response it
/// ended with (the reqwest middleware's and the tower `AdmissionLayer`'s)
/// and in a refusal's [`Throttled::attempts`](crate::Throttled::attempts):
/// retries included, 0 for a synthetic refusal.
///
/// # Examples
///
/// ```
/// use backpressure::retry::Attempts;
/// let mut extensions = http::Extensions::new();
/// extensions.insert(Attempts(2));
/// assert_eq!(extensions.get::<Attempts>(), Some(&Attempts(2)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempts(pub u32);

/// A request's own deadline: put it in the request's extensions
/// (`RequestBuilder::with_extension` with reqwest-middleware,
/// `http::Request::extensions_mut` for a tower stack) to override the
/// layer's default. Admission waits (and, in the reqwest middleware,
/// retries and their backoff) are charged to it.
///
/// # Examples
///
/// ```
/// use backpressure::retry::RequestDeadline;
/// use std::time::Duration;
/// let mut extensions = http::Extensions::new();
/// extensions.insert(RequestDeadline(Duration::from_secs(5)));
/// assert_eq!(extensions.get::<RequestDeadline>().unwrap().0.as_secs(), 5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestDeadline(pub Duration);
