//! The limit algorithms on their own, sample by sample: Aimd decreases
//! once per round trip and grows only when used; Gradient2 follows the
//! latency and both stay within their bounds.

use backpressure::adaptive::{Aimd, Gradient2, LimitAlgorithm, Outcome, Sample};

const MS: u64 = 1_000_000;

fn ok(start: u64, in_flight: usize) -> Sample {
    Sample::new(start, 10, in_flight, Outcome::Success)
}

fn drop_at(start: u64, rtt: u64) -> Sample {
    Sample::new(start, rtt, 8, Outcome::Dropped)
}

/// 8 requests in flight together all get a 429: the limit falls once, not 8 times.
#[test]
fn aimd_eight_concurrent_drops_decrease_once() {
    let mut aimd = Aimd::new().with_limits(1, 64, 100).with_backoff(0.5);
    for i in 0..8 {
        // All started at 100..108, all end at 200..208.
        aimd.update(&drop_at(100 + i, 100));
    }
    assert_eq!(aimd.limit(), 32);
    // A request that started after the decrease is a new round trip.
    aimd.update(&drop_at(300, 10));
    assert_eq!(aimd.limit(), 16);
}

#[test]
fn aimd_grows_one_per_full_window_and_not_when_idle() {
    let mut aimd = Aimd::new().with_limits(1, 10, 1000);
    for i in 0..10 {
        aimd.update(&ok(i, 10));
    }
    assert_eq!(aimd.limit(), 11);
    // Under-used: 5 in flight of 11 is less than half.
    for i in 0..1000 {
        aimd.update(&ok(i, 5));
    }
    assert_eq!(aimd.limit(), 11);
    // Ignored never changes it.
    for i in 0..100 {
        aimd.update(&Sample::new(i, 1, 11, Outcome::Ignored));
    }
    assert_eq!(aimd.limit(), 11);
}

#[test]
fn aimd_stays_within_bounds() {
    let mut aimd = Aimd::new().with_limits(3, 5, 7).with_backoff(0.1);
    for i in 0..10_000 {
        let l = aimd.update(&ok(i, 7));
        assert!((3..=7).contains(&l));
    }
    assert_eq!(aimd.limit(), 7);
    for i in 0..100 {
        let l = aimd.update(&drop_at(10_000 + i * 10, 1));
        assert!((3..=7).contains(&l));
    }
    assert_eq!(aimd.limit(), 3);
}

/// Feeds `rounds` round trips of `per_round` samples each, all with the
/// same RTT and in-flight count; returns the end time.
fn rounds(g: &mut Gradient2, mut t: u64, rounds: u32, rtt: u64, in_flight: usize) -> u64 {
    for _ in 0..rounds {
        for _ in 0..in_flight.max(1) {
            g.update(&Sample::new(t, rtt, in_flight, Outcome::Success));
        }
        t += rtt;
    }
    t
}

#[test]
fn gradient2_grows_at_steady_latency_and_falls_when_it_rises() {
    let mut g = Gradient2::new().with_limits(1, 20, 1000);
    let t = rounds(&mut g, 0, 30, 10 * MS, 20);
    let grown = g.limit();
    assert!(grown > 22, "{grown}");
    // Latency x4: gradient 0.5, the limit falls ~10% a round trip
    // (minus the headroom), until latency alone cannot push it lower.
    rounds(&mut g, t, 10, 40 * MS, grown);
    assert!(g.limit() < grown * 3 / 4, "{} vs {grown}", g.limit());
}

#[test]
fn gradient2_does_not_grow_when_app_limited() {
    let mut g = Gradient2::new().with_limits(1, 20, 1000);
    rounds(&mut g, 0, 100, 10 * MS, 5);
    assert_eq!(g.limit(), 20);
}

#[test]
fn gradient2_stays_within_bounds() {
    let mut g = Gradient2::new().with_limits(3, 5, 9).with_smoothing(1.0);
    let mut t = rounds(&mut g, 0, 100, MS, 9);
    assert_eq!(g.limit(), 9);
    for i in 0..100 {
        let l = g.update(&Sample::new(t, MS, 9, Outcome::Dropped));
        assert!((3..=9).contains(&l), "{i}: {l}");
        t += MS;
    }
    assert_eq!(g.limit(), 3);
    // A zero RTT (an instant answer) neither divides by zero nor grows
    // past max.
    rounds(&mut g, t, 100, 0, 9);
    assert!((3..=9).contains(&g.limit()));
}
