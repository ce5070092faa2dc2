//! The one attempt loop behind every seam: admit → send → observe →
//! settle → decide → readmit, sleep or surface.
//!
//! `Runner`, the reqwest middleware and the tower `AdmissionLayer` are
//! adapters: each implements [`Exchange`] (how to send one attempt of its
//! request and what its answer says) and maps the [`Ended`] it gets back
//! to its own types. Every rule of the contract lives here, once:
//!
//! * one deadline, on the admission's clock, bounds every wait, every
//!   retry and the request itself (an attempt still running at it is
//!   dropped: `timed_out`);
//! * the [`RetryPolicy`] alone classifies the answer and decides; a
//!   capacity answer's wait is the credential's hold, which the next
//!   admit waits behind ([`Decision::Readmit`]), a fault's backoff is
//!   slept on the admission's sleeper and cut short by `close()`;
//! * a refused retry after a fault keeps the fault (`Failed`, with why it
//!   was not retried), never `rate_limited`; after a capacity answer the
//!   refusal is the rate limit itself;
//! * every answer is observed and its usage settled, whatever its status;
//!   a non-2xx pushes a shared credential's holds before the next admit.

use core::future::Future;
use core::time::Duration;
use std::borrow::Cow;

use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::retry::{Backoff, Deadline, Decision, Jitter, RetryPolicy};
use crate::sleep::Sleeper;
use crate::throttled::Human;

use super::{Admission, CallSpec, Status, Throttled, Ticket};

pub(crate) mod reads;

/// What an attempt's result says, as its seam reads it.
#[derive(Debug)]
pub(crate) enum Read {
    /// The server answered: its status, its limit headers, and what it
    /// says the call used of each weighted quota.
    Answer {
        status: u16,
        hint: ServerHint,
        usage: Vec<(Cow<'static, str>, u32)>,
    },
    /// No answer: a transport error (refused, reset, TLS, ...).
    NoAnswer,
    /// A refusal of an admission layer further in: the call's answer as
    /// it is, nothing to learn from it, never retried. (Only the HTTP
    /// seams can see one.)
    #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
    Refusal,
}

/// One seam's request: how to send an attempt of it, and how to read the
/// attempt's result.
pub(crate) trait Exchange {
    /// What an attempt gives back when the server answered.
    type Output;
    /// What an attempt gives back when it did not.
    type Error;

    /// Whether another attempt can be sent (a request whose body is a
    /// stream is sent once).
    fn can_send(&self) -> bool;

    /// Starts one attempt; called right after its admission, and only
    /// while [`can_send`](Self::can_send).
    fn send(&mut self) -> impl Future<Output = Result<Self::Output, Self::Error>>;

    /// What the attempt's result says.
    fn read(&self, result: &Result<Self::Output, Self::Error>) -> Read;

    /// Whether the attempt's request may have reached the server's
    /// handler, so that sending a call that is not idempotent again could
    /// run it twice. By default: any answer but a 429 or 503 (a server
    /// says "not now" before it runs the request), and no answer at all
    /// (a reset or a timeout may come after the handler ran).
    fn may_have_run(&self, result: &Result<Self::Output, Self::Error>, read: &Read) -> bool {
        let _ = result;
        match read {
            Read::Answer { status, .. } => !matches!(status, 429 | 503),
            Read::NoAnswer => true,
            Read::Refusal => false,
        }
    }

    /// Why a call that cannot be sent again ([`can_send`](Self::can_send)
    /// is false) cannot.
    fn unsendable(&self) -> &'static str {
        "its body is a stream"
    }
}

/// How a call ended, for its seam to answer with.
#[derive(Debug)]
pub(crate) enum Ended<T, E, S: Sleeper, C: Clock> {
    /// The server's answer stands: a success (with its ticket, for a
    /// seam that holds it while the body streams), a final status (a
    /// 404: retrying cannot change it), or a refusal of a layer further
    /// in (no ticket for either).
    Answered {
        result: Result<T, E>,
        #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
        ticket: Option<Ticket<S, C>>,
        attempts: u32,
    },
    /// Not now: refused by admission, the server's capacity past what
    /// the call could wait, or no answer by the deadline. `attempts` is
    /// set in it.
    Throttled(Throttled),
    /// A fault (a 5xx, a transport error) that outlasted its retries, or
    /// whose retry was refused (`not_retried` says why): the last answer,
    /// as it was.
    Failed {
        result: Result<T, E>,
        not_retried: Option<Throttled>,
        attempts: u32,
    },
}

/// An attempt's result, and whether it was the server's capacity.
type Last<X> = (
    Result<<X as Exchange>::Output, <X as Exchange>::Error>,
    bool,
);

/// The policy every seam starts from unless told otherwise: 3 retries,
/// full jitter from 100 ms to 5 s, server waits slept up to
/// [`DEFAULT_CLAMP`] (the same 2 s as the admission's default inline
/// wait, so a call and the calls held behind its 429 wait alike).
pub(crate) fn default_policy() -> RetryPolicy {
    let backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).jitter(Jitter::Full);
    RetryPolicy::new(backoff)
        .max_retries(3)
        .clamp(DEFAULT_CLAMP)
}

/// The clamp of [`default_policy`].
pub(crate) const DEFAULT_CLAMP: Duration = Duration::from_secs(2);

impl<S: Sleeper, C: Clock + Clone> Admission<S, C> {
    /// Runs one call to its end: admits each attempt as `spec` within
    /// `budget` (the call's deadline, from now, on this layer's clock:
    /// the spec's, or what a caller that waited has left), sends it
    /// through `exchange`, observes and settles its answer, and does what
    /// `policy` (forked for this call) decides.
    pub(crate) async fn drive<X: Exchange>(
        &self,
        spec: &CallSpec,
        budget: Duration,
        mut policy: RetryPolicy,
        exchange: &mut X,
    ) -> Ended<X::Output, X::Error, S, C> {
        let mut deadline = Deadline::after(self.clock().clone(), budget);
        let mut sent = 0u32;
        // The last answer, and whether it was the server's capacity: what
        // a refused retry ends as.
        let mut last: Option<Last<X>> = None;
        // The server's wait a `Readmit` charged to the deadline: the next
        // admit spends it waiting behind the hold, so it is still the
        // call's own to wait.
        let mut readmit = Duration::ZERO;
        loop {
            let left = deadline.remaining().saturating_add(readmit);
            if left.is_zero() {
                // No time to send anything: nothing is admitted (no slot,
                // no rate cell) and nothing sent.
                return refused_retry(no_time_left(budget, sent), last, sent);
            }
            let inline = core::mem::take(&mut readmit);
            let mut ticket = match self.admit_within(spec, left, inline).await {
                Ok(t) => t,
                Err(refused) => return refused_retry(refused.with_attempts(sent), last, sent),
            };
            sent += 1;
            let timer = self.sleeper().sleep(deadline.remaining());
            let attempt = crate::sleep::within(exchange.send(), timer).await;
            let Some(result) = attempt else {
                // No answer by the deadline: a failure for the circuit,
                // no verdict on the rate.
                ticket.observe_error();
                return Ended::Throttled(crate::throttled::request_timed_out(budget, sent));
            };
            let read = exchange.read(&result);
            // A call that is not idempotent is sent once its request may
            // have reached the server's handler: never again.
            let once = spec.write && !spec.idempotent && exchange.may_have_run(&result, &read);
            let resend = exchange.can_send() && !once;
            let why = if once {
                "it is a write the server may have run"
            } else {
                exchange.unsendable()
            };
            let (status, hint) = match read {
                Read::Refusal => {
                    return Ended::Answered {
                        result,
                        ticket: None,
                        attempts: sent,
                    }
                }
                Read::NoAnswer => {
                    ticket.observe_error();
                    (None, ServerHint::default())
                }
                Read::Answer {
                    status,
                    hint,
                    usage,
                } => {
                    // The layer learns from every answer (a 429 holds the
                    // credential for everyone), and charges what the
                    // server counted, whatever the status.
                    ticket.observe(status, &hint);
                    for (name, used) in &usage {
                        ticket.settle(name, *used);
                    }
                    // What a quota kept in a shared limiter is owed (a
                    // settle, a hold, a stated limit) is sent before the
                    // reply is handed back.
                    self.push_owed(&spec.credential).await;
                    if (200..300).contains(&status) {
                        return Ended::Answered {
                            result,
                            ticket: Some(ticket),
                            attempts: sent,
                        };
                    }
                    // This credential's hold only, for the other processes.
                    self.push_shared(&spec.credential).await;
                    (Some(status), hint)
                }
            };
            drop(ticket);
            match decide(&mut policy, &spec.tool, status, &hint, &mut deadline, sent) {
                // The server's capacity: its wait is the credential's
                // hold, which the next admit waits behind.
                Decision::Readmit { after } => {
                    if !resend {
                        let status = status.unwrap_or(429);
                        let refused = cannot_resend(status, &hint, after, sent, why);
                        return Ended::Throttled(self.told_within_cap(refused, &spec.credential));
                    }
                    readmit = after;
                    last = Some((result, true));
                }
                // A fault's backoff, slept here (cut short by `close`).
                Decision::Retry { after } => {
                    if !resend {
                        return Ended::Failed {
                            result,
                            not_retried: None,
                            attempts: sent,
                        };
                    }
                    if !self.sleep_unless_closed(after).await {
                        let closed = Throttled::new(
                            Status::Closed,
                            "admission",
                            "the admission layer closed before the retry",
                        )
                        .with_attempts(sent);
                        return refused_retry(closed, Some((result, false)), sent);
                    }
                    last = Some((result, false));
                }
                // The server's capacity, not retried: a rate limit, never
                // a plain 429 or a failure.
                Decision::Surface(t) => {
                    let refused = self.told_within_cap(t.with_attempts(sent), &spec.credential);
                    return Ended::Throttled(refused);
                }
                // A fault the policy would not retry now: the fault
                // stands, with the policy's reason.
                Decision::NotRetried(t) => {
                    return Ended::Failed {
                        result,
                        not_retried: Some(t),
                        attempts: sent,
                    }
                }
                Decision::GiveUp => {
                    return Ended::Failed {
                        result,
                        not_retried: None,
                        attempts: sent,
                    }
                }
                // A final answer (a 404): retrying cannot change it.
                _ => {
                    return Ended::Answered {
                        result,
                        ticket: None,
                        attempts: sent,
                    }
                }
            }
        }
    }
}

/// The one place an answer becomes a decision, for the loop above and for
/// the tower `HintRetry` (a policy for stacks without an admission
/// layer): the policy decides, and a retry is traced alike on both.
pub(crate) fn decide<C: Clock>(
    policy: &mut RetryPolicy,
    tool: &str,
    status: Option<u16>,
    hint: &ServerHint,
    deadline: &mut Deadline<C>,
    attempt: u32,
) -> Decision {
    let decision = policy.decide_reply(status, hint, deadline);
    #[cfg(feature = "tracing")]
    if let Decision::Readmit { after } | Decision::Retry { after } = &decision {
        tracing::event!(
            tracing::Level::DEBUG,
            tool = %tool,
            status = status.unwrap_or(0),
            attempt,
            wait_ms = after.as_millis() as u64,
            "backpressure: retrying"
        );
    }
    #[cfg(not(feature = "tracing"))]
    let _ = (tool, attempt);
    decision
}

/// A retry refused (by admission, or by `close` during its wait) ends the
/// call with what it means: after a capacity answer the refusal is the
/// rate limit itself; after a fault it is the fault, with the refusal as
/// the reason it was not retried.
fn refused_retry<T, E, S: Sleeper, C: Clock>(
    refused: Throttled,
    last: Option<(Result<T, E>, bool)>,
    sent: u32,
) -> Ended<T, E, S, C> {
    match last {
        Some((result, false)) => Ended::Failed {
            result,
            not_retried: Some(refused),
            attempts: sent,
        },
        _ => Ended::Throttled(refused),
    }
}

/// The deadline has passed before an attempt could be admitted.
#[cold]
fn no_time_left(budget: Duration, sent: u32) -> Throttled {
    Throttled::new(
        Status::TimedOut,
        "deadline",
        format!(
            "the call's deadline ({} in all) left no time to send the request; \
             retry with a longer deadline",
            Human(budget)
        ),
    )
    .with_attempts(sent)
}

/// A capacity answer whose request cannot be sent again (`why`: its body
/// is a stream, or it is a write the server may have run): the server's
/// wait, as a rate limit.
#[cold]
fn cannot_resend(
    status: u16,
    hint: &ServerHint,
    after: Duration,
    sent: u32,
    why: &str,
) -> Throttled {
    Throttled::new(
        Status::RateLimited,
        crate::retry::server_scope(hint),
        format!(
            "the server answered {status} and this request cannot be sent again ({why}); \
             retry after {}",
            Human(after)
        ),
    )
    .with_retry_after(after)
    .with_attempts(sent)
}
