//! What a response's body says the request used: `llm_usage` reads the
//! `usage` object of an OpenAI or Anthropic reply, and [`buffered`] reads
//! a body once and hands the caller a response with the same body.

use ::reqwest::{Response, ResponseBuilderExt};

/// See [`AdmissionMiddleware::llm_usage`](super::AdmissionMiddleware::llm_usage).
pub(super) fn llm_usage(body: &[u8]) -> Vec<(String, u32)> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let Some(usage) = value.get("usage") else {
        return Vec::new();
    };
    let field = |name: &str| usage.get(name).and_then(serde_json::Value::as_u64);
    let (input, output, total) = if let Some(prompt) = field("prompt_tokens") {
        let output = field("completion_tokens").unwrap_or(0);
        let total = field("total_tokens").unwrap_or(prompt.saturating_add(output));
        (prompt, output, total)
    } else if let Some(input) = field("input_tokens") {
        let input = ["cache_creation_input_tokens", "cache_read_input_tokens"]
            .into_iter()
            .filter_map(field)
            .fold(input, u64::saturating_add);
        let output = field("output_tokens").unwrap_or(0);
        (input, output, input.saturating_add(output))
    } else {
        return Vec::new();
    };
    let units = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    vec![
        ("input_tokens".to_string(), units(input)),
        ("output_tokens".to_string(), units(output)),
        ("tokens".to_string(), units(total)),
    ]
}

/// Whether a response's body is a stream (server-sent events), which is
/// read as it comes and never buffered here.
pub(super) fn is_stream(response: &Response) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reads `response`'s body, hands it to `read`, and returns what `read`
/// found with a response carrying the same status, version, headers,
/// extensions, URL and body, for the caller to read as if untouched.
pub(super) async fn buffered<T>(
    mut response: Response,
    read: impl FnOnce(&[u8]) -> T,
) -> Result<(Response, T), ::reqwest::Error> {
    let (status, version) = (response.status(), response.version());
    let url = response.url().clone();
    let headers = core::mem::take(response.headers_mut());
    let extensions = core::mem::take(response.extensions_mut());
    let body = response.bytes().await?;
    let found = read(&body);
    let mut rebuilt = http::Response::builder()
        .status(status)
        .version(version)
        .url(url)
        .body(body)
        .expect("the status and version came from a response");
    *rebuilt.headers_mut() = headers;
    rebuilt.extensions_mut().extend(extensions);
    Ok((Response::from(rebuilt), found))
}
