//! The acquire futures. Each owns its waiter node, so waiting allocates
//! nothing.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use super::raw::Waiter;
use super::{AcquireError, OwnedSemaphorePermit, Semaphore, SemaphorePermit};

/// Future returned by [`Semaphore::acquire`] and
/// [`Semaphore::acquire_many`].
///
/// Unlike tokio's, this type can be named.
///
/// # Cancel safety
///
/// Dropping it gives back every permit already assigned to it (waking the
/// next waiter if that satisfies it); the place in the queue is lost.
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct Acquire<'a> {
    sem: &'a Semaphore,
    waiter: Waiter,
}

/// Future returned by [`Semaphore::acquire_owned`] and
/// [`Semaphore::acquire_many_owned`].
///
/// # Cancel safety
///
/// As [`Acquire`].
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct AcquireOwned {
    /// `None` once the `Arc` has gone to the permit.
    sem: Option<Arc<Semaphore>>,
    waiter: Waiter,
}

impl<'a> Acquire<'a> {
    #[inline]
    pub(crate) fn new(sem: &'a Semaphore, n: u32) -> Self {
        Self {
            sem,
            waiter: Waiter::new(n),
        }
    }

    /// Splits the pinned future into the semaphore and the pinned waiter.
    fn project(self: Pin<&mut Self>) -> (&'a Semaphore, Pin<&mut Waiter>) {
        // SAFETY: `waiter` is structurally pinned: it is never moved out of
        // a pinned `Acquire`, and `Drop` unlinks it before it goes.
        unsafe {
            let this = self.get_unchecked_mut();
            (this.sem, Pin::new_unchecked(&mut this.waiter))
        }
    }
}

impl<'a> Future for Acquire<'a> {
    type Output = Result<SemaphorePermit<'a>, AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (sem, waiter) = self.project();
        let n = waiter.needed();
        let guess = core::task::ready!(sem.raw.poll_acquire(waiter, cx))?;
        Poll::Ready(Ok(SemaphorePermit::new(sem, n, guess)))
    }
}

impl Drop for Acquire<'_> {
    #[inline]
    fn drop(&mut self) {
        if !self.waiter.is_queued() {
            return;
        }
        // SAFETY: `self` is pinned (a future is dropped in place), and the
        // waiter is structurally pinned.
        let waiter = unsafe { Pin::new_unchecked(&mut self.waiter) };
        self.sem.raw.drop_waiter(waiter);
    }
}

impl AcquireOwned {
    #[inline]
    pub(crate) fn new(sem: Arc<Semaphore>, n: u32) -> Self {
        Self {
            sem: Some(sem),
            waiter: Waiter::new(n),
        }
    }
}

impl Future for AcquireOwned {
    type Output = Result<OwnedSemaphorePermit, AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `waiter` is structurally pinned (see `Acquire::project`);
        // `sem` is not pinned and may be moved out.
        let this = unsafe { self.get_unchecked_mut() };
        let sem = this
            .sem
            .as_ref()
            .expect("`AcquireOwned` polled after completion");
        let n = this.waiter.needed();
        // SAFETY: as above.
        let waiter = unsafe { Pin::new_unchecked(&mut this.waiter) };
        let guess = core::task::ready!(sem.raw.poll_acquire(waiter, cx))?;
        let sem = this.sem.take().expect("checked above");
        Poll::Ready(Ok(OwnedSemaphorePermit::new(sem, n, guess)))
    }
}

impl Drop for AcquireOwned {
    #[inline]
    fn drop(&mut self) {
        let Some(sem) = self.sem.as_ref() else { return };
        if !self.waiter.is_queued() {
            return;
        }
        // SAFETY: the future is dropped in place; the waiter is structurally
        // pinned.
        let waiter = unsafe { Pin::new_unchecked(&mut self.waiter) };
        sem.raw.drop_waiter(waiter);
    }
}

impl fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("sem", &self.sem)
            .field("waiter", &self.waiter)
            .finish()
    }
}

impl fmt::Debug for AcquireOwned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireOwned")
            .field("sem", &self.sem)
            .field("waiter", &self.waiter)
            .finish()
    }
}
