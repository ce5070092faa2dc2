//! The `Run` future: one call of `run`/`try_run`, as leader or follower.
//!
//! ```text
//!            first poll
//!   Init ───────────────┬── cached ──────────────────────────► Done
//!                       ├── key in flight: link node ─► Following ─ DONE ─► Done
//!                       └── key free: insert flight ─► Leading ─ ready/panic ─► Done
//!                                                         ▲
//!                              Following ─ PROMOTED ──────┘
//! ```

use core::fmt;
use core::future::Future;
use core::hash::Hash;
use core::pin::Pin;
use core::ptr::NonNull;
use core::task::{Context, Poll};
use std::panic::{self, AssertUnwindSafe};

use super::flight::{Flight, Node, DONE, LINKED, PROMOTED};
use super::shard::{Expiry, Lookup};
use super::{FlightError, Provenance, SingleFlight};
use crate::clock::Clock;
use crate::sync::Arc;

/// Future returned by [`SingleFlight::run`] and [`SingleFlight::try_run`].
///
/// The key is claimed on the first poll, not at creation. A follower's
/// waiter node lives inside this future, so joining allocates nothing.
///
/// # Cancel safety
///
/// See [`SingleFlight::run`].
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct Run<'a, K, V, E, C: Clock, F, Fut: Future> {
    map: &'a SingleFlight<K, V, E, C>,
    /// `Ok` for `run`, the identity for `try_run`.
    convert: fn(Fut::Output) -> Result<V, E>,
    /// Until the first poll.
    key: Option<K>,
    /// Until this caller starts leading (kept by a follower for promotion).
    make: Option<F>,
    /// The work, while leading. Structurally pinned: only set in place (from
    /// `None`) or dropped in place.
    fut: Option<Fut>,
    /// The flight led or joined; `None` before the first poll and once done.
    flight: Option<Arc<Flight<V, E>>>,
    hash: u64,
    /// Structurally pinned; linked in `flight`'s wait list while
    /// `phase == Following` and its state is `LINKED`.
    node: Node,
    phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Init,
    Leading,
    Following,
    Done,
}

type Output<V, E> = Result<(V, Provenance), FlightError<E>>;

impl<'a, K, V, E, C: Clock, F, Fut: Future> Run<'a, K, V, E, C, F, Fut> {
    pub(super) fn new(
        map: &'a SingleFlight<K, V, E, C>,
        key: K,
        make: F,
        convert: fn(Fut::Output) -> Result<V, E>,
    ) -> Self {
        Self {
            map,
            convert,
            key: Some(key),
            make: Some(make),
            fut: None,
            flight: None,
            hash: 0,
            node: Node::new(LINKED),
            phase: Phase::Init,
        }
    }
}

impl<K, V, E, C, F, Fut> Run<'_, K, V, E, C, F, Fut>
where
    K: Hash + Eq,
    V: Clone,
    C: Clock,
    F: FnOnce() -> Fut,
    Fut: Future,
{
    /// First poll: serve from the cache, join, or lead; the output on a hit.
    fn start(&mut self) -> Option<Output<V, E>> {
        let map = self.map;
        let key = self.key.take().expect("`Run` starts once");
        // The key's `Hash` and the clock run before the lock.
        let hash = map.hasher.hash_one(&key);
        self.hash = hash;
        // A hit reads the coarse time if the clock has one.
        let expiry = match map.cache {
            None => Expiry::Off,
            Some(_) => match map.clock.coarse_bounds() {
                Some((_, latest)) => Expiry::Coarse(latest),
                None => Expiry::Precise(map.clock.now_nanos()),
            },
        };
        let mut guard = map.lock(hash);
        if let Some(value) = guard.live_value(hash, &key, expiry) {
            drop(guard);
            self.phase = Phase::Done;
            drop(key);
            return Some(Ok((value, Provenance::Cached)));
        }
        let (mut found, mut key) = guard.lookup(hash, key, expiry);
        if let Lookup::Recheck = found {
            drop(guard);
            let now = map.clock.now_nanos();
            guard = map.lock(hash);
            (found, key) = guard.lookup(
                hash,
                key.expect("`Recheck` gives the key back"),
                Expiry::Precise(now),
            );
        }
        match found {
            Lookup::Cached(value) => {
                drop(guard);
                self.phase = Phase::Done;
                drop(key);
                Some(Ok((value, Provenance::Cached)))
            }
            Lookup::InFlight(flight) => {
                // SAFETY: the node is pinned inside this future, new (so in
                // no list, state `LINKED`), and `Drop` unlinks it under this
                // shard's lock while it is `LINKED`.
                unsafe { flight.link(NonNull::from(&self.node), &mut *guard) };
                drop(guard);
                self.flight = Some(flight);
                self.phase = Phase::Following;
                // The first `follow` registers the waker and catches a
                // completion that happened in between.
                drop(key);
                None
            }
            Lookup::Recheck => unreachable!("a precise lookup always decides"),
            Lookup::Inserted(flight, replaced) => {
                drop(guard);
                self.flight = Some(flight);
                self.phase = Phase::Leading;
                drop(replaced);
                drop(key);
                None
            }
        }
    }

    /// A follower's poll. `Ready(None)`: promoted, lead now.
    fn follow(&mut self, cx: &mut Context<'_>) -> Poll<Option<Output<V, E>>> {
        let mut st = self.node.state();
        if st == LINKED {
            // Cloned before locking: a waker clone is user code.
            let waker = cx.waker().clone();
            let mut guard = self.map.lock(self.hash);
            // Terminal states are only stored under this lock.
            st = self.node.state();
            if st == LINKED {
                let spare = self.node.set_waker(waker, &mut *guard);
                drop(guard);
                drop(spare);
                return Poll::Pending;
            }
            drop(guard);
            drop(waker);
        }
        if st == PROMOTED {
            self.phase = Phase::Leading;
            return Poll::Ready(None);
        }
        debug_assert_eq!(st, DONE);
        self.phase = Phase::Done;
        let flight = self.flight.take().expect("a follower holds its flight");
        let out = match flight.read_outcome() {
            Some(Ok(v)) => Ok((v, Provenance::Joined)),
            Some(Err(e)) => Err(FlightError::Failed(e)),
            None => Err(FlightError::LeaderPanicked),
        };
        Poll::Ready(Some(out))
    }

    /// The leader's poll: drive the work, catching panics so followers are
    /// released before the panic resumes.
    fn lead(&mut self, cx: &mut Context<'_>) -> Poll<Output<V, E>> {
        let (fut, make) = (&mut self.fut, &mut self.make);
        let polled = panic::catch_unwind(AssertUnwindSafe(|| {
            if fut.is_none() {
                let make = make.take().expect("a leader without work has `make`");
                *fut = Some(make());
            }
            // SAFETY: `fut` is structurally pinned (see the field) and
            // `self` is pinned by `poll`'s caller.
            let work = unsafe { Pin::new_unchecked(fut.as_mut().expect("just set")) };
            let out = work.poll(cx);
            if out.is_ready() {
                // Drop the finished work in place, before sharing its value.
                *fut = None;
            }
            out
        }));
        let polled = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(out)) => Ok((self.convert)(out)),
            Err(payload) => Err(payload),
        };
        let (map, hash) = (self.map, self.hash);
        self.phase = Phase::Done;
        let flight = self.flight.take().expect("a leader holds its flight");
        // A panic in the work or in `complete` releases the followers first.
        let completed = polled.and_then(|result| {
            panic::catch_unwind(AssertUnwindSafe(|| map.complete(&flight, hash, result)))
        });
        match completed {
            Ok(out) => Poll::Ready(out.map(|v| (v, Provenance::Leader))),
            Err(payload) => {
                map.fail_panicked(&flight, hash);
                panic::resume_unwind(payload)
            }
        }
    }
}

impl<K, V, E, C, F, Fut> Future for Run<'_, K, V, E, C, F, Fut>
where
    K: Hash + Eq,
    V: Clone,
    C: Clock,
    F: FnOnce() -> Fut,
    Fut: Future,
{
    type Output = Output<V, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: nothing structurally pinned (`fut`, `node`) is moved out
        // of `this`; see the field docs.
        let this = unsafe { self.get_unchecked_mut() };
        loop {
            match this.phase {
                Phase::Init => {
                    if let Some(out) = this.start() {
                        return Poll::Ready(out);
                    }
                }
                Phase::Following => match this.follow(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(out)) => return Poll::Ready(out),
                    Poll::Ready(None) => {}
                },
                Phase::Leading => return this.lead(cx),
                Phase::Done => panic!("`Run` polled after completion"),
            }
        }
    }
}

impl<K, V, E, C: Clock, F, Fut: Future> Drop for Run<'_, K, V, E, C, F, Fut> {
    fn drop(&mut self) {
        let map = self.map;
        let hash = self.hash;
        match self.phase {
            Phase::Leading => {
                // Cancelled mid-work; the work is dropped after, unlocked.
                let flight = self.flight.take().expect("a leader holds its flight");
                map.resign(map.lock(hash), &flight, hash);
            }
            Phase::Following => {
                if self.node.state() == DONE {
                    return;
                }
                let flight = self.flight.as_ref().expect("a follower holds its flight");
                let mut guard = map.lock(hash);
                // Under the lock: terminal states are stored under it.
                match self.node.state() {
                    LINKED => {
                        // SAFETY: `LINKED` under the lock means the node is
                        // in `flight`'s list; it is live (we own it).
                        unsafe { flight.unlink(NonNull::from(&self.node), &mut *guard) };
                    }
                    PROMOTED => map.resign(guard, flight, hash),
                    _ => {}
                }
            }
            Phase::Init | Phase::Done => {}
        }
    }
}

impl<K, V, E, C: Clock, F, Fut: Future> fmt::Debug for Run<'_, K, V, E, C, F, Fut> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("phase", &self.phase)
            .field("flight", &self.flight)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}
