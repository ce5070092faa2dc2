//! [`CallFailure`]: why a call failed for a reason that is not capacity,
//! carrying the caller's own error type.

use core::fmt;
use std::sync::Arc;

/// What the last attempt of a failed call got: a status that retrying could
/// not change (or that outlasted its retries), or the caller's own transport
/// error, behind an [`Arc`] so coalesced reads share it (as
/// [`SingleFlight`](crate::SingleFlight) does).
///
/// # Examples
///
/// ```
/// use backpressure::admission::CallFailure;
/// use std::sync::Arc;
///
/// let refused: CallFailure<std::io::Error> =
///     CallFailure::Transport(Arc::new(std::io::ErrorKind::ConnectionRefused.into()));
/// assert!(refused.is_transport());
/// assert_eq!(refused.http_status(), 0);
///
/// let gone: CallFailure<std::io::Error> = CallFailure::Status { status: 404 };
/// assert_eq!(gone.http_status(), 404);
/// assert_eq!(gone.to_string(), "the server answered 404");
/// ```
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallFailure<E> {
    /// The server answered with a status that is not a success.
    Status {
        /// The HTTP status (or an equivalent code).
        status: u16,
    },
    /// The attempt returned the caller's error: no answer from the server
    /// (refused, reset, a client timeout, ...).
    Transport(Arc<E>),
}

impl<E> CallFailure<E> {
    /// The status the server answered, or 0 for a transport error.
    pub fn http_status(&self) -> u16 {
        match self {
            CallFailure::Status { status } => *status,
            CallFailure::Transport(_) => 0,
        }
    }

    /// Whether the attempt got no answer (the caller's error).
    pub fn is_transport(&self) -> bool {
        matches!(self, CallFailure::Transport(_))
    }

    /// The caller's error, if the attempt got no answer.
    pub fn transport(&self) -> Option<&E> {
        match self {
            CallFailure::Transport(e) => Some(e),
            CallFailure::Status { .. } => None,
        }
    }
}

/// Cloning shares the caller's error (no `E: Clone` needed).
impl<E> Clone for CallFailure<E> {
    fn clone(&self) -> Self {
        match self {
            CallFailure::Status { status } => CallFailure::Status { status: *status },
            CallFailure::Transport(e) => CallFailure::Transport(e.clone()),
        }
    }
}

impl<E: fmt::Display> fmt::Display for CallFailure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallFailure::Status { status } => write!(f, "the server answered {status}"),
            CallFailure::Transport(e) => fmt::Display::fmt(&**e, f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for CallFailure<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CallFailure::Transport(e) => Some(&**e),
            CallFailure::Status { .. } => None,
        }
    }
}
