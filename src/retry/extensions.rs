//! What travels in `http::Extensions`: [`Attempts`] and [`RequestDeadline`].

use core::time::Duration;

/// How many requests a call sent (retries included, 0 for a synthetic
/// refusal), in the extensions of the response it ended with and in
/// [`Throttled::attempts`](crate::Throttled::attempts).
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

/// A request's own deadline: put it in the request's extensions to override
/// the layer's default. Admission waits (and the reqwest middleware's
/// retries) are charged to it.
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
