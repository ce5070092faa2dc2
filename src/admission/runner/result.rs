//! [`CallResult`]: what one logical call ends as, and its JSON shape.

#[cfg(feature = "serde")]
use core::fmt;

use crate::failure::CallFailure;
use crate::single_flight::Provenance;

#[cfg(doc)]
use super::super::Status;
use super::super::Throttled;
#[cfg(doc)]
use super::Call;
#[cfg(doc)]
use crate::retry::RetryPolicy;

/// The result of one logical call. `E` is the error type of the call's
/// attempts (see [`Call`]).
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallResult<V, E = String> {
    /// The server answered with success.
    Done {
        /// The value.
        value: V,
        /// Whether this call ran, joined an identical one, or was served
        /// from the turn's cache.
        provenance: Provenance,
        /// Requests this call itself sent (0 when joined or cached).
        attempts: u32,
    },
    /// Not now, and why: plan with it, do not retry blindly.
    Throttled(Throttled),
    /// The call failed for a reason that is not about capacity: a status the
    /// [`RetryPolicy`] does not retry, or a 5xx or transport error that
    /// outlasted its retries. Never a 429 (that ends as [`Throttled`]).
    Failed {
        /// What the last attempt got: its status, or the caller's
        /// transport error (shared with coalesced followers).
        error: CallFailure<E>,
        /// Why the retry was refused (by the policy, the admission layer, or
        /// `closed`); `None` when the status is final or retries ran out.
        not_retried: Option<Throttled>,
        /// Requests this call itself sent (0 when joined).
        attempts: u32,
    },
    /// The call's attempt panicked; the turn's other calls complete and the
    /// call's slots were released.
    Panicked {
        /// The panic's message, if it was a string.
        message: String,
    },
}

/// Cloning shares a transport error (no `E: Clone` needed).
impl<V: Clone, E> Clone for CallResult<V, E> {
    fn clone(&self) -> Self {
        match self {
            CallResult::Done {
                value,
                provenance,
                attempts,
            } => CallResult::Done {
                value: value.clone(),
                provenance: *provenance,
                attempts: *attempts,
            },
            CallResult::Throttled(t) => CallResult::Throttled(t.clone()),
            CallResult::Failed {
                error,
                not_retried,
                attempts,
            } => CallResult::Failed {
                error: error.clone(),
                not_retried: not_retried.clone(),
                attempts: *attempts,
            },
            CallResult::Panicked { message } => CallResult::Panicked {
                message: message.clone(),
            },
        }
    }
}

impl<V, E> CallResult<V, E> {
    /// The value, if the call succeeded.
    pub fn value(&self) -> Option<&V> {
        match self {
            CallResult::Done { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The structured refusal, if any.
    pub fn throttled(&self) -> Option<&Throttled> {
        match self {
            CallResult::Throttled(t) => Some(t),
            _ => None,
        }
    }

    /// The failure, if the call failed.
    pub fn failure(&self) -> Option<&CallFailure<E>> {
        match self {
            CallResult::Failed { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Under the `serde` feature every result serializes as one JSON object
/// with a `status` field a model can branch on:
///
/// | variant | `status` | other fields |
/// | --- | --- | --- |
/// | `Done` | `"done"` | `value`, `provenance` (`leader`/`joined`/`cached`), `attempts` |
/// | `Throttled` | the [`Status`] (`rate_limited`, `shed`, ...) | `scope`, `retry_after_ms`, `hint` (as [`Throttled`]) |
/// | `Failed` | `"failed"` | `http_status` (0: transport), `error` (the [`CallFailure`]'s `Display`, so `E: Display`), `attempts`, and `not_retried` (a [`Throttled`] object) when set |
/// | `Panicked` | `"panicked"` | `message` |
#[cfg(feature = "serde")]
impl<V: serde::Serialize, E: fmt::Display> serde::Serialize for CallResult<V, E> {
    fn serialize<Ser: serde::Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
        use serde::ser::SerializeStruct;
        match self {
            CallResult::Done {
                value,
                provenance,
                attempts,
            } => {
                let mut st = s.serialize_struct("CallResult", 4)?;
                st.serialize_field("status", "done")?;
                st.serialize_field("value", value)?;
                st.serialize_field("provenance", provenance)?;
                st.serialize_field("attempts", attempts)?;
                st.end()
            }
            CallResult::Throttled(t) => t.serialize(s),
            CallResult::Failed {
                error,
                not_retried,
                attempts,
            } => {
                let fields = if not_retried.is_some() { 5 } else { 4 };
                let mut st = s.serialize_struct("CallResult", fields)?;
                st.serialize_field("status", "failed")?;
                st.serialize_field("http_status", &error.http_status())?;
                st.serialize_field("error", &error.to_string())?;
                st.serialize_field("attempts", attempts)?;
                match not_retried {
                    Some(t) => st.serialize_field("not_retried", t)?,
                    None => st.skip_field("not_retried")?,
                }
                st.end()
            }
            CallResult::Panicked { message } => {
                let mut st = s.serialize_struct("CallResult", 2)?;
                st.serialize_field("status", "panicked")?;
                st.serialize_field("message", message)?;
                st.end()
            }
        }
    }
}

impl<V, E> CallResult<V, E> {
    /// This result as a caller that did not send it hears it: joined or
    /// cached (`provenance`), with 0 attempts of its own.
    pub(crate) fn into_copy(self, provenance: Provenance) -> CallResult<V, E> {
        match self {
            CallResult::Done { value, .. } => CallResult::Done {
                value,
                provenance,
                attempts: 0,
            },
            CallResult::Throttled(t) => CallResult::Throttled(t.with_attempts(0)),
            CallResult::Failed {
                error, not_retried, ..
            } => CallResult::Failed {
                error,
                not_retried,
                attempts: 0,
            },
            panicked @ CallResult::Panicked { .. } => panicked,
        }
    }
}
