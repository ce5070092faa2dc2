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
/// (`headers::llm_usage`, feature `http`) settles the estimate.
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
