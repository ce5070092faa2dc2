//! A tower request as the admission's attempt loop sends it: each attempt
//! polls the inner service ready and calls it with a clone of the
//! request; the layer's [`Observe`] reads what came back.

use core::future::Future;
use std::borrow::Cow;

use ::tower::Service;

use super::super::BoxError;
use super::Observe;
use crate::admission::attempt::{self, Read};
use crate::Throttled;

pub(super) struct Exchange<S, Req, O> {
    service: S,
    /// The request as the caller made it; each attempt sends a clone.
    req: Req,
    observe: O,
}

impl<S, Req, O> Exchange<S, Req, O> {
    pub(super) fn new(service: S, req: Req, observe: O) -> Self {
        Exchange {
            service,
            req,
            observe,
        }
    }

    /// A refusal of the layer's own, as the observer wants it answered: a
    /// response (see `RefusalResponses`), or the error carrying it.
    pub(super) fn refusal<Resp>(&self, refused: Throttled) -> Result<Resp, BoxError>
    where
        O: Observe<Resp>,
    {
        match self.observe.refusal(&refused) {
            Some(response) => Ok(response),
            None => Err(Box::new(refused)),
        }
    }

    /// `response`, carrying the requests the call sent where its type
    /// can (an `http::Response`'s extensions).
    pub(super) fn mark<Resp>(&self, mut response: Resp, attempts: u32) -> Resp
    where
        O: Observe<Resp>,
    {
        self.observe.attempts(&mut response, attempts);
        response
    }
}

impl<S, Req, O> attempt::Exchange for Exchange<S, Req, O>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Req: Clone,
    O: Observe<S::Response>,
{
    type Output = S::Response;
    type Error = BoxError;

    fn can_send(&self) -> bool {
        true
    }

    fn send(&mut self) -> impl Future<Output = Result<S::Response, BoxError>> {
        let req = self.req.clone();
        let service = &mut self.service;
        async move {
            core::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            service.call(req).await.map_err(Into::into)
        }
    }

    fn read(&self, result: &Result<S::Response, BoxError>) -> Read {
        match self.observe.observe(result) {
            Some((status, hint)) => Read::Answer {
                status,
                hint,
                usage: self
                    .observe
                    .usage(result)
                    .into_iter()
                    .map(|(name, units)| (Cow::Owned(name), units))
                    .collect(),
            },
            // An error that is no refusal of a layer further in: no answer.
            None => match result {
                Err(e) if !e.is::<Throttled>() => Read::NoAnswer,
                // A refusal further in, or an answer the observer says
                // holds nothing to learn: the call's answer as it is.
                _ => Read::Refusal,
            },
        }
    }
}
