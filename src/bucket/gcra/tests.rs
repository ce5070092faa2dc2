//! Unit tests of the raw GCRA: quota conversion and the seqlock retries.
use super::*;
use core::num::NonZeroU32;

fn q(period: u64, burst: u32) -> Quota {
    Quota {
        period,
        burst: NonZeroU32::new(burst).unwrap(),
    }
}

#[test]
fn epoch_wraps_inside_its_bits() {
    let word = (7u64 << BURST_SHIFT) | EPOCH_MASK;
    let bumped = bump_epoch(word);
    assert_eq!(bumped >> BURST_SHIFT, 7);
    assert_eq!(bumped & EPOCH_MASK, 0);
    assert_eq!(bump_epoch(bumped) & EPOCH_MASK, EPOCH_ONE);
}

#[test]
fn convert_keeps_debt_in_cells_when_the_rate_falls() {
    // 1000/s, burst 1000, drained at 0: tat = 1s. Now 1/s, burst 1000.
    let t = convert(
        1_000_000_000,
        0,
        q(1_000_000, 1000),
        q(1_000_000_000, 1000),
        0,
    );
    assert_eq!(t, 1_000 * 1_000_000_000);
    let t = convert(t, 0, q(1_000_000_000, 1000), q(1_000_000, 1000), 0);
    assert_eq!(t, 1_000_000_000);
}

#[test]
fn convert_keeps_a_hold_past_the_burst() {
    // 1/s burst 1, penalized 10 s at 0 (tat = 10 s). Now 100/s burst 100.
    let old = q(1_000_000_000, 1);
    let new = q(10_000_000, 100);
    let t = convert(10_000_000_000, 0, old, new, 10_000_000_000);
    assert_eq!(t - (new.tolerance() - new.period), 10_000_000_000);
    // Without the hold, the same debt is 10 cells: 100 ms at 100/s.
    assert_eq!(convert(10_000_000_000, 0, old, new, 0), 100_000_000);
}

#[test]
fn convert_keeps_full_full_and_forgives_nothing() {
    assert_eq!(convert(5, 100, q(10, 1), q(10, 2), 0), 5);
    assert_eq!(convert(100, 100, q(10, 1), q(1, 2), 0), 100);
    // 5 cells of debt, burst 100 -> 3: over-drawn by 2, not forgiven.
    assert_eq!(convert(150, 100, q(10, 100), q(10, 3), 0), 150);
    // Rounded up to a whole nanosecond.
    assert_eq!(convert(101, 100, q(3, 100), q(2, 100), 0), 101);
    assert_eq!(
        convert(u64::MAX, 0, q(1, 1), q(u64::MAX, u32::MAX), 0),
        u64::MAX
    );
    assert_eq!(convert(u64::MAX, 0, q(u64::MAX, 1), q(1, 1), 0), 1);
    assert_eq!(
        convert(u64::MAX, 0, q(1, 1), q(u64::MAX, u32::MAX), u64::MAX),
        u64::MAX
    );
}

#[test]
fn convert_is_monotonic_keeps_cells_and_never_shortens_a_hold() {
    let quotas = [
        q(10, 1),
        q(10, 10),
        q(20, 10),
        q(7, 3),
        q(100, 9),
        q(1_000, 2),
        q(3, 100),
    ];
    let now = 1_000_000;
    for old in quotas {
        for new in quotas {
            for hold in [0, 1, 15, 200, 5_000] {
                let held_until = if hold == 0 { 0 } else { now + hold };
                let mut last = 0;
                // A running hold leaves the bucket past its next cell.
                let from = if hold == 0 {
                    0
                } else {
                    old.tolerance() - old.period + 1
                };
                for debt in from..=(3 * old.tolerance() + 2 * old.period) {
                    let t = convert(now + debt, now, old, new, held_until) - now;
                    assert!(
                        t >= last,
                        "{old:?} -> {new:?}, hold {hold}: debt {debt} gave {t}, debt {} gave {last}",
                        debt - 1
                    );
                    last = t;
                    let next_old = old.tolerance() - old.period;
                    if hold > 0 && debt > next_old {
                        // The hold's part of the wait is kept as time.
                        let wait = debt - next_old;
                        let next = t - (new.tolerance() - new.period);
                        assert!(
                            next >= wait.min(hold),
                            "{old:?} -> {new:?}: {next} < {wait}"
                        );
                    } else {
                        // Cells stay cells, up to a nanosecond's rounding.
                        let (d, c) = (u128::from(debt), u128::from(t));
                        let (to, tn) = (u128::from(old.period), u128::from(new.period));
                        assert!(c * to >= d * tn, "{old:?} -> {new:?}: cells lost");
                        assert!(c * to < d * tn + to, "{old:?} -> {new:?}: cells added");
                    }
                }
            }
        }
    }
}

#[test]
fn flipping_quotas_builds_no_debt_and_forgives_none() {
    let (a, b) = (q(100, 10), q(100, 9));
    for debt in [0, 1, 450, 900, 1_000, 1_001, 5_000] {
        let mut t = 1_000 + debt;
        for _ in 0..100 {
            t = convert(convert(t, 1_000, a, b, 0), 1_000, b, a, 0);
        }
        assert_eq!(t, 1_000 + debt, "debt {debt} became {}", t - 1_000);
    }
}

/// 15 cells reserved at 10/s are still owed after a flip to 1/s and back.
#[test]
fn a_quota_flip_keeps_reserved_cells() {
    let ten = q(100_000_000, 10);
    let one = q(1_000_000_000, 10);
    let g = Gcra::new(ten);
    let now = 1_000_000_000_000;
    let mut ready = 0;
    for _ in 0..15 {
        let r = g.reserve(1, u64::MAX, now).unwrap();
        ready = ready.max(r.ready_at);
    }
    assert_eq!(g.available(now), 0);
    let owed = g.tat() - now;
    g.set_quota(one, now);
    assert_eq!(g.tat() - now, owed * 10, "15 cells at 1/s");
    g.set_quota(ten, now);
    assert_eq!(g.tat() - now, owed, "15 cells at 10/s again");
    assert_eq!(g.available(now), 0);
    let next = g.reserve(1, u64::MAX, now).unwrap();
    assert!(next.ready_at > ready, "{} <= {ready}", next.ready_at);
}

#[test]
fn a_quota_change_moves_the_stamp_by_one() {
    let g = Gcra::new(q(100, 10));
    g.try_acquire(10, 1_000).unwrap();
    let before = g.view().stamp;
    // A faster rate lowers `tat`, but never the stamp.
    g.set_quota(q(10, 10), 1_000);
    assert_eq!(g.view().stamp, before.wrapping_add(1));
    assert_eq!(g.tat(), 1_100);
    g.reset(1_000);
    assert_eq!(g.view().stamp, before.wrapping_add(2));
    assert_eq!(g.tat(), FULL);
    assert_eq!(g.available(1_000), 10);
}

/// A failed CAS retries with the stamp it found, keeping the quota and
/// skew only if no admin operation ran in between.
#[test]
fn a_failed_cas_after_an_admission_retries_with_the_stamp_it_found() {
    let g = Gcra::new(q(100, 10));
    let stale = g.view();
    g.try_acquire(3, 1_000).unwrap();
    let fresh = g.apply(&stale, 1_100).unwrap_err();
    assert_eq!(fresh.stamp, g.view().stamp);
    assert_eq!(fresh.tat, 1_300);
    assert_eq!((fresh.word, fresh.period), (stale.word, stale.period));
}

/// The same after a quota change: the retry sees the new quota and skew.
#[test]
fn a_failed_cas_after_a_quota_change_rereads_the_quota() {
    let g = Gcra::new(q(100, 10));
    g.try_acquire(10, 1_000).unwrap();
    let stale = g.view();
    g.set_quota(q(10, 10), 1_000);
    let fresh = g.apply(&stale, 5_000).unwrap_err();
    assert_eq!(fresh.period, 10);
    assert_eq!(fresh.tat, 1_100);
    assert_ne!(fresh.word, stale.word);
}

#[test]
fn keeping_queue_keeps_the_wait_past_the_burst() {
    // 1/s burst 1, 10 s past the burst: the first cell still fits at 10 s.
    let old = q(1_000_000_000, 1);
    let new = q(10_000_000, 100);
    let t = convert_keeping_queue(10_000_000_000, 0, old, new);
    assert_eq!(t - (new.tolerance() - new.period), 10_000_000_000);
    let t = convert_keeping_queue(1_500_000_000, 0, q(100_000_000, 10), q(200_000_000, 5));
    assert_eq!(t - 800_000_000, 600_000_000);
}

#[test]
fn keeping_queue_keeps_full_full_and_cells_within_the_burst() {
    assert_eq!(convert_keeping_queue(5, 100, q(10, 1), q(10, 2)), 5);
    assert_eq!(convert_keeping_queue(100, 100, q(10, 1), q(1, 2)), 100);
    // 3 cells of debt, 10 ns -> 20 ns a cell: 3 cells still.
    assert_eq!(convert_keeping_queue(130, 100, q(10, 100), q(20, 100)), 160);
    // 5 cells of debt, burst 100 -> 3: capped at the new burst.
    assert_eq!(convert_keeping_queue(150, 100, q(10, 100), q(10, 3)), 130);
    // Rounded up to a whole nanosecond.
    assert_eq!(convert_keeping_queue(101, 100, q(3, 100), q(2, 100)), 101);
    assert_eq!(
        convert_keeping_queue(u64::MAX, 0, q(1, 1), q(u64::MAX, u32::MAX)),
        u64::MAX
    );
    assert_eq!(
        convert_keeping_queue(u64::MAX, 0, q(u64::MAX, 1), q(1, 1)),
        1
    );
}

#[test]
fn keeping_queue_is_monotonic_and_never_shortens_the_wait() {
    let quotas = [
        q(10, 1),
        q(10, 10),
        q(20, 10),
        q(7, 3),
        q(1_000, 2),
        q(3, 100),
    ];
    let now = 1_000_000;
    for old in quotas {
        for new in quotas {
            let mut last = 0;
            for debt in 0..=(3 * old.tolerance() + 2 * old.period) {
                let t = convert_keeping_queue(now + debt, now, old, new) - now;
                assert!(
                    t >= last,
                    "{old:?} -> {new:?}: debt {debt} gave {t} < {last}"
                );
                last = t;
                if debt > old.tolerance() {
                    let wait = debt - (old.tolerance() - old.period);
                    assert!(t - (new.tolerance() - new.period) >= wait);
                } else if debt > 0 {
                    // Within the burst: its cells, capped at the new burst.
                    let (d, c) = (u128::from(debt), u128::from(t));
                    let (to, tn) = (u128::from(old.period), u128::from(new.period));
                    assert!(c * to >= (d * tn).min(u128::from(new.tolerance()) * to));
                    assert!(c <= u128::from(new.tolerance()));
                }
            }
        }
    }
}

#[test]
fn keeping_queue_flips_build_no_debt() {
    let (a, b) = (q(100, 10), q(100, 9));
    for debt in [0, 1, 450, 900, 1_000, 1_001, 5_000] {
        let mut t = 1_000 + debt;
        for _ in 0..100 {
            t = convert_keeping_queue(convert_keeping_queue(t, 1_000, a, b), 1_000, b, a);
        }
        assert!(t <= 1_000 + debt, "debt {debt} grew to {}", t - 1_000);
    }
}
