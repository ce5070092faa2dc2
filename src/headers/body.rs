//! The one reader of what an LLM provider's JSON body says (feature
//! `http`): its usage, for a whole body ([`llm_usage`]) and a stream event
//! ([`llm_event_usage`]), with the table of what it reads on
//! `Provider::usage_in_body`; and the wait a 429's body states
//! ([`error_wait`], the table on `ServerHint::with_error_body`). A whole
//! reply counts a missing output as 0; a stream event reports only the
//! fields it carries, and the stream adds them up.

use std::time::{Duration, SystemTime};

use serde_json::Value;

/// What a whole (non-streamed) JSON reply says it used: see
/// [`Provider::usage_in_body`](crate::admission::Provider::usage_in_body).
pub(crate) fn llm_usage(body: &[u8]) -> Vec<(String, u32)> {
    parse(body, Whole::Reply)
}

/// What one event of a streamed reply says it used: see
/// [`Provider::usage_in_event`](crate::admission::Provider::usage_in_event).
pub(crate) fn llm_event_usage(data: &[u8]) -> Vec<(String, u32)> {
    parse(data, Whole::Event)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Whole {
    /// The reply is all there is: a missing count is 0.
    Reply,
    /// One event of many: only what it carries.
    Event,
}

fn parse(json: &[u8], whole: Whole) -> Vec<(String, u32)> {
    let Ok(value) = serde_json::from_slice::<Value>(json) else {
        return Vec::new();
    };
    // Anthropic's `message_start` carries it under `message`; Gemini's is
    // `usageMetadata`.
    match value
        .get("usage")
        .or_else(|| value.get("message").and_then(|m| m.get("usage")))
        .or_else(|| value.get("usageMetadata"))
        .filter(|u| u.is_object())
    {
        Some(u) => usage(u, whole),
        None => Vec::new(),
    }
}

fn usage(usage: &Value, whole: Whole) -> Vec<(String, u32)> {
    let field = |name: &str| usage.get(name).and_then(Value::as_u64);
    let units = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    // Anthropic: cache writes count toward the input limit, cache reads do
    // not. Gemini: its prompt count (cached content included) is the input.
    let input = field("prompt_tokens")
        .or_else(|| field("promptTokenCount"))
        .or_else(|| {
            let writes = field("cache_creation_input_tokens").unwrap_or(0);
            field("input_tokens").map(|input| input.saturating_add(writes))
        });
    // Gemini's thinking is output too.
    let gemini = field("candidatesTokenCount").map(|c| {
        let thoughts = field("thoughtsTokenCount").unwrap_or(0);
        c.saturating_add(thoughts)
    });
    let mut output = field("completion_tokens")
        .or_else(|| field("output_tokens"))
        .or(gemini);
    if whole == Whole::Reply && input.is_some() {
        output = output.or(Some(0));
    }
    let total = field("total_tokens")
        .or(field("totalTokenCount"))
        .or(match (input, output) {
            (Some(i), Some(o)) => Some(i.saturating_add(o)),
            _ => None,
        });
    [
        ("input_tokens", input),
        ("output_tokens", output),
        ("tokens", total),
    ]
    .into_iter()
    .filter_map(|(name, n)| Some((name.to_string(), units(n?))))
    .collect()
}

/// The wait a 429's JSON body states, the first found: Google's
/// `google.rpc.QuotaFailure` naming a per-day or per-month quota (the time
/// to its reset: midnight, or the month's first day, Pacific, taken as
/// UTC-8, so an hour late in daylight time and never early), else its
/// `google.rpc.RetryInfo` `retryDelay` (`"23s"`). `None` for any other body.
pub(crate) fn error_wait(body: &[u8], now: SystemTime) -> Option<Duration> {
    let value = serde_json::from_slice::<Value>(body).ok()?;
    // Vertex AI wraps the error in a list of one.
    let error = value.get("error").or_else(|| value.get(0)?.get("error"))?;
    let details = error.get("details")?.as_array()?;
    let of = |t: &'static str| {
        details.iter().filter(move |d| {
            d.get("@type")
                .and_then(Value::as_str)
                .is_some_and(|at| at.ends_with(t))
        })
    };
    let periods = of("google.rpc.QuotaFailure")
        .filter_map(|d| d.get("violations")?.as_array())
        .flatten()
        .filter_map(|v| v.get("quotaId")?.as_str());
    let reset = periods.filter_map(|id| until_reset(id, now)).max();
    reset.or_else(|| {
        let delay = of("google.rpc.RetryInfo").find_map(|d| d.get("retryDelay")?.as_str())?;
        let secs = delay.strip_suffix('s')?.parse::<f64>().ok()?;
        Duration::try_from_secs_f64(secs).ok()
    })
}

/// The time from `now` to the reset of a quota named `PerDay` or `PerMonth`.
fn until_reset(quota: &str, now: SystemTime) -> Option<Duration> {
    use jiff::{tz::offset, ToSpan};
    let secs = now.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    let now = jiff::Timestamp::from_second(i64::try_from(secs).ok()?).ok()?;
    let pacific = now.to_zoned(jiff::tz::TimeZone::fixed(offset(-8)));
    let today = pacific.date();
    let next = if quota.contains("PerDay") {
        today.tomorrow().ok()?
    } else if quota.contains("PerMonth") {
        today.first_of_month().checked_add(1.month()).ok()?
    } else {
        return None;
    };
    let reset = next.to_zoned(pacific.time_zone().clone()).ok()?.timestamp();
    Duration::try_from(now.duration_until(reset)).ok()
}
