//! ManualClock: it saturates, never goes back, and its sleeps wake only
//! when the clock reaches them.

use std::future::Future;
use std::task::{Context, Waker};
use std::time::Duration;

use backpressure::{Clock, ManualClock, Sleeper};
use futures::FutureExt;

#[test]
fn manual_clock_saturates_and_never_goes_back() {
    let c = ManualClock::starting_at(u64::MAX - 1);
    c.advance(Duration::MAX);
    assert_eq!(c.now_nanos(), u64::MAX);
    c.set(0);
    assert_eq!(c.now_nanos(), u64::MAX);
}

#[test]
fn manual_sleep_wakes_only_when_due() {
    let clock = ManualClock::new();
    let mut a = Box::pin(clock.sleep(Duration::from_nanos(10)));
    let mut b = Box::pin(clock.sleep(Duration::from_nanos(20)));
    assert!(a.as_mut().now_or_never().is_none());
    assert!(b.as_mut().now_or_never().is_none());
    let (flag, waker) = counting_waker();
    assert!(b
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    clock.advance(Duration::from_nanos(10));
    assert_eq!(
        flag.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "b is not due at 10"
    );
    assert!(a.as_mut().now_or_never().is_some());
    clock.set(25);
    assert_eq!(
        flag.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the move to 25 woke b"
    );
    assert!(b.as_mut().now_or_never().is_some());
}

/// A waker that counts its wakes.
fn counting_waker() -> (std::sync::Arc<std::sync::atomic::AtomicUsize>, Waker) {
    struct Count(std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (n.clone(), Waker::from(std::sync::Arc::new(Count(n))))
}
