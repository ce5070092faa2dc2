//! `Sleeper`: how a primitive waits for a duration without naming a
//! runtime.
//!
//! * [`DefaultSleeper`]: tokio's timer inside a tokio runtime (feature
//!   `tokio`), else the shared timer thread (`ThreadSleeper`).
//! * [`ManualClock`](crate::ManualClock): completes when the clock passes
//!   the deadline; for tests and simulations.
//!
//! The sleep future is an associated type, not a boxed future, so a wait
//! allocates nothing; the cost is that `Sleeper` is not object safe.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use std::time::Instant;

use crate::sync::{ThreadCondvar, ThreadMutex};

mod default;

pub use default::DefaultSleeper;

/// `work`'s output, or `None` if the timer `timer` makes ends first. The
/// timer is made (and boxed) only if `work` is not ready at once: work that
/// answers on its first poll reads no clock and allocates nothing, and the
/// future stays small.
#[cfg(feature = "admission")]
pub(crate) async fn within<F: Future, T: Future<Output = ()>>(
    work: F,
    timer: impl FnOnce() -> T,
) -> Option<F::Output> {
    let mut work = core::pin::pin!(work);
    let mut timer = Some(timer);
    let mut running: Option<core::pin::Pin<Box<T>>> = None;
    core::future::poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        let make = || Box::pin(timer.take().expect("the timer is made once")());
        running
            .get_or_insert_with(make)
            .as_mut()
            .poll(cx)
            .map(|()| None)
    })
    .await
}

/// Something that can wait for a duration: how every waiting type of the
/// crate reaches a timer without naming a runtime. [`DefaultSleeper`] and
/// [`ManualClock`](crate::ManualClock) implement it; another runtime's
/// timer is a few lines.
///
/// # Examples
///
/// smol's (async-io's) timer as a sleeper:
///
/// ```
/// use backpressure::Sleeper;
/// use std::future::Future;
/// use std::time::Duration;
///
/// #[derive(Clone, Copy, Debug)]
/// struct SmolSleeper;
///
/// impl Sleeper for SmolSleeper {
///     type Sleep = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
///     fn sleep(&self, d: Duration) -> Self::Sleep {
///         Box::pin(async move {
///             smol::Timer::after(d).await;
///         })
///     }
/// }
///
/// smol::block_on(SmolSleeper.sleep(Duration::from_millis(1)));
/// ```
pub trait Sleeper {
    /// The future [`sleep`](Sleeper::sleep) returns.
    type Sleep: Future<Output = ()>;

    /// A future that completes once `duration` has passed (not earlier;
    /// possibly a little later, at the timer's resolution).
    fn sleep(&self, duration: Duration) -> Self::Sleep;
}

impl<S: Sleeper + ?Sized> Sleeper for &S {
    type Sleep = S::Sleep;

    #[inline]
    fn sleep(&self, duration: Duration) -> Self::Sleep {
        (**self).sleep(duration)
    }
}

/// A sleeper that needs no async runtime: one shared timer thread. The
/// first sleep panics if the OS refuses to start the thread.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ThreadSleeper {
    _private: (),
}

impl ThreadSleeper {
    /// A handle to the shared timer thread.
    pub(crate) const fn new() -> Self {
        ThreadSleeper { _private: () }
    }
}

impl Sleeper for ThreadSleeper {
    type Sleep = ThreadSleep;

    fn sleep(&self, duration: Duration) -> ThreadSleep {
        ThreadSleep {
            // `None`: further away than `Instant` can say; never completes.
            deadline: Instant::now().checked_add(duration),
            slot: None,
        }
    }
}

/// The future of `ThreadSleeper::sleep`.
#[must_use = "futures do nothing unless you .await or poll them"]
#[derive(Debug)]
pub(crate) struct ThreadSleep {
    deadline: Option<Instant>,
    /// Shared with the heap entry once registered.
    slot: Option<std::sync::Arc<WakerSlot>>,
}

#[derive(Debug, Default)]
struct WakerSlot(ThreadMutex<Option<Waker>>);

struct Entry {
    deadline: Instant,
    slot: std::sync::Arc<WakerSlot>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest.
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        other.deadline.cmp(&self.deadline)
    }
}

struct Timer {
    heap: ThreadMutex<BinaryHeap<Entry>>,
    changed: ThreadCondvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            heap: ThreadMutex::new(BinaryHeap::new()),
            changed: ThreadCondvar::new(),
        }));
        std::thread::Builder::new()
            .name("backpressure-timer".into())
            .spawn(move || timer.run())
            .expect("backpressure: cannot start the ThreadSleeper timer thread");
        timer
    })
}

impl Timer {
    fn run(&self) {
        let mut due = Vec::new();
        let mut heap = self.heap.lock();
        loop {
            let now = Instant::now();
            while heap.peek().is_some_and(|e| e.deadline <= now) {
                due.extend(heap.pop().and_then(|e| e.slot.0.lock().take()));
            }
            if !due.is_empty() {
                // Wake outside the lock.
                drop(heap);
                due.drain(..).for_each(Waker::wake);
                heap = self.heap.lock();
                continue;
            }
            match heap.peek().map(|e| e.deadline) {
                Some(deadline) => {
                    self.changed.wait_until(&mut heap, deadline);
                }
                None => self.changed.wait(&mut heap),
            }
        }
    }

    fn register(&self, deadline: Instant, slot: std::sync::Arc<WakerSlot>) {
        let mut heap = self.heap.lock();
        let earliest = heap.peek().is_none_or(|e| deadline < e.deadline);
        heap.push(Entry { deadline, slot });
        drop(heap);
        if earliest {
            self.changed.notify_one();
        }
    }
}

impl Future for ThreadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Some(deadline) = this.deadline else {
            return Poll::Pending;
        };
        if Instant::now() >= deadline {
            return Poll::Ready(());
        }
        match &this.slot {
            Some(slot) => {
                let mut waker = slot.0.lock();
                let fired = waker.is_none();
                let stale = waker.as_mut().filter(|w| !w.will_wake(cx.waker()));
                let replaced = stale.map(|w| core::mem::replace(w, cx.waker().clone()));
                // The old waker is dropped outside the lock.
                drop(waker);
                drop(replaced);
                if fired {
                    // The timer took the waker after our clock read: poll
                    // again.
                    cx.waker().wake_by_ref();
                }
            }
            None => {
                let slot =
                    std::sync::Arc::new(WakerSlot(ThreadMutex::new(Some(cx.waker().clone()))));
                this.slot = Some(slot.clone());
                timer().register(deadline, slot);
            }
        }
        Poll::Pending
    }
}

impl Drop for ThreadSleep {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            // Leave the entry; drop the waker now, outside the lock.
            let waker = slot.0.lock().take();
            drop(waker);
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn thread_sleeps_complete_in_deadline_order() {
        let order = std::sync::Mutex::new(Vec::new());
        futures::executor::block_on(async {
            let s = ThreadSleeper::new();
            let a = async {
                s.sleep(Duration::from_millis(30)).await;
                order.lock().unwrap().push(30);
            };
            let b = async {
                s.sleep(Duration::from_millis(5)).await;
                order.lock().unwrap().push(5);
            };
            futures::join!(a, b);
        });
        assert_eq!(*order.lock().unwrap(), vec![5, 30]);
    }

    #[test]
    fn dropped_thread_sleep_releases_its_waker() {
        let mut nap = Box::pin(ThreadSleeper::new().sleep(Duration::from_secs(3600)));
        assert!(nap.as_mut().now_or_never().is_none());
        let slot = nap.slot.clone().unwrap();
        drop(nap);
        assert!(slot.0.lock().is_none());
    }
}
