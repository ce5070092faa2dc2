//! Semaphore benches: ours beside tokio's and async-lock's (and, for 64
//! tasks on 4 permits, futures-intrusive's fair semaphore) in the same
//! groups, so the report reads as ratios from one run. The `floor` rows are
//! the atomic operations alone (what no semaphore can beat).
//!
//! Run: `cargo bench -p backpressure-benches --bench semaphore` (add `-- --quick` for a fast look).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

mod contended_interleaved;
mod contended_loaded;
mod fifo_floor;
mod handoff_alone;
#[path = "../support/interleaved.rs"]
mod interleaved;
mod oversubscribed;
mod two_threads_interleaved;
mod uncontended_interleaved;
use criterion::{criterion_group, Criterion};

/// Polls a future that is expected to be ready at once (the uncontended
/// case), with a no-op waker: the smallest possible executor.
fn poll_ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

fn uncontended(c: &mut Criterion) {
    let mut g = c.benchmark_group("try_acquire+drop/1 thread");
    let floor = AtomicUsize::new(1 << 3);
    g.bench_function("floor (one CAS pair)", |b| {
        b.iter(|| {
            let v = floor.load(Ordering::Relaxed);
            let _ = floor.compare_exchange(v, v - 8, Ordering::Acquire, Ordering::Relaxed);
            let v = floor.load(Ordering::Relaxed);
            let _ = floor.compare_exchange(v, v + 8, Ordering::Release, Ordering::Relaxed);
        })
    });
    let ours = backpressure::Semaphore::new(1);
    g.bench_function("backpressure", |b| {
        b.iter(|| drop(black_box(ours.try_acquire().unwrap())))
    });
    let tokio = tokio::sync::Semaphore::new(1);
    g.bench_function("tokio", |b| {
        b.iter(|| drop(black_box(tokio.try_acquire().unwrap())))
    });
    let al = async_lock::Semaphore::new(1);
    g.bench_function("async-lock", |b| {
        b.iter(|| drop(black_box(al.try_acquire().unwrap())))
    });
    g.finish();

    let mut g = c.benchmark_group("acquire().await+drop/uncontended");
    g.bench_function("backpressure", |b| {
        b.iter(|| drop(black_box(poll_ready(ours.acquire()).unwrap())))
    });
    g.bench_function("tokio", |b| {
        b.iter(|| drop(black_box(poll_ready(tokio.acquire()).unwrap())))
    });
    g.bench_function("async-lock", |b| {
        b.iter(|| drop(black_box(poll_ready(al.acquire()))))
    });
    g.finish();
}

/// Two threads hammer `try_acquire` on one permit; time per successful
/// acquire+drop per thread.
fn two_threads<S: Sync>(iters: u64, sem: &S, op: impl Fn(&S) -> bool + Sync) -> Duration {
    let barrier = Barrier::new(2);
    let start = std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                barrier.wait();
                let mut done = 0;
                while done < iters {
                    if op(sem) {
                        done += 1;
                    }
                }
            });
        }
        Instant::now()
    });
    start.elapsed()
}

fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("try_acquire+drop/2 threads, 1 permit");
    g.measurement_time(Duration::from_secs(4));
    let floor = AtomicUsize::new(1);
    g.bench_function("floor (CAS 1->0, store 1)", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &floor, |f| {
                if f.compare_exchange(1, 0, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    f.store(1, Ordering::Release);
                    true
                } else {
                    false
                }
            })
        })
    });
    // A release that must see whether waiters queued cannot be a plain
    // store: this is the least a semaphore's word can do.
    let floor_cas = AtomicUsize::new(1);
    g.bench_function("floor (CAS 1->0, CAS 0->1)", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &floor_cas, |f| {
                if f.compare_exchange(1, 0, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    let _ = f.compare_exchange(0, 1, Ordering::Release, Ordering::Relaxed);
                    true
                } else {
                    false
                }
            })
        })
    });
    let ours = backpressure::Semaphore::new(1);
    g.bench_function("backpressure", |b| {
        b.iter_custom(|iters| two_threads(iters, &ours, |s| s.try_acquire().is_ok()))
    });
    let tokio = tokio::sync::Semaphore::new(1);
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| two_threads(iters, &tokio, |s| s.try_acquire().is_ok()))
    });
    let al = async_lock::Semaphore::new(1);
    g.bench_function("async-lock", |b| {
        b.iter_custom(|iters| two_threads(iters, &al, |s| s.try_acquire().is_some()))
    });
    let fi = futures_intrusive::sync::Semaphore::new(true, 1);
    g.bench_function("futures-intrusive", |b| {
        b.iter_custom(|iters| two_threads(iters, &fi, |s| s.try_acquire(1).is_some()))
    });
    g.finish();

    // 64 tasks on a 2-worker runtime, 4 permits, each holding its permit
    // across one yield: time per acquisition.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let mut g = c.benchmark_group("64 tasks/4 permits/2 workers, per acquisition");
    g.measurement_time(Duration::from_secs(5));
    macro_rules! tasks {
        ($name:expr, $sem:expr) => {
            g.bench_function($name, |b| {
                let sem = Arc::new($sem);
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    rt.block_on(async {
                        let handles: Vec<_> = (0..64)
                            .map(|_| {
                                let sem = sem.clone();
                                tokio::spawn(async move {
                                    for _ in 0..iters.div_ceil(64) {
                                        let _p = sem.acquire().await;
                                        tokio::task::yield_now().await;
                                    }
                                })
                            })
                            .collect();
                        for h in handles {
                            h.await.unwrap();
                        }
                    });
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (iters.div_ceil(64) * 64) as f64)
                })
            });
        };
    }
    tasks!("backpressure", backpressure::Semaphore::new(4));
    tasks!("tokio", tokio::sync::Semaphore::new(4));
    tasks!("async-lock", async_lock::Semaphore::new(4));
    // futures-intrusive's `acquire(n)` returns a releaser that gives the
    // permits back on drop, like the others' permits.
    g.bench_function("futures-intrusive", |b| {
        let sem = Arc::new(futures_intrusive::sync::Semaphore::new(true, 4));
        b.iter_custom(|iters| {
            let start = Instant::now();
            rt.block_on(async {
                let handles: Vec<_> = (0..64)
                    .map(|_| {
                        let sem = sem.clone();
                        tokio::spawn(async move {
                            for _ in 0..iters.div_ceil(64) {
                                let _p = sem.acquire(1).await;
                                tokio::task::yield_now().await;
                            }
                        })
                    })
                    .collect();
                for h in handles {
                    h.await.unwrap();
                }
            });
            start
                .elapsed()
                .mul_f64(iters as f64 / (iters.div_ceil(64) * 64) as f64)
        })
    });
    g.finish();
}

fn sizes(_: &mut Criterion) {
    let ours = Arc::new(backpressure::Semaphore::new(1));
    let tokio = Arc::new(tokio::sync::Semaphore::new(1));
    let al = Arc::new(async_lock::Semaphore::new(1));
    println!(
        "size_of: Semaphore ours {} / tokio {} / async-lock {}; acquire future ours {} / tokio {} / async-lock {}; owned acquire future ours {} / tokio {}",
        std::mem::size_of::<backpressure::Semaphore>(),
        std::mem::size_of::<tokio::sync::Semaphore>(),
        std::mem::size_of::<async_lock::Semaphore>(),
        std::mem::size_of_val(&ours.acquire()),
        std::mem::size_of_val(&tokio.acquire()),
        std::mem::size_of_val(&al.acquire()),
        std::mem::size_of_val(&ours.clone().acquire_owned()),
        std::mem::size_of_val(&tokio.clone().acquire_owned()),
    );
}

criterion_group!(benches, sizes, uncontended, contended);
/// `cargo bench -p backpressure-benches --bench semaphore` runs the criterion groups above;
/// `cargo bench -p backpressure-benches --bench semaphore -- interleaved` runs `contended_interleaved.rs` instead.
/// `cargo bench -p backpressure-benches --bench semaphore -- handoff` runs `handoff_alone.rs` instead.
/// `cargo bench -p backpressure-benches --bench semaphore -- loaded` runs `contended_loaded.rs` instead.
/// `cargo bench -p backpressure-benches --bench semaphore -- oversubscribed` runs `oversubscribed.rs` instead.
/// `cargo bench -p backpressure-benches --bench semaphore -- uncontended-interleaved` runs `uncontended_interleaved.rs` instead.
/// `cargo bench -p backpressure-benches --bench semaphore -- two-threads-interleaved` runs `two_threads_interleaved.rs` instead.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "interleaved") {
        return contended_interleaved::main();
    }
    if args.iter().any(|a| a == "handoff") {
        return handoff_alone::main();
    }
    if args.iter().any(|a| a == "loaded") {
        return contended_loaded::main();
    }
    if args.iter().any(|a| a == "oversubscribed") {
        return oversubscribed::main();
    }
    if args.iter().any(|a| a == "two-threads-interleaved") {
        return two_threads_interleaved::main();
    }
    if args.iter().any(|a| a == "uncontended-interleaved") {
        return uncontended_interleaved::main();
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
