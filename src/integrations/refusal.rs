//! A refusal as the answer an HTTP client already understands (feature
//! `http`): [`Throttled::to_response`], [`Throttled::is_refusal`] and
//! [`Throttled::REFUSAL_HEADER`].

use crate::retry::Attempts;
use crate::throttled::{Status, Throttled};

#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl Throttled {
    /// The header that marks a synthetic refusal of this crate (its value
    /// is the status, `rate_limited`, `shed`, ...).
    pub const REFUSAL_HEADER: &'static str = "x-backpressure-refusal";

    /// This refusal as the response an HTTP client keeps (feature `http`).
    ///
    /// An LLM client (rig, async-openai, ...) keeps a 429's status, headers
    /// and body, but retries an error from its HTTP stack at once. So the
    /// reqwest middleware and the tower `AdmissionLayer` can answer a
    /// `Throttled` as this response: 429 (503 for `closed`), `retry-after`
    /// (whole seconds, rounded up) and `retry-after-ms`,
    /// [`REFUSAL_HEADER`](Self::REFUSAL_HEADER), an [`Attempts`] extension,
    /// and a JSON body in the providers' error shape carrying every field:
    ///
    /// ```json
    /// {"error": {"type": "rate_limited", "code": "rate_limited",
    ///            "message": "<the hint>", "scope": "api_key",
    ///            "retry_after_ms": 750, "attempts": 0}}
    /// ```
    ///
    /// The crate's own layers recognise it ([`is_refusal`](Self::is_refusal)):
    /// it is never fed to a learned rate or retried by another layer.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// use backpressure::Throttled;
    /// use std::time::Duration;
    ///
    /// let t = Throttled::new(Status::RateLimited, "api_key", "wait for the key's quota")
    ///     .with_retry_after(Duration::from_millis(1500));
    /// let response = t.to_response();
    /// assert_eq!(response.status(), 429);
    /// assert_eq!(response.headers()["retry-after"], "2");
    /// assert_eq!(response.headers()["retry-after-ms"], "1500");
    /// assert_eq!(response.headers()[Throttled::REFUSAL_HEADER], "rate_limited");
    /// let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
    /// assert_eq!(body["error"]["type"], "rate_limited");
    /// assert_eq!(body["error"]["retry_after_ms"], 1500);
    /// ```
    pub fn to_response(&self) -> http::Response<Vec<u8>> {
        let status = match self.status {
            Status::Closed | Status::Unavailable => 503,
            _ => 429,
        };
        let body = serde_json::json!({
            "error": {
                "type": self.status.as_str(),
                "code": self.status.as_str(),
                "message": self.hint,
                "scope": self.scope,
                "retry_after_ms": self.retry_after_ms,
                "attempts": self.attempts,
            }
        });
        let mut builder = http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .header(Self::REFUSAL_HEADER, self.status.as_str());
        if let Some(ms) = self.retry_after_ms {
            builder = builder
                .header("retry-after", ms.div_ceil(1000).to_string())
                .header("retry-after-ms", ms.to_string());
        }
        let mut response = builder
            .body(body.to_string().into_bytes())
            // Every part above is a valid status, name and value.
            .unwrap_or_default();
        response.extensions_mut().insert(Attempts(self.attempts));
        response
    }

    /// Whether `headers` are those of a synthetic refusal of this crate
    /// (feature `http`).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Status;
    /// use backpressure::Throttled;
    /// let r = Throttled::new(Status::Shed, "queue", "busy").to_response();
    /// assert!(Throttled::is_refusal(r.headers()));
    /// assert!(!Throttled::is_refusal(&http::HeaderMap::new()));
    /// ```
    pub fn is_refusal(headers: &http::HeaderMap) -> bool {
        headers.contains_key(Self::REFUSAL_HEADER)
    }
}
