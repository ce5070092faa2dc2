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

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    fn of(pairs: &[(&str, u32)]) -> Vec<(String, u32)> {
        pairs.iter().map(|(n, u)| (n.to_string(), *u)).collect()
    }

    /// One rule for when `tokens` is set, in a body and a stream.
    #[test]
    fn the_body_and_the_stream_read_usage_alike() {
        let openai =
            br#"{"usage":{"prompt_tokens":700,"completion_tokens":105,"total_tokens":805}}"#;
        let want = of(&[
            ("input_tokens", 700),
            ("output_tokens", 105),
            ("tokens", 805),
        ]);
        assert_eq!(llm_usage(openai), want);
        assert_eq!(llm_event_usage(openai), want);
        // No total stated: input plus output, in a body and in an event. Cache
        // writes count as input; cache reads do not (Anthropic's input limit).
        let anthropic = br#"{"usage":{"input_tokens":10,"cache_creation_input_tokens":20,
            "cache_read_input_tokens":900,"output_tokens":5}}"#;
        let want = of(&[("input_tokens", 30), ("output_tokens", 5), ("tokens", 35)]);
        assert_eq!(llm_usage(anthropic), want);
        assert_eq!(llm_event_usage(anthropic), want);
        // Part of a stream: only what the event carries.
        let start = br#"{"type":"message_start","message":{"usage":{"input_tokens":700}}}"#;
        assert_eq!(llm_event_usage(start), of(&[("input_tokens", 700)]));
        let delta = br#"{"type":"message_delta","usage":{"output_tokens":105}}"#;
        assert_eq!(llm_event_usage(delta), of(&[("output_tokens", 105)]));
        // A whole reply with the input alone (an embedding): output 0.
        let embedding = br#"{"usage":{"prompt_tokens":8}}"#;
        assert_eq!(
            llm_usage(embedding),
            of(&[("input_tokens", 8), ("output_tokens", 0), ("tokens", 8)])
        );
        for nothing in [&b"not json"[..], b"[DONE]", br#"{"usage":3}"#, br#"{}"#] {
            assert!(llm_usage(nothing).is_empty());
            assert!(llm_event_usage(nothing).is_empty());
        }
        // Past u32::MAX: clamped.
        let huge = br#"{"usage":{"total_tokens":99999999999}}"#;
        assert_eq!(llm_usage(huge), of(&[("tokens", u32::MAX)]));
        // Gemini: cached content is part of the prompt's count; thinking is output.
        let gemini = br#"{"usageMetadata":{"promptTokenCount":1000,"cachedContentTokenCount":900,
            "candidatesTokenCount":50,"thoughtsTokenCount":20,"totalTokenCount":1070}}"#;
        let want = of(&[
            ("input_tokens", 1000),
            ("output_tokens", 70),
            ("tokens", 1070),
        ]);
        assert_eq!(llm_usage(gemini), want);
        assert_eq!(llm_event_usage(gemini), want);
    }

    /// Gemini's 429 bodies, as its docs publish them.
    #[test]
    fn a_429_body_states_its_wait() {
        // 2026-03-10T12:00:00Z, 04:00 Pacific (UTC-8): 20 h to midnight.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_773_144_000);
        let retry = br#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":
            "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count",
            "quotaId":"GenerateContentInputTokensPerModelPerMinute-FreeTier","quotaValue":"250000"}]},
            {"@type":"type.googleapis.com/google.rpc.Help","links":[]},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"23.5s"}]}}"#;
        assert_eq!(error_wait(retry, now), Some(Duration::from_millis(23_500)));
        let day = br#"[{"error":{"code":429,"details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
            {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"50"}]},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}]"#;
        assert_eq!(error_wait(day, now), Some(Duration::from_secs(20 * 3600)));
        let month =
            br#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure",
            "violations":[{"quotaId":"RequestsPerMonth"}]}]}}"#;
        // To 2026-04-01 00:00 Pacific: 21 days and 20 hours.
        let want = Duration::from_secs((21 * 24 + 20) * 3600);
        assert_eq!(error_wait(month, now), Some(want));
        let openai = br#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
        for nothing in [
            &openai[..],
            b"not json",
            br#"{"error":{"details":[{"retryDelay":"x"}]}}"#,
        ] {
            assert_eq!(error_wait(nothing, now), None);
        }
    }
}
