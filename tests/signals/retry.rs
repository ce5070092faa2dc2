//! Edge cases of the retry toolkit: a RetryBudget's clamped settings and
//! decay, a Deadline's stacked charges and the end of time, a Backoff's
//! saturating ceiling and cap. Manual clock: nothing sleeps.

use std::time::Duration;

use backpressure::retry::{Backoff, Deadline, Jitter, RetryBudget};
use backpressure::ManualClock;

#[test]
fn bad_settings_are_clamped_not_a_panic() {
    let c = ManualClock::new();
    let nan = RetryBudget::with_clock(f64::NAN, 0, Duration::ZERO, c.clone());
    nan.deposit();
    assert!(!nan.try_withdraw());
    let huge = RetryBudget::with_clock(f64::INFINITY, 0, Duration::MAX, c);
    for _ in 0..10_000 {
        huge.deposit();
    }
    assert!(huge.available() > 4_000_000.0);
}

#[test]
fn the_balance_decays_with_the_window() {
    let c = ManualClock::new();
    let b = RetryBudget::with_clock(1.0, 0, Duration::from_secs(1), c.clone());
    for _ in 0..100 {
        b.deposit();
    }
    c.advance(Duration::from_secs(5));
    assert!(!b.try_withdraw());
}

#[test]
fn stacked_charges_add_up_until_the_clock_passes_them() {
    let clock = ManualClock::new();
    let mut d = Deadline::after(clock.clone(), Duration::from_secs(10));
    d.charge(Duration::from_secs(4)).unwrap();
    d.charge(Duration::from_secs(4)).unwrap();
    assert_eq!(d.remaining(), Duration::from_secs(2));
    clock.advance(Duration::from_secs(3)); // mid-sleep: still 2 s left
    assert_eq!(d.remaining(), Duration::from_secs(2));
    clock.advance(Duration::from_secs(6)); // past the charged waits
    assert_eq!(d.remaining(), Duration::from_secs(1));
    assert!(d.charge(Duration::from_nanos(1_000_000_001)).is_err());
}

#[test]
fn deadline_at_the_end_of_time_never_overflows() {
    let clock = ManualClock::starting_at(u64::MAX - 1);
    let mut d = Deadline::after(clock.clone(), Duration::MAX);
    assert_eq!(d.at_nanos(), u64::MAX);
    d.charge(Duration::from_nanos(1)).unwrap();
    assert!(d.charge(Duration::from_nanos(1)).is_err());
    assert!(d.is_expired());
    assert!(
        d.charge(Duration::ZERO).is_err(),
        "an expired deadline fits nothing, not even a zero wait"
    );
}

#[test]
fn ceiling_saturates_for_any_attempt() {
    let b = Backoff::new(Duration::from_nanos(u64::MAX / 2 + 1), Duration::MAX);
    assert_eq!(b.ceiling(0), Duration::from_nanos(u64::MAX / 2 + 1));
    assert_eq!(b.ceiling(1), Duration::from_nanos(u64::MAX));
    for attempt in [2, 63, 64, 65, 1_000, u32::MAX] {
        assert_eq!(b.ceiling(attempt), Duration::from_nanos(u64::MAX));
    }
    let zero = Backoff::new(Duration::ZERO, Duration::from_secs(1));
    assert_eq!(zero.ceiling(u32::MAX), Duration::ZERO);
}

#[test]
fn cap_below_base_caps_every_jitter() {
    for jitter in [
        Jitter::None,
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
    ] {
        let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(1))
            .jitter(jitter)
            .seed(1);
        for attempt in 0..100 {
            assert!(b.delay(attempt) <= Duration::from_secs(1), "{jitter:?}");
        }
    }
}
