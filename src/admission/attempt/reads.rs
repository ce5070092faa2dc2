//! Identical reads in flight at once go out once, on every seam: the
//! first caller leads and keeps its own answer; joiners get a copy when
//! one can be made, else run their own call. A joiner waits only until
//! its own deadline.

use core::future::Future;
use core::task::Poll;
use core::time::Duration;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::admission::attempt::Ended;
use crate::admission::identity::ReadKey;
use crate::admission::{Admission, CallResult};
use crate::clock::Clock;
use crate::failure::CallFailure;
use crate::retry::Deadline;
use crate::single_flight::{FlightError, Provenance, SingleFlight};
use crate::sleep::Sleeper;
use crate::throttled::Human;
use crate::{Status, Throttled};

/// What a read's leader leaves behind: its own answer (for the leader
/// alone) and, if copyable, the copy joiners take theirs from.
#[derive(Debug)]
pub(crate) struct Flight<T, U> {
    own: Mutex<Option<T>>,
    copy: Option<U>,
}

/// The reads in flight of one seam, by [`ReadKey`]. An uncopyable answer
/// ends as the map's error: never cached.
pub(crate) type Reads<T, U, C> = SingleFlight<ReadKey, Arc<Flight<T, U>>, Flight<T, U>, C>;

/// What of a leader's answer the callers that join it may have.
#[derive(Debug)]
pub(crate) enum Share<U> {
    /// Nothing (a refusal, a timeout, a body too large): joiners run their own.
    Not,
    /// A copy for the callers in flight now (a fault): never cached.
    InFlight(U),
    /// A copy for callers in flight and, where cached, later ones (a success).
    Cached(U),
}

/// What joiners may have of how a call ended ([`Ended::sharing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sharing {
    Own,
    InFlight,
    Cached,
}

impl Sharing {
    /// The copy `copy` makes, as far as this sharing allows; `copy` runs only
    /// when something may be shared.
    pub(crate) fn with<U>(self, copy: impl FnOnce() -> Option<U>) -> Share<U> {
        match self {
            Sharing::Own => Share::Not,
            Sharing::InFlight => copy().map_or(Share::Not, Share::InFlight),
            Sharing::Cached => copy().map_or(Share::Not, Share::Cached),
        }
    }
}

#[cfg(feature = "tower")]
impl<U> Share<U> {
    /// The same sharing of another copy.
    pub(crate) fn map<V>(self, f: impl FnOnce(U) -> V) -> Share<V> {
        match self {
            Share::Not => Share::Not,
            Share::InFlight(u) => Share::InFlight(f(u)),
            Share::Cached(u) => Share::Cached(f(u)),
        }
    }
}

impl<T, E, S: Sleeper, C: Clock> Ended<T, E, S, C> {
    /// What joiners may have of this call's end: a server answer is shared
    /// (and cached); a fault that outlasted its retries only with calls in
    /// flight; a refusal, timeout, or refused retry is the leader's own.
    pub(crate) fn sharing(&self) -> Sharing {
        match self {
            Ended::Answered { result: Ok(_), .. } => Sharing::Cached,
            Ended::Answered { result: Err(_), .. }
            | Ended::Failed {
                not_retried: None, ..
            } => Sharing::InFlight,
            Ended::Throttled(_) | Ended::Failed { .. } => Sharing::Own,
        }
    }

    /// The call's [`CallResult`]: the one mapping of the loop's end (`Runner`
    /// and `McpGate` use it). `value` reads an answer as the call's value or
    /// its failure; `failed` is true when the loop gave up on the answer (a
    /// fault that outlasted its retries).
    pub(crate) fn into_call_result<V, F>(
        self,
        value: impl FnOnce(Result<T, E>, bool) -> Result<V, CallFailure<F>>,
    ) -> CallResult<V, F> {
        let (result, not_retried, attempts, failed) = match self {
            Ended::Throttled(t) => return CallResult::Throttled(t),
            Ended::Answered {
                result, attempts, ..
            } => (result, None, attempts, false),
            Ended::Failed {
                result,
                not_retried,
                attempts,
            } => (result, not_retried, attempts, true),
        };
        match value(result, failed) {
            Ok(value) => CallResult::Done {
                value,
                provenance: Provenance::Leader,
                attempts,
            },
            Err(error) => CallResult::Failed {
                error,
                not_retried,
                attempts,
            },
        }
    }
}

impl<V, E> Joined<CallResult<V, E>, CallResult<V, E>> {
    /// The caller's result: its own, or a copy of the call it joined or
    /// found cached (0 attempts of its own).
    pub(crate) fn into_result(self) -> CallResult<V, E> {
        match self {
            Joined::Own(own) => own,
            Joined::Copy(copy, provenance) => copy.into_copy(provenance),
            Joined::TimedOut(refused) => CallResult::Throttled(refused),
        }
    }
}

/// How a coalesced call ended for this caller.
#[derive(Debug)]
pub(crate) enum Joined<T, U> {
    /// This caller's own answer: it led, or the joined answer was uncopyable.
    Own(T),
    /// A copy of the joined (or cached) answer.
    Copy(U, Provenance),
    /// This caller's deadline passed while waiting: it sent nothing.
    TimedOut(Throttled),
}

impl<S: Sleeper, C: Clock + Clone> Admission<S, C> {
    /// Runs `run` for `key` unless an identical read is in flight (then joins
    /// it, for at most `budget`). `run` gets what is left of `budget`.
    pub(crate) async fn coalesce<T, U, RC, F, Fut>(
        &self,
        reads: &Reads<T, U, RC>,
        key: ReadKey,
        budget: Duration,
        run: F,
    ) -> Joined<T, U>
    where
        U: Clone,
        RC: Clock,
        F: FnOnce(Duration) -> Fut,
        Fut: Future<Output = (T, Share<U>)>,
    {
        let deadline = Deadline::after(self.clock().clone(), budget);
        // `run` is called at most once. (Locks, not cells: futures are `Send`.)
        let run = Mutex::new(Some(run));
        let ran = Mutex::new(false);
        let led = {
            let flight = reads.try_run(key, || {
                let run = run
                    .lock()
                    .take()
                    .expect("a flight runs its caller's work once");
                *ran.lock() = true;
                let left = deadline.remaining();
                async move {
                    let (own, share) = run(left).await;
                    let own = Mutex::new(Some(own));
                    match share {
                        Share::Cached(copy) => Ok(Arc::new(Flight {
                            own,
                            copy: Some(copy),
                        })),
                        Share::InFlight(copy) => Err(Flight {
                            own,
                            copy: Some(copy),
                        }),
                        Share::Not => Err(Flight { own, copy: None }),
                    }
                }
            });
            let mut flight = core::pin::pin!(flight);
            let mut timeout = core::pin::pin!(self.sleeper().sleep(budget));
            core::future::poll_fn(|cx| match flight.as_mut().poll(cx) {
                Poll::Ready(led) => Poll::Ready(Some(led)),
                // A caller running its own call is bounded by the attempt loop; one
                // waiting for another's, here.
                Poll::Pending if *ran.lock() => Poll::Pending,
                Poll::Pending => timeout.as_mut().poll(cx).map(|()| None),
            })
            .await
        };
        let Some(led) = led else {
            return Joined::TimedOut(joined_timed_out(budget));
        };
        let flight = match led {
            Ok((flight, provenance)) => {
                if provenance == Provenance::Leader
                    && let Some(own) = flight.own.lock().take()
                {
                    return Joined::Own(own);
                }
                match &flight.copy {
                    Some(copy) => return Joined::Copy(copy.clone(), provenance),
                    None => None,
                }
            }
            Err(FlightError::Failed(flight)) => match (&flight.copy, *ran.lock()) {
                (Some(copy), false) => return Joined::Copy(copy.clone(), Provenance::Joined),
                _ => Some(flight),
            },
            // The leader panicked: this caller runs its own call.
            Err(_) => None,
        };
        // This caller led and its answer is not for sharing (only the caller
        // that ran the work takes it).
        if let Some(own) = flight
            .filter(|_| *ran.lock())
            .and_then(|f| f.own.lock().take())
        {
            return Joined::Own(own);
        }
        let run = run.lock().take();
        let run = run.expect("a caller that did not lead has its work");
        Joined::Own(run(deadline.remaining()).await.0)
    }
}

/// A caller whose deadline passed while the identical read it joined ran.
#[cold]
pub(crate) fn joined_timed_out(budget: Duration) -> Throttled {
    Throttled::new(
        Status::TimedOut,
        "deadline",
        format!(
            "the identical request this call joined was still running at the call's deadline \
             ({} in all); nothing was sent for it; retry with a longer deadline or later",
            Human(budget)
        ),
    )
    .with_attempts(0)
}
