//! One flight: the state one execution of a key shares between its leader,
//! its followers and (while the key maps to it) the shard's table.
//!
//! # Flight state
//!
//! | value      | outcome cell     | meaning                                           |
//! |------------|------------------|---------------------------------------------------|
//! | `RUNNING`  | uninitialized    | a leader owns the work; followers wait             |
//! | `OK`       | `Ok(value)`      | the work returned a value; followers clone it      |
//! | `FAILED`   | `Err(Arc<E>)`    | the work returned an error; followers share it     |
//! | `PANICKED` | uninitialized    | the leader panicked; followers get `LeaderPanicked` |
//!
//! `RUNNING` changes once, with the shard lock held, by the current leader
//! ([`Flight::publish`]). The outcome cell is written by that leader
//! *before* the change, without the lock, and never again, so after
//! observing `OK`/`FAILED` with `Acquire` anyone may read it.
//!
//! # Node state
//!
//! Every follower owns a [`Node`] pinned inside its future:
//!
//! | value      | meaning                                                      |
//! |------------|--------------------------------------------------------------|
//! | `LINKED`   | in the flight's wait list; only the shard lock holder changes it |
//! | `DONE`     | unlinked because the flight finished: read the flight state   |
//! | `PROMOTED` | unlinked to lead: the previous leader went away, run your own work |
//!
//! `DONE` and `PROMOTED` are terminal: the lock holder stores them with
//! `Release` as its last access to the node (after taking the waker out), so
//! the owner can see them with an `Acquire` load and go on without the lock.

use core::fmt;
use core::mem::MaybeUninit;
use core::ptr::NonNull;
use core::task::Waker;
use std::sync::Arc as StdArc;

use crate::sync::{AtomicUsize, Ordering, UnsafeCell};
use crate::wait_list::{WaitList, WaitNode};

pub(super) const RUNNING: usize = 0;
pub(super) const OK: usize = 1;
pub(super) const FAILED: usize = 2;
pub(super) const PANICKED: usize = 3;

pub(super) const LINKED: usize = 0;
pub(super) const DONE: usize = 1;
pub(super) const PROMOTED: usize = 2;

/// What a finished flight hands to its followers.
pub(super) type Outcome<V, E> = Result<V, StdArc<E>>;

/// The shared state of one execution. See the module docs.
pub(super) struct Flight<V, E> {
    /// `RUNNING`, `OK`, `FAILED` or `PANICKED`.
    state: AtomicUsize,
    /// Written once by the leader before `state` leaves `RUNNING`; read only
    /// after observing `OK`/`FAILED`.
    outcome: UnsafeCell<MaybeUninit<Outcome<V, E>>>,
    /// The followers, oldest first. Only accessed while the lock of the
    /// shard that this flight's key hashes to is held.
    waiters: UnsafeCell<WaitList<Node>>,
}

// SAFETY: `waiters` is only touched under the shard lock. The outcome is
// written once before publication (Release) and afterwards only read through
// shared references, possibly from several threads at once (hence `V: Sync`)
// and dropped by whichever thread drops the last `Arc` (hence `V: Send`).
unsafe impl<V: Send + Sync, E: Send + Sync> Send for Flight<V, E> {}
// SAFETY: as for `Send`.
unsafe impl<V: Send + Sync, E: Send + Sync> Sync for Flight<V, E> {}

/// Proof that the caller holds the shard lock of a flight's key (every
/// call site passes the guard of `shard_of(hash)`).
pub(super) type Locked<'a, T> = &'a mut T;

impl<V, E> Flight<V, E> {
    pub(super) fn new() -> Self {
        Self {
            state: AtomicUsize::new(RUNNING),
            outcome: UnsafeCell::new(MaybeUninit::uninit()),
            waiters: UnsafeCell::new(WaitList::new()),
        }
    }

    /// The flight state, `Acquire`: pairs with the `Release` store in
    /// [`Flight::publish`], so an `OK`/`FAILED` result makes the outcome
    /// cell readable.
    #[inline]
    pub(super) fn state(&self) -> usize {
        self.state.load(Ordering::Acquire)
    }

    /// Writes the outcome.
    ///
    /// # Safety
    ///
    /// Only the flight's current leader calls this, at most once, while the
    /// state is `RUNNING`; no one reads the cell until `publish(OK|FAILED)`.
    pub(super) unsafe fn write_outcome(&self, outcome: Outcome<V, E>) {
        // SAFETY: the caller is the only writer and nobody reads yet.
        self.outcome.with_mut(|cell| unsafe {
            (*cell).write(outcome);
        });
    }

    /// Clones the outcome for a follower or a cache hit; `None` if the
    /// flight is still running or panicked.
    pub(super) fn read_outcome(&self) -> Option<Outcome<V, E>>
    where
        V: Clone,
    {
        match self.state() {
            // SAFETY: `OK`/`FAILED` was observed with `Acquire`, so the
            // single write of the cell happened before and it is never
            // written again.
            OK | FAILED => Some(self.outcome.with(|cell| unsafe {
                match (*cell).assume_init_ref() {
                    Ok(v) => Ok(v.clone()),
                    Err(e) => Err(StdArc::clone(e)),
                }
            })),
            _ => None,
        }
    }

    /// Links a follower's node at the back of the wait list.
    ///
    /// # Safety
    ///
    /// The node is pinned, in no list, in state `LINKED`, and its owner
    /// unlinks it (under the same lock) before it is dropped or moved.
    pub(super) unsafe fn link<S>(&self, node: NonNull<Node>, _locked: Locked<'_, S>) {
        // SAFETY: the shard lock is held (the guard is borrowed); the
        // caller guarantees the node's contract.
        self.waiters
            .with_mut(|list| unsafe { (*list).push_back(node) });
    }

    /// Unlinks a follower's node that is in state `LINKED`.
    ///
    /// # Safety
    ///
    /// The node is live and linked in this flight's list.
    pub(super) unsafe fn unlink<S>(&self, node: NonNull<Node>, _locked: Locked<'_, S>) {
        // SAFETY: lock held; the node is live and in this list.
        let linked = self
            .waiters
            .with_mut(|list| unsafe { (*list).remove(node) });
        debug_assert!(linked, "a LINKED node is in its flight's list");
    }

    /// Whether any follower waits.
    pub(super) fn has_waiters<S>(&self, _locked: Locked<'_, S>) -> bool {
        // SAFETY: lock held.
        self.waiters.with(|list| unsafe { !(*list).is_empty() })
    }

    /// Unlinks the oldest follower, takes its waker and marks it `PROMOTED`
    /// (it will run its own work); `None` if nobody waits.
    pub(super) fn promote_next<S>(&self, _locked: Locked<'_, S>) -> Option<Option<Waker>> {
        // SAFETY: lock held.
        let node = self
            .waiters
            .with_mut(|list| unsafe { (*list).pop_front() })?;
        // SAFETY: linked nodes are live (their owners unlink them under this
        // lock before they go); the lock is held.
        Some(unsafe { WaitNode::finish(node, PROMOTED) })
    }

    /// Moves the flight to `state` (`OK`, `FAILED` or `PANICKED`) and hands
    /// out a batch of followers' wakers, marking them `DONE`. Returns whether
    /// followers remain (call [`Flight::drain`] again with the lock re-taken).
    pub(super) fn publish<S>(
        &self,
        state: usize,
        wakers: &mut super::WakeList,
        locked: Locked<'_, S>,
    ) -> bool {
        debug_assert_ne!(state, RUNNING);
        // Release: pairs with the Acquire in `state()`: the outcome written
        // before this is visible to whoever sees `OK`/`FAILED`.
        self.state.store(state, Ordering::Release);
        self.drain(wakers, locked)
    }

    /// Marks up to `WAKE_BATCH - wakers.len()` followers `DONE` and collects
    /// their wakers; returns whether followers remain.
    pub(super) fn drain<S>(&self, wakers: &mut super::WakeList, _locked: Locked<'_, S>) -> bool {
        while wakers.len() < crate::sync::WAKE_BATCH {
            // SAFETY: lock held.
            let Some(node) = self.waiters.with_mut(|list| unsafe { (*list).pop_front() }) else {
                return false;
            };
            // SAFETY: as in `promote_next`.
            if let Some(waker) = unsafe { WaitNode::finish(node, DONE) } {
                wakers.push(waker);
            }
        }
        // SAFETY: lock held.
        self.waiters.with(|list| unsafe { !(*list).is_empty() })
    }
}

impl<V, E> Drop for Flight<V, E> {
    fn drop(&mut self) {
        // Acquire: pairs with `publish` (belt and braces after the `Arc`).
        if matches!(self.state.load(Ordering::Acquire), OK | FAILED) {
            // SAFETY: `OK`/`FAILED` means the cell was written, and this is
            // the last reference.
            self.outcome
                .with_mut(|cell| unsafe { (*cell).assume_init_drop() });
        }
    }
}

impl<V, E> fmt::Debug for Flight<V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state.load(Ordering::Relaxed) {
            RUNNING => "running",
            OK => "ok",
            FAILED => "failed",
            _ => "panicked",
        };
        f.debug_struct("Flight").field("state", &state).finish()
    }
}

/// A follower's place in a flight's wait list; lives pinned in its future.
/// Its `state` is `LINKED`, `DONE` or `PROMOTED` (see the module docs).
pub(super) type Node = WaitNode;

impl Node {
    /// The node state, `Acquire`: pairs with the `Release` store in
    /// `finish`, after which the owner may go on without the lock.
    #[inline]
    pub(super) fn state(&self) -> usize {
        self.state.load(Ordering::Acquire)
    }

    /// Stores `waker` unless an equivalent one is there; returns the waker
    /// no longer needed, to drop after unlocking.
    pub(super) fn set_waker<S>(&self, waker: Waker, _locked: Locked<'_, S>) -> Option<Waker> {
        // SAFETY: the shard lock is held (the `Locked` token proves it).
        unsafe { self.swap_waker(waker) }
    }
}
