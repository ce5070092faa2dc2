//! `PollSemaphore`: a permit acquired from a `poll_*` method (the
//! concurrency layer's `poll_ready`). One boxed acquire future, reused for
//! every wait; a waiter dropped while queued hands its permit on.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use crate::semaphore::{AcquireOwned, OwnedSemaphorePermit, Semaphore, TryAcquireError};

pub(crate) struct PollSemaphore {
    semaphore: Arc<Semaphore>,
    acquire: Option<Pin<Box<AcquireOwned>>>,
    waiting: bool,
}

impl PollSemaphore {
    pub(crate) fn new(semaphore: Arc<Semaphore>) -> Self {
        PollSemaphore {
            semaphore,
            acquire: None,
            waiting: false,
        }
    }

    pub(crate) fn semaphore(&self) -> &Arc<Semaphore> {
        &self.semaphore
    }

    pub(crate) fn is_waiting(&self) -> bool {
        self.waiting
    }

    #[inline]
    pub(crate) fn poll_acquire(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<OwnedSemaphorePermit>> {
        if !self.waiting {
            match self.semaphore.clone().try_acquire_owned() {
                Ok(permit) => return Poll::Ready(Some(permit)),
                Err(TryAcquireError::Closed) => return Poll::Ready(None),
                Err(_) => self.start_wait(),
            }
        }
        self.poll_wait(cx)
    }

    #[cold]
    fn start_wait(&mut self) {
        let fresh = self.semaphore.clone().acquire_owned();
        match &mut self.acquire {
            // Completed (`waiting` was false): replacing it drops nothing queued.
            Some(stored) => stored.set(fresh),
            None => self.acquire = Some(Box::pin(fresh)),
        }
        self.waiting = true;
    }

    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<OwnedSemaphorePermit>> {
        let Some(acquire) = self.acquire.as_mut() else {
            // Unreachable: `waiting` implies a stored future.
            self.start_wait();
            return self.poll_wait(cx);
        };
        let result = core::task::ready!(acquire.as_mut().poll(cx));
        self.waiting = false;
        Poll::Ready(result.ok())
    }
}

impl Clone for PollSemaphore {
    fn clone(&self) -> Self {
        PollSemaphore::new(self.semaphore.clone())
    }
}

impl fmt::Debug for PollSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollSemaphore")
            .field("semaphore", &self.semaphore)
            .field("waiting", &self.waiting)
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    /// A waiter dropped while queued hands its assigned permit to the next.
    #[test]
    fn dropped_while_queued_gives_back_its_assigned_permit() {
        let sem = Arc::new(Semaphore::new(1));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut a = PollSemaphore::new(sem.clone());
        let mut b = a.clone();
        let mut c = a.clone();
        let Poll::Ready(Some(permit)) = a.poll_acquire(&mut cx) else {
            panic!("free permit")
        };
        assert!(b.poll_acquire(&mut cx).is_pending());
        assert!(c.poll_acquire(&mut cx).is_pending());
        assert!(b.is_waiting());
        drop(permit); // assigned to `b`, the oldest waiter
        drop(b); // ... which is cancelled: the permit moves on to `c`
        assert!(matches!(c.poll_acquire(&mut cx), Poll::Ready(Some(_))));
        assert_eq!(sem.available_permits(), 1);
        // The box is reused for the next wait.
        let Poll::Ready(Some(p)) = a.poll_acquire(&mut cx) else {
            panic!()
        };
        assert!(c.poll_acquire(&mut cx).is_pending());
        drop(p);
        assert!(matches!(c.poll_acquire(&mut cx), Poll::Ready(Some(_))));
        sem.close();
        assert!(matches!(c.poll_acquire(&mut cx), Poll::Ready(None)));
    }
}
