//! The shapes a server's "not now" comes in, and the texts that are not one.

use super::*;
use rmcp::model::{ContentBlock, ErrorCode};
use serde_json::json;

fn status_of(r: &Result<CallToolResult, ServiceError>) -> Option<(u16, Option<Duration>)> {
    read_hint(r, "t")
}

fn read_hint(
    r: &Result<CallToolResult, ServiceError>,
    tool: &str,
) -> Option<(u16, Option<Duration>)> {
    match read(r, tool) {
        Read::Answer { status, hint, .. } => Some((status, hint.retry_after)),
        _ => None,
    }
}

fn rpc(code: i32, message: &'static str, data: Option<Value>) -> ServiceError {
    ServiceError::McpError(ErrorData::new(ErrorCode(code), message, data))
}

#[test]
fn a_tool_error_that_is_not_about_capacity_is_the_tools_answer() {
    let r = Ok(CallToolResult::error(vec![ContentBlock::text(
        "no such issue: PROJ-12",
    )]));
    assert_eq!(status_of(&r), Some((200, None)));
    let ok = Ok(CallToolResult::success(vec![ContentBlock::text(
        "rate limit: 5",
    )]));
    assert_eq!(
        status_of(&ok),
        Some((200, None)),
        "only isError results are read"
    );
}

#[test]
fn a_tool_error_in_words_is_a_bare_429() {
    let r = Ok(CallToolResult::error(vec![ContentBlock::text(
        r#"{"type":"error","error":"Meraki API rate limit reached."}"#,
    )]));
    assert_eq!(status_of(&r), Some((429, None)));
}

fn text(t: &str) -> Result<CallToolResult, ServiceError> {
    Ok(CallToolResult::error(vec![ContentBlock::text(t)]))
}

/// A tool's ordinary error that mentions a limit is not read as one.
#[test]
fn a_phrase_inside_a_tools_error_is_not_a_rate_limit() {
    for t in [
        "rate limit must be 1..100",
        "invalid argument: the rate limit is 5 per call",
        "Error in handler: upstream said Too Many Requests while syncing 3 of 9 records",
        r#"{"error":"field rate_limit must be an integer"}"#,
        "Traceback (most recent call last): ... HTTPError: 429 Too Many Requests",
    ] {
        assert_eq!(status_of(&text(t)), Some((200, None)), "{t}");
    }
}

/// The wait a text states is read.
#[test]
fn a_limit_in_words_states_its_wait() {
    let cases = [
        ("Too Many Requests", None),
        ("Rate limit exceeded, retry after 1 seconds", Some(1_000)),
        ("Rate limited. Try again in 20s.", Some(20_000)),
        ("Error: quota exceeded - please retry in 500 ms", Some(500)),
        (
            "GitHub API rate limit exceeded. Retry after 2 minutes",
            Some(120_000),
        ),
    ];
    for (t, ms) in cases {
        let wait = ms.map(Duration::from_millis);
        assert_eq!(status_of(&text(t)), Some((429, wait)), "{t}");
    }
    // The Python SDK's wrapper of the tool's own exception, for this tool
    // only (a dot in its name included).
    let sdk = text("Error executing tool docs.search: Rate limit exceeded, retry after 1 seconds");
    assert_eq!(
        read_hint(&sdk, "docs.search"),
        Some((429, Some(Duration::from_secs(1))))
    );
    assert_eq!(read_hint(&sdk, "docs"), Some((200, None)));
    // A JSON-RPC error's message, and ToolHive's code with its data.
    let e = Err(rpc(-32000, "rate limit exceeded, try again in 3s", None));
    assert_eq!(status_of(&e), Some((429, Some(Duration::from_secs(3)))));
    let toolhive = Err(rpc(
        -32029,
        "Rate limit exceeded",
        Some(json!({"retryAfterSeconds": 4})),
    ));
    assert_eq!(
        status_of(&toolhive),
        Some((429, Some(Duration::from_secs(4))))
    );
}

/// A closed transport is final, not retried.
#[test]
fn a_closed_transport_is_final() {
    assert!(matches!(
        read(&Err(ServiceError::TransportClosed), "t"),
        Read::Refusal
    ));
}

#[test]
fn a_throttled_in_structured_content_keeps_its_wait() {
    let t =
        json!({"status": "rate_limited", "scope": "api_key", "retry_after_ms": 1500, "hint": "h"});
    let r = Ok(CallToolResult::structured_error(t));
    assert_eq!(
        status_of(&r),
        Some((429, Some(Duration::from_millis(1500))))
    );
    let down = json!({"status": "unavailable", "retryAfter": 3});
    let r = Ok(CallToolResult::structured_error(down));
    assert_eq!(status_of(&r), Some((503, Some(Duration::from_secs(3)))));
    let other = json!({"status": "timed_out", "hint": "the tool's own deadline"});
    let r = Ok(CallToolResult::structured_error(other));
    assert_eq!(status_of(&r), Some((200, None)));
}

#[test]
fn a_tools_limit_holds_the_tool_and_a_servers_the_credential() {
    let scope = |r: &Result<CallToolResult, ServiceError>| match read(r, "search") {
        Read::Answer { hint, .. } => hint.scope,
        _ => panic!("no answer"),
    };
    let words = Ok(CallToolResult::error(vec![ContentBlock::text(
        "Rate limit hit",
    )]));
    assert_eq!(scope(&words).as_deref(), Some("search"));
    let named = json!({"status": "rate_limited", "scope": "index", "retry_after_ms": 5});
    assert_eq!(
        scope(&Ok(CallToolResult::structured_error(named))).as_deref(),
        Some("index")
    );
    assert_eq!(scope(&Err(rpc(429, "slow down", None))), None);
}

#[test]
fn json_rpc_errors_say_it_in_the_code_the_message_or_the_data() {
    let by_code = Err(rpc(429, "slow down", None));
    assert_eq!(status_of(&by_code), Some((429, None)));
    // gitlab-mcp-server's shape: -32000 "rate limit exceeded".
    let by_words = Err(rpc(-32000, "rate limit exceeded", None));
    assert_eq!(status_of(&by_words), Some((429, None)));
    // firezone's: a number of seconds beside the words.
    let data = json!({"retry_after_seconds": 7});
    let by_data = Err(rpc(-32010, "Too many calls", Some(data)));
    assert_eq!(
        status_of(&by_data),
        Some((429, Some(Duration::from_secs(7))))
    );
    let invalid = Err(rpc(-32602, "invalid params: limit must be < 100", None));
    assert_eq!(status_of(&invalid), Some((FINAL, None)));
}

#[test]
fn a_bad_wait_is_clamped_not_a_panic() {
    for data in [
        json!({"retry_after_ms": -5}),
        json!({"retry_after_ms": 1e300}),
        json!({"retry_after": "soon"}),
        json!({"retryAfter": -1.5}),
    ] {
        let r = Err(rpc(429, "x", Some(data.clone())));
        let (status, wait) = status_of(&r).unwrap();
        assert_eq!(status, 429, "{data}");
        assert!(
            wait.is_none_or(|w| w <= Duration::from_secs(1_000_000_000)),
            "{data}"
        );
    }
}

#[test]
fn a_transport_fault_with_a_status_is_that_status() {
    let e = rmcp::transport::DynamicTransportError::from_parts(
        "test",
        core::any::TypeId::of::<()>(),
        Box::new(StreamableHttpError::<reqwest::Error>::HttpStatus(
            HttpStatusError::new(429, Some("2".into())),
        )),
    );
    assert_eq!(
        status_of(&Err(ServiceError::TransportSend(e))),
        Some((429, Some(Duration::from_secs(2))))
    );
}

/// Only a whole `Throttled` that sent nothing says the tool never ran.
#[test]
fn a_gates_refusal_ran_nothing() {
    let throttled = |attempts: u32| {
        let t = crate::Throttled::new(crate::Status::RateLimited, "tool:t", "wait")
            .with_attempts(attempts);
        CallToolResult::structured_error(serde_json::to_value(t).unwrap())
    };
    assert!(ran_nothing(&throttled(0)));
    // A handler refused by the API behind it, after sending: it may have run.
    assert!(!ran_nothing(&throttled(1)));
    let mut success = throttled(0);
    success.is_error = Some(false);
    assert!(!ran_nothing(&success), "not an error");
    let words = CallToolResult::error(vec![ContentBlock::text("Rate limit exceeded")]);
    assert!(!ran_nothing(&words), "a limit in words does not say");
}
