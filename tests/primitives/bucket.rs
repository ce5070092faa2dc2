//! TokenBucket: deterministic tests on a ManualClock, plus one multi-thread
//! test on the real clock that asserts counts, never durations.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backpressure::{CheckError, Clock, ManualClock, Quota, ReserveError, TokenBucket};
use futures::FutureExt;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

const MS: Duration = Duration::from_millis(1);

/// 10/s (one per 100 ms), burst 3.
fn bucket() -> (TokenBucket<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let q = Quota::per_second(nz(10)).allow_burst(nz(3));
    (TokenBucket::with_clock(q, clock.clone()), clock)
}

fn admit_all(b: &TokenBucket<ManualClock>) -> u32 {
    let mut n = 0;
    while b.try_acquire(1).is_ok() {
        n += 1;
    }
    n
}

#[test]
fn burst_then_one_per_period() {
    let (b, clock) = bucket();
    assert_eq!(admit_all(&b), 3);
    for _ in 0..50 {
        clock.advance(99 * MS);
        assert_eq!(admit_all(&b), 0, "a cell before its period elapsed");
        clock.advance(MS);
        assert_eq!(admit_all(&b), 1);
    }
    // Idle long enough refills to the burst, no further.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(b.available(), 3);
    assert_eq!(admit_all(&b), 3);
}

#[test]
fn admitted_in_any_window_is_bounded_exactly() {
    // Poll every 7 ms for 10 s, count admissions per sliding 1 s window.
    let (b, clock) = bucket();
    let mut admitted_at = Vec::new();
    for step in 0..1430u64 {
        while b.try_acquire(1).is_ok() {
            admitted_at.push(step * 7);
        }
        clock.advance(7 * MS);
    }
    for (i, &start) in admitted_at.iter().enumerate() {
        let in_window = admitted_at[i..]
            .iter()
            .take_while(|&&t| t < start + 1000)
            .count();
        // burst + rate * t, t = 1 s.
        assert!(
            in_window <= 3 + 10,
            "{in_window} admitted in 1 s from {start} ms"
        );
    }
    // Steady state is the rate: 3 + 10 s * 10/s (+1 for the last edge).
    assert!(
        (100..=104).contains(&admitted_at.len()),
        "{}",
        admitted_at.len()
    );
}

#[test]
fn denial_reports_the_wait_and_consumes_nothing() {
    let (b, clock) = bucket();
    b.try_acquire(3).unwrap();
    clock.advance(30 * MS);
    for _ in 0..100 {
        assert_eq!(
            b.try_acquire(2),
            Err(CheckError::NotUntil { wait: 170 * MS })
        );
    }
    clock.advance(170 * MS);
    assert!(b.try_acquire(2).is_ok());
}

#[test]
fn more_than_the_burst_is_insufficient_capacity() {
    let (b, _) = bucket();
    assert_eq!(
        b.try_acquire(4),
        Err(CheckError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    );
    assert_eq!(
        b.reserve(4, Duration::MAX).unwrap_err(),
        ReserveError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }
    );
    assert_eq!(b.available(), 3, "a refusal consumed something");
    assert!(b.try_acquire(0).is_ok());
    assert_eq!(b.reserve(0, Duration::ZERO).unwrap().wait(), Duration::ZERO);
}

#[test]
fn reserve_just_below_at_and_above_the_wait() {
    let (b, _) = bucket();
    b.try_acquire(3).unwrap();
    let wait = 100 * MS;
    let below = b.reserve(1, wait - Duration::from_nanos(1)).unwrap_err();
    assert_eq!(below, ReserveError::RateLimited { retry_after: wait });
    // The refusal took nothing: the same wait again, exactly.
    let at = b.reserve(1, wait).unwrap();
    assert_eq!(at.wait(), wait);
    assert_eq!(at.ready_at(), 100_000_000);
    // Stacked: the next one is a period later.
    let above = b.reserve(1, wait * 3).unwrap();
    assert_eq!(above.wait(), 2 * wait);
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(3 * wait));
}

#[test]
fn reserve_counts_against_the_rate_like_admission() {
    // Reserving far ahead is bounded by the rate: 3 now, then one per
    // 100 ms.
    let (b, _) = bucket();
    let waits: Vec<_> = (0..10)
        .map(|_| b.reserve(1, Duration::from_secs(10)).unwrap().wait())
        .collect();
    let want: Vec<_> = [0, 0, 0, 100, 200, 300, 400, 500, 600, 700]
        .iter()
        .map(|&ms| ms * MS)
        .collect();
    assert_eq!(waits, want);
}

#[test]
fn cancel_refunds_only_the_top_reservation() {
    let (b, clock) = bucket();
    b.try_acquire(3).unwrap();
    let r1 = b.reserve(1, Duration::from_secs(1)).unwrap();
    let r2 = b.reserve(1, Duration::from_secs(1)).unwrap();
    assert_eq!(r2.wait(), 200 * MS);
    assert!(!r1.cancel(), "r2 is stacked on r1");
    assert!(r2.cancel());
    // Exactly r2's cell came back: the next reservation waits 200 ms.
    let r3 = b.reserve(1, Duration::from_secs(1)).unwrap();
    assert_eq!(r3.wait(), 200 * MS);

    // A cancel after time passed gives back what is left, never more than
    // the burst.
    clock.advance(Duration::from_secs(10));
    assert!(r3.cancel());
    assert_eq!(b.available(), 3);
}

#[test]
fn cancel_after_an_admission_or_penalty_is_refused() {
    let (b, _) = bucket();
    let r = b.reserve(2, Duration::ZERO).unwrap();
    b.try_acquire(1).unwrap();
    assert!(!r.cancel());
    assert_eq!(b.available(), 0);

    let (b, _) = bucket();
    let r = b.reserve(1, Duration::ZERO).unwrap();
    b.penalize(MS);
    assert!(!r.cancel());
}

#[test]
fn cancel_after_reset_or_quota_change_is_refused() {
    let (b, _) = bucket();
    let r = b.reserve(3, Duration::ZERO).unwrap();
    b.reset();
    // Pushing the state back to exactly what `r` wrote must not let its
    // stale cancel through.
    b.try_acquire(3).unwrap();
    assert!(!r.cancel());
    assert_eq!(b.available(), 0);

    let (b, _) = bucket();
    let r = b.reserve(1, Duration::ZERO).unwrap();
    b.set_quota(Quota::per_second(nz(20)).allow_burst(nz(3)));
    assert!(!r.cancel());
}

#[test]
fn penalize_admits_nothing_before_the_retry_time() {
    let (b, clock) = bucket();
    b.penalize(Duration::from_secs(5));
    assert_eq!(b.available(), 0);
    assert_eq!(
        b.try_acquire(1).unwrap_err().wait(),
        Some(Duration::from_secs(5))
    );
    let r = b.reserve(1, Duration::from_secs(4)).unwrap_err();
    assert_eq!(r.retry_after(), Some(Duration::from_secs(5)));
    clock.advance(Duration::from_secs(5) - Duration::from_nanos(1));
    assert!(b.try_acquire(1).is_err());
    clock.advance(Duration::from_nanos(1));
    // One cell at the retry time, then the rate: no burst after a 429.
    assert_eq!(admit_all(&b), 1);
    clock.advance(100 * MS);
    assert_eq!(admit_all(&b), 1);
    // A shorter penalty than the current debt does not move the wait (it
    // only voids refunds; see `cancel_cannot_undercut_a_shorter_penalty`).
    b.try_acquire(1).unwrap_err();
    b.penalize(MS);
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(100 * MS));
}

#[test]
fn quota_change_keeps_debt_in_cells() {
    let (b, clock) = bucket();
    b.try_acquire(3).unwrap();
    // Raising the burst keeps the 3 cells of debt: the 47 cells never
    // taken are there at once, the 3 taken come back at the rate.
    b.set_quota(Quota::per_second(nz(10)).allow_burst(nz(50)));
    assert_eq!(b.available(), 47);
    assert_eq!(admit_all(&b), 47);
    clock.advance(100 * MS);
    assert_eq!(admit_all(&b), 1);
    // It refills to the new burst over time.
    clock.advance(Duration::from_secs(60));
    assert_eq!(b.available(), 50);

    // Lowering the burst below the debt keeps the debt: the bucket is
    // over-drawn until the 3 cells taken have refilled (issue #21, 7: a
    // quota change forgives nothing; it used to clamp them to the burst).
    let (b, clock) = bucket();
    b.try_acquire(3).unwrap();
    b.set_quota(Quota::per_second(nz(10)).allow_burst(nz(1)));
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(300 * MS));
    clock.advance(300 * MS);
    assert_eq!(admit_all(&b), 1);

    // Raising the rate: the same cells of debt, now shorter.
    let (b, clock) = bucket();
    b.try_acquire(3).unwrap();
    b.set_quota(Quota::per_second(nz(100)).allow_burst(nz(3)));
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(10 * MS));
    clock.advance(30 * MS);
    assert_eq!(admit_all(&b), 3);

    // Lowering the rate makes the debt last longer, in cells.
    let (b, clock) = bucket();
    b.try_acquire(3).unwrap(); // 3 cells of debt
    b.set_quota(Quota::per_second(nz(1)).allow_burst(nz(3)));
    assert_eq!(
        b.try_acquire(1).unwrap_err().wait(),
        Some(Duration::from_secs(1))
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(admit_all(&b), 1);

    // A penalty survives a rate and burst increase, to the nanosecond.
    let (b, clock) = bucket();
    b.penalize(Duration::from_secs(2));
    b.set_quota(Quota::per_second(nz(1000)));
    assert_eq!(
        b.try_acquire(1).unwrap_err().wait(),
        Some(Duration::from_secs(2))
    );
    clock.advance(Duration::from_secs(2));
    assert!(b.try_acquire(1).is_ok());
    assert!(b.try_acquire(1).is_err());
    assert_eq!(b.quota(), Quota::per_second(nz(1000)));

    // Mid-stream: the same quota again changes nothing.
    let (b, _) = bucket();
    b.try_acquire(1).unwrap();
    let r = b.reserve(1, Duration::ZERO).unwrap();
    b.set_quota(b.quota());
    assert_eq!(b.available(), 1);
    assert!(r.cancel());
}

/// Issue #10, item 1: `set_quota` added a period whenever the burst grew
/// (and a 1 ns fence every time) and never took it back, so flipping
/// between two quotas with nothing admitted locked the bucket out without
/// bound (0 available, a 9.1 s wait after 100 flips).
#[test]
fn set_quota_flipping_invents_no_debt() {
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let a = Quota::per_second(nz(10));
    let b = a.allow_burst(nz(9));
    let bucket = TokenBucket::with_clock(a, clock.clone());
    for _ in 0..100 {
        bucket.set_quota(b);
        bucket.set_quota(a);
    }
    // Nothing was admitted: a full bucket stays full.
    assert_eq!(bucket.available(), 10);
    clock.advance(200 * MS);
    assert!(bucket.available() >= 9);
    clock.advance(Duration::from_secs(2));
    assert_eq!(bucket.available(), 10);

    // With debt: flipping keeps it, and never adds to it.
    bucket.try_acquire(4).unwrap();
    for _ in 0..100 {
        bucket.set_quota(b);
        bucket.set_quota(a);
    }
    assert_eq!(bucket.available(), 6);
    clock.advance(400 * MS);
    assert_eq!(bucket.available(), 10);

    // Drained, and across rates too: the debt ends where it was.
    let slow = Quota::per_second(nz(1)).allow_burst(nz(10));
    bucket.try_acquire(10).unwrap();
    for _ in 0..100 {
        bucket.set_quota(slow);
        bucket.set_quota(a);
    }
    assert_eq!(bucket.try_acquire(1).unwrap_err().wait(), Some(100 * MS));
    clock.advance(Duration::from_secs(1));
    assert_eq!(bucket.available(), 10);
    // A burst below the debt keeps it: 10 cells of debt under burst 9
    // stay 10, however many trips (they used to be clamped to 9).
    bucket.try_acquire(10).unwrap();
    for _ in 0..100 {
        bucket.set_quota(b);
        bucket.set_quota(slow);
        bucket.set_quota(a);
    }
    assert_eq!(bucket.available(), 0);
    assert_eq!(bucket.try_acquire(1).unwrap_err().wait(), Some(100 * MS));
    clock.advance(Duration::from_secs(1));
    assert_eq!(bucket.available(), 10);

    // A penalty is kept as it was, not stretched.
    bucket.penalize(Duration::from_secs(5));
    for _ in 0..100 {
        bucket.set_quota(slow);
        bucket.set_quota(b);
        bucket.set_quota(a);
    }
    assert_eq!(
        bucket.try_acquire(1).unwrap_err().wait(),
        Some(Duration::from_secs(5))
    );
}

#[test]
fn reset_refills_and_forgets_penalties() {
    let (b, _) = bucket();
    b.penalize(Duration::from_secs(3600));
    b.reset();
    assert_eq!(admit_all(&b), 3);
}

#[test]
fn saturates_at_clock_extremes() {
    // A clock at u64::MAX: a cell's new arrival time cannot be stored, so
    // nothing is admitted, and nothing panics.
    let clock = ManualClock::starting_at(u64::MAX);
    let b = TokenBucket::with_clock(Quota::per_second(nz(10)), clock.clone());
    assert!(b.try_acquire(1).is_err());
    assert!(b.reserve(1, Duration::MAX).is_err());
    b.penalize(Duration::MAX);
    b.set_quota(Quota::with_period(Duration::MAX).allow_burst(NonZeroU32::MAX));
    assert_eq!(b.available(), 0);
    b.reset();
    clock.advance(Duration::MAX);

    // Close to the end, the last cells that still fit are admitted.
    let clock = ManualClock::starting_at(u64::MAX - 250);
    let b = TokenBucket::with_clock(
        Quota::with_period(Duration::from_nanos(100)).allow_burst(nz(5)),
        clock,
    );
    assert_eq!(b.available(), 2);
    assert_eq!(admit_all_generic(&b), 2);

    // A huge quota: tolerance saturates, cells still fit.
    let b = TokenBucket::with_clock(
        Quota::with_period(Duration::MAX).allow_burst(NonZeroU32::MAX),
        ManualClock::new(),
    );
    assert!(b.try_acquire(1).is_ok());
    assert!(b.try_acquire(1).is_err());
    b.penalize(Duration::MAX);
    assert_eq!(
        b.reserve(1, Duration::MAX).unwrap_err().retry_after(),
        Some(Duration::from_nanos(u64::MAX))
    );
}

fn admit_all_generic<C: Clock>(b: &TokenBucket<C>) -> u32 {
    let mut n = 0;
    while b.try_acquire(1).is_ok() {
        n += 1;
    }
    n
}

#[test]
fn until_ready_sleeps_exactly_the_reserved_wait() {
    let (b, clock) = bucket();
    let sleeper = clock.clone();
    b.try_acquire(3).unwrap();
    let mut fut = Box::pin(b.until_ready(2, Duration::from_secs(1), &sleeper));
    assert!(fut.as_mut().now_or_never().is_none());
    // The cells are taken while it sleeps: nobody else gets them.
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(300 * MS));
    sleeper.advance(199 * MS);
    assert!(fut.as_mut().now_or_never().is_none());
    sleeper.advance(MS);
    assert_eq!(fut.as_mut().now_or_never(), Some(Ok(())));
    assert_eq!(clock.now_nanos(), 200_000_000);
}

/// Issue #21, item 11: a `penalize` (a 429 another caller heard) that
/// lands while `until_ready` sleeps towards its reserved cells sends it
/// behind the hold; before, it went at its old instant, into the 429.
#[test]
fn until_ready_ignores_a_hold_placed_while_it_sleeps() {
    let (b, clock) = bucket();
    let sleeper = clock.clone();
    b.try_acquire(3).unwrap();
    let mut fut = Box::pin(b.until_ready(1, Duration::from_secs(5), &sleeper));
    assert!(
        fut.as_mut().now_or_never().is_none(),
        "its cell is 100 ms away"
    );
    sleeper.advance(50 * MS);
    b.penalize(Duration::from_secs(2));
    // Past its old instant, inside the hold: it has not gone.
    sleeper.advance(100 * MS);
    assert!(
        fut.as_mut().now_or_never().is_none(),
        "went inside the hold"
    );
    sleeper.advance(1_900 * MS);
    assert_eq!(fut.as_mut().now_or_never(), Some(Ok(())));
    assert_eq!(clock.now_nanos(), 2_050_000_000, "at the hold's end");
    // A hold ends with the bucket drained to one cell: the sleeper's.
    assert_eq!(admit_all(&b), 0);

    // A hold that ends before the reserved instant changes nothing.
    let (b, clock) = bucket();
    let sleeper = clock.clone();
    b.try_acquire(3).unwrap();
    let mut fut = Box::pin(b.until_ready(3, Duration::from_secs(5), &sleeper));
    assert!(fut.as_mut().now_or_never().is_none());
    b.penalize(Duration::from_millis(100));
    sleeper.advance(300 * MS);
    assert_eq!(fut.as_mut().now_or_never(), Some(Ok(())));
    assert_eq!(clock.now_nanos(), 300_000_000);
}

/// The same for a `Scoped` key, and a hold longer than the budget that is
/// left refuses instead of sleeping past it.
#[test]
fn scoped_until_ready_ignores_a_hold_placed_while_it_sleeps() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let limits = backpressure::Scoped::with_clock(
        Quota::per_second(nz(10)).allow_burst(nz(1)),
        clock.clone(),
    );
    limits.try_acquire(&"k", 1).unwrap();
    let mut fut = Box::pin(limits.until_ready(&"k", 1, Duration::from_secs(1), &sleeper));
    assert!(fut.as_mut().now_or_never().is_none());
    limits.penalize(&"k", Duration::from_secs(3)).unwrap();
    sleeper.advance(100 * MS);
    match fut.as_mut().now_or_never() {
        Some(Err(ReserveError::RateLimited { retry_after })) => {
            assert!(retry_after > Duration::from_secs(2), "{retry_after:?}")
        }
        other => panic!("went or slept on inside a 3 s hold: {other:?}"),
    }
}

#[test]
fn until_ready_never_sleeps_past_its_budget() {
    let (b, clock) = bucket();
    let sleeper = clock;
    b.try_acquire(3).unwrap();
    let got = b
        .until_ready(1, 99 * MS, &sleeper)
        .now_or_never()
        .expect("a refusal must not sleep");
    assert_eq!(
        got,
        Err(ReserveError::RateLimited {
            retry_after: 100 * MS
        })
    );
    // Nothing was consumed.
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(100 * MS));
}

#[test]
fn dropping_until_ready_gives_the_cells_back() {
    let (b, clock) = bucket();
    let sleeper = clock;
    b.try_acquire(3).unwrap();
    let mut fut = Box::pin(b.until_ready(1, Duration::from_secs(1), &sleeper));
    assert!(fut.as_mut().now_or_never().is_none());
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(200 * MS));
    drop(fut);
    assert_eq!(b.try_acquire(1).unwrap_err().wait(), Some(100 * MS));
}

#[test]
fn works_through_the_rate_limiter_trait() {
    use backpressure::RateLimiter;
    // The one seam, generic: ready futures over the same bucket state.
    async fn available<L: RateLimiter>(l: &L) -> u32 {
        l.available().await
    }
    let (b, clock) = bucket();
    futures::executor::block_on(async {
        assert_eq!(available(&b).await, 3);
        RateLimiter::try_acquire(&b, 2).await.unwrap();
        assert_eq!(available(&b).await, 1);
        // Reserved through the trait, the cell stays taken.
        assert_eq!(
            RateLimiter::reserve(&b, 1, Duration::ZERO).await,
            Ok(Duration::ZERO)
        );
        assert_eq!(available(&b).await, 0);
        RateLimiter::penalize(&b, Duration::from_secs(1)).await;
        clock.advance(Duration::from_millis(500)); // 5 cells' worth of time
        assert_eq!(available(&b).await, 0, "held by the penalty");
        clock.advance(Duration::from_millis(500));
        assert!(available(&b).await > 0, "free once the hold ends");
    });
}

#[test]
fn many_threads_never_exceed_burst_plus_rate() {
    // 4 threads spin on try_acquire for ~200 ms of real time. Count, do not
    // time: admitted <= burst + rate * elapsed + 1, where elapsed is read
    // from the bucket's own clock after the last admission.
    let quota = Quota::per_second(nz(1000)).allow_burst(nz(20));
    let b = Arc::new(TokenBucket::new(quota));
    let start = b.clock().now_nanos();
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (b, admitted, stop) = (b.clone(), admitted.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let ok = if i % 2 == 0 {
                        b.try_acquire(1).is_ok()
                    } else {
                        b.reserve(1, Duration::ZERO).is_ok()
                    };
                    if ok {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = b.clock().now_nanos() - start;
    let admitted = admitted.load(Ordering::Relaxed);
    let bound = 20 + elapsed / 1_000_000 + 1;
    assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
    // And the bucket was not starved: at least the burst got through.
    assert!(admitted >= 20, "admitted only {admitted}");
}

/// Regression: a penalty shorter than the bucket's debt wrote nothing, so
/// cancelling the reservation that made the debt lowered the bucket below
/// the penalty and admitted a call before the server's Retry-After.
#[test]
fn cancel_cannot_undercut_a_shorter_penalty() {
    let clock = ManualClock::new();
    let b = TokenBucket::with_clock(Quota::per_second(nz(1)).allow_burst(nz(5)), clock.clone());
    b.try_acquire(5).unwrap(); // the burst is spent: next cell in 1 s
    let r = b.reserve(3, Duration::from_secs(10)).unwrap(); // debt up to 4 s out
    b.penalize(Duration::from_secs(2)); // shorter than the debt
    assert!(!r.cancel(), "the refund would undercut the penalty");
    clock.advance(Duration::from_millis(1500));
    assert!(b.try_acquire(1).is_err(), "admitted before Retry-After");
}

/// `penalize(0)` (a `Retry-After: 0`) drained a full burst to one cell: a
/// "retry now" removed the headroom the bucket had.
#[test]
fn a_zero_penalty_keeps_the_headroom() {
    use backpressure::{ManualClock, Quota, TokenBucket};
    use std::num::NonZeroU32;
    let bucket = TokenBucket::with_clock(
        Quota::per_second(NonZeroU32::new(10).unwrap()),
        ManualClock::new(),
    );
    bucket.try_acquire(2).unwrap();
    bucket.penalize(std::time::Duration::ZERO);
    assert_eq!(bucket.available(), 8);
}

/// Issue #21, item 12: a period of 2^62 ns or more with a burst above 1
/// granted part of the burst, then reported 584-year waits (the instants
/// overflowed). The burst is capped to what refills within 2^62 ns (at
/// least one cell), and the wait after it is the period's own.
#[test]
fn a_period_of_2_62_ns_grants_its_capped_burst_and_an_honest_wait() {
    for (period, granted) in [(1u64 << 61, 2u32), (1 << 62, 1), (u64::MAX, 1)] {
        let clock = ManualClock::new();
        let q = Quota::with_period(Duration::from_nanos(period)).allow_burst(nz(10));
        let b = TokenBucket::with_clock(q, clock);
        assert_eq!(b.quota().burst().get(), granted, "period {period}");
        assert_eq!(admit_all(&b), granted, "period {period}");
        match b.try_acquire(1) {
            Err(CheckError::NotUntil { wait }) => {
                assert_eq!(wait, Duration::from_nanos(period), "period {period}")
            }
            other => panic!("period {period}: {other:?}"),
        }
    }
}

/// cargo-mutants: nothing read a bucket's `Debug`. It is what a user
/// logging a bucket sees: the quota and the state word, in units.
#[test]
fn debug_shows_the_quota_and_the_state() {
    let (b, clock) = bucket();
    clock.advance(Duration::from_secs(1));
    b.try_acquire(1).unwrap();
    let s = format!("{b:?}");
    for part in ["TokenBucket", "period: 100000000", "burst: 3", "tat: "] {
        assert!(s.contains(part), "{part:?} missing from {s}");
    }
}

/// `RateLimiter::reserve_after` (issue #43): the cells are taken as of the
/// instant the call goes, the wait is from now, and a refusal says how long
/// from now, with nothing taken.
#[test]
fn reserve_after_takes_the_cells_then_and_refuses_with_the_wait_from_now() {
    use backpressure::RateLimiter;
    let clock = ManualClock::new();
    // 10/s, burst 10: one cell per 100 ms.
    let b = TokenBucket::with_clock(Quota::per_second(nz(10)), clock.clone());
    let ms = Duration::from_millis;
    let after = |n, not_before, max_wait| {
        RateLimiter::reserve_after(&b, n, not_before, max_wait)
            .now_or_never()
            .unwrap()
    };
    let refused = |retry_after| Err(ReserveError::RateLimited { retry_after });
    b.try_acquire(10).unwrap();
    // Five cells are usable in 500 ms, for a call that may not go before
    // 200 ms: beyond its 300 ms budget, refused with the wait from now.
    assert_eq!(after(5, ms(200), ms(300)), refused(ms(500)));
    assert_eq!(b.available(), 0, "nothing taken");
    // Within 600 ms: granted at 500 ms.
    assert_eq!(after(5, ms(200), ms(600)), Ok(ms(500)));
    // Not before past the budget: refused at once, nothing taken.
    assert_eq!(after(1, ms(700), ms(600)), refused(ms(700)));
    // The burst's ten are back at 1 s, less the five.
    clock.advance(ms(1_000));
    assert_eq!(b.available(), 5);
}

/// `reserve_after`'s default (a limiter that does not take cells at an
/// instant, here `RollingWindow`): reserved now, the wait the longer of
/// the two, and the same refusal past `max_wait`.
#[test]
fn reserve_after_by_default_reserves_now_and_waits_the_longer() {
    use backpressure::{RateLimiter, RollingWindow};
    let ms = Duration::from_millis;
    let window = RollingWindow::with_clock(nz(2), ms(1_000), ManualClock::new());
    let after = |n, not_before, max_wait| {
        RateLimiter::reserve_after(&window, n, not_before, max_wait)
            .now_or_never()
            .unwrap()
    };
    assert_eq!(after(1, ms(300), ms(500)), Ok(ms(300)));
    assert_eq!(
        after(1, ms(700), ms(500)),
        Err(ReserveError::RateLimited {
            retry_after: ms(700)
        })
    );
    // Nothing was taken by the refusal: the second of two still fits now.
    assert_eq!(after(1, Duration::ZERO, Duration::ZERO), Ok(Duration::ZERO));
}

/// `retry_after()` keeps an `Unavailable` store's wait.
#[test]
fn retry_after_ignores_unavailable() {
    let wait = Duration::from_millis(250);
    let e = ReserveError::Unavailable { retry_after: wait };
    assert_eq!(e.retry_after(), Some(wait));
    assert_eq!(
        ReserveError::RateLimited { retry_after: wait }.retry_after(),
        Some(wait)
    );
    let never = ReserveError::InsufficientCapacity {
        requested: 2,
        capacity: 1,
    };
    assert_eq!(never.retry_after(), None);
    assert_eq!(ReserveError::TooManyKeys { limit: 1 }.retry_after(), None);
}
