//! The one attempt loop behind every seam (`Runner`, reqwest, tower):
//! admit → send → observe → settle → decide → readmit, sleep or surface.
//! Seams implement [`Exchange`] and map [`Ended`] to their own types. One
//! deadline bounds everything; the [`RetryPolicy`] alone decides; a
//! refused retry after a fault keeps the fault, never `rate_limited`.

use core::future::Future;
use core::time::Duration;
use std::borrow::Cow;

use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::retry::{reply_class, Backoff, Deadline, Decision, Jitter, ReplyClass, RetryPolicy};
use crate::sleep::Sleeper;
use crate::throttled::Human;

use super::{Admission, CallSpec, Status, Throttled, Ticket};

pub(crate) mod reads;

/// What an attempt's result says, as its seam reads it.
#[derive(Debug)]
pub(crate) enum Read {
    /// The server answered: status, limit headers, reported usage.
    Answer {
        status: u16,
        hint: ServerHint,
        usage: Vec<(Cow<'static, str>, u32)>,
    },
    NoAnswer,
    /// A refusal of an admission layer further in: never retried, nothing
    /// learned (only the HTTP seams can see one).
    #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
    Refusal,
}

/// One seam's request: how to send an attempt and read its result.
pub(crate) trait Exchange {
    type Output;
    type Error;

    /// Whether another attempt can be sent (a streamed body is sent once).
    fn can_send(&self) -> bool;

    /// Starts one attempt; only called while [`can_send`](Self::can_send).
    fn send(&mut self) -> impl Future<Output = Result<Self::Output, Self::Error>>;

    fn read(&self, result: &Result<Self::Output, Self::Error>) -> Read;

    /// Whether the request may have reached the server's handler, so a
    /// non-idempotent resend could run it twice. By default: any answer but
    /// 429/503, and no answer at all (a reset may come after the handler ran).
    fn may_have_run(&self, result: &Result<Self::Output, Self::Error>, read: &Read) -> bool {
        let _ = result;
        match read {
            Read::Answer { status, .. } => !matches!(status, 429 | 503),
            Read::NoAnswer => true,
            Read::Refusal => false,
        }
    }

    /// Why [`can_send`](Self::can_send) is false.
    fn unsendable(&self) -> &'static str {
        "its body is a stream"
    }
}

/// How a call ended, for its seam to answer with.
#[derive(Debug)]
pub(crate) enum Ended<T, E, S: Sleeper, C: Clock> {
    /// The server's answer stands: a success (with its ticket, for a seam
    /// that streams the body), a final status, or an inner layer's refusal.
    Answered {
        result: Result<T, E>,
        #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
        ticket: Option<Ticket<S, C>>,
        attempts: u32,
    },
    /// Not now: refused by admission, capacity past what the call could
    /// wait, or no answer by the deadline.
    Throttled(Throttled),
    /// A fault that outlasted its retries, or whose retry was refused.
    Failed {
        result: Result<T, E>,
        not_retried: Option<Throttled>,
        attempts: u32,
    },
}

impl<T, E, S: Sleeper, C: Clock> Ended<T, E, S, C> {
    fn answered(result: Result<T, E>, ticket: Option<Ticket<S, C>>, attempts: u32) -> Self {
        Ended::Answered {
            result,
            ticket,
            attempts,
        }
    }

    fn failed(result: Result<T, E>, not_retried: Option<Throttled>, attempts: u32) -> Self {
        Ended::Failed {
            result,
            not_retried,
            attempts,
        }
    }
}

/// An attempt's result, and whether it was the server's capacity.
type Last<X> = (
    Result<<X as Exchange>::Output, <X as Exchange>::Error>,
    bool,
);

/// The policy every seam starts from: 3 retries, full jitter from 100 ms
/// to 5 s, server waits slept up to [`DEFAULT_CLAMP`].
pub(crate) fn default_policy() -> RetryPolicy {
    let backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).jitter(Jitter::Full);
    RetryPolicy::new(backoff)
        .max_retries(3)
        .clamp(DEFAULT_CLAMP)
}

/// The clamp of [`default_policy`] (the admission's default inline wait).
pub(crate) const DEFAULT_CLAMP: Duration = Duration::from_secs(2);

impl<S: Sleeper, C: Clock + Clone> Admission<S, C> {
    /// Runs one call to its end within `budget` (from now, on this layer's
    /// clock), doing what `template` decides. The call pays into the retry
    /// budget now; its own policy (counts, jitter) is forked only if an
    /// answer needs a decision, so a call answered at once forks none.
    pub(crate) async fn drive<X: Exchange>(
        &self,
        spec: &CallSpec,
        budget: Duration,
        template: &RetryPolicy,
        exchange: &mut X,
    ) -> Ended<X::Output, X::Error, S, C> {
        template.deposit();
        let mut policy: Option<RetryPolicy> = None;
        let start = self.clock().now_nanos();
        let mut deadline = Deadline::at(
            self.clock().clone(),
            start.saturating_add(crate::clock::saturating_nanos(budget)),
        );
        // The first admit starts when the call does: one clock read for both.
        let mut now = Some(start);
        let mut sent = 0u32;
        // The last answer, and whether it was capacity: what a refused retry ends as.
        let mut last: Option<Last<X>> = None;
        // A `Readmit` wait charged to the deadline: still the call's own to spend
        // waiting behind the hold.
        let mut readmit = Duration::ZERO;
        loop {
            let left = deadline.remaining().saturating_add(readmit);
            if left.is_zero() {
                return refused_retry(no_time_left(budget, sent), last, sent);
            }
            let inline = core::mem::take(&mut readmit);
            let mut ticket = match self.admit_within(spec, left, inline, now.take()).await {
                Ok(t) => t,
                Err(refused) => return refused_retry(refused.with_attempts(sent), last, sent),
            };
            sent += 1;
            let timer = || self.sleeper().sleep(deadline.remaining());
            let attempt = crate::sleep::within(exchange.send(), timer).await;
            let Some(result) = attempt else {
                // No answer by the deadline: a circuit failure, no verdict on the rate.
                ticket.observe_error();
                let write = spec.write && !spec.idempotent;
                return Ended::Throttled(crate::throttled::request_timed_out(budget, sent, write));
            };
            let read = exchange.read(&result);
            // A non-idempotent call is never resent once it may have run.
            let once = spec.write && !spec.idempotent && exchange.may_have_run(&result, &read);
            let resend = exchange.can_send() && !once;
            let why = if once {
                "it is a write the server may have run"
            } else {
                exchange.unsendable()
            };
            // Classed once: the breaker, the learned rate and the retry
            // decision all read this class.
            let (status, class, hint) = match read {
                Read::Refusal => return Ended::answered(result, None, sent),
                Read::NoAnswer => {
                    ticket.observe_error();
                    (None, ReplyClass::Transient, ServerHint::default())
                }
                Read::Answer {
                    status,
                    hint,
                    usage,
                } => {
                    let class = reply_class(Some(status), &hint);
                    // Observed and settled whatever the status.
                    ticket.observe_class(status, class, &hint);
                    for (name, used) in &usage {
                        ticket.settle(name, *used);
                    }
                    // What a shared limiter is owed is sent before the reply is handed back
                    // (boxed: the await is rare, and the loop's future stays small).
                    if self.owes(&spec.credential) {
                        Box::pin(self.push_owed(&spec.credential)).await;
                    }
                    if class == ReplyClass::Success {
                        return Ended::answered(result, Some(ticket), sent);
                    }
                    // This credential's hold, for the other processes.
                    if self.is_shared(&spec.credential) {
                        Box::pin(self.push_shared(&spec.credential)).await;
                    }
                    (Some(status), class, hint)
                }
            };
            drop(ticket);
            let policy = policy.get_or_insert_with(|| template.fork_unpaid());
            match decide(
                policy,
                &spec.tool,
                status,
                class,
                &hint,
                &mut deadline,
                sent,
            ) {
                // Capacity: the wait is the credential's hold; the next admit waits it.
                Decision::Readmit { after } if resend => {
                    readmit = after;
                    last = Some((result, true));
                }
                Decision::Readmit { after } => {
                    let refused = cannot_resend(status.unwrap_or(429), &hint, after, sent, why);
                    return Ended::Throttled(self.told_within_cap(refused, &spec.credential));
                }
                // A fault's backoff, slept here (cut short by `close`).
                Decision::Retry { after } if resend => {
                    // Boxed: a fault's path, and the loop's future stays small.
                    if !Box::pin(self.sleep_unless_closed(after)).await {
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
                // Capacity, not retried: a rate limit, never a failure.
                Decision::Surface(t) => {
                    let refused = self.told_within_cap(t.with_attempts(sent), &spec.credential);
                    return Ended::Throttled(refused);
                }
                // A fault not retried now: the fault stands, with the reason.
                Decision::NotRetried(t) => return Ended::failed(result, Some(t), sent),
                // Out of retries, or a retry that cannot be sent.
                Decision::Retry { .. } | Decision::GiveUp => {
                    return Ended::failed(result, None, sent)
                }
                _ => return Ended::answered(result, None, sent),
            }
        }
    }
}

/// The one place an answer becomes a decision, shared with tower's
/// `HintRetry` so retries are traced alike.
pub(crate) fn decide<C: Clock>(
    policy: &mut RetryPolicy,
    tool: &str,
    status: Option<u16>,
    class: ReplyClass,
    hint: &ServerHint,
    deadline: &mut Deadline<C>,
    attempt: u32,
) -> Decision {
    let decision = policy.decide_class(class, status, hint, deadline);
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

/// A refused retry: after a capacity answer, the refusal itself; after a
/// fault, the fault with the refusal as `not_retried`.
fn refused_retry<T, E, S: Sleeper, C: Clock>(
    refused: Throttled,
    last: Option<(Result<T, E>, bool)>,
    sent: u32,
) -> Ended<T, E, S, C> {
    match last {
        Some((result, false)) => Ended::failed(result, Some(refused), sent),
        _ => Ended::Throttled(refused),
    }
}

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

/// A capacity answer whose request cannot be sent again: a rate limit.
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
