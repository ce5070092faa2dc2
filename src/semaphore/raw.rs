//! The semaphore algorithm: one atomic state word and an intrusive FIFO of
//! waiters. The public API in `mod.rs` is a thin, documented shell over it.
//!
//! # The state word
//!
//! | bits       | name      | meaning                                              |
//! |------------|-----------|------------------------------------------------------|
//! | 0          | `CLOSED`  | `close()` was called; no new permits are issued       |
//! | 1          | `QUEUED`  | the wait list is (or is about to be) non-empty         |
//! | 2..        | permits   | permits available to `try_acquire` right now          |
//!
//! # Invariants
//!
//! 1. While the wait list is non-empty, `QUEUED` is set and the permit count
//!    is 0: every permit that becomes free while someone waits is handed to
//!    the oldest waiter instead. So `try_acquire`, which needs a non-zero
//!    count, can never jump the queue, and it needs no check of its own.
//! 2. `QUEUED` is set and cleared only with the wait-list lock held. While it
//!    is set, nothing but the lock holder changes the permit count: the
//!    lock-free paths (try_acquire, release, forget) all compare-and-swap the
//!    whole word and go to the lock (or fail) when they see `QUEUED`.
//! 3. Permits are conserved: available + held by permits + assigned to
//!    waiters == issued (`new` + `add_permits` - `forget_permits`).
//!
//! # Acquiring
//!
//! `try_acquire` (and an acquire future's first poll) is one CAS taking
//! `n` permits off the count. Its expected value is this thread's hint
//! (`hint.rs`: the word it last left this semaphore in) when that would
//! let the CAS succeed, else a load. The hint is never believed on its
//! own: a wrong one is a failed CAS. A failed CAS backs off only if the
//! word it returned lets it try again.
//!
//! # Releasing
//!
//! With no waiter queued a release is one CAS on the state word and takes no
//! lock. The race with a waiter about to queue is settled by that CAS: the
//! waiter sets `QUEUED` with a CAS too, so the release either lands first
//! (the waiter sees the permits) or sees `QUEUED` and goes to the lock. The
//! same CAS enforces `MAX_PERMITS`, conditioned on the count it checked
//! (see [`overflow`]).
//!
//! A permit's drop expects the word its own acquire left (a [`Guess`])
//! instead of loading it; a wrong guess costs a failed CAS. A guess that
//! would decide anything without a CAS (`QUEUED` set, the bound reached)
//! is replaced by a load first.
//!
//! The locked path wakes every waiter it satisfies, in batches after
//! unlocking, not one at a time by the waiter before it. A panicking waker
//! strands nothing: the rest are woken and the leftover stored, then the
//! panic is resumed (`WakeBatch` in `wait_list.rs`).
//!
//! # The waiter node
//!
//! Each pending acquire owns a [`Node`] pinned inside its future. Its `state`
//! is `remaining << 1 | NODE_CLOSED`:
//!
//! * `remaining > 0`, flag clear: linked in the wait list, owed `remaining`
//!   more permits. Only the lock holder changes it.
//! * `0`: fully assigned and unlinked.
//! * flag set: unlinked by `close()`; `remaining` permits were never assigned.
//!
//! The last two are terminal: the lock holder writes them with `Release` as
//! its last access to the node (after taking the waker out), so the owner
//! can see them with an `Acquire` load and finish without the lock.

use core::fmt;
use core::mem::MaybeUninit;
use core::pin::Pin;
use core::ptr::NonNull;
use core::task::{Context, Poll};

use crate::sync::{fence, AtomicBool, AtomicUsize, Backoff, ListGuard, ListLock, Ordering};
use crate::wait_list::{Panic, WaitList, WaitNode, WakeBatch};

use super::{AcquireError, TryAcquireError};

const CLOSED: usize = 1;
const QUEUED: usize = 2;
const SHIFT: usize = 2;

const NODE_CLOSED: usize = 1;

/// Whether any semaphore in this process has ever been closed; never
/// cleared. While clear, a fully served waiter skips reading the contended
/// state word (`finish_terminal` in `wait.rs`). Under loom each semaphore
/// keeps its own flag (`closed_hint`), since a static would leak across
/// executions.
#[cfg(not(all(test, feature = "loom")))]
static ANY_CLOSED: AtomicBool = AtomicBool::new(false);

/// What a release expects the state word to be: the word as the permit's
/// acquire left it, if that fits in 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Guess(u32);

impl Guess {
    /// No guess: the release loads the word. Has `QUEUED` set, which a
    /// release never acts on without a load.
    pub(crate) const NONE: Guess = Guess(u32::MAX);

    /// The word `word`, if it fits (else no guess).
    #[inline]
    pub(super) fn of(word: usize) -> Guess {
        u32::try_from(word).map_or(Guess::NONE, Guess)
    }

    /// For a permit to pack (any bits are sound: only ever a CAS's expected
    /// value).
    #[inline]
    pub(crate) const fn to_bits(self) -> u32 {
        self.0
    }

    /// The inverse of [`Guess::to_bits`].
    #[inline]
    pub(crate) const fn from_bits(bits: u32) -> Guess {
        Guess(bits)
    }
}

/// Same bound as tokio: the count must fit the word with room for flags.
pub(crate) const MAX_PERMITS: usize = usize::MAX >> 3;

/// Aligned to its size so the state word and the lock, touched together,
/// never straddle two cache lines.
#[repr(align(32))]
pub(crate) struct RawSemaphore {
    /// See the module docs for the layout.
    state: AtomicUsize,
    waiters: ListLock<WaitList<Node>>,
    /// Under loom, this semaphore's `ANY_CLOSED`.
    #[cfg(all(test, feature = "loom"))]
    closed_hint: AtomicBool,
}

/// The semaphore's waiter node; its `state` is `remaining << 1 |
/// NODE_CLOSED` (see the module docs).
type Node = WaitNode;

/// Where an acquire future is in its life, and whether its node is written.
/// `repr(u32)` so a new future's two fields are one 8-byte store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Phase {
    /// Not polled yet. The node is not written.
    Idle,
    /// The node is written and was queued (it may since have been fully
    /// assigned).
    Queued,
    /// Returned `Ready` without queuing; the node is not written.
    Done,
    /// Returned `Ready` (or was dropped) after queuing: the node is
    /// written and unlinked, and is dropped with the future.
    Settled,
}

/// An acquire future's core, wrapped by `Acquire` and `AcquireOwned`. The
/// node is written only when the future queues (`Phase::Queued`).
pub(crate) struct Waiter {
    node: MaybeUninit<Node>,
    needed: u32,
    phase: Phase,
}

/// What [`RawSemaphore::add_unqueued`] did.
enum Added {
    /// The permits are in the word.
    Done,
    /// `QUEUED` is set: the permits must go through the wait list.
    Queued,
    /// The count would pass `MAX_PERMITS`; nothing was added.
    Overflow,
}

impl RawSemaphore {
    #[cfg(not(all(test, feature = "loom")))]
    pub(crate) const fn new(permits: usize) -> Self {
        Self {
            state: AtomicUsize::new(permits << SHIFT),
            waiters: ListLock::new(WaitList::new()),
        }
    }

    #[cfg(all(test, feature = "loom"))]
    pub(crate) fn new(permits: usize) -> Self {
        Self {
            state: AtomicUsize::new(permits << SHIFT),
            waiters: ListLock::new(WaitList::new()),
            closed_hint: AtomicBool::new(false),
        }
    }

    /// The flag that says whether a close may have happened: the
    /// process-wide [`ANY_CLOSED`], or under loom this semaphore's own.
    #[cfg(not(all(test, feature = "loom")))]
    #[inline]
    fn closed_hint(&self) -> &AtomicBool {
        &ANY_CLOSED
    }

    #[cfg(all(test, feature = "loom"))]
    fn closed_hint(&self) -> &AtomicBool {
        &self.closed_hint
    }

    #[inline]
    pub(crate) fn available_permits(&self) -> usize {
        // Relaxed: a snapshot; it synchronizes with nothing.
        self.state.load(Ordering::Relaxed) >> SHIFT
    }

    /// [`RawSemaphore::is_closed`], but `false` without reading the state
    /// word if no semaphore has ever been closed (see [`ANY_CLOSED`]).
    #[inline]
    fn is_closed_hinted(&self) -> bool {
        // Relaxed: see `close`.
        self.closed_hint().load(Ordering::Relaxed) && self.is_closed()
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with the `fetch_or(CLOSED, Release)` in `close`.
        self.state.load(Ordering::Acquire) & CLOSED == CLOSED
    }

    /// Takes `n` permits now or fails; never queues and never writes the
    /// word on failure. On success, the word it left, for the release.
    #[inline]
    pub(crate) fn try_acquire(&self, n: usize) -> Result<Guess, TryAcquireError> {
        assert_max(n);
        let n_shifted = n << SHIFT;
        let mut curr = self.expected(n);
        let backoff = Backoff::new();
        loop {
            if curr & CLOSED == CLOSED {
                return Err(closed_seen());
            }
            // Invariant 1: with waiters queued the count is 0, so a non-zero
            // request fails here and cannot overtake them.
            if (curr >> SHIFT) < n {
                return Err(TryAcquireError::NoPermits);
            }
            if n == 0 {
                return Ok(Guess::of(curr));
            }
            // Acquire on success: pairs with the Release of whichever
            // release made these permits available.
            match self.state.compare_exchange_weak(
                curr,
                curr - n_shifted,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    hint::set(self.addr(), curr - n_shifted);
                    return Ok(Guess::of(curr - n_shifted));
                }
                Err(actual) => {
                    curr = actual;
                    // Back off only before another CAS: a word that
                    // decides the acquire fails it at once.
                    if curr & CLOSED == 0 && (curr >> SHIFT) >= n {
                        backoff.spin();
                    }
                }
            }
        }
    }

    /// Where a `try_acquire` of `n` permits starts its CAS: this thread's
    /// hint if it would let the CAS decide, else the loaded word.
    #[inline]
    fn expected(&self, n: usize) -> usize {
        match hint::get(self.addr()) {
            // A hint that would fail the acquire (closed, too few permits)
            // or pass it without a CAS (`n == 0`) is not believed.
            Some(word) if n > 0 && word & CLOSED == 0 && word >> SHIFT >= n => word,
            // Relaxed: only the successful CAS needs to synchronize.
            _ => {
                #[cfg(all(test, not(feature = "loom")))]
                hint::loaded();
                self.state.load(Ordering::Relaxed)
            }
        }
    }

    /// This semaphore's key in the thread's hint.
    #[inline]
    fn addr(&self) -> usize {
        core::ptr::from_ref(self) as usize
    }

    /// Returns (or adds) `n` permits. Lock-free unless a waiter is queued.
    /// Panics like tokio past `MAX_PERMITS` (see [`overflow`]).
    #[inline]
    #[track_caller]
    pub(crate) fn release(&self, n: usize, guess: Guess) {
        if n == 0 {
            return;
        }
        match self.add_unqueued(n, guess) {
            Added::Done => {}
            Added::Queued => self.release_slow(n),
            Added::Overflow => overflow(n),
        }
    }

    /// Adds `n` permits to the word unless `QUEUED` is set or the count
    /// would pass `MAX_PERMITS`, checked on the value the CAS is conditioned
    /// on (so concurrent additions cannot both pass).
    #[inline]
    fn add_unqueued(&self, n: usize, guess: Guess) -> Added {
        let mut curr = guess.0 as usize;
        // A guess is only the expected value of the CAS: if it would
        // decide on its own (`QUEUED`, the bound), read the word instead.
        // No underflow: a guess's count is below 2^30.
        if curr & QUEUED == QUEUED || n > MAX_PERMITS - (curr >> SHIFT) {
            // Relaxed: the CAS below carries the ordering.
            curr = self.state.load(Ordering::Relaxed);
        }
        let backoff = Backoff::new();
        loop {
            if curr & QUEUED == QUEUED {
                return Added::Queued;
            }
            let avail = curr >> SHIFT;
            // `avail <= MAX_PERMITS` always holds (this check guards every
            // addition), so the subtraction cannot underflow; it also
            // rejects `n > MAX_PERMITS` before `n << SHIFT` could wrap.
            if n > MAX_PERMITS - avail {
                return Added::Overflow;
            }
            // Release on success: pairs with the Acquire CAS of the next
            // `try_acquire` (or the enqueue CAS) that takes these permits.
            match self.state.compare_exchange_weak(
                curr,
                curr + (n << SHIFT),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    hint::set(self.addr(), curr + (n << SHIFT));
                    return Added::Done;
                }
                Err(actual) => {
                    curr = actual;
                    backoff.spin();
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    #[track_caller]
    fn release_slow(&self, n: usize) {
        let guard = self.waiters.lock();
        self.release_locked(n, guard);
    }

    /// Hands `rem` permits to the oldest waiters, then stores what is left.
    /// A panicking waker, or a leftover past `MAX_PERMITS`, is reported only
    /// after the hand-off is complete and every satisfied waiter woken.
    #[track_caller]
    fn release_locked<'a>(&'a self, mut rem: usize, mut guard: ListGuard<'a, WaitList<Node>>) {
        let mut wakers = WakeBatch::new();
        let mut panicked: Option<Panic> = None;
        // Whether the leftover was refused.
        let refused = loop {
            // Relaxed: under the lock; `QUEUED` only changes under the lock.
            let curr = self.state.load(Ordering::Relaxed);
            if curr & QUEUED == 0 {
                // Nobody waits (invariant 1), so the permits go to the word.
                // The batch is empty here (woken at the end of the last
                // round). Lock-free paths still move the count, so CAS.
                let added = self.add_unqueued(rem, Guess::NONE);
                drop(guard);
                match added {
                    Added::Done => break false,
                    Added::Overflow => break true,
                    Added::Queued => unreachable!("QUEUED is only set under the lock"),
                }
            }
            while rem > 0 && !wakers.is_full() {
                let Some(node) = guard.front() else { break };
                // SAFETY: linked nodes are live (they unlink themselves
                // under this lock before they are dropped).
                let node = unsafe { node.as_ref() };
                // Relaxed: a linked node's state is only written under the
                // lock, which we hold.
                let owed = node.state.load(Ordering::Relaxed) >> 1;
                if rem < owed {
                    // Partial assignment; the node stays at the front.
                    // Relaxed: the owner reads non-terminal values only to
                    // decide to take the lock.
                    node.state.store((owed - rem) << 1, Ordering::Relaxed);
                    rem = 0;
                    break;
                }
                rem -= owed;
                let unlinked = guard.pop_front().expect("the front node");
                // SAFETY: just unlinked, live, lock held. `finish` stores
                // the terminal state with Release (pairs with the owner's
                // Acquire in `poll`/`drop`): the last access to the node.
                if let Some(waker) = unsafe { WaitNode::finish(unlinked, 0) } {
                    wakers.push(waker);
                }
            }
            // `Some(refused)` once the hand-off is complete.
            let done = if guard.is_empty() {
                // The count is 0 while QUEUED is set (invariant 1), so the
                // leftover fits unless it alone passes the bound; then it
                // is refused, but QUEUED is still cleared.
                let refused = rem > MAX_PERMITS;
                let stored = if refused { 0 } else { rem };
                // Clear QUEUED and publish the leftover in one RMW; CLOSED
                // is left as it is.
                // Release: pairs with the Acquire CAS that takes them.
                self.state
                    .fetch_add((stored << SHIFT).wrapping_sub(QUEUED), Ordering::Release);
                Some(refused)
            } else if rem == 0 {
                Some(false)
            } else {
                None
            };
            drop(guard);
            if let Some(payload) = wakers.wake_all() {
                panicked.get_or_insert(payload);
            }
            if let Some(refused) = done {
                break refused;
            }
            guard = self.waiters.lock();
        };
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
        if refused {
            overflow(rem);
        }
    }

    /// Adds `n` new permits: exactly a release, as in tokio.
    #[inline]
    #[track_caller]
    pub(crate) fn add_permits(&self, n: usize) {
        self.release(n, Guess::NONE);
    }

    /// Removes up to `n` available permits; returns how many it removed.
    pub(crate) fn forget_permits(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        // Relaxed: forgetting publishes nothing and takes no data.
        let mut curr = self.state.load(Ordering::Relaxed);
        let backoff = Backoff::new();
        loop {
            let avail = curr >> SHIFT;
            if avail == 0 {
                // Includes the QUEUED case (invariant 1): nothing to take.
                return 0;
            }
            let take = avail.min(n);
            match self.state.compare_exchange_weak(
                curr,
                curr - (take << SHIFT),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(actual) => {
                    curr = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// Closes the semaphore and fails every queued waiter.
    pub(crate) fn close(&self) {
        // Relaxed: whoever must see it is polled after this call, so
        // coherence suffices; the CLOSED bit carries the ordering
        // (`is_closed` Acquire, `enqueue` under the lock, `closed_seen`'s
        // Acquire fence).
        self.closed_hint().store(true, Ordering::Relaxed);
        let mut guard = self.waiters.lock();
        // Set under the lock so that no waiter queues after the drain below
        // (the enqueue path checks CLOSED under the same lock).
        // Release: pairs with the Acquire load in `is_closed`/`poll`.
        self.state.fetch_or(CLOSED, Ordering::Release);
        let mut wakers = WakeBatch::new();
        // A panicking waker is resumed only after every waiter is failed
        // and woken (see `release_locked`).
        let mut panicked: Option<Panic> = None;
        loop {
            while !wakers.is_full() {
                let Some(node) = guard.pop_front() else { break };
                // SAFETY: the node was linked, so it is live; lock held.
                // Relaxed: a linked node's state is written under the lock.
                let st = unsafe { node.as_ref() }.state.load(Ordering::Relaxed);
                // SAFETY: just unlinked, live, lock held; `finish`'s Release
                // store pairs with the owner's Acquire load (last access).
                if let Some(waker) = unsafe { WaitNode::finish(node, st | NODE_CLOSED) } {
                    wakers.push(waker);
                }
            }
            let empty = guard.is_empty();
            if empty {
                // Release: pairs with nothing in particular; the lock orders
                // it with the next lock holder.
                self.state.fetch_and(!QUEUED, Ordering::Release);
            }
            drop(guard);
            if let Some(payload) = wakers.wake_all() {
                panicked.get_or_insert(payload);
            }
            if empty {
                break;
            }
            guard = self.waiters.lock();
        }
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
    }
}

/// A release would push the available count past `MAX_PERMITS`: panic with
/// tokio's messages, at tokio's moment.
///
/// Like tokio, the bound is checked only on what is left after feeding the
/// queued waiters, so a permit's drop may panic (panicking earlier would
/// reject programs tokio accepts). Unlike tokio, the addition is refused,
/// so the count never passes the bound. A permit dropped while unwinding
/// does not panic again (that would abort).
#[cold]
#[inline(never)]
#[track_caller]
fn overflow(added: usize) {
    if std::thread::panicking() {
        return;
    }
    if added > MAX_PERMITS {
        panic!("cannot add more than MAX_PERMITS permits ({})", MAX_PERMITS);
    }
    panic!(
        "number of added permits ({}) would overflow MAX_PERMITS ({})",
        added, MAX_PERMITS
    );
}

/// tokio's check and message, for requests that cannot fit the word
/// (reachable only on 32-bit targets).
#[inline]
#[track_caller]
pub(crate) fn assert_max(n: usize) {
    assert!(
        n <= MAX_PERMITS,
        "a semaphore may not have more than MAX_PERMITS permits ({})",
        MAX_PERMITS
    );
}

#[inline]
fn is_terminal(node_state: usize) -> bool {
    node_state == 0 || node_state & NODE_CLOSED == NODE_CLOSED
}

/// A `try_acquire` read CLOSED with a Relaxed load: the Acquire fence
/// makes the close happen-before what this thread does next, so a waiter
/// it then polls sees the closed hint and fails too.
#[cold]
fn closed_seen() -> TryAcquireError {
    // Acquire: pairs with the Release `fetch_or(CLOSED)` in `close`.
    fence(Ordering::Acquire);
    TryAcquireError::Closed
}

mod hint;
mod wait;

impl fmt::Debug for RawSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.load(Ordering::Relaxed);
        f.debug_struct("Semaphore")
            .field("permits", &(st >> SHIFT))
            .field("closed", &(st & CLOSED == CLOSED))
            .field("queued", &(st & QUEUED == QUEUED))
            .finish()
    }
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("needed", &self.needed)
            .field("phase", &self.phase)
            .finish()
    }
}
