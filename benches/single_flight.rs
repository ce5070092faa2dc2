//! SingleFlight against async_singleflight (`UnaryGroup`) and, for the
//! cached path, moka's `future::Cache::get_with` and a mutex-guarded map.
//!
//! Every case polls by hand with a no-op waker, so no executor's cost is in
//! the numbers, and every peer is in the same group so criterion's report
//! reads as a ratio.
//!
//! * `join`: one leader holds a key in flight; each iteration creates a
//!   call for that key, polls it once (it joins) and drops it (it leaves).
//! * `miss/1t`, `miss/2t`: each iteration runs a call on a fresh key whose
//!   work is ready at once (claim, run, publish, remove). On 2 threads a
//!   second thread does the same on its own keys for the whole measurement.
//! * `hit`: a call on a key whose value is cached; beside it the same on a
//!   `ManualClock`, a bare `DefaultClock` read, and a mutex-guarded
//!   `HashMap<u64, Arc<u64>>` lookup as the floor.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{pending, ready, Future};
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use async_singleflight::UnaryGroup;
use backpressure::{Clock, ManualClock, SingleFlight};
use criterion::{criterion_group, criterion_main, Criterion};

/// Polls `fut` to completion with a no-op waker (spinning if it is not
/// ready, which none of these cases should need).
fn run<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::hint::spin_loop();
    }
}

/// Polls `fut` once; it must be pending.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) {
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.poll(&mut cx).is_pending());
}

fn join(c: &mut Criterion) {
    let mut g = c.benchmark_group("single_flight/join");

    let ours = SingleFlight::<u64, u64>::new();
    let mut leader = Box::pin(ours.run(1, pending::<u64>));
    poll_once(leader.as_mut());
    g.bench_function("backpressure", |b| {
        b.iter(|| {
            let mut f = pin!(ours.run(black_box(1), || ready(0)));
            poll_once(f.as_mut());
        })
    });
    drop(leader);

    let theirs = UnaryGroup::<u64, u64>::new();
    let mut leader = Box::pin(theirs.work(&1, pending::<u64>()));
    poll_once(leader.as_mut());
    g.bench_function("async_singleflight", |b| {
        b.iter(|| {
            let mut f = pin!(theirs.work(black_box(&1), ready(0)));
            poll_once(f.as_mut());
        })
    });
    drop(leader);
    g.finish();
}

/// Times `iters` misses on the calling thread while, with `contended`, a
/// second thread misses on its own keys the whole time.
fn misses<M: Sync>(
    map: &M,
    iters: u64,
    contended: bool,
    miss: impl Fn(&M, u64) + Sync,
) -> Duration {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(if contended { 2 } else { 1 });
    std::thread::scope(|s| {
        if contended {
            s.spawn(|| {
                start.wait();
                let mut k = 1u64 << 63;
                while !stop.load(Ordering::Relaxed) {
                    miss(map, k);
                    k += 1;
                }
            });
        }
        start.wait();
        let t = Instant::now();
        for k in 0..iters {
            miss(map, black_box(k));
        }
        let elapsed = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        elapsed
    })
}

fn miss(c: &mut Criterion) {
    for (name, contended) in [
        ("single_flight/miss/1t", false),
        ("single_flight/miss/2t", true),
    ] {
        let mut g = c.benchmark_group(name);
        let ours = SingleFlight::<u64, u64>::new();
        g.bench_function("backpressure", |b| {
            b.iter_custom(|iters| {
                misses(&ours, iters, contended, |m, k| {
                    black_box(run(m.run(k, || ready(k))).unwrap());
                })
            })
        });
        let theirs = UnaryGroup::<u64, u64>::new();
        g.bench_function("async_singleflight", |b| {
            b.iter_custom(|iters| {
                misses(&theirs, iters, contended, |m, k| {
                    black_box(run(m.work(&k, ready(k))));
                })
            })
        });
        g.finish();
    }
}

fn hit(c: &mut Criterion) {
    let mut g = c.benchmark_group("single_flight/hit");
    let ours: SingleFlight<u64, u64> = SingleFlight::builder()
        .cache(Duration::from_secs(3_600), 1_024)
        .build();
    run(ours.run(7, || ready(7))).unwrap();
    g.bench_function("backpressure", |b| {
        b.iter(|| run(ours.run(black_box(7), || ready(0))).unwrap())
    });

    // The same hit on a clock that is one atomic load: what is left is the
    // cost of reading `DefaultClock` for the expiry check.
    let manual: SingleFlight<u64, u64, Infallible, ManualClock> = SingleFlight::builder()
        .cache(Duration::from_secs(3_600), 1_024)
        .clock(ManualClock::new())
        .build();
    run(manual.run(7, || ready(7))).unwrap();
    g.bench_function("backpressure_manual_clock", |b| {
        b.iter(|| run(manual.run(black_box(7), || ready(0))).unwrap())
    });
    // The default clock, as a bucket built with `new` reads it.
    let bucket =
        backpressure::TokenBucket::new(backpressure::Quota::per_second(std::num::NonZeroU32::MIN));
    let clock = bucket.clock();
    g.bench_function("default_clock_read", |b| {
        b.iter(|| black_box(&clock).now_nanos())
    });

    let moka = moka::future::Cache::<u64, u64>::new(1_024);
    run(moka.get_with(7, ready(7)));
    g.bench_function("moka_get_with", |b| {
        b.iter(|| run(moka.get_with(black_box(7), ready(0))))
    });

    let map = parking_lot::Mutex::new(HashMap::<u64, Arc<u64>>::from([(7, Arc::new(7))]));
    g.bench_function("mutex_hashmap_floor", |b| {
        b.iter(|| *map.lock().get(&black_box(7)).cloned().unwrap())
    });
    g.finish();
}

criterion_group!(benches, join, miss, hit);
criterion_main!(benches);
