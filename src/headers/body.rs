//! The one reader of an LLM provider's `usage` object (feature `http`), for
//! a whole body ([`llm_usage`]) and a stream event ([`llm_event_usage`]);
//! the table of what it reads is on `Provider::usage_in_body`. A whole
//! reply counts a missing output as 0; a stream event reports only the
//! fields it carries, and the stream adds them up.

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
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
        return Vec::new();
    };
    // Anthropic's `message_start` carries it under `message`.
    match value
        .get("usage")
        .or_else(|| value.get("message").and_then(|m| m.get("usage")))
        .filter(|u| u.is_object())
    {
        Some(u) => usage(u, whole),
        None => Vec::new(),
    }
}

fn usage(usage: &serde_json::Value, whole: Whole) -> Vec<(String, u32)> {
    let field = |name: &str| usage.get(name).and_then(serde_json::Value::as_u64);
    let units = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    // Anthropic: cache writes count toward the input limit, cache reads do not.
    let input = field("prompt_tokens").or_else(|| {
        let writes = field("cache_creation_input_tokens").unwrap_or(0);
        field("input_tokens").map(|input| input.saturating_add(writes))
    });
    let mut output = field("completion_tokens").or_else(|| field("output_tokens"));
    if whole == Whole::Reply && input.is_some() {
        output = output.or(Some(0));
    }
    let total = field("total_tokens").or(match (input, output) {
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
    }
}
