//! [`PollSemaphore`]: acquiring a permit from a `poll_*` method.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use crate::semaphore::{AcquireOwned, OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// An `Arc<Semaphore>` with a stored acquire future, so a permit can be
/// polled for from `poll_ready`.
///
/// [`poll_acquire`](Self::poll_acquire) takes a free permit without
/// allocating; only when it has to queue does it box an `AcquireOwned`,
/// reused by later waits. The queued future keeps its FIFO place across
/// polls. Clones share the semaphore but each waits in its own place.
///
/// # Cancel safety
///
/// Dropping a `PollSemaphore` while it waits gives every permit already
/// assigned to it back to the semaphore.
///
/// # Examples
///
/// A hand-written future that holds one permit while it runs:
///
/// ```
/// use backpressure::{PollSemaphore, Semaphore};
/// use std::future::poll_fn;
/// use std::sync::Arc;
///
/// let semaphore = Arc::new(Semaphore::new(1));
/// let mut poll = PollSemaphore::new(semaphore.clone());
/// futures::executor::block_on(async {
///     let permit = poll_fn(|cx| poll.poll_acquire(cx)).await.unwrap();
///     assert_eq!(semaphore.available_permits(), 0);
///     drop(permit);
///     assert_eq!(semaphore.available_permits(), 1);
///
///     // A closed semaphore answers `None`.
///     semaphore.close();
///     assert!(poll_fn(|cx| poll.poll_acquire(cx)).await.is_none());
/// });
/// ```
pub struct PollSemaphore {
    semaphore: Arc<Semaphore>,
    /// The stored acquire future, kept after a wait so the box is reused.
    acquire: Option<Pin<Box<AcquireOwned>>>,
    /// Whether `acquire` holds a future still waiting for its permit.
    waiting: bool,
}

impl PollSemaphore {
    /// Polls for permits of `semaphore`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{PollSemaphore, Semaphore};
    /// use std::sync::Arc;
    /// let poll = PollSemaphore::new(Arc::new(Semaphore::new(3)));
    /// assert_eq!(poll.semaphore().available_permits(), 3);
    /// ```
    pub fn new(semaphore: Arc<Semaphore>) -> Self {
        PollSemaphore {
            semaphore,
            acquire: None,
            waiting: false,
        }
    }

    /// The semaphore.
    pub fn semaphore(&self) -> &Arc<Semaphore> {
        &self.semaphore
    }

    /// The semaphore, dropping any wait in progress.
    pub fn into_inner(self) -> Arc<Semaphore> {
        self.semaphore.clone()
    }

    /// Whether a wait is in progress (a `Pending` was returned and no
    /// permit yet).
    pub fn is_waiting(&self) -> bool {
        self.waiting
    }

    /// Polls for one permit: `Ready(Some(permit))`, `Pending` (the waker
    /// in `cx` is woken when a permit is assigned), or `Ready(None)` once
    /// the semaphore is closed.
    ///
    /// # Cancel safety
    ///
    /// A wait started here continues at the next call, in the same place
    /// in the queue; dropping `self` abandons it and returns what was
    /// assigned.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{PollSemaphore, Semaphore};
    /// use futures::task::noop_waker_ref;
    /// use std::sync::Arc;
    /// use std::task::{Context, Poll};
    ///
    /// let semaphore = Arc::new(Semaphore::new(1));
    /// let mut a = PollSemaphore::new(semaphore.clone());
    /// let mut b = a.clone();
    /// let mut cx = Context::from_waker(noop_waker_ref());
    /// let Poll::Ready(Some(permit)) = a.poll_acquire(&mut cx) else { panic!() };
    /// assert!(b.poll_acquire(&mut cx).is_pending()); // queued
    /// drop(permit); // handed to `b`'s queued future
    /// assert!(matches!(b.poll_acquire(&mut cx), Poll::Ready(Some(_))));
    /// assert_eq!(semaphore.available_permits(), 1);
    /// ```
    #[inline]
    pub fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<Option<OwnedSemaphorePermit>> {
        if !self.waiting {
            match self.semaphore.clone().try_acquire_owned() {
                Ok(permit) => return Poll::Ready(Some(permit)),
                Err(TryAcquireError::Closed) => return Poll::Ready(None),
                Err(_) => self.start_wait(),
            }
        }
        self.poll_wait(cx)
    }

    /// Stores a fresh acquire future, reusing the box of the last one.
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
        match acquire.as_mut().poll(cx) {
            Poll::Ready(result) => {
                self.waiting = false;
                Poll::Ready(result.ok())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Clone for PollSemaphore {
    /// The same semaphore, with no wait in progress.
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
