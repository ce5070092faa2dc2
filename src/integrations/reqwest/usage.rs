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
    let head = Head::take(&mut response);
    let body = response.bytes().await?;
    let found = read(&body);
    Ok((head.response(body), found))
}

/// A response without its body.
#[derive(Clone, Debug)]
pub(super) struct Head {
    status: http::StatusCode,
    version: http::Version,
    url: ::reqwest::Url,
    headers: http::HeaderMap,
    pub(super) extensions: http::Extensions,
}

impl Head {
    /// `response`'s head; its headers and extensions are taken out of it.
    pub(super) fn take(response: &mut Response) -> Head {
        Head {
            status: response.status(),
            version: response.version(),
            url: response.url().clone(),
            headers: core::mem::take(response.headers_mut()),
            extensions: core::mem::take(response.extensions_mut()),
        }
    }

    /// The response of this head and `body`.
    pub(super) fn response(self, body: impl Into<::reqwest::Body>) -> Response {
        let mut rebuilt = http::Response::builder()
            .status(self.status)
            .version(self.version)
            .url(self.url)
            .body(body.into())
            .expect("the status and version came from a response");
        *rebuilt.headers_mut() = self.headers;
        rebuilt.extensions_mut().extend(self.extensions);
        Response::from(rebuilt)
    }
}
