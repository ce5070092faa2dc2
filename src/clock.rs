//! Time sources: monotonic nanoseconds from an origin. All time arithmetic
//! in the crate is saturating integer nanoseconds (`u64`).

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::sleep::Sleeper;
use crate::sync::{self, AtomicU64, Ordering, ThreadMutex};

/// A monotonic time source in nanoseconds since some origin. Implementations
/// must never go backwards.
///
/// # Examples
///
/// ```
/// use backpressure::{Clock, ManualClock};
///
/// fn elapsed_since(clock: &dyn Clock, start: u64) -> u64 {
///     clock.now_nanos().saturating_sub(start)
/// }
/// let clock = ManualClock::new();
/// let start = clock.now_nanos();
/// clock.advance(std::time::Duration::from_millis(5));
/// assert_eq!(elapsed_since(&clock, start), 5_000_000);
/// ```
pub trait Clock: Send + Sync + fmt::Debug {
    /// Nanoseconds since this clock's origin.
    fn now_nanos(&self) -> u64;

    /// A cheaper, coarser reading for expiry checks, on a time base of the
    /// clock's own (not comparable with `now_nanos`'s): `(earliest, latest)`
    /// around the true time; successive `earliest`s never go backwards.
    /// `None` (the default) if the clock has none. `DefaultClock` has one on
    /// Linux (`CLOCK_MONOTONIC_COARSE`).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Clock, ManualClock, Quota, TokenBucket};
    /// assert_eq!(ManualClock::new().coarse_bounds(), None);
    /// let bucket = TokenBucket::new(Quota::per_second(std::num::NonZeroU32::MIN));
    /// if let Some((earliest, latest)) = bucket.clock().coarse_bounds() {
    ///     assert!(earliest <= latest);
    /// }
    /// ```
    #[inline]
    fn coarse_bounds(&self) -> Option<(u64, u64)> {
        None
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }
    #[inline]
    fn coarse_bounds(&self) -> Option<(u64, u64)> {
        (**self).coarse_bounds()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }
    #[inline]
    fn coarse_bounds(&self) -> Option<(u64, u64)> {
        (**self).coarse_bounds()
    }
}

/// The default clock of every type (the default `C` parameter, not nameable
/// outside the crate): `quanta` (TSC where available, else the OS monotonic
/// clock), origin at creation.
#[derive(Clone)]
pub struct DefaultClock {
    clock: quanta::Clock,
    /// The origin as a raw (unscaled) reading.
    origin: u64,
    /// How far the coarse clock may lag the true time (0: none).
    coarse_lag: u64,
    /// How the counter is read and scaled (see `tsc.rs`).
    tsc: tsc::Tsc,
}

mod tsc;

impl DefaultClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        // Under miri (no inline assembly) quanta's mock clock stands still.
        #[cfg(miri)]
        let (clock, tsc) = (quanta::Clock::mock().0, tsc::Tsc::OS);
        #[cfg(not(miri))]
        let clock = quanta::Clock::new();
        #[cfg(not(miri))]
        let tsc = tsc::Tsc::detect(&clock);
        let origin = tsc.raw(&clock);
        Self {
            clock,
            origin,
            coarse_lag: coarse::lag(),
            tsc,
        }
    }
}

/// `CLOCK_MONOTONIC_COARSE`: the kernel's monotonic time as of its last
/// tick, read from the vDSO.
#[cfg(all(target_os = "linux", not(miri)))]
mod coarse {
    /// Twice the clock's resolution (a tick, plus one for a late tick); 0 if
    /// unknown or above 10 ms.
    pub(super) fn lag() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable `timespec`.
        let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0;
        match (ok, ts.tv_sec, ts.tv_nsec) {
            (true, 0, res @ 1..=10_000_000) => 2 * res as u64,
            _ => 0,
        }
    }

    #[inline]
    pub(super) fn now() -> Option<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable `timespec`.
        let ok = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0;
        ok.then(|| (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64)
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
mod coarse {
    pub(super) fn lag() -> u64 {
        0
    }

    #[inline]
    pub(super) fn now() -> Option<u64> {
        None
    }
}

impl Default for DefaultClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for DefaultClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        // 0 if the raw counter reads at or before the origin.
        self.tsc.nanos_since(&self.clock, self.origin)
    }

    #[inline]
    fn coarse_bounds(&self) -> Option<(u64, u64)> {
        if self.coarse_lag == 0 {
            return None;
        }
        let earliest = coarse::now()?;
        Some((earliest, earliest.saturating_add(self.coarse_lag)))
    }
}

impl fmt::Debug for DefaultClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DefaultClock")
            .field("now_nanos", &self.now_nanos())
            .finish()
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// It is also a [`Sleeper`]: a sleep completes once the clock reaches its
/// deadline, and [`advance`](ManualClock::advance) and
/// [`set`](ManualClock::set) wake every sleep they make due.
///
/// # Examples
///
/// ```
/// use backpressure::{Clock, ManualClock, Sleeper};
/// use futures::FutureExt;
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let view = clock.clone();
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(view.now_nanos(), 1_000_000_000);
///
/// let mut nap = Box::pin(clock.sleep(Duration::from_secs(5)));
/// assert!(nap.as_mut().now_or_never().is_none());
/// view.advance(Duration::from_secs(5)); // any clone moves it
/// assert!(nap.as_mut().now_or_never().is_some());
///
/// clock.set(u64::MAX);
/// clock.advance(Duration::from_secs(1)); // saturates, never panics
/// assert_eq!(view.now_nanos(), u64::MAX);
/// ```
#[derive(Clone)]
pub struct ManualClock {
    now: sync::Arc<AtomicU64>,
    sleeps: Arc<ManualSleeps>,
}

/// The sleeps registered on a [`ManualClock`]. Plain std atomics: a loom
/// atomic would add a scheduling point to every `advance` in the models.
#[derive(Default)]
struct ManualSleeps {
    /// How many entries `waiting` holds, so a move with no sleeper takes no
    /// lock.
    len: AtomicUsize,
    waiting: ThreadMutex<Vec<(u64, Waker)>>,
}

impl ManualClock {
    /// A clock at 0.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A clock at `nanos`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Clock, ManualClock};
    /// assert_eq!(ManualClock::starting_at(7).now_nanos(), 7);
    /// ```
    pub fn starting_at(nanos: u64) -> Self {
        Self {
            now: sync::Arc::new(AtomicU64::new(nanos)),
            sleeps: Arc::default(),
        }
    }

    /// Moves the clock forward by `d` (saturating at `u64::MAX`) and wakes
    /// every sleep now due.
    pub fn advance(&self, d: Duration) {
        let d = saturating_nanos(d);
        // Relaxed: the clock value orders no other memory (a sleeper's
        // registration is ordered by the SeqCst fences in `wake_due`).
        let _ = self
            .now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(d))
            });
        self.wake_due();
    }

    /// Sets the clock to `nanos` and wakes every sleep now due. A smaller
    /// value is ignored: clocks do not go back.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Clock, ManualClock};
    /// let clock = ManualClock::new();
    /// clock.set(10);
    /// clock.set(5); // ignored: clocks do not go back
    /// assert_eq!(clock.now_nanos(), 10);
    /// ```
    pub fn set(&self, nanos: u64) {
        // Relaxed: as in `advance`.
        self.now.fetch_max(nanos, Ordering::Relaxed);
        self.wake_due();
    }

    /// Wakes the registered sleeps whose deadline the clock has reached.
    fn wake_due(&self) {
        // SeqCst fence, paired with the one in `ManualSleep::poll`: either
        // this move sees the sleeper's `len`, or the sleeper's re-check
        // sees this move's time, so no due sleep is left unwoken.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if self.sleeps.len.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return;
        }
        let now = self.now_nanos();
        let due: Vec<Waker> = {
            let mut waiting = self.sleeps.waiting.lock();
            let (due, keep): (Vec<_>, Vec<_>) = waiting.drain(..).partition(|(at, _)| *at <= now);
            *waiting = keep;
            // Relaxed: a hint read under no lock; the fences order it.
            self.sleeps
                .len
                .store(waiting.len(), std::sync::atomic::Ordering::Relaxed);
            due.into_iter().map(|(_, w)| w).collect()
        };
        due.into_iter().for_each(Waker::wake);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        // Relaxed: as in `advance`.
        self.now.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now_nanos", &self.now_nanos())
            .field(
                "sleeping",
                &self.sleeps.len.load(std::sync::atomic::Ordering::Relaxed),
            )
            .finish()
    }
}

impl Sleeper for ManualClock {
    type Sleep = ManualSleep;

    fn sleep(&self, duration: Duration) -> ManualSleep {
        ManualSleep {
            clock: self.clone(),
            deadline: self.now_nanos().saturating_add(saturating_nanos(duration)),
        }
    }
}

/// The future of a [`ManualClock`]'s sleep.
#[must_use = "futures do nothing unless you .await or poll them"]
#[derive(Debug)]
pub struct ManualSleep {
    clock: ManualClock,
    deadline: u64,
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.clock.now_nanos() >= self.deadline {
            return Poll::Ready(());
        }
        {
            let sleeps = &self.clock.sleeps;
            let mut waiting = sleeps.waiting.lock();
            if !waiting
                .iter()
                .any(|(at, w)| *at == self.deadline && w.will_wake(cx.waker()))
            {
                waiting.push((self.deadline, cx.waker().clone()));
                // Relaxed: ordered against a clock move by the fences.
                sleeps
                    .len
                    .store(waiting.len(), std::sync::atomic::Ordering::Relaxed);
            }
        }
        // SeqCst fence, paired with `wake_due`'s: see there. The entry stays
        // if this returns Ready; the next move that is due drops it.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if self.clock.now_nanos() >= self.deadline {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX`.
#[inline]
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "quanta reads the TSC with inline asm")]
    fn default_clock_is_monotonic() {
        let c = DefaultClock::new();
        let mut last = 0;
        for _ in 0..1000 {
            let now = c.now_nanos();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn saturating_nanos_of_huge_durations() {
        assert_eq!(saturating_nanos(Duration::MAX), u64::MAX);
        assert_eq!(saturating_nanos(Duration::from_nanos(5)), 5);
    }
}
