//! What an MCP server's answer says about its capacity, in the shapes
//! recognised, tried in order:
//!
//! | where | read as the server's capacity when | its wait |
//! | --- | --- | --- |
//! | the HTTP transport (rmcp's streamable HTTP client) | a 429 or 5xx status | its `Retry-After` (the only header rmcp keeps) |
//! | a JSON-RPC error | code 429 or `-32029` (ToolHive's), a message whose whole text is a limit, or `data` that says so | `data`'s wait field, else the message's |
//! | a tool result with `isError: true` | `structuredContent` that says so, or a text block whose whole text is a limit, or is a JSON object that says so | the object's wait field, else the text's |
//!
//! A **text is a limit** only when its whole shape is one (at most 200
//! characters): at most four words of preamble, one of [`PHRASES`], then
//! nothing but a stated wait (`retry after N`, `try again in N`, ...). The
//! Python SDK's wrapper of a tool's exception, `Error executing tool
//! <the tool>: `, is taken off first. A phrase found somewhere in a text
//! is never a limit: a tool's ordinary error read as one would be
//! retried, and a write run again.
//!
//! An **object** says so with a `status` of `rate_limited`,
//! `quota_exhausted`, `shed` or `unavailable` (a 503), a string field
//! `error`, `code`, `message` or `type` whose whole text is a limit, or a
//! wait field (`retry_after_ms`/`retryAfterMs` in ms;
//! `retry_after_seconds`/`retryAfterSeconds`/`retry_after`/`retryAfter`
//! in seconds or as an HTTP date).
//!
//! A limit in a tool's result holds only that tool (or the object's
//! `scope`); the tool ran, so it is retried only for a read or idempotent
//! tool, unless the result is a whole [`Throttled`] that sent nothing
//! (`attempts: 0`: a `ServerGate`'s refusal). A limit at the transport or in a JSON-RPC error was said before
//! the tool ran: it holds the credential (unless `data` names a `scope`).

use std::time::{Duration, SystemTime};

use rmcp::model::{CallToolResult, ErrorData};
use rmcp::transport::streamable_http_client::{HttpStatusError, StreamableHttpError};
use rmcp::ServiceError;
use serde_json::{Map, Value};

use crate::admission::attempt::Read;
use crate::headers::ServerHint;

#[cfg(doc)]
use crate::Throttled;

/// Lowercase phrases that say "rate limit" in a server's own words, the
/// longer before the shorter that begin them.
pub(crate) const PHRASES: [&str; 14] = [
    "rate limit exceeded",
    "rate limit reached",
    "rate limit hit",
    "rate limited",
    "rate-limited",
    "rate limit",
    "rate-limit",
    "ratelimit",
    "rate_limit_exceeded",
    "rate_limited",
    "too many requests",
    "quota exceeded",
    "quota_exhausted",
    "quota exhausted",
];

/// A JSON-RPC error code that says "rate limited": ToolHive's.
const RPC_RATE_LIMITED: i32 = -32029;

/// The status of a JSON-RPC error that says it is a rate limit; any other
/// is final, a 400.
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
        // A closed transport does not come back: final, never retried.
        Err(ServiceError::TransportClosed) => Read::Refusal,
        // Timed out in rmcp, cancelled, an unexpected reply: no answer.
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

/// The HTTP status rmcp's streamable HTTP client reports, or an
/// [`HttpStatusError`] in the error's `source` chain.
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

/// Whether a tool result is a refusal that ran nothing: an `isError` whose
/// `structuredContent` is a whole [`Throttled`] with `attempts: 0` (what
/// `McpGate::refusal` writes, and a `ServerGate` answers before the tool
/// runs), so even a write may be sent again.
pub(crate) fn ran_nothing(r: &CallToolResult) -> bool {
    use serde::Deserialize;
    let throttled = r
        .structured_content
        .as_ref()
        .map(crate::Throttled::deserialize);
    r.is_error == Some(true) && matches!(throttled, Some(Ok(t)) if t.attempts == 0)
}

/// A JSON-RPC error that says it is a rate limit, and its wait.
fn rpc_error(e: &ErrorData) -> Option<ServerHint> {
    let data = e.data.as_ref().and_then(Value::as_object);
    let text = limit_text(&e.message);
    let said = matches!(e.code.0, 429 | RPC_RATE_LIMITED)
        || text.is_some()
        || data.is_some_and(|d| object_status(d).is_some());
    said.then(|| {
        let mut hint = data.map_or_else(ServerHint::default, |d| hint_of(d, None));
        hint.retry_after = hint.retry_after.or(text.flatten());
        hint
    })
}

/// An `isError` result that says it is the server's capacity: its status
/// (429, or 503 for `unavailable`) and wait.
fn tool_error(r: &CallToolResult, tool: &str) -> Option<(u16, ServerHint)> {
    if let Some(o) = r.structured_content.as_ref().and_then(Value::as_object)
        && let Some(status) = object_status(o)
    {
        return Some((status, hint_of(o, Some(tool))));
    }
    for text in r.content.iter().filter_map(|c| c.as_text()) {
        // A text that is a JSON object is read as one.
        if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(&text.text) {
            if let Some(status) = object_status(&o) {
                return Some((status, hint_of(&o, Some(tool))));
            }
            continue;
        }
        // The official Python SDK wraps a tool's exception as
        // "Error executing tool <name>: <message>".
        let own = text.text.trim_start();
        let lead = "error executing tool ";
        let wrapped = own
            .get(..lead.len())
            .filter(|l| l.eq_ignore_ascii_case(lead))
            .and_then(|_| own[lead.len()..].strip_prefix(tool)?.strip_prefix(':'));
        if let Some(wait) = limit_text(wrapped.unwrap_or(own)) {
            let hint = ServerHint {
                retry_after: wait,
                scope: Some(tool.to_string()),
                ..ServerHint::default()
            };
            return Some((429, hint));
        }
    }
    None
}

/// The status an object stands for, when it says it is out of capacity.
fn object_status(o: &Map<String, Value>) -> Option<u16> {
    match o.get("status").and_then(Value::as_str) {
        Some("rate_limited" | "quota_exhausted" | "shed") => return Some(429),
        Some("unavailable") => return Some(503),
        _ => {}
    }
    let said = ["error", "code", "message", "type"]
        .iter()
        .filter_map(|k| o.get(*k).and_then(Value::as_str))
        .any(|text| limit_text(text).is_some());
    (said || wait(o).is_some()).then_some(429)
}

/// Whether `text`'s whole shape is a limit, and its wait: `None` when not
/// one, `Some(None)` when one that states no wait.
fn limit_text(text: &str) -> Option<Option<Duration>> {
    let text = text.trim();
    if text.len() > 200 {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    let lower = lower.trim_end_matches(['.', '!', ' ']);
    // The first phrase in the text, the longest at that place.
    let (at, phrase) = PHRASES
        .iter()
        .filter_map(|p| lower.find(p).map(|at| (at, *p)))
        .min_by_key(|(at, p)| (*at, core::cmp::Reverse(p.len())))?;
    let preamble = lower[..at].trim_end().trim_end_matches([':', '-']);
    let words = preamble.split_whitespace();
    let plain = |w: &str| {
        w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_'".contains(&b))
    };
    if words.clone().count() > 4 || !words.into_iter().all(plain) {
        return None;
    }
    let rest = lower[at + phrase.len()..].trim_start_matches([',', ';', ':', '.', '-', '!', ' ']);
    if rest.is_empty() {
        return Some(None);
    }
    stated_wait(rest).map(Some)
}

/// A wait stated as the whole of `text`: "retry after 2 seconds", "try
/// again in 20s", "please retry in 500 ms".
fn stated_wait(text: &str) -> Option<Duration> {
    let text = text.strip_prefix("please ").unwrap_or(text);
    let text = [
        "retry after",
        "retry in",
        "try again after",
        "try again in",
        "retry",
    ]
    .iter()
    .find_map(|lead| text.strip_prefix(lead))?
    .trim_start();
    let digits = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let n: f64 = text[..digits].parse().ok()?;
    let unit = text[digits..].trim();
    let seconds = match unit {
        "" | "s" | "sec" | "secs" | "second" | "seconds" | "second(s)" => n,
        "ms" | "millisecond" | "milliseconds" => n / 1000.0,
        "m" | "min" | "mins" | "minute" | "minutes" => n * 60.0,
        _ => return None,
    };
    // Clamped like a `Retry-After`: the hold's own cap applies when placed.
    Some(Duration::from_secs_f64(seconds.clamp(0.0, 1e9)))
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

/// The wait an object states, if any, clamped like a `Retry-After`.
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
mod tests;
