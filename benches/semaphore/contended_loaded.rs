//! The two-worker hand-off of `contended_interleaved.rs` (64 tasks on 4
//! permits, each holding its permit across one yield) while the same
//! runtime has work of its own: `BACKGROUND` more tasks that each run
//! about half a microsecond of arithmetic and yield, for as long as the
//! semaphore's tasks run. Prints, per case, the median over rounds of
//! the ns per acquisition and of the background units per microsecond,
//! and the per-round ratios to futures-intrusive.
//!
//! Why (issue #44, item 1): on an idle 2-vCPU host futures-intrusive wins
//! the unloaded row because it wakes one waiter at a time (the woken
//! waiter's poll wakes the next), so the semaphore's tasks keep to one
//! worker and tokio parks the other: the row runs on one core. The two
//! floors (`fifo_floor.rs`: a minimal FIFO under a spin lock, waking at
//! once or one at a time) show the wake protocol, not the lock, decides
//! the row; this table shows what waking one at a time costs when the
//! runtime has other work.
//!
//! Run: `cargo bench -p backpressure-benches --bench semaphore -- loaded`
//! (`SEM_BENCH_BACKGROUND=<n>` sets the number of background tasks.)

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use crate::contended_interleaved::{PER_TASK, TASKS};
use crate::fifo_floor::{Fifo, Wakes};

const ROUNDS: usize = 20;
/// Background tasks; `SEM_BENCH_BACKGROUND=<n>` changes it.
const BACKGROUND: usize = 2;

fn background() -> usize {
    std::env::var("SEM_BENCH_BACKGROUND")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(BACKGROUND)
}

/// About half a microsecond of dependent multiplies (on the Intel Xeon of
/// BENCHMARKS.md): one background unit.
fn unit(seed: u64) -> u64 {
    let mut x = seed;
    for _ in 0..400 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
    }
    black_box(x)
}

type Body = Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One round: the background tasks start, then the 64 tasks run `body`
/// `PER_TASK` times each; returns (ns per acquisition, background units
/// per microsecond while they ran).
fn round(rt: &tokio::runtime::Runtime, body: Option<Body>) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let units = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let background: Vec<_> = (0..background())
            .map(|k| {
                let (stop, units) = (stop.clone(), units.clone());
                tokio::spawn(async move {
                    while !stop.load(Relaxed) {
                        unit(k as u64);
                        units.fetch_add(1, Relaxed);
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        let before = units.load(Relaxed);
        let start = Instant::now();
        match body {
            Some(body) => crate::contended_interleaved::all_tasks(move || body()).await,
            // The background alone, for about as long as a case runs.
            None => tokio::time::sleep(std::time::Duration::from_millis(40)).await,
        }
        let elapsed = start.elapsed();
        let done = units.load(Relaxed) - before;
        stop.store(true, Relaxed);
        for b in background {
            b.await.unwrap();
        }
        (
            elapsed.as_nanos() as f64 / (TASKS * PER_TASK) as f64,
            done as f64 / (elapsed.as_nanos() as f64 / 1e3),
        )
    })
}

macro_rules! holding {
    ($sem:expr, $acquire:ident($($arg:expr),*)) => {{
        let sem = Arc::new($sem);
        let body: Body = Arc::new(move || {
            let sem = sem.clone();
            Box::pin(async move {
                let _p = sem.$acquire($($arg),*).await;
                tokio::task::yield_now().await;
            })
        });
        Some(body)
    }};
}

pub fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let cases: Vec<(&str, Option<Body>)> = vec![
        (
            "backpressure",
            holding!(backpressure::Semaphore::new(4), acquire()),
        ),
        (
            "futures-intrusive",
            holding!(futures_intrusive::sync::Semaphore::new(true, 4), acquire(1)),
        ),
        ("tokio", holding!(tokio::sync::Semaphore::new(4), acquire())),
        (
            "floor: FIFO, spin lock",
            holding!(Fifo::spin(4, Wakes::AtOnce), acquire()),
        ),
        (
            "floor: one woken at a time",
            holding!(Fifo::spin(4, Wakes::OneAtATime), acquire()),
        ),
        (
            "async-lock",
            holding!(async_lock::Semaphore::new(4), acquire()),
        ),
        ("background alone", None),
    ];
    for (_, body) in &cases {
        round(&rt, body.clone());
    }
    let mut results = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (k, (_, body)) in cases.iter().enumerate() {
            results[k].push(round(&rt, body.clone()));
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let fi = 1;
    println!(
        "64 tasks / 4 permits / 2 workers beside {} background tasks, {ROUNDS} interleaved rounds (medians)",
        background()
    );
    for (k, (name, body)) in cases.iter().enumerate() {
        let bg = median(results[k].iter().map(|r| r.1).collect());
        if body.is_none() {
            println!("{name:26} {:>28} background {bg:5.2} units/us", "");
            continue;
        }
        let ns = median(results[k].iter().map(|r| r.0).collect());
        // The median of per-round ratios to futures-intrusive of one measure.
        let to_fi = |of: fn(&(f64, f64)) -> f64| {
            median(
                results[k]
                    .iter()
                    .zip(&results[fi])
                    .map(|(a, b)| of(a) / of(b))
                    .collect(),
            )
        };
        let (ns_ratio, bg_ratio) = (to_fi(|r| r.0), to_fi(|r| r.1));
        println!(
            "{name:26} {ns:6.1} ns/acquisition ({ns_ratio:4.2}x fi)  background {bg:5.2} units/us ({bg_ratio:4.2}x fi)"
        );
    }
}
