//! What a call resolves to: the value's provenance, or why there is none.

use core::fmt;
use std::error::Error;
use std::sync::Arc;

/// Whose work produced a value: Go's `shared` flag, split three ways.
///
/// # Examples
///
/// ```
/// use backpressure::Provenance;
/// use backpressure::SingleFlight;
///
/// # futures::executor::block_on(async {
/// let flights = SingleFlight::<u8, u8>::new();
/// let (_, how) = flights.run(1, || async { 7 }).await.unwrap();
/// assert_eq!(how, Provenance::Leader);
/// assert!(!how.is_shared());
/// # });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Provenance {
    /// This caller ran the work (also after taking over from a cancelled
    /// leader).
    Leader,
    /// Another caller's work, which this one waited for.
    Joined,
    /// A completed result served from the TTL cache.
    Cached,
}

impl Provenance {
    /// Whether the value came from someone else's work.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Provenance;
    /// assert!(Provenance::Joined.is_shared());
    /// assert!(Provenance::Cached.is_shared());
    /// assert!(!Provenance::Leader.is_shared());
    /// ```
    #[inline]
    pub fn is_shared(self) -> bool {
        self != Provenance::Leader
    }
}

/// Why a [`SingleFlight`](super::SingleFlight) call produced no value.
///
/// # Examples
///
/// ```
/// use backpressure::SingleFlight;
///
/// # futures::executor::block_on(async {
/// let flights = SingleFlight::<u8, u8, String>::new();
/// let err = flights
///     .try_run(1, || async { Err::<u8, _>("timeout".to_string()) })
///     .await
///     .unwrap_err();
/// assert_eq!(err.failed().map(|e| e.as_str()), Some("timeout"));
/// assert_eq!(err.to_string(), "single-flight work failed: timeout");
/// # });
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum FlightError<E> {
    /// The work returned this error; the leader and every follower share it.
    Failed(Arc<E>),
    /// The leader panicked. Followers get this instead of rerunning the work
    /// in a herd; the panic propagates in the leader's task. The key is free.
    LeaderPanicked,
}

impl<E> FlightError<E> {
    /// The shared error, if the work returned one.
    pub fn failed(&self) -> Option<&Arc<E>> {
        match self {
            FlightError::Failed(e) => Some(e),
            FlightError::LeaderPanicked => None,
        }
    }

    /// Whether the leader panicked.
    pub fn is_leader_panicked(&self) -> bool {
        matches!(self, FlightError::LeaderPanicked)
    }
}

impl<E> Clone for FlightError<E> {
    fn clone(&self) -> Self {
        match self {
            FlightError::Failed(e) => FlightError::Failed(Arc::clone(e)),
            FlightError::LeaderPanicked => FlightError::LeaderPanicked,
        }
    }
}

impl<E: fmt::Display> fmt::Display for FlightError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlightError::Failed(e) => write!(f, "single-flight work failed: {e}"),
            FlightError::LeaderPanicked => f.write_str("single-flight leader panicked"),
        }
    }
}

impl<E: Error + 'static> Error for FlightError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            FlightError::Failed(e) => Some(&**e),
            FlightError::LeaderPanicked => None,
        }
    }
}
