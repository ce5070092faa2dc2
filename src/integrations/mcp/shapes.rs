//! What an MCP server's answer says about its capacity. Servers do not
//! agree on how to say "not now", so these are the shapes recognised, in
//! the order they are tried:
//!
//! | where | read as the server's capacity when | its wait |
//! | --- | --- | --- |
//! | the HTTP transport (rmcp's streamable HTTP client) | a 429 or 5xx status | its `Retry-After` (the only header rmcp keeps) |
//! | a JSON-RPC error | code 429, a message that says so ([`PHRASES`]), or `data` that does (below) | `data`'s wait field |
//! | a tool result with `isError: true` | `structuredContent` that says so (below), or a text block with one of [`PHRASES`] | `structuredContent`'s wait field |
//!
//! An object (`data`, `structuredContent`) says so with a `status` of
//! `rate_limited`, `quota_exhausted` or `shed` (a [`Throttled`] from a
//! gate further in), `unavailable` (read as a 503), a string field
//! `error`, `code`, `message` or `type` with one of [`PHRASES`], or a wait
//! field. Its wait is the first of `retry_after_ms` / `retryAfterMs`
//! (milliseconds), `retry_after_seconds` / `retryAfterSeconds` /
//! `retry_after` / `retryAfter` (seconds, or a `Retry-After` value: an
//! HTTP date). Anything else is the tool's own answer: final, not retried.
//!
//! A limit a tool reports in its result is the tool's (the API behind
//! it): it holds only that tool's calls, under the object's `scope` if it
//! names one, else the tool's name. A limit at the transport or in a
//! JSON-RPC error is the server's: it holds the credential (unless
//! `data` names a `scope`).

use std::time::{Duration, SystemTime};

use rmcp::model::{CallToolResult, ErrorData};
use rmcp::transport::streamable_http_client::{HttpStatusError, StreamableHttpError};
use rmcp::ServiceError;
use serde_json::{Map, Value};

use crate::admission::attempt::Read;
use crate::headers::ServerHint;

#[cfg(doc)]
use crate::Throttled;

/// Lowercase phrases that say "rate limit" in a server's own words.
pub(crate) const PHRASES: [&str; 7] = [
    "rate limit",
    "rate-limit",
    "ratelimit",
    "rate_limit",
    "too many requests",
    "quota exceeded",
    "quota_exhausted",
];

/// The status a JSON-RPC error that says it is a rate limit stands for.
/// A JSON-RPC error that does not is final: a 400 (retrying the same
/// arguments cannot change it).
pub(super) const FINAL: u16 = 400;

/// What a `tools/call`'s result says, for the attempt loop.
pub(crate) fn read(result: &Result<CallToolResult, ServiceError>, tool: &str) -> Read {
    match result {
        Ok(r) if r.is_error == Some(true) => match tool_error(r, tool) {
            Some((status, hint)) => answer(status, hint),
            // The tool's own error: an answer like any other.
            None => answer(200, ServerHint::default()),
        },
        Ok(_) => answer(200, ServerHint::default()),
        Err(ServiceError::McpError(e)) => match rpc_error(e) {
            Some(hint) => answer(429, hint),
            None => answer(FINAL, ServerHint::default()),
        },
        Err(ServiceError::TransportSend(e)) => match http_status(&*e.error) {
            Some(h) => {
                let now = SystemTime::now();
                let hint = match &h.retry_after {
                    Some(v) => ServerHint::from_headers([("retry-after", v.as_bytes())], now),
                    None => ServerHint::default(),
                };
                answer(h.status, hint)
            }
            None => Read::NoAnswer,
        },
        // Closed, timed out in rmcp, cancelled, an unexpected reply: no
        // answer from the server.
        Err(_) => Read::NoAnswer,
    }
}

fn answer(status: u16, hint: ServerHint) -> Read {
    Read::Answer {
        status,
        hint,
        usage: Vec::new(),
    }
}

/// The HTTP status rmcp's streamable HTTP client reports: its reqwest
/// client's error, or an [`HttpStatusError`] a custom backend puts in its
/// error's `source` chain.
fn http_status<'e>(
    error: &'e (dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'e HttpStatusError> {
    if let Some(StreamableHttpError::HttpStatus(h)) =
        error.downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        return Some(h);
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(h) = e.downcast_ref::<HttpStatusError>() {
            return Some(h);
        }
        next = e.source();
    }
    None
}

/// A JSON-RPC error that says it is a rate limit, and its wait.
fn rpc_error(e: &ErrorData) -> Option<ServerHint> {
    let data = e.data.as_ref().and_then(Value::as_object);
    let said = e.code.0 == 429
        || says_rate_limit(&e.message)
        || data.is_some_and(|d| object_status(d).is_some());
    said.then(|| data.map_or_else(ServerHint::default, |d| hint_of(d, None)))
}

/// An `isError` result that says it is the server's capacity: its status
/// (429, or 503 for `unavailable`) and wait.
fn tool_error(r: &CallToolResult, tool: &str) -> Option<(u16, ServerHint)> {
    let object = r.structured_content.as_ref().and_then(Value::as_object);
    let status = object.and_then(object_status).or_else(|| {
        let mut texts = r.content.iter().filter_map(|c| c.as_text());
        texts.any(|t| says_rate_limit(&t.text)).then_some(429)
    })?;
    let hint = match object {
        Some(o) => hint_of(o, Some(tool)),
        None => ServerHint {
            scope: Some(tool.to_string()),
            ..ServerHint::default()
        },
    };
    Some((status, hint))
}

/// The status an object stands for, when it says the server is out of
/// capacity.
fn object_status(o: &Map<String, Value>) -> Option<u16> {
    match o.get("status").and_then(Value::as_str) {
        Some("rate_limited" | "quota_exhausted" | "shed") => return Some(429),
        Some("unavailable") => return Some(503),
        _ => {}
    }
    let said = ["error", "code", "message", "type"]
        .iter()
        .filter_map(|k| o.get(*k).and_then(Value::as_str))
        .any(says_rate_limit);
    (said || wait(o).is_some()).then_some(429)
}

fn says_rate_limit(text: &str) -> bool {
    // Bounded: a tool's text can be long, and the phrases are short.
    let head = text.get(..text.len().min(4096)).unwrap_or(text);
    let lower = head.to_ascii_lowercase();
    PHRASES.iter().any(|p| lower.contains(p))
}

/// An object's wait, held under the scope it names, else `scope`.
fn hint_of(o: &Map<String, Value>, scope: Option<&str>) -> ServerHint {
    let named = o
        .get("scope")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    ServerHint {
        retry_after: wait(o),
        scope: named.or(scope).map(str::to_string),
        ..ServerHint::default()
    }
}

/// The wait an object states, if any (negative, fractional or absurd
/// numbers are clamped like a `Retry-After` header: the hold's own cap
/// applies when it is placed).
fn wait(o: &Map<String, Value>) -> Option<Duration> {
    for key in ["retry_after_ms", "retryAfterMs"] {
        if let Some(ms) = o.get(key).and_then(Value::as_f64) {
            return Some(Duration::from_secs_f64(ms.clamp(0.0, 1e12) / 1000.0));
        }
    }
    for key in [
        "retry_after_seconds",
        "retryAfterSeconds",
        "retry_after",
        "retryAfter",
    ] {
        match o.get(key) {
            Some(Value::Number(n)) => {
                let s = n.as_f64().unwrap_or(0.0);
                return Some(Duration::from_secs_f64(s.clamp(0.0, 1e9)));
            }
            Some(Value::String(v)) => {
                let header = [("retry-after", v.as_bytes())];
                return ServerHint::from_headers(header, SystemTime::now()).retry_after;
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ContentBlock, ErrorCode};
    use serde_json::json;

    fn status_of(r: &Result<CallToolResult, ServiceError>) -> Option<(u16, Option<Duration>)> {
        match read(r, "t") {
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
        // Meraki's shape (panoramicdata/Meraki.Api#389): words, no number.
        let r = Ok(CallToolResult::error(vec![ContentBlock::text(
            r#"{"type":"error","error":"Meraki API rate limit reached."}"#,
        )]));
        assert_eq!(status_of(&r), Some((429, None)));
    }

    #[test]
    fn a_throttled_in_structured_content_keeps_its_wait() {
        let t = json!({"status": "rate_limited", "scope": "api_key", "retry_after_ms": 1500, "hint": "h"});
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
    fn a_transport_fault_without_a_status_is_no_answer() {
        assert!(matches!(
            read(&Err(ServiceError::TransportClosed), "t"),
            Read::NoAnswer
        ));
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
}
