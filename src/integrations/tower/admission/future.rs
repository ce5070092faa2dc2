//! [`AdmissionFuture`]: admit, then call the ready service, holding the
//! ticket until the response is ready.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{ready, Context, Poll};

use ::tower::Service;

use super::super::BoxError;
use super::{Observe, Release};
use core::time::Duration;

use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::retry::ReplyClass;
use crate::sleep::Sleeper;
use crate::throttled::{Human, Status};
use crate::{admission::Ticket, Throttled};

/// The boxed `Admission::admit` of one request (an `async fn`, so its
/// future has no name).
pub(super) type Admit<Sl, C> =
    Pin<Box<dyn Future<Output = Result<Ticket<Sl, C>, Throttled>> + Send>>;

pin_project_lite::pin_project! {
    /// The response future of [`AdmissionService`](super::AdmissionService):
    /// admits the request, then calls the inner service (made ready before
    /// `call`) at once, and holds the [`Ticket`] until the response is
    /// ready; the response is then observed and the ticket dropped.
    ///
    /// # Cancel safety
    ///
    /// Dropped while admitting, it gives back whatever `admit` took (slots,
    /// reserved cells, budget); dropped while the inner call runs, it drops
    /// the ticket (its slots return) with the inner future, unobserved.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct AdmissionFuture<S, Req, O, Sl, C, R = super::AtHead>
    where
        S: Service<Req>,
        Sl: Sleeper,
        C: Clock,
    {
        #[pin]
        state: State<S, Req, Sl, C>,
        observe: O,
        // When the ticket is given back: with the head, or with the body.
        release: R,
        // When the call's deadline passes, on the layer's clock, and the
        // deadline itself (to word a timeout).
        deadline_at: u64,
        budget: Duration,
        // Capacity answers (429, 503 + Retry-After) are returned as they
        // are, not as a `Throttled`.
        raw: bool,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<S, Req, Sl, C>
    where
        S: Service<Req>,
        Sl: Sleeper,
        C: Clock,
    {
        // Waiting for the ticket; the ready service and the request wait
        // with it.
        Admitting {
            admit: Admit<Sl, C>,
            service: Option<S>,
            req: Option<Req>,
        },
        // The inner call runs under the ticket, until the deadline.
        Calling {
            #[pin]
            future: S::Future,
            #[pin]
            timeout: Sl::Sleep,
            ticket: Option<Ticket<Sl, C>>,
        },
        Done,
    }
}

impl<S, Req, O, Sl, C, R> AdmissionFuture<S, Req, O, Sl, C, R>
where
    S: Service<Req>,
    Sl: Sleeper,
    C: Clock,
{
    pub(super) fn new(
        admit: Admit<Sl, C>,
        service: S,
        req: Req,
        (observe, release): (O, R),
        deadline: (u64, Duration),
        raw: bool,
    ) -> Self {
        AdmissionFuture {
            state: State::Admitting {
                admit,
                service: Some(service),
                req: Some(req),
            },
            observe,
            release,
            deadline_at: deadline.0,
            budget: deadline.1,
            raw,
        }
    }
}

impl<S, Req, O, Sl, C, R> Future for AdmissionFuture<S, Req, O, Sl, C, R>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    O: Observe<S::Response>,
    Sl: Sleeper,
    C: Clock,
    R: Release<S::Response, Sl, C>,
{
    type Output = Result<R::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Admitting {
                    admit,
                    service,
                    req,
                } => {
                    let admitted = ready!(admit.as_mut().poll(cx));
                    let (ticket, mut service, req) = match (admitted, service.take(), req.take()) {
                        (Ok(ticket), Some(service), Some(req)) => (ticket, service, req),
                        (Err(refused), _, _) => {
                            this.state.set(State::Done);
                            let answered = answer(this.observe, refused);
                            return Poll::Ready(answered.map(|r| this.release.release(r, None)));
                        }
                        // Unreachable: both are taken only here, just
                        // before leaving this state.
                        _ => return Poll::Ready(Err(polled_after_completion())),
                    };
                    // Sent the instant it is admitted: the rate cell was
                    // reserved for now, and the service is already ready.
                    let future = service.call(req);
                    // The deadline bounds the request too, not only the
                    // wait for admission.
                    let admission = ticket.admission();
                    let left = this
                        .deadline_at
                        .saturating_sub(admission.clock().now_nanos());
                    let timeout = admission.sleeper().sleep(Duration::from_nanos(left));
                    this.state.set(State::Calling {
                        future,
                        timeout,
                        ticket: Some(ticket),
                    });
                }
                StateProj::Calling {
                    future,
                    timeout,
                    ticket,
                } => {
                    let result = match future.poll(cx) {
                        Poll::Ready(r) => r.map_err(Into::into),
                        Poll::Pending => {
                            ready!(timeout.poll(cx));
                            // Dropped at the deadline: no verdict on the
                            // rate, a failure for the circuit.
                            if let Some(ticket) = ticket.take() {
                                ticket.observe_error();
                            }
                            this.state.set(State::Done);
                            let t = crate::throttled::request_timed_out(*this.budget, 1);
                            let answered = answer(this.observe, t);
                            return Poll::Ready(answered.map(|r| this.release.release(r, None)));
                        }
                    };
                    let mut result = result;
                    let mut ticket = ticket.take();
                    if let Some(t) = ticket.as_mut() {
                        for (name, units) in this.observe.usage(&result) {
                            t.settle(&name, units);
                        }
                    }
                    // An error that is no refusal of a layer further in: no
                    // answer, a failure for the circuit.
                    if let (Some(ticket), Err(e)) = (&ticket, &result)
                        && !e.is::<Throttled>()
                    {
                        ticket.observe_error();
                    }
                    if let Some(held) = &ticket
                        && let Some((status, hint)) = this.observe.observe(&result)
                    {
                        let hold = held.observe(status, &hint);
                        let class = crate::retry::reply_class(Some(status), &hint);
                        if class == ReplyClass::Capacity && !*this.raw {
                            // A refusal, not the server's body: nothing
                            // left to hold the slot for.
                            drop(ticket.take());
                            result = answer(this.observe, capacity(status, &hint, hold));
                        }
                    }
                    this.state.set(State::Done);
                    // The ticket goes now, or with the body.
                    return Poll::Ready(result.map(|r| this.release.release(r, ticket)));
                }
                StateProj::Done => return Poll::Ready(Err(polled_after_completion())),
            }
        }
    }
}

/// A refusal of the layer's own, as the observe hook wants it answered: a
/// response (see `RefusalResponses`), or the error carrying it.
#[cold]
fn answer<O: Observe<Resp>, Resp>(observe: &O, refused: Throttled) -> Result<Resp, BoxError> {
    match observe.refusal(&refused) {
        Some(response) => Ok(response),
        None => Err(Box::new(refused)),
    }
}

/// The server's "not now", as the caller of the layer hears it: a
/// `rate_limited` with the wait the credential (or the scope) is now held
/// for, never a plain 429.
#[cold]
fn capacity(status: u16, hint: &ServerHint, hold: Option<Duration>) -> Throttled {
    let wait = hold
        .or_else(|| hint.wait())
        .unwrap_or(crate::retry::RetryPolicy::BARE_429_HOLD);
    Throttled::new(
        Status::RateLimited,
        crate::retry::server_scope(hint),
        format!("the server answered {status}; retry after {}", Human(wait)),
    )
    .with_retry_after(wait)
    .with_attempts(1)
}

#[cold]
fn polled_after_completion() -> BoxError {
    "AdmissionFuture polled after completion".into()
}

impl<S, Req, O, Sl, C, R> fmt::Debug for AdmissionFuture<S, Req, O, Sl, C, R>
where
    S: Service<Req>,
    Sl: Sleeper,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitting { .. } => "admitting",
            State::Calling { .. } => "calling",
            State::Done => "done",
        };
        f.debug_struct("AdmissionFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
