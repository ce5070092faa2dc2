//! `Sleeper`: how a primitive waits for a duration without naming a
//! runtime.
//!
//! * [`ThreadSleeper`]: needs no runtime at all (one shared timer thread).
//! * [`ManualSleeper`]: completes when a [`ManualClock`] passes the
//!   deadline; for tests and simulations.
//! * `TokioSleeper` (feature `tokio`) and `AsyncIoSleeper` (feature
//!   `async-io`): the runtimes' own timers.
//!
//! The sleep future is an associated type, not a boxed future: a wait
//! allocates nothing, and the runtime's timer (tokio's `Sleep` is 100-odd
//! bytes and `!Unpin`) is stored inline in the caller's future. The cost
//! is that `Sleeper` is not object safe; a `Box<dyn Future>` adapter on top
//! is a few lines should anyone need one.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use std::time::Instant;

use crate::clock::{saturating_nanos, Clock, ManualClock};
use crate::sync::{Arc, Mutex, ThreadCondvar, ThreadMutex};

mod default;

pub use default::{DefaultSleep, DefaultSleeper};

/// Something that can wait for a duration.
///
/// # Examples
///
/// ```
/// use backpressure::{Sleeper, ThreadSleeper};
/// use std::time::Duration;
///
/// async fn pause<S: Sleeper>(s: &S) {
///     s.sleep(Duration::from_millis(1)).await;
/// }
/// futures::executor::block_on(pause(&ThreadSleeper::new()));
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

// ---------------------------------------------------------------------------
// ThreadSleeper

/// A sleeper that needs no async runtime.
///
/// All sleeps share one timer thread, started on first use and kept for the
/// life of the process: a min-heap of `(deadline, waker)` behind a mutex,
/// and a condition variable the thread waits on until the earliest
/// deadline (or until an earlier one is pushed). Wakers are woken after the
/// mutex is released. A dropped sleep leaves its heap entry (without its
/// waker) until the deadline passes, so the heap holds at most the sleeps
/// started within the longest pending duration.
///
/// Use it under `futures::executor::block_on` or any executor without a
/// timer; under tokio or smol prefer their own timers (features `tokio`,
/// `async-io`).
///
/// # Panics
///
/// The first sleep panics if the OS refuses to start the timer thread.
///
/// # Examples
///
/// ```
/// use backpressure::{Sleeper, ThreadSleeper};
/// use std::time::{Duration, Instant};
///
/// let start = Instant::now();
/// futures::executor::block_on(ThreadSleeper::new().sleep(Duration::from_millis(2)));
/// assert!(start.elapsed() >= Duration::from_millis(2));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadSleeper {
    _private: (),
}

impl ThreadSleeper {
    /// A handle to the shared timer thread.
    pub const fn new() -> Self {
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

/// The future of [`ThreadSleeper::sleep`].
#[must_use = "futures do nothing unless you .await or poll them"]
#[derive(Debug)]
pub struct ThreadSleep {
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
                let mut fired = false;
                let replaced = {
                    let mut waker = slot.0.lock();
                    match &mut *waker {
                        Some(w) if w.will_wake(cx.waker()) => None,
                        Some(w) => Some(core::mem::replace(w, cx.waker().clone())),
                        None => {
                            fired = true;
                            None
                        }
                    }
                };
                // The old waker is dropped outside the lock.
                drop(replaced);
                if fired {
                    // The timer took the waker between our clock read and
                    // now: the deadline has passed; poll again.
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

// ---------------------------------------------------------------------------
// ManualSleeper

/// A sleeper on a [`ManualClock`]: a sleep completes once the clock has
/// reached its deadline. For deterministic tests of code that waits.
///
/// Moving the clock does not wake anyone by itself (the clock knows nothing
/// of sleepers): call [`advance`](ManualSleeper::advance), which moves the
/// clock and wakes whoever is due, or [`wake_due`](ManualSleeper::wake_due)
/// after moving the clock another way. Clones share the clock and the
/// sleepers.
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, ManualSleeper, Sleeper};
/// use futures::FutureExt;
/// use std::time::Duration;
///
/// let sleeper = ManualSleeper::new(ManualClock::new());
/// let mut nap = Box::pin(sleeper.sleep(Duration::from_secs(5)));
/// assert!(nap.as_mut().now_or_never().is_none());
/// sleeper.advance(Duration::from_secs(4));
/// assert!(nap.as_mut().now_or_never().is_none());
/// sleeper.advance(Duration::from_secs(1));
/// assert!(nap.as_mut().now_or_never().is_some());
/// ```
#[derive(Clone)]
pub struct ManualSleeper {
    clock: ManualClock,
    waiting: Arc<Mutex<Vec<(u64, Waker)>>>,
}

impl ManualSleeper {
    /// A sleeper on `clock` (clones of a `ManualClock` share one time).
    pub fn new(clock: ManualClock) -> Self {
        ManualSleeper {
            clock,
            waiting: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The clock the sleeps are measured on.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Moves the clock forward by `d` and wakes every sleep now due.
    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
        self.wake_due();
    }

    /// Wakes every registered sleep whose deadline the clock has reached;
    /// returns how many.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{ManualClock, ManualSleeper};
    /// let sleeper = ManualSleeper::new(ManualClock::new());
    /// assert_eq!(sleeper.wake_due(), 0);
    /// ```
    pub fn wake_due(&self) -> usize {
        let now = self.clock.now_nanos();
        let due: Vec<Waker> = {
            let mut waiting = self.waiting.lock();
            let (due, keep) = waiting.drain(..).partition(|(at, _)| *at <= now);
            *waiting = keep;
            due.into_iter().map(|(_, w)| w).collect()
        };
        let n = due.len();
        due.into_iter().for_each(Waker::wake);
        n
    }
}

impl fmt::Debug for ManualSleeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualSleeper")
            .field("clock", &self.clock)
            .field("waiting", &self.waiting.lock().len())
            .finish()
    }
}

impl Sleeper for ManualSleeper {
    type Sleep = ManualSleep;

    fn sleep(&self, duration: Duration) -> ManualSleep {
        ManualSleep {
            sleeper: self.clone(),
            deadline: self
                .clock
                .now_nanos()
                .saturating_add(saturating_nanos(duration)),
        }
    }
}

/// The future of [`ManualSleeper::sleep`].
#[must_use = "futures do nothing unless you .await or poll them"]
#[derive(Debug)]
pub struct ManualSleep {
    sleeper: ManualSleeper,
    deadline: u64,
}

impl ManualSleep {
    /// The deadline, in nanoseconds on the sleeper's clock.
    pub fn deadline(&self) -> u64 {
        self.deadline
    }
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.sleeper.clock.now_nanos() >= self.deadline {
            return Poll::Ready(());
        }
        let mut waiting = self.sleeper.waiting.lock();
        if !waiting
            .iter()
            .any(|(at, w)| *at == self.deadline && w.will_wake(cx.waker()))
        {
            waiting.push((self.deadline, cx.waker().clone()));
        }
        Poll::Pending
    }
}

// ---------------------------------------------------------------------------
// Runtime adapters

/// Sleeps with `tokio::time::sleep` (feature `tokio`). Needs a tokio
/// runtime with the time driver enabled.
///
/// # Examples
///
/// ```
/// use backpressure::{Sleeper, TokioSleeper};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// TokioSleeper.sleep(Duration::from_millis(1)).await;
/// # });
/// ```
#[cfg(feature = "tokio")]
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSleeper;

#[cfg(feature = "tokio")]
impl Sleeper for TokioSleeper {
    type Sleep = tokio::time::Sleep;

    #[inline]
    fn sleep(&self, duration: Duration) -> tokio::time::Sleep {
        tokio::time::sleep(duration)
    }
}

/// Sleeps with `async_io::Timer` (feature `async-io`), the timer smol
/// uses; works under any executor.
///
/// # Examples
///
/// ```
/// use backpressure::{AsyncIoSleeper, Sleeper};
/// use std::time::Duration;
///
/// futures::executor::block_on(AsyncIoSleeper.sleep(Duration::from_millis(1)));
/// ```
#[cfg(feature = "async-io")]
#[derive(Clone, Copy, Debug, Default)]
pub struct AsyncIoSleeper;

#[cfg(feature = "async-io")]
impl Sleeper for AsyncIoSleeper {
    type Sleep = AsyncIoSleep;

    #[inline]
    fn sleep(&self, duration: Duration) -> AsyncIoSleep {
        AsyncIoSleep(async_io::Timer::after(duration))
    }
}

/// The future of [`AsyncIoSleeper::sleep`].
#[cfg(feature = "async-io")]
#[must_use = "futures do nothing unless you .await or poll them"]
#[derive(Debug)]
pub struct AsyncIoSleep(async_io::Timer);

#[cfg(feature = "async-io")]
impl Future for AsyncIoSleep {
    type Output = ();

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // `Timer` is `Unpin`.
        Pin::new(&mut self.0).poll(cx).map(drop)
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

    #[test]
    fn manual_sleep_wakes_only_when_due() {
        let sleeper = ManualSleeper::new(ManualClock::new());
        let mut a = Box::pin(sleeper.sleep(Duration::from_nanos(10)));
        let mut b = Box::pin(sleeper.sleep(Duration::from_nanos(20)));
        assert!(a.as_mut().now_or_never().is_none());
        assert!(b.as_mut().now_or_never().is_none());
        sleeper.advance(Duration::from_nanos(10));
        assert_eq!(sleeper.waiting.lock().len(), 1);
        assert!(a.as_mut().now_or_never().is_some());
        assert!(b.as_mut().now_or_never().is_none());
        sleeper.clock().set(25);
        assert_eq!(sleeper.wake_due(), 1);
        assert!(b.as_mut().now_or_never().is_some());
    }
}
