//! Reading a response's body for its usage.

use ::reqwest::{Response, ResponseBuilderExt};

/// Whether a response's body is a stream (server-sent events), never
/// buffered here.
pub(super) fn is_stream(response: &Response) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reads `response`'s body, hands it to `read`, and returns what it found
/// with an equivalent response for the caller.
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
