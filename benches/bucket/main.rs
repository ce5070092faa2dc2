//! TokenBucket and Scoped beside governor, same groups, same clock source
//! (quanta) read on every call.
//!
//! Run: `cargo bench -p backpressure-benches --bench bucket -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use backpressure::{Quota, Scoped, TokenBucket};
mod bucket_interleaved;
#[path = "../support/interleaved.rs"]
mod interleaved;
mod keyed_interleaved;
use criterion::{criterion_group, Criterion};
use governor::{Quota as GQuota, RateLimiter};

#[path = "../support/walks.rs"]
mod walks;
use walks::{round_robin, zipf};

/// Never denies: one cell per nanosecond, a burst of 2^32 - 1.
fn admitting() -> (Quota, GQuota) {
    (
        Quota::with_period(Duration::from_nanos(1)).allow_burst(NonZeroU32::MAX),
        GQuota::with_period(Duration::from_nanos(1))
            .unwrap()
            .allow_burst(NonZeroU32::MAX),
    )
}

/// Keyed, fast refill (governor's own benchmark setup): 10^9 cells per
/// second, a burst of 10^9. Every key is full again between two of its
/// calls, so a registry that drops full buckets at once would drop every
/// hot key.
fn keyed_fast_refill() -> (Quota, GQuota) {
    let n = NonZeroU32::new(1_000_000_000).unwrap();
    (Quota::per_second(n), GQuota::per_second(n))
}

/// Keyed, in debt: one cell per second, a burst of 10^9. Every key admits
/// for the whole run and is never full again.
fn keyed_in_debt() -> (Quota, GQuota) {
    let one = NonZeroU32::new(1).unwrap();
    let burst = NonZeroU32::new(1_000_000_000).unwrap();
    (
        Quota::per_second(one).allow_burst(burst),
        GQuota::per_second(one).allow_burst(burst),
    )
}

/// The floor: one clock read, as each side does it.
fn clock_read(c: &mut Criterion) {
    use backpressure::Clock;
    use governor::clock::Clock as _;
    let mut g = c.benchmark_group("clock read");
    let bucket =
        backpressure::TokenBucket::new(backpressure::Quota::per_second(std::num::NonZeroU32::MIN));
    let ours = bucket.clock();
    g.bench_function("backpressure", |b| b.iter(|| black_box(ours.now_nanos())));
    let theirs = governor::clock::QuantaClock::default();
    g.bench_function("governor", |b| b.iter(|| black_box(theirs.now())));
    g.finish();
}

fn check_admitting(c: &mut Criterion) {
    let mut g = c.benchmark_group("check admitting");
    let (ours, theirs) = admitting();
    let bucket = TokenBucket::new(ours);
    g.bench_function("backpressure", |b| {
        b.iter(|| black_box(bucket.try_acquire(1)).is_ok())
    });
    let gov = RateLimiter::direct(theirs);
    g.bench_function("governor", |b| b.iter(|| black_box(gov.check()).is_ok()));
    g.finish();
}

fn check_denying(c: &mut Criterion) {
    let mut g = c.benchmark_group("check denying");
    let bucket = TokenBucket::new(Quota::with_period(Duration::from_secs(3600)));
    bucket.try_acquire(1).unwrap();
    g.bench_function("backpressure", |b| {
        b.iter(|| black_box(bucket.try_acquire(1)).is_err())
    });
    let gov = RateLimiter::direct(GQuota::with_period(Duration::from_secs(3600)).unwrap());
    gov.check().unwrap();
    g.bench_function("governor", |b| b.iter(|| black_box(gov.check()).is_err()));
    g.finish();
}

/// Each of two threads makes `iters` checks; the time reported is the
/// wall time of the whole run, i.e. per check per thread.
fn two_threads(iters: u64, check: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            barrier.wait();
            for _ in 0..iters {
                check();
            }
        });
        barrier.wait();
        let start = Instant::now();
        for _ in 0..iters {
            check();
        }
        other.join().unwrap();
        start.elapsed()
    })
}

fn check_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("check admitting, 2 threads");
    let (ours, theirs) = admitting();
    let bucket = TokenBucket::new(ours);
    g.bench_function("backpressure", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                black_box(bucket.try_acquire(1)).ok();
            })
        })
    });
    let gov = RateLimiter::direct(theirs);
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                black_box(gov.check()).ok();
            })
        })
    });
    g.finish();
}

fn keyed(c: &mut Criterion, name: &str, keys: u64, quotas: (Quota, GQuota), walk: Vec<u64>) {
    let mut g = c.benchmark_group(format!("keyed check, {name}"));
    let (ours, theirs) = quotas;
    let scoped: Scoped<u64> = Scoped::new(ours).with_max_keys(2 * keys as usize);
    let gov = RateLimiter::keyed(theirs);
    for k in 0..keys {
        scoped.try_acquire(&k, 1).unwrap();
        gov.check_key(&k).unwrap();
    }
    let mask = walk.len();
    let mut i = 0usize;
    g.bench_function("backpressure", |b| {
        b.iter(|| {
            i += 1;
            if i == mask {
                i = 0;
            }
            black_box(scoped.try_acquire(&walk[i], 1)).is_ok()
        })
    });
    let mut i = 0usize;
    g.bench_function("governor", |b| {
        b.iter(|| {
            i += 1;
            if i == mask {
                i = 0;
            }
            black_box(gov.check_key(&walk[i])).is_ok()
        })
    });
    println!(
        "keys held after the run: backpressure {}, governor {}",
        scoped.len(),
        gov.len()
    );
    g.finish();
}

fn keyed_1k(c: &mut Criterion) {
    keyed(
        c,
        "1000 keys, fast refill",
        1_000,
        keyed_fast_refill(),
        round_robin(1_000),
    );
    keyed(
        c,
        "1000 keys, in debt",
        1_000,
        keyed_in_debt(),
        round_robin(1_000),
    );
}

fn keyed_zipf(c: &mut Criterion) {
    keyed(
        c,
        "100000 keys zipf, fast refill",
        100_000,
        keyed_fast_refill(),
        zipf(100_000, 1 << 20),
    );
}

fn keyed_1m(c: &mut Criterion) {
    keyed(
        c,
        "1000000 keys, in debt",
        1_000_000,
        keyed_in_debt(),
        round_robin(1_000_000),
    );
}

criterion_group!(
    benches,
    clock_read,
    check_admitting,
    check_denying,
    check_two_threads,
    keyed_1k,
    keyed_zipf,
    keyed_1m
);
/// `cargo bench -p backpressure-benches --bench bucket` runs the criterion groups above;
/// `cargo bench -p backpressure-benches --bench bucket -- interleaved` runs `bucket_interleaved.rs` instead.
/// `cargo bench -p backpressure-benches --bench bucket -- keyed-interleaved` runs `keyed_interleaved.rs` instead.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "interleaved") {
        return bucket_interleaved::main();
    }
    if args.iter().any(|a| a == "keyed-interleaved") {
        return keyed_interleaved::main();
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
