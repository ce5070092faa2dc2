//! `Throttled`: the structured "not now" a caller (or a model) can plan
//! with. [`Admission::admit`] refuses with it, [`RetryPolicy`] surfaces
//! with it and [`Runner`] returns it; it depends on nothing in the crate.
//!
//! [`Admission::admit`]: crate::admission::Admission::admit
//! [`RetryPolicy`]: crate::retry::RetryPolicy
//! [`Runner`]: crate::admission::Runner

use core::fmt;
use core::time::Duration;

/// Why a call was not admitted (or not completed). Serialized in
/// `snake_case` (`"rate_limited"`, `"shed"`, ...).
///
/// # Examples
///
/// ```
/// use backpressure::Status;
/// assert_eq!(Status::RateLimited.as_str(), "rate_limited");
/// assert!(Status::RateLimited.is_retryable());
/// assert!(!Status::QuotaExhausted.is_retryable());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Status {
    /// A rate limit (ours or the server's) needs a longer wait than the call
    /// can afford inline; retry after `retry_after_ms`.
    RateLimited,
    /// The wait queue was full: the call was refused at once, with a drain
    /// estimate in `retry_after_ms`.
    Shed,
    /// The call's deadline would pass before it could start.
    TimedOut,
    /// The admission layer was closed.
    Closed,
    /// The run's call budget is spent; nothing was sent.
    BudgetExhausted,
    /// The server's limit resets later than any retry is worth (a daily
    /// quota): surface it to the operator.
    QuotaExhausted,
    /// The server kept failing: its circuit is open and nothing was sent;
    /// retry after `retry_after_ms` (see
    /// [`CircuitBreaker`](crate::admission::CircuitBreaker)).
    Unavailable,
}

impl Status {
    /// The wire name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::RateLimited => "rate_limited",
            Status::Shed => "shed",
            Status::TimedOut => "timed_out",
            Status::Closed => "closed",
            Status::BudgetExhausted => "budget_exhausted",
            Status::QuotaExhausted => "quota_exhausted",
            Status::Unavailable => "unavailable",
        }
    }

    /// Whether retrying later can succeed without an operator.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Status::RateLimited | Status::Shed | Status::TimedOut | Status::Unavailable
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The structured outcome of a call that was not admitted: what happened,
/// which limit (`scope`), when to try again and a sentence for a human or a
/// model. With `serde`:
/// `{"status":"rate_limited","scope":"api_key","retry_after_ms":4200,"hint":"..."}`.
///
/// # Examples
///
/// ```
/// use backpressure::Status;
/// use backpressure::Throttled;
/// use std::time::Duration;
///
/// let t = Throttled::new(Status::RateLimited, "api_key", "wait for the key's quota")
///     .with_retry_after(Duration::from_millis(4200));
/// assert_eq!(t.retry_after_ms, Some(4200));
/// assert_eq!(
///     t.to_string(),
///     "rate_limited (api_key), retry after 4200 ms: wait for the key's quota"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Throttled {
    /// What happened.
    pub status: Status,
    /// Which limit: `"api_key"`, `"tool:<name>"`, `"global"`, `"queue"`,
    /// `"server:<scope>"`, `"budget"`, ...
    pub scope: String,
    /// When a retry can succeed, in milliseconds from now, if known.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub retry_after_ms: Option<u64>,
    /// One sentence saying what to do.
    pub hint: String,
    /// How many requests the call sent before this answer: 0 when refused
    /// before sending anything, 1 or more when the server answered "not
    /// now" or the deadline passed mid-request.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_zero"))]
    pub attempts: u32,
}

#[cfg(feature = "serde")]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Throttled {
    /// A throttled outcome with no retry time.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// use backpressure::Throttled;
    /// let t = Throttled::new(Status::Closed, "admission", "shutting down");
    /// assert_eq!(t.retry_after_ms, None);
    /// ```
    pub fn new(status: Status, scope: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            status,
            scope: scope.into(),
            retry_after_ms: None,
            hint: hint.into(),
            attempts: 0,
        }
    }

    /// Records how many requests the call sent before this answer.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// use backpressure::Throttled;
    /// let t = Throttled::new(Status::RateLimited, "api_key", "the server still answers 429")
    ///     .with_attempts(3);
    /// assert_eq!(t.attempts, 3);
    /// assert!(t.to_string().ends_with("(after 3 requests)"));
    /// ```
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// Sets the retry time (rounded up to whole milliseconds).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// use backpressure::Throttled;
    /// use std::time::Duration;
    /// let t = Throttled::new(Status::Shed, "queue", "busy")
    ///     .with_retry_after(Duration::from_micros(1500));
    /// assert_eq!(t.retry_after_ms, Some(2));
    /// ```
    pub fn with_retry_after(mut self, d: Duration) -> Self {
        self.retry_after_ms = Some(ceil_ms(d));
        self
    }

    /// The retry time as a `Duration`.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.status, self.scope)?;
        if let Some(ms) = self.retry_after_ms {
            write!(f, ", retry after {ms} ms")?;
        }
        write!(f, ": {}", self.hint)?;
        match self.attempts {
            0 => Ok(()),
            1 => f.write_str(" (after 1 request)"),
            n => write!(f, " (after {n} requests)"),
        }
    }
}

impl std::error::Error for Throttled {}

/// The answer for a request still running at its call's deadline: it was
/// dropped and the call is `timed_out` (never a transport failure, which a
/// caller would retry at once). A `write` says it may have run.
#[cfg(feature = "admission")]
#[cold]
pub(crate) fn request_timed_out(budget: Duration, attempts: u32, write: bool) -> Throttled {
    let then = if write {
        "it is a write the server may have run: check its effect before running it again"
    } else {
        "retry with a longer deadline or later"
    };
    Throttled::new(
        Status::TimedOut,
        "deadline",
        format!(
            "the request was still running at the call's deadline ({} in all) and was dropped; {then}",
            Human(budget)
        ),
    )
    .with_attempts(attempts)
}

/// `d` in milliseconds, rounded up, saturating.
pub(crate) fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A duration written for a person or a model: "350 ms", "2.25 s",
/// "4 min 10 s", "3.5 h". Exact values belong in `retry_after_ms`.
#[cfg(feature = "admission")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Human(pub(crate) Duration);

#[cfg(feature = "admission")]
impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let secs = d.as_secs_f64();
        if d < Duration::from_millis(1) && !d.is_zero() {
            f.write_str("under 1 ms")
        } else if d < Duration::from_secs(1) {
            write!(f, "{} ms", d.as_millis())
        } else if secs < 100.0 {
            let s = format!("{:.2}", (secs * 100.0).round() / 100.0);
            let s = s.trim_end_matches('0').trim_end_matches('.');
            write!(f, "{s} s")
        } else if secs < 3600.0 {
            let total = secs.round() as u64;
            match total % 60 {
                0 => write!(f, "{} min", total / 60),
                s => write!(f, "{} min {s} s", total / 60),
            }
        } else {
            let h = (secs / 360.0).round() / 10.0;
            write!(f, "{h} h")
        }
    }
}

#[cfg(all(test, feature = "admission", not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn human_durations_carry_no_nanosecond_noise() {
        let cases = [
            (Duration::from_nanos(2_249_801_146), "2.25 s"),
            (Duration::from_millis(2_500), "2.5 s"),
            (Duration::from_secs(3), "3 s"),
            (Duration::from_nanos(349_600_000), "349 ms"),
            (Duration::ZERO, "0 ms"),
            (Duration::from_nanos(10), "under 1 ms"),
            (Duration::from_secs(250), "4 min 10 s"),
            (Duration::from_secs(300), "5 min"),
            (Duration::from_secs(12_600), "3.5 h"),
            (Duration::MAX, "5124095576030431 h"),
        ];
        for (d, want) in cases {
            assert_eq!(Human(d).to_string(), want, "{d:?}");
        }
    }
}
