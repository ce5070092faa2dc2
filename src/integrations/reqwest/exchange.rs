//! A request through the rest of the middleware chain, as the admission's
//! attempt loop sends it.

use core::fmt;
use std::borrow::Cow;
use std::time::SystemTime;

use ::reqwest::{Request, Response};
use ::reqwest_middleware::{Error, Next, Result};
use bytes::Bytes;

use super::{usage, BodyUsage, Usage};
use crate::admission::attempt::Read;
use crate::headers::ServerHint;
use crate::Throttled;

/// A response, what its body said the request used, and a 429's body.
pub(super) struct Sent {
    pub(super) response: Response,
    used: Vec<(String, u32)>,
    refused: Option<Bytes>,
}

/// The most of a 429's body read for the wait it states.
const ERROR_BODY_LIMIT: u64 = 64 << 10;

/// One request through the rest of the middleware chain: each attempt a
/// clone of the request (a streamed body is sent once).
pub(super) struct Exchange<'a, 'n> {
    /// The next attempt's request.
    pub(super) req: Option<Request>,
    pub(super) extensions: &'a mut http::Extensions,
    pub(super) next: Next<'n>,
    pub(super) usage: Option<&'a Usage>,
    pub(super) body_usage: Option<&'a BodyUsage>,
}

impl crate::admission::attempt::Exchange for Exchange<'_, '_> {
    type Output = Sent;
    type Error = Error;

    fn can_send(&self) -> bool {
        self.req.is_some()
    }

    fn send(&mut self) -> impl core::future::Future<Output = Result<Sent>> {
        let req = self.req.take();
        self.req = req.as_ref().and_then(Request::try_clone);
        let next = self.next.clone();
        let extensions = &mut *self.extensions;
        let body_usage = self.body_usage;
        async move {
            let Some(req) = req else {
                return Err(Error::middleware(Unsendable));
            };
            let response = next.run(req, extensions).await?;
            let buffer =
                !usage::is_stream(&response) && !crate::Throttled::is_refusal(response.headers());
            let refused = response.status() == 429
                && response
                    .content_length()
                    .is_none_or(|n| n <= ERROR_BODY_LIMIT);
            match body_usage {
                // Read here, once, whatever the status.
                Some(read) if buffer => {
                    let copy = |body: &[u8]| refused.then(|| Bytes::copy_from_slice(body));
                    let (response, (used, body)) =
                        usage::buffered(response, |body| (read(body), copy(body)))
                            .await
                            .map_err(Error::Reqwest)?;
                    Ok(Sent {
                        response,
                        used,
                        refused: body,
                    })
                }
                _ if buffer && refused => {
                    let (response, body) = usage::buffered(response, Bytes::copy_from_slice)
                        .await
                        .map_err(Error::Reqwest)?;
                    let refused = Some(body);
                    Ok(Sent {
                        response,
                        used: Vec::new(),
                        refused,
                    })
                }
                _ => Ok(Sent {
                    response,
                    used: Vec::new(),
                    refused: None,
                }),
            }
        }
    }

    fn read(&self, result: &Result<Sent>) -> Read {
        match result {
            // A refusal of an admission layer further in: final, nothing to learn.
            Ok(sent) if crate::Throttled::is_refusal(sent.response.headers()) => Read::Refusal,
            Err(Error::Middleware(e)) if e.downcast_ref::<Throttled>().is_some() => Read::Refusal,
            Ok(Sent {
                response,
                used,
                refused,
            }) => {
                let mut usage: Vec<(Cow<'static, str>, u32)> = used
                    .iter()
                    .map(|(name, units)| (Cow::Owned(name.clone()), *units))
                    .collect();
                if let Some(read) = self.usage {
                    usage.extend(read(response).into_iter().map(|(n, u)| (Cow::Owned(n), u)));
                }
                let now = SystemTime::now();
                let mut hint = ServerHint::from_header_map(response.headers(), now);
                if let Some(body) = refused {
                    hint = hint.with_error_body(body, now);
                }
                Read::Answer {
                    status: response.status().as_u16(),
                    hint,
                    usage,
                }
            }
            Err(_) => Read::NoAnswer,
        }
    }
}

/// A request asked to be sent again after its only copy went out (never:
/// `can_send` is asked first).
#[derive(Debug)]
struct Unsendable;

impl fmt::Display for Unsendable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request's body is a stream and cannot be sent again")
    }
}

impl std::error::Error for Unsendable {}
