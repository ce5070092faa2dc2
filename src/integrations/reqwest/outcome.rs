//! How a request through the middleware ended (attempts, why a fault was
//! not retried, whether it joined a read), carried in its extensions; and
//! the copy of a coalesced read's answer for the callers that joined it.

use std::sync::Arc;

use ::reqwest::Response;
use ::reqwest_middleware::{Error, RequestBuilder, Result};
use bytes::Bytes;

use crate::admission::attempt::reads::{Share, Sharing};
use crate::admission::{CallFailure, CallResult};
use crate::retry::Attempts;
use crate::single_flight::Provenance;
use crate::Throttled;

use super::usage::Head;

/// Written into the request's extensions by the middleware when the
/// request ends; read by `call_result`.
#[derive(Clone, Debug)]
pub(super) struct Outcome {
    pub(super) attempts: u32,
    /// Why the last fault was not retried, when something refused it.
    pub(super) not_retried: Option<Throttled>,
    /// The refusal the request ended as (an error, or a synthetic 429).
    pub(super) refused: Option<Throttled>,
    pub(super) provenance: Provenance,
    /// What the callers that joined this request may have of it.
    pub(super) sharing: Sharing,
}

impl Outcome {
    pub(super) fn new(attempts: u32) -> Self {
        Outcome {
            attempts,
            not_retried: None,
            refused: None,
            provenance: Provenance::Leader,
            sharing: Sharing::Own,
        }
    }

    /// The outcome of a call that ended refused.
    pub(super) fn refused(refused: Throttled) -> Self {
        Outcome {
            attempts: refused.attempts,
            refused: Some(refused),
            ..Outcome::new(0)
        }
    }

    /// The outcome of a caller that joined this one's read.
    fn joined(&self) -> Self {
        Outcome {
            attempts: 0,
            provenance: Provenance::Joined,
            ..self.clone()
        }
    }
}

/// A coalesced read's answer, as the callers that joined it get it.
#[derive(Clone, Debug)]
pub(super) struct Copy {
    outcome: Outcome,
    answer: Answer,
}

#[derive(Clone, Debug)]
enum Answer {
    /// A response, its body read whole (the head boxed).
    Response(Box<Head>, Bytes),
    /// No answer: the transport error's message.
    Failed(String),
}

/// The most a read's body may declare (`Content-Length`) to be copied.
pub(super) const COPY_LIMIT: u64 = 1 << 20;

/// The leader's answer, and a copy for the callers that joined its read,
/// as far as `sharing` allows and only when safe: a response whose body
/// declares at most [`COPY_LIMIT`] and is no stream, read here within
/// `timer` (the leader's deadline; a body still arriving then is the
/// leader's `timed_out`). Otherwise each joiner sends its own request.
pub(super) async fn share<F: core::future::Future<Output = ()>>(
    result: Result<Response>,
    outcome: Option<Outcome>,
    budget: core::time::Duration,
    timer: impl FnOnce() -> F,
) -> (Result<Response>, Share<Copy>) {
    let outcome = outcome.unwrap_or_else(|| Outcome::new(1));
    let sharing = outcome.sharing;
    match result {
        Ok(response)
            if sharing == Sharing::Own
                || super::usage::is_stream(&response)
                || response.content_length().is_none_or(|n| n > COPY_LIMIT) =>
        {
            (Ok(response), Share::Not)
        }
        Ok(mut response) => {
            let head = Head::take(&mut response);
            let body = crate::sleep::within(response.bytes(), timer).await;
            match body {
                Some(Ok(body)) => {
                    let own = head.clone().response(body.clone());
                    let answer = Answer::Response(Box::new(head), body);
                    (Ok(own), sharing.with(|| Some(Copy { outcome, answer })))
                }
                Some(Err(e)) => (Err(Error::Reqwest(e)), Share::Not),
                None => {
                    let late = crate::throttled::request_timed_out(budget, outcome.attempts, false);
                    (Err(Error::middleware(late)), Share::Not)
                }
            }
        }
        Err(e) => {
            let copy = sharing.with(|| {
                let answer = Answer::Failed(e.to_string());
                Some(Copy { outcome, answer })
            });
            (Err(e), copy)
        }
    }
}

impl Copy {
    /// This copy as the answer of a caller that joined the read, and the
    /// outcome to write into its extensions.
    pub(super) fn answer(self) -> (Result<Response>, Outcome) {
        let outcome = self.outcome.joined();
        let result = match self.answer {
            Answer::Response(mut head, body) => {
                head.extensions.insert(Attempts(0));
                Ok(head.response(body))
            }
            Answer::Failed(message) => Err(Error::middleware(Joined(message))),
        };
        (result, outcome)
    }
}

/// The failure of the request an identical read joined.
#[derive(Debug)]
struct Joined(String);

impl core::fmt::Display for Joined {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "the identical request this one joined failed: {}",
            self.0
        )
    }
}

impl std::error::Error for Joined {}

/// See [`AdmissionMiddleware::call_result`](super::AdmissionMiddleware::call_result).
pub(super) async fn call_result(mut request: RequestBuilder) -> CallResult<Response, Error> {
    let mut extensions = core::mem::take(request.extensions());
    let (client, built) = request.build_split();
    let built = match built {
        Ok(built) => built,
        Err(e) => {
            return CallResult::Failed {
                error: CallFailure::Transport(Arc::new(Error::Reqwest(e))),
                not_retried: None,
                attempts: 0,
            }
        }
    };
    let result = client.execute_with_extensions(built, &mut extensions).await;
    let outcome = extensions.get::<Outcome>().cloned();
    to_call_result(result, outcome)
}

fn to_call_result(
    result: Result<Response>,
    outcome: Option<Outcome>,
) -> CallResult<Response, Error> {
    // Without the middleware: one request, as it came back.
    let outcome = outcome.unwrap_or_else(|| Outcome::new(1));
    if let Some(refused) = outcome.refused {
        return CallResult::Throttled(refused);
    }
    match result {
        Ok(response) if response.status().is_success() => CallResult::Done {
            value: response,
            provenance: outcome.provenance,
            attempts: outcome.attempts,
        },
        Ok(response) => CallResult::Failed {
            error: CallFailure::Status {
                status: response.status().as_u16(),
            },
            not_retried: outcome.not_retried,
            attempts: outcome.attempts,
        },
        Err(Error::Middleware(e)) if e.downcast_ref::<Throttled>().is_some() => {
            let t = e
                .downcast_ref::<Throttled>()
                .cloned()
                .expect("checked above");
            CallResult::Throttled(t)
        }
        Err(e) => CallResult::Failed {
            error: CallFailure::Transport(Arc::new(e)),
            not_retried: outcome.not_retried,
            attempts: outcome.attempts,
        },
    }
}
