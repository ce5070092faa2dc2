//! `TokenBucket::try_acquire` beside governor's `check` on one thread,
//! measured the way a noisy shared machine allows: each case runs 200,000
//! calls per round, the cases interleaved round after round. Prints each
//! case's best round and the median over rounds of the per-round ratio to
//! its governor twin (neighbouring rounds see the same load).
//!
//! Both sides read the quanta clock on every call; the `clock read` pair
//! is the floor both sit on (on this kind of machine `rdtsc` alone takes
//! about as long as the whole check, so these pairs come out even), and
//! `floor: clock read + CAS`, beside an admitting check, is the floor of
//! an admission. The
//! `manual clock` pairs take the clock out: each side with its own
//! test clock (an atomic load), the same arithmetic and CAS, so they show
//! the algorithms' own cost.
//!
//! Run: `cargo bench -p backpressure-benches --bench bucket -- interleaved`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backpressure::{Clock, ManualClock, Quota, TokenBucket};
use governor::clock::Clock as _;
use governor::{Quota as GQuota, RateLimiter};

const PER_ROUND: u32 = 200_000;
const ROUNDS: usize = 60;

use crate::interleaved;
use crate::interleaved::Case;

pub fn main() {
    // The default clock, as every bucket built with `new` reads it.
    let ours_bucket = TokenBucket::new(Quota::per_second(NonZeroU32::MIN));
    let ours_clock = ours_bucket.clock().clone();
    let gov_clock = governor::clock::QuantaClock::default();
    let admitting = Quota::with_period(Duration::from_nanos(1)).allow_burst(NonZeroU32::MAX);
    let g_admitting = GQuota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::MAX);
    let admit = TokenBucket::new(admitting);
    let g_admit = RateLimiter::direct(g_admitting);
    let deny = TokenBucket::new(Quota::with_period(Duration::from_secs(3600)));
    deny.try_acquire(1).unwrap();
    let g_deny = RateLimiter::direct(GQuota::with_period(Duration::from_secs(3600)).unwrap());
    g_deny.check().unwrap();
    let m_admit = TokenBucket::with_clock(admitting, ManualClock::new());
    let g_m_admit =
        RateLimiter::direct_with_clock(g_admitting, governor::clock::FakeRelativeClock::default());
    let hour = Duration::from_secs(3600);
    let m_deny = TokenBucket::with_clock(Quota::with_period(hour), ManualClock::new());
    m_deny.try_acquire(1).unwrap();
    let g_m_deny = RateLimiter::direct_with_clock(
        GQuota::with_period(hour).unwrap(),
        governor::clock::FakeRelativeClock::default(),
    );
    g_m_deny.check().unwrap();
    // The floor under an admitting check: the clock read and one CAS of
    // a stamp computed from it (the least GCRA does), paired with a second
    // admitting bucket.
    let floor_clock = ours_bucket.clock().clone();
    let floor_tat = AtomicU64::new(0);
    let admit_again = TokenBucket::new(admitting);
    let cases: Vec<Case> = vec![
        (
            "floor: clock read + CAS",
            Box::new(move || {
                let now = floor_clock.now_nanos();
                let tat = floor_tat.load(Ordering::Relaxed);
                let next = tat.max(now) + 1;
                floor_tat
                    .compare_exchange(tat, next, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            }),
        ),
        (
            "check admitting: backpressure",
            Box::new(move || black_box(admit_again.try_acquire(1)).is_ok()),
        ),
        (
            "clock read: backpressure",
            Box::new(move || {
                black_box(ours_clock.now_nanos());
                true
            }),
        ),
        (
            "clock read: governor",
            Box::new(move || {
                black_box(gov_clock.now());
                true
            }),
        ),
        (
            "check admitting: backpressure",
            Box::new(move || black_box(admit.try_acquire(1)).is_ok()),
        ),
        (
            "check admitting: governor",
            Box::new(move || black_box(g_admit.check()).is_ok()),
        ),
        (
            "check denying: backpressure",
            Box::new(move || black_box(deny.try_acquire(1)).is_err()),
        ),
        (
            "check denying: governor",
            Box::new(move || black_box(g_deny.check()).is_err()),
        ),
        (
            "manual clock, admitting: backpressure",
            Box::new(move || black_box(m_admit.try_acquire(1)).is_ok()),
        ),
        (
            "manual clock, admitting: governor",
            Box::new(move || black_box(g_m_admit.check()).is_ok()),
        ),
        (
            "manual clock, denying: backpressure",
            Box::new(move || black_box(m_deny.try_acquire(1)).is_err()),
        ),
        (
            "manual clock, denying: governor",
            Box::new(move || black_box(g_m_deny.check()).is_err()),
        ),
    ];
    let times = interleaved::rounds(&cases, ROUNDS, PER_ROUND);
    println!("one thread, ns per call, {ROUNDS} interleaved rounds of {PER_ROUND}");
    interleaved::print_pairs(&cases, &times);
}
