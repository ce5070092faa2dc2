//! A refusal as the answer an HTTP client already understands, and the
//! request count that travels with every answer.
//!
//! An LLM client (rig, async-openai, ...) keeps a 429's status, headers and
//! body and plans with them; it wraps an error from inside its HTTP stack
//! as a retryable transport failure. So the reqwest middleware and the
//! tower `AdmissionLayer` can answer a [`Throttled`] as a synthetic
//! response ([`refusal_response`]): 429 (503 for `closed`), `retry-after`
//! and `retry-after-ms`, and a JSON body in the providers' error shape
//! that carries every field of the `Throttled`:
//!
//! ```json
//! {"error": {"type": "rate_limited", "code": "rate_limited",
//!            "message": "<the hint>", "scope": "api_key",
//!            "retry_after_ms": 750, "attempts": 0}}
//! ```
//!
//! The response carries [`REFUSAL_HEADER`], so the crate's own layers
//! recognise it as ours ([`is_refusal`]): it is never fed to a learned rate
//! or retried by another layer of the crate.

use crate::throttled::{Status, Throttled};

/// The header that marks a synthetic refusal (its value is the status,
/// `rate_limited`, `shed`, ...).
pub const REFUSAL_HEADER: &str = "x-backpressure-refusal";

/// How many requests a call sent, in the extensions of the response it
/// ended with (the reqwest middleware's and the tower `AdmissionLayer`'s):
/// retries included, 0 for a synthetic refusal.
///
/// # Examples
///
/// ```
/// use backpressure::reqwest::Attempts;
/// let mut extensions = http::Extensions::new();
/// extensions.insert(Attempts(2));
/// assert_eq!(extensions.get::<Attempts>(), Some(&Attempts(2)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempts(pub u32);

/// `throttled` as the response an HTTP client keeps: 429 (503 for
/// `closed`), `retry-after` (whole seconds, rounded up) and
/// `retry-after-ms`, [`REFUSAL_HEADER`], an [`Attempts`] extension, and
/// the JSON body described in the module docs.
///
/// # Examples
///
/// ```
/// use backpressure::reqwest::{refusal_response, REFUSAL_HEADER};
/// use backpressure::throttled::Status;
/// use backpressure::Throttled;
/// use std::time::Duration;
///
/// let t = Throttled::new(Status::RateLimited, "api_key", "wait for the key's quota")
///     .with_retry_after(Duration::from_millis(1500));
/// let response = refusal_response(&t);
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["retry-after-ms"], "1500");
/// assert_eq!(response.headers()[REFUSAL_HEADER], "rate_limited");
/// let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
/// assert_eq!(body["error"]["type"], "rate_limited");
/// assert_eq!(body["error"]["retry_after_ms"], 1500);
/// ```
pub fn refusal_response(throttled: &Throttled) -> http::Response<Vec<u8>> {
    let status = match throttled.status {
        Status::Closed => 503,
        _ => 429,
    };
    let body = serde_json::json!({
        "error": {
            "type": throttled.status.as_str(),
            "code": throttled.status.as_str(),
            "message": throttled.hint,
            "scope": throttled.scope,
            "retry_after_ms": throttled.retry_after_ms,
            "attempts": throttled.attempts,
        }
    });
    let mut builder = http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header(REFUSAL_HEADER, throttled.status.as_str());
    if let Some(ms) = throttled.retry_after_ms {
        builder = builder
            .header("retry-after", ms.div_ceil(1000).to_string())
            .header("retry-after-ms", ms.to_string());
    }
    let mut response = builder
        .body(body.to_string().into_bytes())
        // Every part above is a valid status, name and value.
        .unwrap_or_default();
    response
        .extensions_mut()
        .insert(Attempts(throttled.attempts));
    response
}

/// Whether `headers` are those of a synthetic refusal of this crate.
///
/// # Examples
///
/// ```
/// use backpressure::reqwest::{is_refusal, refusal_response};
/// use backpressure::throttled::Status;
/// use backpressure::Throttled;
/// let r = refusal_response(&Throttled::new(Status::Shed, "queue", "busy"));
/// assert!(is_refusal(r.headers()));
/// assert!(!is_refusal(&http::HeaderMap::new()));
/// ```
pub fn is_refusal(headers: &http::HeaderMap) -> bool {
    headers.contains_key(REFUSAL_HEADER)
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn a_closed_layer_answers_503_and_no_retry_time_sends_no_retry_headers() {
        let r = refusal_response(&Throttled::new(
            Status::Closed,
            "admission",
            "shutting down",
        ));
        assert_eq!(r.status(), 503);
        assert!(r.headers().get("retry-after").is_none());
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["error"]["code"], "closed");
        assert_eq!(body["error"]["message"], "shutting down");
        assert!(body["error"]["retry_after_ms"].is_null());
    }
}
