//! The waiter's side of the protocol: poll, re-poll and cancelled unlink.
//! The state word, invariants and the release side are in the parent module.

use super::*;

impl RawSemaphore {
    /// Polls for `waiter.needed` permits. On `Ready(Ok)` the caller owns
    /// them (and has its release's guess); on `Ready(Err)` it owns none.
    #[inline]
    pub(crate) fn poll_acquire(
        &self,
        waiter: Pin<&mut Waiter>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Guess, AcquireError>> {
        // SAFETY: nothing is moved out of `waiter`; the node stays pinned.
        let waiter = unsafe { waiter.get_unchecked_mut() };
        match waiter.phase {
            Phase::Idle => match self.try_acquire(waiter.needed as usize) {
                Ok(guess) => {
                    waiter.phase = Phase::Done;
                    Poll::Ready(Ok(guess))
                }
                Err(TryAcquireError::Closed) => {
                    waiter.phase = Phase::Done;
                    Poll::Ready(Err(AcquireError::closed()))
                }
                // After a wait the word has moved on: no guess.
                Err(TryAcquireError::NoPermits) => {
                    self.enqueue(waiter, cx).map_ok(|()| Guess::NONE)
                }
            },
            Phase::Queued => self.repoll(waiter, cx).map_ok(|()| Guess::NONE),
            Phase::Done | Phase::Settled => polled_after_completion(),
        }
    }

    /// First poll, fast path failed: take what is there, queue for the rest.
    #[cold]
    #[inline(never)]
    fn enqueue(&self, waiter: &mut Waiter, cx: &mut Context<'_>) -> Poll<Result<(), AcquireError>> {
        let needed = waiter.needed as usize;
        // Clone before locking: a waker clone is user code.
        let waker = cx.waker().clone();
        let mut guard = self.waiters.lock();
        // Relaxed: every path below that takes permits does so by a CAS
        // with Acquire.
        let mut curr = self.state.load(Ordering::Relaxed);
        loop {
            // CLOSED is set under this lock: read here, the close
            // happens-before this thread's next steps (see `close`).
            if curr & CLOSED == CLOSED {
                drop(guard);
                waiter.phase = Phase::Done;
                return Poll::Ready(Err(AcquireError::closed()));
            }
            let avail = curr >> SHIFT;
            if curr & QUEUED == 0 && avail >= needed {
                // Permits came back between the fast path and the lock.
                match self.state.compare_exchange_weak(
                    curr,
                    curr - (needed << SHIFT),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        drop(guard);
                        waiter.phase = Phase::Done;
                        return Poll::Ready(Ok(()));
                    }
                    Err(actual) => {
                        curr = actual;
                        continue;
                    }
                }
            }
            // Take everything available (0 if QUEUED) and set QUEUED, in one
            // CAS: this is what a lock-free release races with.
            let next = (curr & CLOSED) | QUEUED;
            if curr != next {
                // Acquire: we take `avail` permits; pairs with the Release
                // of the releases that made them available.
                if let Err(actual) = self.state.compare_exchange_weak(
                    curr,
                    next,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    curr = actual;
                    continue;
                }
            }
            let remaining = needed - avail;
            // Written on first poll; the unlock publishes it.
            let node = waiter.node.write(Node::new(remaining << 1));
            // SAFETY: the node is not linked yet, so only we can reach it.
            // The slot is empty (a new node), so nothing comes back to be
            // dropped under the lock.
            let none = unsafe { node.swap_waker(waker) };
            debug_assert!(none.is_none());
            // SAFETY: the node is pinned inside the future and unlinked; the
            // future's `Drop` unlinks it (under this lock) before it goes.
            unsafe { guard.push_back(NonNull::from(&*node)) };
            waiter.phase = Phase::Queued;
            return Poll::Pending;
        }
    }

    /// A queued waiter is polled again.
    fn repoll(&self, waiter: &mut Waiter, cx: &mut Context<'_>) -> Poll<Result<(), AcquireError>> {
        // Acquire: pairs with the Release store of a terminal state.
        let st = waiter.node().state.load(Ordering::Acquire);
        if let Some(ready) = self.finish_terminal(waiter, st) {
            return ready;
        }
        self.repoll_slow(waiter, cx)
    }

    #[cold]
    #[inline(never)]
    fn repoll_slow(
        &self,
        waiter: &mut Waiter,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), AcquireError>> {
        let mut waker = Some(cx.waker().clone());
        let guard = self.waiters.lock();
        // Relaxed: under the lock, which orders us after the last writer.
        let st = waiter.node().state.load(Ordering::Relaxed);
        if !is_terminal(st) {
            // Still linked: make sure the newest waker is the one woken.
            let new = waker.take().expect("waker taken once");
            // SAFETY: the lock is held.
            waker = unsafe { waiter.node().swap_waker(new) };
            drop(guard);
            // The waker not kept is dropped outside the lock.
            drop(waker);
            return Poll::Pending;
        }
        drop(guard);
        drop(waker);
        self.finish_terminal(waiter, st)
            .expect("terminal node state")
    }

    /// Completes a waiter whose node is unlinked (state `0` or closed).
    fn finish_terminal(
        &self,
        waiter: &mut Waiter,
        st: usize,
    ) -> Option<Poll<Result<(), AcquireError>>> {
        if !is_terminal(st) {
            return None;
        }
        let needed = waiter.needed as usize;
        waiter.phase = Phase::Settled;
        if st == 0 && !self.is_closed_hinted() {
            return Some(Poll::Ready(Ok(())));
        }
        // Closed (like tokio, a closed semaphore fails even a waiter whose
        // permits were all assigned): hand back what was assigned.
        self.release(needed - (st >> 1), Guess::NONE);
        Some(Poll::Ready(Err(AcquireError::closed())))
    }

    /// The acquire future is dropped: unlink the node and give back every
    /// permit already assigned to it.
    pub(crate) fn drop_waiter(&self, waiter: Pin<&mut Waiter>) {
        // SAFETY: nothing is moved out; the node stays where it is until
        // the future's memory is released after this returns.
        let waiter = unsafe { waiter.get_unchecked_mut() };
        if waiter.phase != Phase::Queued {
            return;
        }
        waiter.phase = Phase::Settled;
        let needed = waiter.needed as usize;
        // Acquire: pairs with the Release store of a terminal state.
        let st = waiter.node().state.load(Ordering::Acquire);
        if is_terminal(st) {
            self.release(needed - (st >> 1), Guess::NONE);
            return;
        }
        self.drop_waiter_slow(waiter, needed);
    }

    #[cold]
    #[inline(never)]
    fn drop_waiter_slow(&self, waiter: &mut Waiter, needed: usize) {
        let mut guard = self.waiters.lock();
        // Relaxed: under the lock.
        let st = waiter.node().state.load(Ordering::Relaxed);
        if !is_terminal(st) {
            // SAFETY: the node is live, the lock is held and the node is in
            // this list (non-terminal state means linked).
            let linked = unsafe { guard.remove(NonNull::from(waiter.node())) };
            debug_assert!(linked);
        }
        let assigned = needed - (st >> 1);
        if assigned > 0 {
            // Through the locked path: the next waiters may now be served.
            self.release_locked(assigned, guard);
        }
        // The node's waker is dropped with the future, after the lock.
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn polled_after_completion() -> ! {
    panic!("`Acquire` polled after completion")
}

impl Waiter {
    #[inline]
    pub(crate) fn new(needed: u32) -> Self {
        Self {
            node: MaybeUninit::uninit(),
            needed,
            phase: Phase::Idle,
        }
    }

    #[inline]
    pub(crate) fn needed(&self) -> u32 {
        self.needed
    }

    /// Whether the node may be linked (the future was queued and has not
    /// completed).
    #[inline]
    pub(crate) fn is_queued(&self) -> bool {
        self.phase == Phase::Queued
    }

    /// The node, which only a queued (or settled) waiter has written.
    #[inline]
    fn node(&self) -> &Node {
        debug_assert!(matches!(self.phase, Phase::Queued | Phase::Settled));
        // SAFETY: `enqueue` writes the node before it sets `Queued`, and
        // `Settled` only ever follows `Queued`; no other phase reaches here.
        unsafe { self.node.assume_init_ref() }
    }
}

impl Drop for Waiter {
    #[inline]
    fn drop(&mut self) {
        // The owning future's `Drop` has unlinked a queued node already
        // (`drop_waiter`); what is left is its waker, if any.
        if matches!(self.phase, Phase::Queued | Phase::Settled) {
            // SAFETY: written (see `node`), dropped once, here.
            unsafe { self.node.assume_init_drop() };
        }
    }
}
