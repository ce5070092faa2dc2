//! What an LLM provider's JSON body says (feature `http`): its usage, in
//! a whole reply and in a stream's events, and the wait a 429's body states.

use std::time::{Duration, SystemTime};

use backpressure::admission::Provider;
use backpressure::headers::ServerHint;

/// The wait `body` states, through the public reader.
fn wait(body: &[u8], now: SystemTime) -> Option<Duration> {
    ServerHint::default().with_error_body(body, now).retry_after
}

fn of(pairs: &[(&str, u32)]) -> Vec<(String, u32)> {
    pairs.iter().map(|(n, u)| (n.to_string(), *u)).collect()
}

/// One rule for when `tokens` is set, in a body and a stream.
#[test]
fn the_body_and_the_stream_read_usage_alike() {
    let openai = br#"{"usage":{"prompt_tokens":700,"completion_tokens":105,"total_tokens":805}}"#;
    let want = of(&[
        ("input_tokens", 700),
        ("output_tokens", 105),
        ("tokens", 805),
    ]);
    assert_eq!(Provider::usage_in_body(openai), want);
    assert_eq!(Provider::usage_in_event(openai), want);
    // No total stated: input plus output, in a body and in an event. Cache
    // writes count as input; cache reads do not (Anthropic's input limit).
    let anthropic = br#"{"usage":{"input_tokens":10,"cache_creation_input_tokens":20,
        "cache_read_input_tokens":900,"output_tokens":5}}"#;
    let want = of(&[("input_tokens", 30), ("output_tokens", 5), ("tokens", 35)]);
    assert_eq!(Provider::usage_in_body(anthropic), want);
    assert_eq!(Provider::usage_in_event(anthropic), want);
    // Part of a stream: only what the event carries.
    let start = br#"{"type":"message_start","message":{"usage":{"input_tokens":700}}}"#;
    assert_eq!(
        Provider::usage_in_event(start),
        of(&[("input_tokens", 700)])
    );
    let delta = br#"{"type":"message_delta","usage":{"output_tokens":105}}"#;
    assert_eq!(
        Provider::usage_in_event(delta),
        of(&[("output_tokens", 105)])
    );
    // A whole reply with the input alone (an embedding): output 0.
    let embedding = br#"{"usage":{"prompt_tokens":8}}"#;
    assert_eq!(
        Provider::usage_in_body(embedding),
        of(&[("input_tokens", 8), ("output_tokens", 0), ("tokens", 8)])
    );
    for nothing in [&b"not json"[..], b"[DONE]", br#"{"usage":3}"#, br#"{}"#] {
        assert!(Provider::usage_in_body(nothing).is_empty());
        assert!(Provider::usage_in_event(nothing).is_empty());
    }
    // Past u32::MAX: clamped.
    let huge = br#"{"usage":{"total_tokens":99999999999}}"#;
    assert_eq!(Provider::usage_in_body(huge), of(&[("tokens", u32::MAX)]));
    // Gemini: cached content is part of the prompt's count; thinking is output.
    let gemini = br#"{"usageMetadata":{"promptTokenCount":1000,"cachedContentTokenCount":900,
        "candidatesTokenCount":50,"thoughtsTokenCount":20,"totalTokenCount":1070}}"#;
    let want = of(&[
        ("input_tokens", 1000),
        ("output_tokens", 70),
        ("tokens", 1070),
    ]);
    assert_eq!(Provider::usage_in_body(gemini), want);
    assert_eq!(Provider::usage_in_event(gemini), want);
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
    assert_eq!(wait(retry, now), Some(Duration::from_millis(23_500)));
    let day = br#"[{"error":{"code":429,"details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
        {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"50"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}]"#;
    assert_eq!(wait(day, now), Some(Duration::from_secs(20 * 3600)));
    let month = br#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure",
        "violations":[{"quotaId":"RequestsPerMonth"}]}]}}"#;
    // To 2026-04-01 00:00 Pacific: 21 days and 20 hours.
    let want = Duration::from_secs((21 * 24 + 20) * 3600);
    assert_eq!(wait(month, now), Some(want));
    let openai = br#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
    for nothing in [
        &openai[..],
        b"not json",
        br#"{"error":{"details":[{"retryDelay":"x"}]}}"#,
    ] {
        assert_eq!(wait(nothing, now), None);
    }
}
