//! [`Call::request`]: a reqwest request as a [`Runner`](crate::admission::Runner)
//! call.

use std::time::SystemTime;

use reqwest_middleware::RequestBuilder;

use crate::admission::{Call, CallSpec, Reply};
use crate::headers::ServerHint;

/// A response read whole: what a [`Call::request`] returns (`Clone`, so
/// the callers of one coalesced read share it).
type HttpReply = http::Response<Vec<u8>>;

impl Call<HttpReply, reqwest_middleware::Error> {
    /// The call that sends `request` (from a `reqwest_middleware` client, or
    /// `ClientWithMiddleware::from(reqwest::Client)`), admitted as `spec`,
    /// once per attempt. Each response is read whole into an
    /// `http::Response<Vec<u8>>` (`Clone`, so the callers of one coalesced
    /// read share it); its status and limit headers go back to the admission
    /// layer.
    ///
    /// A `GET` or `HEAD` with `spec` a read is coalesced with the identical
    /// ones of the turn (compared as the reqwest middleware does); set
    /// [`coalesce_key`](Call::coalesce_key) for anything else. Put the
    /// admission in the `Runner` *or* the client's middleware, not both. A
    /// request with a streamed body is sent by the first attempt only.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, Call, CallSpec, Runner};
    /// use reqwest_middleware::ClientWithMiddleware;
    /// use std::time::Duration;
    ///
    /// let client = ClientWithMiddleware::from(reqwest::Client::new());
    /// let runner: Runner<http::Response<Vec<u8>>, reqwest_middleware::Error> =
    ///     Runner::new(Admission::builder().build(), Duration::from_secs(3));
    /// let call = Call::request(
    ///     CallSpec::new("search", "key-a"),
    ///     client.get("http://127.0.0.1:9/search?q=refund"),
    /// );
    /// # drop((runner, call));
    /// ```
    pub fn request(spec: CallSpec, request: RequestBuilder) -> Self {
        let key = request
            .try_clone()
            .and_then(|r| r.build().ok())
            .and_then(|r| {
                let method = r.method();
                let read = method == http::Method::GET || method == http::Method::HEAD;
                (!spec.write && read)
                    .then(|| crate::admission::identity::reqwest(&r, false))
                    .flatten()
            });
        let call = Call::new(spec, move || {
            let attempt = request.try_clone();
            async move {
                let Some(attempt) = attempt else {
                    return Err(reqwest_middleware::Error::middleware(NotCloneable));
                };
                let response = attempt.send().await?;
                let status = response.status();
                let headers = response.headers().clone();
                let now = SystemTime::now();
                let hint = ServerHint::from_header_map(&headers, now);
                let mut reply = HttpReply::new(response.bytes().await?.to_vec());
                let hint = match status.as_u16() {
                    429 => hint.with_error_body(reply.body(), now),
                    _ => hint,
                };
                *reply.status_mut() = status;
                *reply.headers_mut() = headers;
                Ok(Reply::new(status.as_u16(), reply).with_hint(hint))
            }
        });
        match key {
            Some(key) => call.coalesce_key(key),
            None => call,
        }
    }
}

/// A retry of a request whose body is a stream.
#[derive(Debug)]
struct NotCloneable;

impl core::fmt::Display for NotCloneable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the request's body is a stream and cannot be sent again")
    }
}

impl std::error::Error for NotCloneable {}
