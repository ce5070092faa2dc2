//! Identical reads in flight at once go out once, on every seam: the
//! first caller leads (its answer stays exactly its own: a streamed body,
//! its ticket), the callers that join it get a copy of that answer when
//! one can be made, and run their own call when it cannot.

use core::convert::Infallible;
use core::future::Future;
use core::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::Clock;
use crate::single_flight::{Provenance, SingleFlight};

/// What a read's leader leaves behind: its own answer (taken by the
/// leader alone) and, when its answer can be copied, the copy the callers
/// that joined it each make theirs from.
#[derive(Debug)]
pub(crate) struct Flight<T, U> {
    own: Mutex<Option<T>>,
    copy: Option<U>,
}

/// The reads in flight of one seam, by key (method + URL + credential,
/// or tool + arguments).
pub(crate) type Reads<K, T, U, C> = SingleFlight<K, Arc<Flight<T, U>>, Infallible, C>;

/// How a coalesced call ended for this caller.
#[derive(Debug)]
pub(crate) enum Joined<T, U> {
    /// This caller's own answer: it led, or it ran its own call because
    /// the answer it joined could not be copied.
    Own(T),
    /// A copy of the answer of the call this caller joined.
    Copy(U),
}

/// Runs `run` for `key` unless an identical read is in flight (then joins
/// it). `run` gives the answer and, if it can be shared, a copy of it.
pub(crate) async fn coalesce<K, T, U, C, F, Fut>(
    reads: &Reads<K, T, U, C>,
    key: K,
    run: F,
) -> Joined<T, U>
where
    K: Hash + Eq + Clone,
    U: Clone,
    C: Clock,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (T, Option<U>)>,
{
    // `run` is called at most once: by the leader, or by a caller whose
    // leader's answer could not be copied.
    let mut run = Some(run);
    let led = reads
        .try_run(key, || {
            let run = run
                .take()
                .expect("a flight runs its caller's work at most once");
            async move {
                let (own, copy) = run().await;
                Ok::<_, Infallible>(Arc::new(Flight {
                    own: Mutex::new(Some(own)),
                    copy,
                }))
            }
        })
        .await;
    let flight = match led {
        Ok((flight, Provenance::Leader)) => {
            if let Some(own) = flight.own.lock().take() {
                return Joined::Own(own);
            }
            flight
        }
        Ok((flight, _)) => flight,
        // The leader panicked: this caller runs its own call.
        Err(_) => {
            let run = run.take().expect("a follower's work was not run");
            return Joined::Own(run().await.0);
        }
    };
    match (&flight.copy, run.take()) {
        (Some(copy), _) => Joined::Copy(copy.clone()),
        (None, Some(run)) => Joined::Own(run().await.0),
        // Unreachable: a caller whose work ran led, and took its own.
        (None, None) => unreachable!("a leader's answer was taken twice"),
    }
}
