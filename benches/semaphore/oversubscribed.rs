//! The wait list's lock when threads outnumber cores (issue #44 item 2):
//! 2, 8 and 16 threads, on a semaphore with no permits, each queue an
//! acquisition (one poll) and cancel it (drop), as fast as they can, so
//! every operation takes the wait list's lock twice. A lock that spins
//! against a holder the OS descheduled shows as a worst operation of a
//! whole time slice or more; one that parks, as the holder's next turn.
//!
//! Each round runs every case for `ROUND_MS` on fresh threads, the cases
//! interleaved round after round; the table gives, per case and thread
//! count, the median over rounds of the throughput (operations a second,
//! all threads) and of the round's worst operation, and the worst
//! operation over all rounds.
//!
//! Run: `cargo bench -p backpressure-benches --bench semaphore -- oversubscribed`
//! (`SEM_BENCH_ONLY=<substring>` keeps the matching cases and
//! `SEM_BENCH_THREADS=2,8` the thread counts, for a profiler.)

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

const ROUNDS: usize = 7;
const ROUND_MS: u64 = 300;

/// One queued-then-cancelled acquisition on the shared semaphore.
type Op = Arc<dyn Fn() + Send + Sync>;

fn queue_and_cancel<F: Future>(fut: F) {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        fut.as_mut().poll(&mut cx).is_pending(),
        "no permits: queued"
    );
}

fn cases() -> Vec<(&'static str, Op)> {
    let ours = Arc::new(backpressure::Semaphore::new(0));
    let tokio = Arc::new(tokio::sync::Semaphore::new(0));
    let fi = Arc::new(futures_intrusive::sync::Semaphore::new(true, 0));
    let al = Arc::new(async_lock::Semaphore::new(0));
    vec![
        (
            "backpressure",
            Arc::new(move || queue_and_cancel(ours.acquire())),
        ),
        ("tokio", Arc::new(move || queue_and_cancel(tokio.acquire()))),
        (
            "futures-intrusive",
            Arc::new(move || queue_and_cancel(fi.acquire(1))),
        ),
        (
            "async-lock",
            Arc::new(move || queue_and_cancel(al.acquire())),
        ),
    ]
}

/// Runs `op` on `threads` threads for `ROUND_MS`: (operations a second,
/// the slowest single operation).
fn round(op: &Op, threads: usize) -> (f64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (op, stop, start) = (op.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let (mut n, mut worst) = (0u64, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    op();
                    worst = worst.max(t.elapsed());
                    n += 1;
                }
                (n, worst)
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(Duration::from_millis(ROUND_MS));
    stop.store(true, Ordering::Relaxed);
    let (mut total, mut worst) = (0u64, Duration::ZERO);
    for h in handles {
        let (n, w) = h.join().unwrap();
        total += n;
        worst = worst.max(w);
    }
    (total as f64 / began.elapsed().as_secs_f64(), worst)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn main() {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("oversubscribed: {cores} cores, {ROUNDS} rounds of {ROUND_MS} ms per case");
    println!(
        "| threads | case | M ops/s (median) | worst op, median of rounds | worst op, all rounds |"
    );
    println!("| --- | --- | --- | --- | --- |");
    let only = std::env::var("SEM_BENCH_ONLY").ok();
    let counts: Vec<usize> = std::env::var("SEM_BENCH_THREADS")
        .ok()
        .map(|t| t.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 8, 16]);
    for threads in counts {
        let mut cases = cases();
        if let Some(only) = &only {
            cases.retain(|(name, _)| name.contains(only.as_str()));
        }
        let mut rate = vec![Vec::new(); cases.len()];
        let mut worst = vec![Vec::new(); cases.len()];
        for _ in 0..ROUNDS {
            for (i, (_, op)) in cases.iter().enumerate() {
                let (r, w) = round(op, threads);
                rate[i].push(r);
                worst[i].push(w.as_secs_f64() * 1e3);
            }
        }
        for (i, (name, _)) in cases.iter().enumerate() {
            let all = worst[i].iter().copied().fold(0.0, f64::max);
            println!(
                "| {threads} | {name} | {:.2} | {:.2} ms | {:.2} ms |",
                median(rate[i].clone()) / 1e6,
                median(worst[i].clone()),
                all
            );
        }
    }
}
