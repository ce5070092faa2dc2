//! [`RollingWindow`]: an exact "at most T per rolling window W" limit (a
//! sliding log under one mutex).

use core::fmt;
use core::future::{ready, Future};
use core::num::NonZeroU32;
use core::time::Duration;
use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::bucket::{CheckError, ReserveError};
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::limiter::RateLimiter;

/// At most `limit` cells in any rolling window of `window`, exactly, for a
/// server that counts that way. A [`TokenBucket`] admits `burst + rate x t`
/// over any span `t`, so matching "T per W" with one wastes capacity; this
/// admits T in any window of length W, in bursts of up to T.
///
/// A new cell goes at the earliest instant at least `window` after the cell
/// `limit` places before it. Memory: 8 bytes per cell of the limit.
/// Implements [`RateLimiter`], so it can stand for a credential's request
/// quota ([`Builder::shared_quota`](crate::admission::Builder::shared_quota)).
///
/// [`TokenBucket`]: crate::TokenBucket
///
/// # Examples
///
/// ```
/// use backpressure::{ManualClock, RollingWindow};
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let window = RollingWindow::with_clock(NonZeroU32::new(3).unwrap(), Duration::from_secs(1), clock.clone());
/// assert!(window.try_acquire(3).is_ok()); // the whole limit at once
/// assert!(window.try_acquire(1).is_err());
/// clock.advance(Duration::from_millis(999));
/// assert!(window.try_acquire(1).is_err()); // still inside the window
/// clock.advance(Duration::from_millis(1));
/// assert!(window.try_acquire(3).is_ok()); // the first three left it
/// // A reservation waits for its turn: the cells above leave at 2 s.
/// assert_eq!(window.reserve(1, Duration::from_secs(5)), Ok(Duration::from_secs(1)));
/// ```
pub struct RollingWindow<C: Clock = DefaultClock> {
    limit: u32,
    /// The window, in nanoseconds (at least 1).
    window: u64,
    clock: C,
    log: Mutex<Log>,
}

#[derive(Debug, Default)]
struct Log {
    /// The instants of the last `limit` cells handed out, oldest first.
    cells: VecDeque<u64>,
    /// No cell before this instant: the server's hold.
    held_until: u64,
}

impl RollingWindow {
    /// `limit` per rolling `window`, on the default clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::RollingWindow;
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// // "60 requests per rolling minute".
    /// let window = RollingWindow::new(NonZeroU32::new(60).unwrap(), Duration::from_secs(60));
    /// assert_eq!(window.available(), 60);
    /// ```
    pub fn new(limit: NonZeroU32, window: Duration) -> Self {
        Self::with_clock(limit, window, DefaultClock::new())
    }
}

impl<C: Clock> RollingWindow<C> {
    /// The largest limit kept (8 MiB of log); a larger one is clamped.
    pub const MAX_LIMIT: u32 = 1 << 20;

    /// `limit` (clamped to [`MAX_LIMIT`](Self::MAX_LIMIT)) per rolling
    /// `window` (at least 1 ns), on `clock`.
    pub fn with_clock(limit: NonZeroU32, window: Duration, clock: C) -> Self {
        Self {
            limit: limit.get().min(Self::MAX_LIMIT),
            window: saturating_nanos(window).max(1),
            clock,
            log: Mutex::new(Log::default()),
        }
    }

    /// The limit per window.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The earliest instant `n` cells fit (`n <= limit`), from `now`.
    fn slot(&self, log: &Log, n: u32, now: u64) -> u64 {
        let at = now.max(log.held_until);
        // The new cells go a window after the cell `limit` places before.
        let len = log.cells.len();
        let n = n as usize;
        let limit = self.limit as usize;
        if len + n <= limit {
            return at;
        }
        let before = log.cells[len + n - limit - 1];
        at.max(before.saturating_add(self.window))
    }

    fn take(&self, log: &mut Log, n: u32, at: u64) {
        log.cells.extend(std::iter::repeat_n(at, n as usize));
        while log.cells.len() > self.limit as usize {
            log.cells.pop_front();
        }
    }

    /// Takes `n` cells now, or none.
    ///
    /// # Errors
    ///
    /// [`CheckError::NotUntil`] with the wait until they would fit, or
    /// [`CheckError::InsufficientCapacity`] when `n` is above the limit.
    pub fn try_acquire(&self, n: u32) -> Result<(), CheckError> {
        // A reservation with no wait allowed takes its cells now, or none.
        self.reserve(n, Duration::ZERO)
            .map(drop)
            .map_err(ReserveError::into_check)
    }

    /// Takes `n` cells at the earliest instant they fit, if that is within
    /// `max_wait`, and returns the wait; the cells stay taken.
    ///
    /// # Errors
    ///
    /// [`ReserveError::RateLimited`] when the wait is longer than `max_wait`
    /// (nothing is taken), or [`ReserveError::InsufficientCapacity`].
    pub fn reserve(&self, n: u32, max_wait: Duration) -> Result<Duration, ReserveError> {
        if n > self.limit {
            return Err(ReserveError::InsufficientCapacity {
                requested: n,
                capacity: self.limit,
            });
        }
        let now = self.clock.now_nanos();
        let mut log = self.log.lock();
        let at = self.slot(&log, n, now);
        let wait = Duration::from_nanos(at - now);
        if wait > max_wait {
            return Err(ReserveError::RateLimited { retry_after: wait });
        }
        self.take(&mut log, n, at);
        Ok(wait)
    }

    /// The server said "not before `retry_after`": no cell is handed out
    /// until then. A hold never shortens one already running.
    pub fn penalize(&self, retry_after: Duration) {
        let until = self
            .clock
            .now_nanos()
            .saturating_add(saturating_nanos(retry_after));
        let mut log = self.log.lock();
        log.held_until = log.held_until.max(until);
    }

    /// How many cells [`try_acquire`](Self::try_acquire) would take now
    /// (0 while held).
    pub fn available(&self) -> u32 {
        let now = self.clock.now_nanos();
        let log = self.log.lock();
        if log.held_until > now {
            return 0;
        }
        // Cells still inside a window that reaches now (future ones too).
        let live = log
            .cells
            .iter()
            .rev()
            .take_while(|&&at| at.saturating_add(self.window) > now)
            .count();
        self.limit - u32::try_from(live).unwrap_or(self.limit)
    }
}

impl<C: Clock> RateLimiter for RollingWindow<C> {
    fn try_acquire(&self, n: u32) -> impl Future<Output = Result<(), CheckError>> + Send {
        ready(RollingWindow::try_acquire(self, n))
    }

    fn reserve(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Duration, ReserveError>> + Send {
        ready(RollingWindow::reserve(self, n, max_wait))
    }

    fn penalize(&self, retry_after: Duration) -> impl Future<Output = ()> + Send {
        RollingWindow::penalize(self, retry_after);
        ready(())
    }

    fn available(&self) -> impl Future<Output = u32> + Send {
        ready(RollingWindow::available(self))
    }
}

impl<C: Clock> fmt::Debug for RollingWindow<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RollingWindow")
            .field("limit", &self.limit)
            .field("window", &self.window())
            .field("available", &self.available())
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const MS: u64 = 1_000_000;

    fn window(limit: u32, ms: u64) -> (RollingWindow<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        let w = RollingWindow::with_clock(
            NonZeroU32::new(limit).unwrap(),
            Duration::from_millis(ms),
            clock.clone(),
        );
        (w, clock)
    }

    /// At most `limit` of `starts` (sorted) in any window of `w` ns.
    fn busiest(starts: &[u64], w: u64) -> usize {
        let mut most = 0;
        let mut from = 0;
        for (i, &t) in starts.iter().enumerate() {
            while starts[from] + w <= t {
                from += 1;
            }
            most = most.max(i + 1 - from);
        }
        most
    }

    /// Random schedules never put more than 10 in any 1 s window, and a
    /// backlog uses at least 95% of the capacity.
    #[test]
    fn random_schedules_never_put_more_than_the_limit_in_any_window() {
        for seed in 0..8 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let (w, clock) = window(10, 1_000);
            let mut starts = Vec::new();
            for _ in 0..1_000 {
                let gap = match rng.u8(..10) {
                    0 => rng.u64(..3_000 * MS),
                    1..=5 => 0,
                    _ => rng.u64(..150 * MS),
                };
                clock.advance(Duration::from_nanos(gap));
                let n = if rng.u8(..10) == 0 { rng.u32(1..=3) } else { 1 };
                let wait = w.reserve(n, Duration::MAX).unwrap();
                let at = clock.now_nanos() + u64::try_from(wait.as_nanos()).unwrap();
                starts.extend(std::iter::repeat_n(at, n as usize));
                assert!(w.log.lock().cells.len() <= 10);
            }
            starts.sort_unstable();
            assert!(busiest(&starts, 1_000 * MS) <= 10, "seed {seed}");
        }
        let (w, _) = window(10, 1_000);
        let last = (0..1_000)
            .map(|_| w.reserve(1, Duration::MAX).unwrap())
            .max()
            .unwrap();
        let used = 1_000.0 / ((last.as_secs_f64() + 1.0) * 10.0);
        assert!(used >= 0.95, "{used}");
    }
}
