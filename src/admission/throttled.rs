//! `Throttled`: the structured "not now" a caller (or a model) can plan
//! with, instead of a generic error.

use core::fmt;
use core::time::Duration;

/// Why a call was not admitted (or not completed).
///
/// Serialized in `snake_case` (`"rate_limited"`, `"shed"`, ...).
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
    /// quota, say): surface it to the operator, do not retry.
    QuotaExhausted,
}

impl Status {
    /// The wire name, as serialized.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// assert_eq!(Status::BudgetExhausted.as_str(), "budget_exhausted");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Status::RateLimited => "rate_limited",
            Status::Shed => "shed",
            Status::TimedOut => "timed_out",
            Status::Closed => "closed",
            Status::BudgetExhausted => "budget_exhausted",
            Status::QuotaExhausted => "quota_exhausted",
        }
    }

    /// Whether retrying later can succeed without an operator.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// assert!(Status::Shed.is_retryable());
    /// assert!(!Status::BudgetExhausted.is_retryable());
    /// ```
    pub fn is_retryable(self) -> bool {
        matches!(self, Status::RateLimited | Status::Shed | Status::TimedOut)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The structured outcome of a call that was not admitted: what happened,
/// which limit it was (`scope`), when to try again and a sentence for a
/// human or a model.
///
/// With the `serde` feature it serializes as
/// `{"status":"rate_limited","scope":"api_key","retry_after_ms":4200,"hint":"..."}`.
///
/// # Examples
///
/// ```
/// use backpressure::{Status, Throttled};
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
}

impl Throttled {
    /// A throttled outcome with no retry time.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Status, Throttled};
    /// let t = Throttled::new(Status::Closed, "admission", "shutting down");
    /// assert_eq!(t.retry_after_ms, None);
    /// ```
    pub fn new(status: Status, scope: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            status,
            scope: scope.into(),
            retry_after_ms: None,
            hint: hint.into(),
        }
    }

    /// Sets the retry time (rounded up to whole milliseconds).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Status, Throttled};
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
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Status, Throttled};
    /// use std::time::Duration;
    /// let t = Throttled::new(Status::Shed, "queue", "busy").with_retry_after(Duration::from_secs(2));
    /// assert_eq!(t.retry_after(), Some(Duration::from_secs(2)));
    /// ```
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
        write!(f, ": {}", self.hint)
    }
}

impl std::error::Error for Throttled {}

/// `d` in milliseconds, rounded up, saturating.
pub(crate) fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}
