//! The least a FIFO semaphore can do in the 64-task tables, as floors
//! beside the peers: a permit count and a queue of wakers under one lock,
//! and nothing else (no node, no cancellation, no close, no overflow
//! check). A queued acquire takes a ticket; a release hands its permit to
//! the oldest ticket (`served` counts the hand-offs) and wakes it after
//! unlocking. Two ways to wake ([`Wakes`]) and three locks:
//!
//! - none, for a current-thread runtime only (`Fifo::unsync` is `unsafe`
//!   for that reason): what is left is the runtime's own price of a FIFO
//!   hand-off (a waker clone, a wake, the woken task's poll);
//! - a spin lock that never parks (item 2 of issue #44 rules it out for
//!   the shipped semaphore), whose unlock is a plain store;
//! - `parking_lot::Mutex`, futures-intrusive's lock, which spins briefly,
//!   then parks (`std::sync::Mutex` read the same on one thread and
//!   slower on two).
//!
//! Every acquire the benches start is awaited to completion and a task is
//! polled only when woken; a queued future dropped early would strand its
//! ticket. So these are floors, not semaphores. Their locks and their
//! bound on holders are tested in `tests/primitives/fifo_floor.rs`, under
//! miri too.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

/// When a release wakes the waiter it handed a permit to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wakes {
    /// At once, as ours, tokio's and async-lock's do.
    AtOnce,
    /// One woken waiter at a time: while a woken waiter has not been
    /// polled, a release hands its permit over but keeps the waker, and
    /// the woken waiter's completing poll wakes the next. This is what
    /// futures-intrusive's fair semaphore does (its release wakes the
    /// head only if the head was not woken yet, and the head's poll takes
    /// the permit and wakes the next), with the permit still handed over
    /// at the release.
    OneAtATime,
}

/// What the lock guards.
pub(crate) struct State {
    permits: usize,
    wakes: Wakes,
    /// The next ticket to give a queued acquire.
    next: u64,
    /// How many queued acquires were handed a permit: ticket `t` has one
    /// once `served > t`.
    served: u64,
    /// The wakers of tickets `served..next`, oldest first.
    waiters: VecDeque<Waker>,
    /// `Wakes::OneAtATime`: a woken waiter has not been polled yet.
    woken: bool,
    /// `Wakes::OneAtATime`: wakers of served tickets not woken yet.
    deferred: VecDeque<Waker>,
}

impl State {
    fn new(permits: usize, wakes: Wakes) -> Self {
        Self {
            permits,
            wakes,
            next: 0,
            served: 0,
            waiters: VecDeque::new(),
            woken: false,
            deferred: VecDeque::new(),
        }
    }
}

/// A way to get at the [`State`] exclusively.
pub(crate) trait Guard: Send + Sync {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R;
}

/// No lock: every access is on one thread (see [`Fifo::unsync`]).
pub(crate) struct Unsync(UnsafeCell<State>);

// SAFETY: an `Unsync` is only built by `Fifo::unsync`, whose caller
// promises that every access happens on one thread.
unsafe impl Send for Unsync {}
// SAFETY: as above.
unsafe impl Sync for Unsync {}

impl Guard for Unsync {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // SAFETY: one thread (see `Fifo::unsync`), and no `f` below calls
        // `with` again, so this is the only reference.
        f(unsafe { &mut *self.0.get() })
    }
}

/// A test-and-set lock that spins until it gets in and never parks.
pub(crate) struct Spin {
    locked: AtomicBool,
    state: UnsafeCell<State>,
}

// SAFETY: the state is only reached with `locked` held.
unsafe impl Sync for Spin {}

impl Guard for Spin {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // Acquire: pairs with the Release store below, so this holder
        // sees the previous holder's writes.
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Relaxed: only the CAS above synchronizes.
            while self.locked.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
        // SAFETY: `locked` is held, so this is the only reference.
        let out = f(unsafe { &mut *self.state.get() });
        // Release: pairs with the Acquire CAS of the next holder.
        self.locked.store(false, Ordering::Release);
        out
    }
}

impl Guard for parking_lot::Mutex<State> {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.lock())
    }
}

/// A FIFO semaphore reduced to its floor (see the module docs).
pub(crate) struct Fifo<G> {
    guard: G,
}

impl Fifo<Unsync> {
    /// # Safety
    ///
    /// Every acquire, poll and permit drop on it must happen on one
    /// thread (a current-thread runtime's).
    pub(crate) unsafe fn unsync(permits: usize) -> Self {
        let state = State::new(permits, Wakes::AtOnce);
        Self {
            guard: Unsync(UnsafeCell::new(state)),
        }
    }
}

impl Fifo<Spin> {
    pub(crate) fn spin(permits: usize, wakes: Wakes) -> Self {
        let state = State::new(permits, wakes);
        Self {
            guard: Spin {
                locked: AtomicBool::new(false),
                state: UnsafeCell::new(state),
            },
        }
    }
}

impl Fifo<parking_lot::Mutex<State>> {
    pub(crate) fn parking_lot(permits: usize) -> Self {
        let state = State::new(permits, Wakes::AtOnce);
        Self {
            guard: parking_lot::Mutex::new(state),
        }
    }
}

impl<G: Guard> Fifo<G> {
    pub(crate) fn acquire(&self) -> Acquire<'_, G> {
        Acquire {
            sem: self,
            ticket: None,
        }
    }
}

pub(crate) struct Acquire<'a, G> {
    sem: &'a Fifo<G>,
    ticket: Option<u64>,
}

impl<'a, G: Guard> Future for Acquire<'a, G> {
    type Output = Permit<'a, G>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit<'a, G>> {
        let ticket = self.ticket;
        // `Ok(next to wake)` when ready, `Err(ticket taken)` when not.
        let polled = self.sem.guard.with(|s| match ticket {
            None if s.permits > 0 => {
                // A count above 0 means nobody waits: a release hands its
                // permit to a waiter before it adds to the count.
                s.permits -= 1;
                Ok(None)
            }
            None => {
                s.waiters.push_back(cx.waker().clone());
                s.next += 1;
                Err(Some(s.next - 1))
            }
            Some(t) if s.served > t => {
                // The woken waiter passes the wake on.
                s.woken = false;
                let next = s.deferred.pop_front();
                s.woken = next.is_some();
                Ok(next)
            }
            Some(t) => {
                let slot = &mut s.waiters[(t - s.served) as usize];
                if !slot.will_wake(cx.waker()) {
                    slot.clone_from(cx.waker());
                }
                Err(None)
            }
        });
        match polled {
            Ok(next) => {
                if let Some(waker) = next {
                    waker.wake();
                }
                Poll::Ready(Permit { sem: self.sem })
            }
            Err(ticket) => {
                if ticket.is_some() {
                    self.ticket = ticket;
                }
                Poll::Pending
            }
        }
    }
}

pub(crate) struct Permit<'a, G: Guard> {
    sem: &'a Fifo<G>,
}

impl<G: Guard> Drop for Permit<'_, G> {
    fn drop(&mut self) {
        let next = self.sem.guard.with(|s| {
            let Some(waker) = s.waiters.pop_front() else {
                s.permits += 1;
                return None;
            };
            s.served += 1;
            if s.wakes == Wakes::OneAtATime {
                if s.woken {
                    s.deferred.push_back(waker);
                    return None;
                }
                s.woken = true;
            }
            Some(waker)
        });
        if let Some(waker) = next {
            waker.wake();
        }
    }
}
