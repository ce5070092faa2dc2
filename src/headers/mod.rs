//! What a server says about its limits, read from response headers.
//!
//! [`ServerHint::from_headers`] takes any iterator of `(name, value)` pairs,
//! so it works with every HTTP library; the `http` feature adds
//! `ServerHint::from_header_map`. Formats and rules are on [`ServerHint`].

#[cfg(feature = "http")]
mod body;
mod parse;
mod value;
mod write;

#[cfg(feature = "http")]
pub(crate) use body::{llm_event_usage, llm_usage};
#[cfg(feature = "testing")]
pub(crate) use write::retry_after_secs;
pub use write::RateLimitHeaders;

use std::time::{Duration, SystemTime};

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// The server's view of its limits, as relative waits.
///
/// Built by [`from_headers`](Self::from_headers). Every field is `None` (or
/// empty) when the response did not say.
///
/// # Formats
///
/// | header | values accepted |
/// | --- | --- |
/// | `Retry-After` | delta-seconds (`120`, also fractional `1.5`); HTTP-date as IMF-fixdate, RFC 850 or asctime |
/// | `retry-after-ms`, `x-ms-retry-after-ms` | milliseconds (`1500`, `12.5`) |
/// | `RateLimit-Policy` | `"burst";q=100;w=60` (RFC 9651 List; name a String or Token; `qu` unit), older `100;w=60` |
/// | `RateLimit` | `"burst";r=50;t=30` (List), older `limit=100, remaining=50, reset=5` (Dictionary) |
/// | `RateLimit-Limit/-Remaining/-Reset` | older drafts; `Limit` may be `100, 100;w=60` |
/// | `X-RateLimit-*`, `X-Rate-Limit-*` | `-Limit`, `-Remaining`, `-Used`, `-Reset`, `-Reset-After`; `-<field>-<resource>` (`x-ratelimit-reset-tokens`) becomes a named policy ([`policies`](ServerHint::policies)) |
/// | `anthropic-ratelimit-<resource>-<field>` | a named policy per resource |
/// | `X-RateLimit-Scope`, `-Resource`, `-Bucket` | [`scope`](Self::scope), in that order of preference |
///
/// A per-resource limit whose header names its window (Kong's `second` ..
/// `day`, Anthropic's minute) gets it as the policy's window; OpenAI's names
/// get none, since servers using them count over different windows (see
/// [`Provider::OpenAi`](crate::admission::Provider::OpenAi)). With a window,
/// a request limit becomes the learned rate's ceiling (`limit / window`).
///
/// A reset value below 10⁹ is a delta in seconds (fractions kept); up to
/// 10¹² a Unix time in seconds; up to 10¹⁵ a Unix time in milliseconds;
/// larger numbers are skipped. Otherwise an RFC 3339 timestamp (with an
/// offset), a Go-style duration (`1s`, `6m0s`, `1h2m3.5s`), or an HTTP-date
/// (`httpdate`: a mismatched weekday is rejected; RFC 850 years `00`–`69`
/// are 20xx).
///
/// # Time
///
/// Every result is a wait relative to the response. Absolute times are
/// converted against the response's own `Date` header when it is within
/// [`MAX_DATE_SKEW`](Self::MAX_DATE_SKEW) of the `now` passed in, else
/// against `now`. A time in the past is a zero wait; every duration is at
/// most [`MAX_DURATION`](Self::MAX_DURATION). Fractions round up.
///
/// # Precedence
///
/// `retry-after-ms`, then `x-ms-retry-after-ms`, then `Retry-After`. For the
/// top-level counters, the IETF `RateLimit` field, then `RateLimit-*`, then
/// `X-RateLimit-*`; among equals the first header wins.
/// [`wait`](Self::wait) puts `Retry-After` before every reset field.
///
/// # Garbage
///
/// A value that does not parse is skipped. Names and values may be any
/// bytes: nothing panics, no duration is negative or overflows.
///
/// # Serde
///
/// With the `serde` feature durations are whole milliseconds, rounded up
/// (`retry_after_ms`, `reset_after_ms`, `window_ms`).
///
/// # Examples
///
/// ```
/// use backpressure::headers::ServerHint;
/// use std::time::{Duration, SystemTime};
///
/// let hint = ServerHint::from_headers(
///     [("Retry-After", "3"), ("X-RateLimit-Remaining", "0")],
///     SystemTime::now(),
/// );
/// assert_eq!(hint.retry_after, Some(Duration::from_secs(3)));
/// assert_eq!(hint.remaining, Some(0));
/// assert_eq!(hint.wait(), Some(Duration::from_secs(3)));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
#[non_exhaustive]
pub struct ServerHint {
    /// How long the server asked us to wait (`Retry-After` and its
    /// millisecond forms).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "retry_after_ms", with = "millis", default)
    )]
    pub retry_after: Option<Duration>,
    /// Requests allowed per window.
    pub limit: Option<u64>,
    /// Requests left in the current window.
    pub remaining: Option<u64>,
    /// Requests used in the current window (`X-RateLimit-Used`); gives
    /// `remaining` as `limit - used` when that is absent.
    pub used: Option<u64>,
    /// Time until the window resets and `remaining` is refilled.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "reset_after_ms", with = "millis", default)
    )]
    pub reset_after: Option<Duration>,
    /// Named limits (IETF `RateLimit`/`RateLimit-Policy` members, or
    /// per-resource vendor headers), in order of first appearance. Without
    /// top-level counters, `limit`, `remaining` and `reset_after` summarise
    /// the policy with the fewest remaining (ties: the longest reset).
    #[cfg_attr(feature = "serde", serde(default))]
    pub policies: Vec<Policy>,
    /// What the limit applies to, as the server named it
    /// (`X-RateLimit-Scope`, else `-Resource`, else `-Bucket`).
    pub scope: Option<String>,
}

/// [`ServerHint::policies`]' element; the type has no public name.
mod policy {
    use core::time::Duration;
    #[cfg(feature = "serde")]
    use serde::{Deserialize, Serialize};

    /// One named limit from a response.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let hint = ServerHint::from_headers(
    ///     [
    ///         ("RateLimit-Policy", r#""burst";q=100;w=60"#),
    ///         ("RateLimit", r#""burst";r=0;t=12"#),
    ///     ],
    ///     SystemTime::now(),
    /// );
    /// let p = &hint.policies[0];
    /// assert_eq!(p.name.as_deref(), Some("burst"));
    /// assert_eq!(p.quota, Some(100));
    /// assert_eq!(p.window, Some(Duration::from_secs(60)));
    /// assert_eq!(p.remaining, Some(0));
    /// assert_eq!(p.reset_after, Some(Duration::from_secs(12)));
    /// ```
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    #[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
    #[non_exhaustive]
    pub struct Policy {
        /// The policy's name; `None` for the unnamed older form
        /// (`RateLimit-Policy: 100;w=60`).
        pub name: Option<String>,
        /// Units allowed per window (`q`, or the resource's limit header).
        pub quota: Option<u64>,
        /// What the quota counts (`qu`: `requests`, `content-bytes`, ...).
        pub quota_unit: Option<String>,
        /// The window length (`w`).
        #[cfg_attr(
            feature = "serde",
            serde(rename = "window_ms", with = "super::millis", default)
        )]
        pub window: Option<Duration>,
        /// Units left (`r`, or the resource's remaining header).
        pub remaining: Option<u64>,
        /// Time until the quota is restored (`t`, or the resource's reset).
        #[cfg_attr(
            feature = "serde",
            serde(rename = "reset_after_ms", with = "super::millis", default)
        )]
        pub reset_after: Option<Duration>,
    }
}
pub(crate) use policy::Policy;

impl ServerHint {
    /// The longest duration a hint holds (2³² − 1 seconds): longer values are
    /// capped, so adding one to an `Instant` or nanosecond clock cannot
    /// overflow.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use std::time::SystemTime;
    ///
    /// let hint = ServerHint::from_headers([("retry-after", "99999999999999999999")], SystemTime::now());
    /// assert_eq!(hint.retry_after, Some(ServerHint::MAX_DURATION));
    /// ```
    pub const MAX_DURATION: Duration = Duration::from_secs(u32::MAX as u64);

    /// How far the response's `Date` may be from `now` and still be trusted
    /// for absolute times (one day).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    /// // A server whose clock says 1970: its Date is ignored, not trusted
    /// // into a 53-year wait.
    /// let hint = ServerHint::from_headers(
    ///     [("date", "Thu, 01 Jan 1970 00:00:00 GMT"), ("x-ratelimit-reset", "1700000030")],
    ///     now,
    /// );
    /// assert_eq!(hint.reset_after, Some(Duration::from_secs(30)));
    /// assert_eq!(ServerHint::MAX_DATE_SKEW, Duration::from_secs(86_400));
    /// ```
    pub const MAX_DATE_SKEW: Duration = Duration::from_secs(86_400);

    /// Reads every recognised header in `headers`; `now` is when the response
    /// arrived. Names are matched case-insensitively; values are trimmed of
    /// spaces and tabs and must be UTF-8. Anything else is skipped.
    ///
    /// # Examples
    ///
    /// GitHub's epoch reset, read against the response's own `Date` (our
    /// clock is 20 minutes fast here):
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let headers: Vec<(&str, &[u8])> = vec![
    ///     ("date", b"Tue, 14 Nov 2023 22:13:20 GMT"), // Unix 1700000000
    ///     ("x-ratelimit-limit", b"5000"),
    ///     ("x-ratelimit-remaining", b"0"),
    ///     ("x-ratelimit-reset", b"1700000060"),
    ///     ("x-ratelimit-resource", b"core"),
    /// ];
    /// let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 1_200);
    /// let hint = ServerHint::from_headers(headers, now);
    /// assert_eq!(hint.reset_after, Some(Duration::from_secs(60)));
    /// assert_eq!(hint.scope.as_deref(), Some("core"));
    /// assert_eq!(hint.wait(), Some(Duration::from_secs(60)));
    /// ```
    pub fn from_headers<I, N, V>(headers: I, now: SystemTime) -> ServerHint
    where
        I: IntoIterator<Item = (N, V)>,
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut acc = parse::Acc::default();
        // Every name we know is ASCII and shorter than this.
        let mut name_buf = [0u8; 64];
        for (name, value) in headers {
            let name = name.as_ref();
            let Some(lower) = name_buf.get_mut(..name.len()) else {
                continue;
            };
            lower.copy_from_slice(name);
            lower.make_ascii_lowercase();
            let Ok(lower) = core::str::from_utf8(lower) else {
                continue;
            };
            if !parse::is_candidate(lower) {
                continue;
            }
            let Ok(value) = core::str::from_utf8(value.as_ref()) else {
                continue;
            };
            acc.add(lower, value.trim_matches([' ', '\t']));
        }
        acc.finish(now)
    }

    /// [`from_headers`](Self::from_headers) over an `http::HeaderMap`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use http::HeaderMap;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let mut map = HeaderMap::new();
    /// map.insert("retry-after", "2".parse().unwrap());
    /// let hint = ServerHint::from_header_map(&map, SystemTime::now());
    /// assert_eq!(hint.retry_after, Some(Duration::from_secs(2)));
    /// ```
    #[cfg(feature = "http")]
    pub fn from_header_map(map: &http::HeaderMap, now: SystemTime) -> ServerHint {
        Self::from_headers(map.iter(), now)
    }

    /// Adds the wait a 429's JSON body states: the longer of it and the
    /// headers' (feature `http`). The reqwest middleware and `Call::request` read it
    /// from every 429 body of at most 64 KiB; a tower observer that holds
    /// the body can call it.
    ///
    /// | body | the wait |
    /// | --- | --- |
    /// | Gemini / Vertex AI `error.details[]` with `google.rpc.QuotaFailure` whose `quotaId` names `PerDay` or `PerMonth` | until the quota resets: midnight (or the month's first day) Pacific, taken as UTC-8 (an hour late in daylight time, never early), so the call ends `quota_exhausted` at once and is not retried |
    /// | `google.rpc.RetryInfo` `retryDelay` (`"23s"`) | that delay |
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let body = br#"{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
    ///     {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "23s"}]}}"#;
    /// let hint = ServerHint::default().with_error_body(body, SystemTime::now());
    /// assert_eq!(hint.retry_after, Some(Duration::from_secs(23)));
    /// ```
    #[cfg(feature = "http")]
    pub fn with_error_body(mut self, body: &[u8], now: SystemTime) -> ServerHint {
        let said = body::error_wait(body, now);
        self.retry_after = self.retry_after.max(said);
        self
    }

    /// How long the server wants us to wait, if it said: `retry_after`, else
    /// the longest `reset_after` among exhausted limits, else `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let now = SystemTime::now();
    /// let hint = ServerHint::from_headers(
    ///     [("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "30"), ("retry-after", "5")],
    ///     now,
    /// );
    /// assert_eq!(hint.wait(), Some(Duration::from_secs(5)));
    ///
    /// let hint = ServerHint::from_headers([("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "30")], now);
    /// assert_eq!(hint.wait(), None); // requests left: no need to wait
    /// ```
    pub fn wait(&self) -> Option<Duration> {
        if self.retry_after.is_some() {
            return self.retry_after;
        }
        let top = (self.remaining == Some(0))
            .then_some(self.reset_after)
            .flatten();
        let policies = self
            .policies
            .iter()
            .filter(|p| p.remaining == Some(0))
            .filter_map(|p| p.reset_after);
        top.into_iter().chain(policies).max()
    }
}

/// Serde for `Option<Duration>` as whole milliseconds, rounded up.
#[cfg(feature = "serde")]
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => {
                let ms = d.as_nanos().div_ceil(1_000_000);
                s.serialize_some(&u64::try_from(ms).unwrap_or(u64::MAX))
            }
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let max = super::ServerHint::MAX_DURATION;
        Ok(Option::<u64>::deserialize(d)?.map(|ms| Duration::from_millis(ms).min(max)))
    }
}
