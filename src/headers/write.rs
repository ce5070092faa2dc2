//! Writing `Retry-After` and the IETF `RateLimit-Policy` / `RateLimit`
//! fields (draft-ietf-httpapi-ratelimit-headers-10), for servers built with
//! the crate.

use std::time::Duration;

use sfv::{KeyRef, ListSerializer, StringRef};

use crate::bucket::TokenBucket;
use crate::clock::Clock;
use crate::{throttled::Status, Throttled};

/// The largest Integer a structured field can carry (RFC 9651 §3.3.1).
const SF_MAX: u64 = 999_999_999_999_999;

/// `d` in whole seconds, rounded up (never early), at most the largest
/// structured-field Integer.
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.min(SF_MAX)
}

/// One quota policy as a server announces it: `RateLimit-Policy:
/// "name";q=<quota>;w=<window>`, `RateLimit: "name";r=<remaining>;t=<reset>`
/// and, when set, `Retry-After: <seconds>`.
///
/// Seconds are rounded up, so a client never comes back early. Numbers
/// above the structured-field maximum (10¹⁵ − 1) are written as it, and
/// name characters outside printable ASCII as `?`.
/// [`TokenBucket::rate_limit_headers`] fills one in from a bucket.
///
/// # Examples
///
/// ```
/// use backpressure::headers::{RateLimitHeaders, ServerHint};
/// use std::time::{Duration, SystemTime};
///
/// let h = RateLimitHeaders::new("api", 100, Duration::from_secs(60), 0, Duration::from_millis(1500))
///     .with_retry_after(Duration::from_millis(1500));
/// assert_eq!(h.policy(), r#""api";q=100;w=60"#);
/// assert_eq!(h.rate_limit(), r#""api";r=0;t=2"#);
/// assert_eq!(
///     h.to_pairs(),
///     vec![
///         ("retry-after", "2".to_string()),
///         ("ratelimit-policy", r#""api";q=100;w=60"#.to_string()),
///         ("ratelimit", r#""api";r=0;t=2"#.to_string()),
///     ]
/// );
/// // What a client reads back.
/// let hint = ServerHint::from_headers(h.to_pairs(), SystemTime::now());
/// assert_eq!(hint.wait(), Some(Duration::from_secs(2)));
/// assert_eq!(hint.remaining, Some(0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitHeaders {
    /// The policy's name (`"default"`, `"api_key"`, ...).
    pub name: String,
    /// Units allowed per window (`q`).
    pub quota: u64,
    /// The window (`w`).
    pub window: Duration,
    /// Units left now (`r`).
    pub remaining: u64,
    /// Time until the quota is restored (`t`).
    pub reset_after: Duration,
    /// `Retry-After`, written when set (a 429 or 503).
    pub retry_after: Option<Duration>,
}

impl RateLimitHeaders {
    /// A policy with no `Retry-After`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::RateLimitHeaders;
    /// use std::time::Duration;
    /// let h = RateLimitHeaders::new("default", 10, Duration::from_secs(1), 7, Duration::from_millis(300));
    /// assert_eq!(h.rate_limit(), r#""default";r=7;t=1"#);
    /// assert_eq!(h.retry_after, None);
    /// ```
    pub fn new(
        name: impl Into<String>,
        quota: u64,
        window: Duration,
        remaining: u64,
        reset_after: Duration,
    ) -> Self {
        RateLimitHeaders {
            name: name.into(),
            quota,
            window,
            remaining,
            reset_after,
            retry_after: None,
        }
    }

    /// Adds `Retry-After` (for a 429 or a 503).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::RateLimitHeaders;
    /// use std::time::Duration;
    /// let h = RateLimitHeaders::new("default", 1, Duration::from_secs(1), 0, Duration::from_secs(1))
    ///     .with_retry_after(Duration::from_millis(10));
    /// assert_eq!(h.retry_after_value().as_deref(), Some("1"));
    /// ```
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// The `RateLimit-Policy` value: `"name";q=<quota>;w=<window s>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::RateLimitHeaders;
    /// use std::time::Duration;
    /// let h = RateLimitHeaders::new("a\"b", 5, Duration::from_millis(2500), 5, Duration::ZERO);
    /// assert_eq!(h.policy(), r#""a\"b";q=5;w=3"#);
    /// ```
    pub fn policy(&self) -> String {
        self.item(
            ("q", self.quota),
            ("w", retry_after_secs(self.window).max(1)),
        )
    }

    /// The `RateLimit` value: `"name";r=<remaining>;t=<reset s>`.
    pub fn rate_limit(&self) -> String {
        self.item(
            ("r", self.remaining),
            ("t", retry_after_secs(self.reset_after)),
        )
    }

    /// The `Retry-After` value in delta seconds, rounded up, if set.
    pub fn retry_after_value(&self) -> Option<String> {
        self.retry_after.map(|d| retry_after_secs(d).to_string())
    }

    /// Every header as `(lowercase name, value)`.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(3);
        if let Some(v) = self.retry_after_value() {
            out.push(("retry-after", v));
        }
        out.push(("ratelimit-policy", self.policy()));
        out.push(("ratelimit", self.rate_limit()));
        out
    }

    /// Writes (replacing) the headers into an `http::HeaderMap`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::RateLimitHeaders;
    /// use std::time::Duration;
    /// let mut map = http::HeaderMap::new();
    /// RateLimitHeaders::new("x", 5, Duration::from_secs(1), 0, Duration::from_secs(1))
    ///     .with_retry_after(Duration::from_secs(1))
    ///     .write_to(&mut map);
    /// assert_eq!(map["retry-after"], "1");
    /// assert_eq!(map["ratelimit"], r#""x";r=0;t=1"#);
    /// ```
    #[cfg(feature = "http")]
    pub fn write_to(&self, map: &mut http::HeaderMap) {
        for (name, value) in self.to_pairs() {
            // Every value we write is printable ASCII, a valid header value.
            if let Ok(v) = http::HeaderValue::from_str(&value) {
                map.insert(http::header::HeaderName::from_static(name), v);
            }
        }
    }

    fn item(&self, a: (&'static str, u64), b: (&'static str, u64)) -> String {
        let name: String = self
            .name
            .chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
            .collect();
        let name = StringRef::from_str(&name).unwrap_or(StringRef::constant("default"));
        let int = |v: u64| sfv::Integer::try_from(v.min(SF_MAX)).unwrap_or(sfv::Integer::MAX);
        let mut ser = ListSerializer::new();
        let _ = ser
            .bare_item(name)
            .parameter(KeyRef::constant(a.0), int(a.1))
            .parameter(KeyRef::constant(b.0), int(b.1));
        ser.finish().unwrap_or_default()
    }
}

impl<C: Clock> TokenBucket<C> {
    /// The bucket's state as response headers (no `Retry-After`; add it with
    /// [`RateLimitHeaders::with_retry_after`] on a 429). A GCRA bucket has no
    /// fixed window, so: `q` = the burst; `w` = burst × period (rounded up);
    /// `r` = the cells [`available`](TokenBucket::available) now; `t` = when
    /// `r` is 0 the wait for the next cell, else the time until full.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let bucket = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(2).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// bucket.try_acquire(2).unwrap();
    /// let wait = bucket.try_acquire(1).unwrap_err().wait().unwrap(); // 500 ms
    /// let h = bucket.rate_limit_headers("api").with_retry_after(wait);
    /// assert_eq!(h.policy(), r#""api";q=2;w=1"#);
    /// assert_eq!(h.rate_limit(), r#""api";r=0;t=1"#);
    /// let hint = ServerHint::from_headers(h.to_pairs(), SystemTime::now());
    /// assert_eq!(hint.wait(), Some(Duration::from_secs(1)));
    /// ```
    pub fn rate_limit_headers(&self, name: impl Into<String>) -> RateLimitHeaders {
        let (debt, quota) = self.debt();
        let period = quota.period;
        let tolerance = period.saturating_mul(u64::from(quota.burst.get()));
        let remaining = tolerance.saturating_sub(debt) / period;
        let reset = if remaining == 0 {
            // The next cell fits once the debt is down to `tolerance - period`.
            debt.saturating_add(period).saturating_sub(tolerance)
        } else {
            debt
        };
        RateLimitHeaders::new(
            name,
            u64::from(quota.burst.get()),
            Duration::from_nanos(tolerance),
            remaining,
            Duration::from_nanos(reset),
        )
    }
}

/// Writing a refusal as an HTTP response, for servers built with the crate.
impl Throttled {
    /// The HTTP status for this refusal: 503 for `shed`, `closed` and
    /// `unavailable`, 504 for `timed_out`, else 429.
    pub fn http_status(&self) -> u16 {
        match self.status {
            Status::Shed | Status::Closed | Status::Unavailable => 503,
            Status::TimedOut => 504,
            _ => 429,
        }
    }

    /// The response headers for this refusal: `Retry-After` in seconds,
    /// rounded up, when the retry time is known. Add the quota's fields with
    /// [`TokenBucket::rate_limit_headers`](crate::TokenBucket::rate_limit_headers).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::Status;
    /// use backpressure::Throttled;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let t = Throttled::new(Status::RateLimited, "api_key", "slow down")
    ///     .with_retry_after(Duration::from_millis(1200));
    /// assert_eq!(t.to_headers(), vec![("retry-after", "2".to_string())]);
    /// let hint = ServerHint::from_headers(t.to_headers(), SystemTime::now());
    /// assert_eq!(hint.wait(), Some(Duration::from_secs(2)));
    /// ```
    pub fn to_headers(&self) -> Vec<(&'static str, String)> {
        match self.retry_after() {
            Some(d) => vec![("retry-after", retry_after_secs(d).to_string())],
            None => Vec::new(),
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use crate::{headers::ServerHint, ManualClock, Quota};
    use std::num::NonZeroU32;
    use std::time::SystemTime;

    /// Headers written from a bucket read back as the same wait and remaining.
    #[test]
    fn written_headers_round_trip_through_server_hint() {
        let quotas = [
            Quota::per_second(NonZeroU32::new(1).unwrap()),
            Quota::per_second(NonZeroU32::new(3).unwrap()),
            Quota::per_minute(NonZeroU32::new(10).unwrap()),
            Quota::with_period(Duration::from_millis(1_500))
                .allow_burst(NonZeroU32::new(4).unwrap()),
            Quota::per_second(NonZeroU32::new(1000).unwrap()),
        ];
        for quota in quotas {
            let clock = ManualClock::new();
            let bucket = TokenBucket::with_clock(quota, clock.clone());
            for step in 0..50u64 {
                let refused = bucket.try_acquire(1).err();
                if step % 17 == 16 {
                    bucket.penalize(Duration::from_millis(2_345));
                }
                let written = match refused.and_then(|e| e.wait()) {
                    Some(wait) => bucket.rate_limit_headers("api").with_retry_after(wait),
                    None => bucket.rate_limit_headers("api"),
                };
                let hint = ServerHint::from_headers(written.to_pairs(), SystemTime::now());
                assert_eq!(
                    hint.remaining,
                    Some(written.remaining),
                    "{quota:?} step {step}"
                );
                assert_eq!(hint.remaining, Some(u64::from(bucket.available())));
                assert_eq!(hint.limit, Some(u64::from(quota.burst().get())));
                let expected = match written.retry_after {
                    Some(d) => Some(Duration::from_secs(retry_after_secs(d))),
                    None if written.remaining == 0 => {
                        Some(Duration::from_secs(retry_after_secs(written.reset_after)))
                    }
                    None => None,
                };
                assert_eq!(hint.wait(), expected, "{quota:?} step {step}");
                if written.remaining == 0 {
                    let wait = bucket.try_acquire(1).unwrap_err().wait().unwrap();
                    assert_eq!(written.reset_after, wait, "{quota:?} step {step}");
                }
                clock.advance(Duration::from_millis(137 * (step % 5)));
            }
        }
    }

    #[test]
    fn names_and_numbers_are_clamped_to_valid_structured_fields() {
        let h = RateLimitHeaders::new(
            "tab\there",
            u64::MAX,
            Duration::MAX,
            u64::MAX,
            Duration::MAX,
        );
        assert_eq!(
            h.policy(),
            r#""tab?here";q=999999999999999;w=999999999999999"#
        );
        assert_eq!(
            h.rate_limit(),
            r#""tab?here";r=999999999999999;t=999999999999999"#
        );
        assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
    }
}
