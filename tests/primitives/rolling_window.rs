//! RollingWindow: a cell waits a window after the one `limit` places
//! before it, refusals take nothing, holds and clamped settings. Manual
//! clock: exact instants.

use std::num::NonZeroU32;
use std::time::Duration;

use backpressure::{CheckError, ManualClock, ReserveError, RollingWindow};

fn window(limit: u32, ms: u64) -> (RollingWindow<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let w = RollingWindow::with_clock(
        NonZeroU32::new(limit).unwrap(),
        Duration::from_millis(ms),
        clock.clone(),
    );
    (w, clock)
}

#[test]
fn a_cell_waits_a_window_after_the_one_limit_places_before_it() {
    let (w, clock) = window(2, 100);
    assert_eq!(w.reserve(1, Duration::MAX), Ok(Duration::ZERO));
    clock.advance(Duration::from_millis(30));
    assert_eq!(w.reserve(1, Duration::MAX), Ok(Duration::ZERO));
    assert_eq!(w.reserve(1, Duration::MAX), Ok(Duration::from_millis(70)));
    assert_eq!(w.reserve(1, Duration::MAX), Ok(Duration::from_millis(100)));
    assert_eq!(w.available(), 0);
    assert_eq!(w.reserve(2, Duration::MAX), Ok(Duration::from_millis(200)));
}

#[test]
fn refusals_take_nothing_and_say_when() {
    let (w, clock) = window(3, 1_000);
    assert!(w.try_acquire(2).is_ok());
    assert_eq!(
        w.try_acquire(2),
        Err(CheckError::NotUntil {
            wait: Duration::from_secs(1)
        })
    );
    assert_eq!(
        w.reserve(2, Duration::from_millis(999)),
        Err(ReserveError::RateLimited {
            retry_after: Duration::from_secs(1)
        })
    );
    assert_eq!(w.available(), 1, "nothing was taken by the refusals");
    assert_eq!(
        w.try_acquire(4),
        Err(CheckError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    );
    assert!(w.try_acquire(0).is_ok());
    clock.advance(Duration::from_secs(1));
    assert_eq!(w.available(), 3);
}

#[test]
fn a_hold_admits_nothing_until_it_ends_and_never_shortens() {
    let (w, clock) = window(5, 100);
    w.penalize(Duration::from_millis(500));
    w.penalize(Duration::from_millis(10));
    assert_eq!(w.available(), 0);
    assert_eq!(
        w.try_acquire(1),
        Err(CheckError::NotUntil {
            wait: Duration::from_millis(500)
        })
    );
    clock.advance(Duration::from_millis(500));
    assert_eq!(w.available(), 5);
    w.penalize(Duration::MAX); // saturates
    assert_eq!(w.available(), 0);
}

#[test]
fn settings_are_clamped() {
    let (w, _) = window(1, 0);
    assert_eq!(w.window(), Duration::from_nanos(1));
    let big = RollingWindow::with_clock(
        NonZeroU32::new(u32::MAX).unwrap(),
        Duration::from_secs(1),
        ManualClock::new(),
    );
    assert_eq!(big.limit(), RollingWindow::<ManualClock>::MAX_LIMIT);
}
