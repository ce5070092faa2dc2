//! [`DefaultSleeper`]: the runtime's own timer when there is one, else the
//! shared timer thread; the default sleeper of every type that waits.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use super::{Sleeper, ThreadSleep, ThreadSleeper};

/// Sleeps on tokio's timer when called inside a tokio runtime whose time
/// driver is enabled (feature `tokio`), and on a shared timer thread
/// everywhere else.
///
/// The timer thread is started on first use and kept for the life of the
/// process: a min-heap of `(deadline, waker)` behind a mutex and a condvar,
/// waking outside the mutex. A dropped sleep leaves its heap entry (without
/// its waker) until the deadline passes. The first sleep panics if the OS
/// refuses to start the thread.
///
/// The choice is made at each [`sleep`](Sleeper::sleep), so one value
/// serves callers on any runtime. Under tokio a sleep is boxed (tokio's
/// `Sleep` is `!Unpin`), and `tokio::time::pause` works in tests.
///
/// # Examples
///
/// ```
/// use backpressure::{DefaultSleeper, Sleeper};
/// use std::time::Duration;
///
/// // No runtime: the timer thread.
/// futures::executor::block_on(DefaultSleeper::new().sleep(Duration::from_millis(1)));
/// // Inside tokio (with feature `tokio`): tokio's timer.
/// tokio::runtime::Builder::new_current_thread()
///     .enable_time()
///     .build()
///     .unwrap()
///     .block_on(DefaultSleeper::new().sleep(Duration::from_millis(1)));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultSleeper {
    _private: (),
}

impl DefaultSleeper {
    /// The default sleeper.
    pub const fn new() -> Self {
        DefaultSleeper { _private: () }
    }
}

/// The future of [`DefaultSleeper::sleep`].
#[must_use = "futures do nothing unless you .await or poll them"]
#[derive(Debug)]
pub struct DefaultSleep {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Thread(ThreadSleep),
    #[cfg(feature = "tokio")]
    Tokio(Pin<Box<tokio::time::Sleep>>),
}

impl Sleeper for DefaultSleeper {
    type Sleep = DefaultSleep;

    fn sleep(&self, duration: Duration) -> DefaultSleep {
        #[cfg(feature = "tokio")]
        if let Some(sleep) = tokio_sleep(duration) {
            return DefaultSleep {
                inner: Inner::Tokio(sleep),
            };
        }
        DefaultSleep {
            inner: Inner::Thread(ThreadSleeper::new().sleep(duration)),
        }
    }
}

/// tokio's sleep, if this thread is inside a tokio runtime with timers.
#[cfg(feature = "tokio")]
fn tokio_sleep(duration: Duration) -> Option<Pin<Box<tokio::time::Sleep>>> {
    tokio::runtime::Handle::try_current().ok()?;
    // A runtime built without `enable_time` panics in `sleep` (tokio cannot
    // be asked first): it gets the timer thread instead.
    std::panic::catch_unwind(|| Box::pin(tokio::time::sleep(duration))).ok()
}

impl Future for DefaultSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.inner {
            Inner::Thread(sleep) => Pin::new(sleep).poll(cx),
            #[cfg(feature = "tokio")]
            Inner::Tokio(sleep) => sleep.as_mut().poll(cx),
        }
    }
}

#[cfg(all(test, not(feature = "loom"), feature = "tokio"))]
mod tests {
    use super::*;

    #[test]
    fn inside_tokio_the_default_sleeps_on_tokio_time() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let sleep = DefaultSleeper::new().sleep(Duration::from_secs(60));
            assert!(matches!(sleep.inner, Inner::Tokio(_)));
            let start = tokio::time::Instant::now();
            sleep.await;
            assert!(start.elapsed() >= Duration::from_secs(60));
        });
    }

    #[test]
    fn a_tokio_runtime_without_timers_falls_back_to_the_timer_thread() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let sleep = DefaultSleeper::new().sleep(Duration::from_millis(1));
            assert!(matches!(sleep.inner, Inner::Thread(_)));
            sleep.await;
        });
    }

    #[test]
    fn outside_a_runtime_the_default_is_the_timer_thread() {
        let sleep = DefaultSleeper::new().sleep(Duration::from_millis(1));
        assert!(matches!(sleep.inner, Inner::Thread(_)));
        futures::executor::block_on(sleep);
    }
}
