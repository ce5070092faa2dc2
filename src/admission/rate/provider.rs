//! What the layer knows of an LLM provider it is told it talks to: the
//! window its limit headers count over, and the weighted quotas those
//! headers describe (learned from the first reply, never configured).

use core::time::Duration;

/// An API whose rate-limit headers the admission layer should read with
/// that API's documented meaning ([`Builder::provider`](crate::admission::Builder::provider)).
///
/// | provider | headers | window | learned quotas |
/// | --- | --- | --- | --- |
/// | [`OpenAi`](Self::OpenAi) (and servers that copy its headers with its meaning) | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` | a minute | `tokens` |
/// | [`Anthropic`](Self::Anthropic) | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | a minute (always: the names are Anthropic's own) | `tokens`, `input_tokens`, `output_tokens` |
///
/// Told the provider, the layer learns the server's numbers from its first
/// reply and needs no quota configured:
///
/// * a `requests` limit sets the credential's learned rate
///   (`limit / 60 s`, as a `RateLimit-Policy` would);
/// * each learned quota starts unlimited and takes the server's limit for
///   the credential that reported it, with a burst of one second's worth:
///   providers enforce a minute's limit in shorter slices (OpenAI says its
///   limits "may be quantized"), so a minute's worth at once would be
///   refused. A call costing more than that burst waits for a full one and
///   is then sent (it is charged the burst; its usage settles the rest);
/// * a quota configured with [`resource`](crate::admission::Builder::resource) is
///   kept, and lowered to the server's limit when the server's is lower;
/// * what calls sent before the first reply used is not counted against
///   the learned quota (nothing metered them); the server's `remaining`,
///   when lower than what the layer believes is left, is charged as usual.
///
/// A call draws on a learned quota only when it says what it costs
/// ([`CallSpec::cost`](crate::admission::CallSpec::cost), the middleware's
/// `cost_from`); usage read from the reply
/// (`Provider::usage_in_body`, feature `http`) settles the estimate.
///
/// Without this, OpenAI's names are still read for holds (`remaining: 0`
/// with its reset, a 429 charged to the quota that is spent) but set no
/// rate: the same names count per second on some compatible servers and
/// per day on others, and a minute assumed wrongly reads a limit as 60
/// times lower than it is.
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, CallSpec, Provider};
/// use backpressure::headers::ServerHint;
/// use std::time::SystemTime;
///
/// # futures::executor::block_on(async {
/// let admission = Admission::builder().provider(Provider::OpenAi).build();
/// assert_eq!(admission.available("key", "tokens"), Some(u32::MAX)); // not known yet
/// let ticket = admission.admit(&CallSpec::new("chat", "key").cost("tokens", 800)).await.unwrap();
/// let reply = ServerHint::from_headers(
///     [("x-ratelimit-limit-requests", "180"), ("x-ratelimit-limit-tokens", "120000")],
///     SystemTime::now(),
/// );
/// ticket.observe(200, &reply);
/// assert_eq!(admission.available("key", "tokens"), Some(2_000)); // a second's worth
/// let rate = admission.learned_rate("key").unwrap();
/// assert!((rate - 3.0).abs() < 1e-9, "180 a minute is 3 a second: {rate}");
/// # });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Provider {
    /// OpenAI, and OpenAI-compatible servers whose `x-ratelimit-*-requests`
    /// and `-tokens` limits count per minute as OpenAI's do (not Groq's,
    /// whose requests limit is per day).
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
}

impl Provider {
    /// What a whole (non-streamed) JSON reply of an LLM provider says the
    /// call used, as `(quota name, units)`: `input_tokens`, `output_tokens`
    /// and `tokens`. For the
    /// reqwest middleware's `usage_from_body`, or
    /// [`Ticket::settle`](crate::admission::Ticket::settle). A body that is
    /// not JSON, or has no `usage`, reports nothing; a count past `u32::MAX`
    /// is clamped to it. Names the layer has no quota for are ignored by the
    /// settle, so the three can always be reported.
    ///
    /// | provider | `usage` fields | reported as |
    /// | --- | --- | --- |
    /// | OpenAI (and compatible servers) | `prompt_tokens`, `completion_tokens`, `total_tokens` | `input_tokens`, `output_tokens`, `tokens` |
    /// | Anthropic | `input_tokens` (+ `cache_creation_input_tokens`, `cache_read_input_tokens`), `output_tokens` | `input_tokens` (all input), `output_tokens`, `tokens` |
    ///
    /// `tokens` is `total_tokens` when the reply states it, else input plus
    /// output (a missing output counts as 0: an embedding).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Provider;
    /// let llm_usage = Provider::usage_in_body;
    /// let openai = br#"{"usage": {"prompt_tokens": 700, "completion_tokens": 105, "total_tokens": 805}}"#;
    /// assert_eq!(
    ///     llm_usage(openai),
    ///     [("input_tokens".to_string(), 700), ("output_tokens".to_string(), 105), ("tokens".to_string(), 805)]
    /// );
    /// let anthropic = br#"{"usage": {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5}}"#;
    /// assert_eq!(llm_usage(anthropic)[2], ("tokens".to_string(), 105));
    /// assert!(llm_usage(b"not json").is_empty());
    /// ```
    #[cfg(feature = "http")]
    pub fn usage_in_body(body: &[u8]) -> Vec<(String, u32)> {
        crate::headers::llm_usage(body)
    }

    /// What one event of an LLM's streamed reply says it used (for
    /// `usage_from_stream` on the reqwest middleware or the tower layer):
    /// the fields it carries. OpenAI sends `usage` in its last chunk (with
    /// `stream_options.include_usage`); Anthropic sends the input in
    /// `message_start` (under `message`) and the output so far in each
    /// `message_delta`. The stream keeps the largest count per name and,
    /// when it ends, `tokens` is at least `input_tokens + output_tokens`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Provider;
    /// let llm_event_usage = Provider::usage_in_event;
    /// let start = br#"{"type":"message_start","message":{"usage":{"input_tokens":700}}}"#;
    /// let delta = br#"{"type":"message_delta","usage":{"output_tokens":105}}"#;
    /// assert_eq!(llm_event_usage(start), [("input_tokens".to_string(), 700)]);
    /// assert_eq!(llm_event_usage(delta), [("output_tokens".to_string(), 105)]);
    /// assert!(llm_event_usage(b"[DONE]").is_empty());
    /// ```
    #[cfg(feature = "http")]
    pub fn usage_in_event(data: &[u8]) -> Vec<(String, u32)> {
        crate::headers::llm_event_usage(data)
    }

    /// The window the provider's limit headers count over.
    pub(in crate::admission) const fn window(self) -> Duration {
        match self {
            Provider::OpenAi | Provider::Anthropic => Duration::from_secs(60),
        }
    }

    /// The weighted quotas the provider's headers report on, as the layer
    /// names them (`input-tokens` in a header is the quota `input_tokens`).
    pub(in crate::admission) const fn quotas(self) -> &'static [&'static str] {
        match self {
            Provider::OpenAi => &["tokens"],
            Provider::Anthropic => &["tokens", "input_tokens", "output_tokens"],
        }
    }
}

/// The burst a learned weighted quota gets at `rate` units a second: one
/// second's worth, at least one unit, at most the server's whole `limit`.
pub(in crate::admission) fn learned_burst(rate: f64, limit: u64) -> u32 {
    let second = rate.ceil().max(1.0);
    let limit = limit.max(1) as f64;
    second.min(limit).min(f64::from(u32::MAX)) as u32
}
