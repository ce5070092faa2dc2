//! A tower request as the attempt loop sends it: each attempt polls the
//! inner service ready and calls it with a clone of the request.

use core::any::Any;
use core::future::Future;
use std::borrow::Cow;
use std::sync::Arc;

use parking_lot::Mutex;

use ::tower::Service;

use super::super::BoxError;
use super::{Observe, Release};
use crate::admission::attempt::reads::Share;
use crate::admission::attempt::{self, Ended, Read};
use crate::admission::{Admission, CallSpec};
use crate::clock::Clock;
use crate::retry::RetryPolicy;
use crate::sleep::Sleeper;
use crate::Throttled;

/// A coalesced read's own answer, type-erased.
pub(super) type Erased = Box<dyn Any + Send>;
/// The copy of a read's answer that joined calls make theirs from, erased.
pub(super) type ErasedCopy = Arc<dyn Any + Send + Sync>;

/// A layer's reads in flight (their clock is never read: no cache).
pub(super) type Reads = attempt::reads::Reads<Erased, ErasedCopy, crate::clock::DefaultClock>;

/// What joined calls get of a read's answer (a refusal or timeout is the
/// leader's own: they send their own requests).
pub(super) enum Copy<Resp> {
    /// The server's answer (copied by the observer).
    Answer(Resp),
    /// No answer: the error's message.
    Failed(String),
}

/// The error of a call whose last attempt got no answer and was not
/// retried again. The inner error is its `source`; `CallResult::from_tower`
/// reads the attempts and why the retry was refused.
#[derive(Debug)]
pub(crate) struct Unanswered {
    attempts: u32,
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    not_retried: Option<Throttled>,
    source: BoxError,
}

impl Unanswered {
    /// The requests the call sent.
    #[cfg(feature = "http")]
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why the last fault was not retried, when something refused the retry;
    /// `None` when the retries ran out.
    #[cfg(feature = "http")]
    pub(crate) fn not_retried(&self) -> Option<&Throttled> {
        self.not_retried.as_ref()
    }
}

impl core::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "no answer after {} requests: {}",
            self.attempts, self.source
        )
    }
}

impl std::error::Error for Unanswered {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

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

    /// The call's last answer, carrying how it ended where its type can; a
    /// last error wrapped in an [`Unanswered`].
    pub(super) fn ended<Resp>(
        &self,
        result: Result<Resp, BoxError>,
        attempts: u32,
        not_retried: Option<Throttled>,
        fault: bool,
    ) -> Result<Resp, BoxError>
    where
        O: Observe<Resp>,
    {
        match result {
            Ok(mut response) => {
                self.observe
                    .record(&mut response, attempts, not_retried.as_ref());
                Ok(response)
            }
            Err(e) if fault => Err(Box::new(Unanswered {
                attempts,
                not_retried,
                source: e,
            })),
            Err(e) => Err(e),
        }
    }
}

/// A refusal of the layer's own, as `observe` wants it answered: a
/// response (see `RefusalResponses`), or the error carrying it.
pub(super) fn refusal<Resp, O: Observe<Resp>>(
    observe: &O,
    refused: Throttled,
) -> Result<Resp, BoxError> {
    match observe.refusal(&refused) {
        Some(mut response) => {
            // The refusal travels with its response, for `call_result`.
            let attempts = refused.attempts;
            observe.record(&mut response, attempts, Some(&refused));
            Ok(response)
        }
        None => Err(Box::new(refused)),
    }
}

impl<S, Req, O> Exchange<S, Req, O>
where
    S: tower::Service<Req>,
    S::Error: Into<BoxError>,
    Req: Clone,
    O: Observe<S::Response>,
{
    /// The call through the attempt loop: its answer (ticket released or
    /// carried in its body), and a copy for joined calls if the observer makes one.
    pub(super) async fn answer<Sl, C, R>(
        mut self,
        admission: &Admission<Sl, C>,
        spec: &CallSpec,
        policy: &RetryPolicy,
        release: &R,
    ) -> (Result<R::Response, BoxError>, Share<Copy<S::Response>>)
    where
        Sl: Sleeper,
        C: Clock + Clone,
        R: Release<S::Response, Sl, C>,
    {
        let ended = admission
            .drive(spec, spec.deadline, policy, &mut self)
            .await;
        let sharing = ended.sharing();
        // An answer keeps its ticket; a fault not retried keeps why.
        let (result, ticket, attempts, not_retried, fault) = match ended {
            Ended::Answered {
                result,
                ticket,
                attempts,
            } => (result, ticket, attempts, None, false),
            Ended::Throttled(refused) => {
                let own = refusal(&self.observe, refused).map(|r| release.release(r, None));
                return (own, Share::Not);
            }
            Ended::Failed {
                result,
                not_retried,
                attempts,
            } => (result, None, attempts, not_retried, true),
        };
        let copy = sharing.with(|| self.copy_of(&result));
        let own = self
            .ended(result, attempts, not_retried, fault)
            .map(|r| release.release(r, ticket));
        (own, copy)
    }

    fn copy_of(&self, result: &Result<S::Response, BoxError>) -> Option<Copy<S::Response>> {
        match result {
            Ok(response) => Some(Copy::Answer(self.observe.copy(response)?)),
            Err(e) => Some(Copy::Failed(e.to_string())),
        }
    }
}

/// The answer of a call that joined an identical read: the copy its
/// leader left (`attempts: 0`).
pub(super) fn joined<Resp, O, R, Sl, C>(
    copy: &(dyn Any + Send + Sync),
    observe: &O,
    release: &R,
) -> Result<R::Response, BoxError>
where
    Resp: 'static,
    O: Observe<Resp>,
    R: Release<Resp, Sl, C>,
    Sl: Sleeper,
    C: Clock,
{
    let copy = copy
        .downcast_ref::<Mutex<Copy<Resp>>>()
        .expect("a read's copy has the layer's response type");
    match &*copy.lock() {
        Copy::Answer(response) => {
            let mut response = observe
                .copy(response)
                .expect("an observer that copied a response copies it again");
            observe.record(&mut response, 0, None);
            Ok(release.release(response, None))
        }
        Copy::Failed(message) => Err(Box::new(Unanswered {
            attempts: 0,
            not_retried: None,
            source: format!("the identical request this one joined failed: {message}").into(),
        })),
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
                // A refusal further in, or nothing to learn: the answer as it is.
                _ => Read::Refusal,
            },
        }
    }
}
