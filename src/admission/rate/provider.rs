//! What the layer knows of an LLM provider it is told it talks to: its
//! limit headers' window and the weighted quotas they describe.

use core::time::Duration;

/// An API whose rate-limit headers the admission layer should read with
/// that API's documented meaning ([`Builder::provider`](crate::admission::Builder::provider)).
///
/// | provider | headers | window | learned quotas |
/// | --- | --- | --- | --- |
/// | [`OpenAi`](Self::OpenAi) (and servers that copy its headers with its meaning) | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` | a minute | `tokens` |
/// | [`Anthropic`](Self::Anthropic) | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | a minute (always: the names are Anthropic's own) | `tokens`, `input_tokens`, `output_tokens` |
/// | [`Gemini`](Self::Gemini) (and Vertex AI) | none: a 429's body states its wait (`ServerHint::with_error_body`, feature `http`), a per-day quota's reset included | a minute | none: configure `input_tokens` with [`resource`](crate::admission::Builder::resource) |
///
/// Told the provider, the layer learns the server's numbers from its first
/// reply and needs no quota configured:
///
/// * a `requests` limit sets the credential's learned rate (`limit / 60 s`);
/// * each learned quota starts unlimited and takes the server's limit,
///   with a burst of one second's worth (providers enforce a minute's
///   limit in shorter slices); a call costing more waits for a full burst;
/// * a quota configured with [`resource`](crate::admission::Builder::resource)
///   is kept, and lowered to the server's limit if that is lower.
///
/// A call draws on a learned quota only when it states its cost
/// ([`CallSpec::cost`](crate::admission::CallSpec::cost)). Without a
/// provider, OpenAI's header names still drive holds but set no rate,
/// since compatible servers use the same names for other windows.
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
    /// OpenAI, and compatible servers whose `x-ratelimit-*` limits count per
    /// minute (not Groq's, whose requests limit is per day).
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
    /// Google's Gemini API and Vertex AI (`generateContent`).
    Gemini,
}

impl Provider {
    /// What a whole (non-streamed) JSON reply of an LLM provider says the
    /// call used, as `(quota name, units)`, for the reqwest middleware's
    /// `usage_from_body` or [`Ticket::settle`](crate::admission::Ticket::settle).
    /// A body that is not JSON, or has no `usage`, reports nothing; counts
    /// are clamped to `u32::MAX`.
    ///
    /// | provider | `usage` fields | reported as |
    /// | --- | --- | --- |
    /// | OpenAI (and compatible servers) | `prompt_tokens`, `completion_tokens`, `total_tokens` | `input_tokens`, `output_tokens`, `tokens` |
    /// | Anthropic | `input_tokens`, `cache_creation_input_tokens`, `cache_read_input_tokens`, `output_tokens` | `input_tokens` (uncached input and cache writes), `output_tokens`, `tokens` |
    /// | Gemini (`usageMetadata`) | `promptTokenCount`, `cachedContentTokenCount`, `candidatesTokenCount`, `thoughtsTokenCount`, `totalTokenCount` | `input_tokens` (the prompt, cached content included), `output_tokens` (candidates and thoughts), `tokens` |
    ///
    /// `tokens` is `total_tokens` (`totalTokenCount`) when stated, else input
    /// plus output. Gemini's tokens-per-minute limit counts input tokens, and
    /// its prompt count includes cached content ("Rate limits" and "Context
    /// caching" guides), so a cached prompt is counted whole.
    /// Anthropic counts only uncached input tokens, cache writes included,
    /// toward its input-tokens-per-minute limit, not cache reads (its "Rate
    /// limits" guide, for current models), so cache reads are not counted
    /// here: an agent's cached prompt does not spend the input quota.
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
    /// let anthropic = br#"{"usage": {"input_tokens": 10, "cache_creation_input_tokens": 20,
    ///     "cache_read_input_tokens": 900, "output_tokens": 5}}"#;
    /// assert_eq!(llm_usage(anthropic)[0], ("input_tokens".to_string(), 30)); // not the 900 read
    /// assert_eq!(llm_usage(anthropic)[2], ("tokens".to_string(), 35));
    /// assert!(llm_usage(b"not json").is_empty());
    /// ```
    #[cfg(feature = "http")]
    pub fn usage_in_body(body: &[u8]) -> Vec<(String, u32)> {
        crate::headers::llm_usage(body)
    }

    /// What one event of an LLM's streamed reply says it used (for
    /// `usage_from_stream` on the reqwest middleware or the tower layer).
    /// The stream keeps the largest count per name, and at the end `tokens`
    /// is at least `input_tokens + output_tokens`.
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

    pub(in crate::admission) const fn window(self) -> Duration {
        match self {
            Provider::OpenAi | Provider::Anthropic | Provider::Gemini => Duration::from_secs(60),
        }
    }

    /// The weighted quotas the provider's headers report on, as the layer
    /// names them.
    pub(in crate::admission) const fn quotas(self) -> &'static [&'static str] {
        match self {
            Provider::OpenAi => &["tokens"],
            Provider::Anthropic => &["tokens", "input_tokens", "output_tokens"],
            Provider::Gemini => &[],
        }
    }
}

/// A learned weighted quota's burst: one second's worth, clamped to
/// `1..=limit`.
pub(in crate::admission) fn learned_burst(rate: f64, limit: u64) -> u32 {
    let second = rate.ceil().max(1.0);
    let limit = limit.max(1) as f64;
    second.min(limit).min(f64::from(u32::MAX)) as u32
}
