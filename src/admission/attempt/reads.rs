//! Identical reads in flight at once go out once, on every seam: the
//! first caller leads (its answer stays exactly its own: a streamed body,
//! its ticket), the callers that join it get a copy of that answer when
//! one can be made, and run their own call when it cannot.
//!
//! A caller that joins is a caller of its own: it waits for the leader
//! only until its own deadline (then it is `timed_out`, having sent
//! nothing), and an answer the seam will not copy (a refusal or timeout
//! that belongs to the leader's deadline and budget, a body too large or
//! streamed) sends it off to make its own call, with what is left of its
//! deadline.

use core::future::Future;
use core::task::Poll;
use core::time::Duration;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::admission::attempt::Ended;
use crate::admission::identity::ReadKey;
use crate::admission::Admission;
use crate::clock::Clock;
use crate::retry::Deadline;
use crate::single_flight::{FlightError, Provenance, SingleFlight};
use crate::sleep::Sleeper;
use crate::throttled::Human;
use crate::{Status, Throttled};

/// What a read's leader leaves behind: its own answer (taken by the
/// leader alone) and, when its answer can be copied, the copy the callers
/// that joined it each make theirs from.
#[derive(Debug)]
pub(crate) struct Flight<T, U> {
    own: Mutex<Option<T>>,
    copy: Option<U>,
}

/// The reads in flight of one seam, by [`ReadKey`]. A flight whose answer
/// cannot be copied ends as the map's error: never cached, and each
/// caller that joined it runs its own call.
pub(crate) type Reads<T, U, C> = SingleFlight<ReadKey, Arc<Flight<T, U>>, Flight<T, U>, C>;

/// What of a leader's answer the callers that join it may have.
#[derive(Debug)]
pub(crate) enum Share<U> {
    /// Nothing: the answer is the leader's own (a refusal, a timeout, a
    /// body too large to copy); each caller that joined runs its own call.
    Not,
    /// This copy, for the callers in flight now (a fault): never cached.
    InFlight(U),
    /// This copy, for the callers in flight and, where the seam keeps a
    /// cache, later ones (a success).
    Cached(U),
}

/// What the callers that joined a call may have of how it ended
/// ([`Ended::sharing`]: the one rule, for every seam).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// Nothing: it is the leader's own.
    Own,
    /// A copy, for the callers in flight now.
    InFlight,
    /// A copy, for those in flight and, where the seam keeps a cache,
    /// later ones.
    Cached,
}

impl Sharing {
    /// The copy `copy` makes, as far as this sharing allows (none made:
    /// nothing shared); `copy` runs only when something may be.
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
    /// The same sharing of another copy (the tower layer's, type-erased).
    pub(crate) fn map<V>(self, f: impl FnOnce(U) -> V) -> Share<V> {
        match self {
            Share::Not => Share::Not,
            Share::InFlight(u) => Share::InFlight(f(u)),
            Share::Cached(u) => Share::Cached(f(u)),
        }
    }
}

impl<T, E, S: Sleeper, C: Clock> Ended<T, E, S, C> {
    /// What the callers that joined this call may have of its end: the
    /// server's answer is shared (and cached where the seam keeps a
    /// cache); a fault that outlasted its retries, or an error that is the
    /// answer, with the calls in flight only; a refusal, a timeout and a
    /// fault whose retry something refused (the leader's deadline, budget
    /// or breaker) are the leader's own.
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
}

/// How a coalesced call ended for this caller.
#[derive(Debug)]
pub(crate) enum Joined<T, U> {
    /// This caller's own answer: it led, or it ran its own call because
    /// the answer it joined could not be copied.
    Own(T),
    /// A copy of the answer of the call this caller joined (or of a
    /// cached one: `Provenance::Cached`).
    Copy(U, Provenance),
    /// This caller's deadline passed while it waited for the call it
    /// joined: it sent nothing.
    TimedOut(Throttled),
}

impl<S: Sleeper, C: Clock + Clone> Admission<S, C> {
    /// Runs `run` for `key` unless an identical read is in flight (then
    /// joins it, for at most `budget`). `run` is given what is left of
    /// `budget` and gives the answer and what of it may be shared.
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
        // `run` is called at most once: by the leader, or by a caller
        // whose leader's answer could not be copied.
        // (Locks, not cells: the seams' futures are `Send`.)
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
                // A caller running its own call is bounded by the loop's
                // deadline; one waiting for another's, here.
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
        // This caller led, and its answer is not for sharing (only the
        // caller that ran the work takes the answer: the others share the
        // same flight).
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
fn joined_timed_out(budget: Duration) -> Throttled {
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
