//! `ConcurrencyLimitLayer`'s permit accounting around its fast path (a
//! free permit taken in `poll_ready` without the stored acquire future):
//! counts only, no clocks.

use std::future::{ready, Future, Ready};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use backpressure::tower::ConcurrencyLimitLayer;
use backpressure::Semaphore;
use tower::{Layer, Service};

/// Answers at once.
#[derive(Clone, Copy)]
struct Noop;

impl Service<u32> for Noop {
    type Response = u32;
    type Error = std::convert::Infallible;
    type Future = Ready<Result<u32, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, x: u32) -> Self::Future {
        ready(Ok(x))
    }
}

#[test]
fn a_queued_service_takes_the_permit_it_was_assigned_not_a_free_one() {
    let sem = Arc::new(Semaphore::new(1));
    let layer = ConcurrencyLimitLayer::with_semaphore(sem.clone());
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut a = layer.layer(Noop);
    let mut b = a.clone();

    assert!(a.poll_ready(&mut cx).is_ready());
    let held = a.call(1);
    assert!(b.poll_ready(&mut cx).is_pending(), "queued behind `a`");
    drop(held); // assigned to `b`'s queued acquire
    sem.add_permits(1); // and one more free, with nobody queued
    assert_eq!(sem.available_permits(), 1);

    // `b` must take what it was assigned, not the free permit as well.
    assert!(b.poll_ready(&mut cx).is_ready());
    assert_eq!(sem.available_permits(), 1);
    let fut = b.call(2);
    assert_eq!(sem.available_permits(), 1);
    drop(fut);
    assert_eq!(sem.available_permits(), 2);
}

#[test]
fn the_permit_returns_when_the_response_is_ready_not_when_it_is_dropped() {
    let sem = Arc::new(Semaphore::new(2));
    let mut svc = ConcurrencyLimitLayer::with_semaphore(sem.clone()).layer(Noop);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);

    assert!(svc.poll_ready(&mut cx).is_ready());
    assert_eq!(
        sem.available_permits(),
        1,
        "held between poll_ready and call"
    );
    let mut fut = pin!(svc.call(7));
    assert_eq!(sem.available_permits(), 1, "held by the response future");
    assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(7))));
    assert_eq!(sem.available_permits(), 2, "returned at completion");
}

#[test]
fn a_closed_semaphore_fails_poll_ready_and_reject_mode_says_closed() {
    let sem = Arc::new(Semaphore::new(1));
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut queueing = ConcurrencyLimitLayer::with_semaphore(sem.clone()).layer(Noop);
    let mut rejecting = ConcurrencyLimitLayer::with_semaphore(sem.clone())
        .reject(std::time::Duration::from_millis(5))
        .layer(Noop);
    sem.close();

    let Poll::Ready(Err(e)) = queueing.poll_ready(&mut cx) else {
        panic!("a closed semaphore is an error")
    };
    let t = e.downcast_ref::<backpressure::Throttled>().unwrap();
    assert_eq!(t.status, backpressure::Status::Closed);

    assert!(rejecting.poll_ready(&mut cx).is_ready());
    let mut fut = pin!(rejecting.call(1));
    let Poll::Ready(Err(e)) = fut.as_mut().poll(&mut cx) else {
        panic!("refused")
    };
    // No slot will ever come free: `closed`, not a `shed` with a retry time.
    let t = e.downcast_ref::<backpressure::Throttled>().unwrap();
    assert_eq!(t.status, backpressure::Status::Closed);
    assert_eq!(t.retry_after_ms, None);
}
