//! Two threads `try_acquire` + drop on one permit, measured the way a
//! noisy shared machine allows: each case runs one round (two fresh
//! threads, until one has had the permit `PER_THREAD` times), the
//! cases interleaved round after round, and each round's time per
//! acquisition recorded. Prints each case's best and median round and the
//! median over rounds of the per-round ratio to the round's best peer.
//!
//! Two floors: a compare-and-swap to take the permit and a plain store to
//! give it back (no semaphore can release with a store, since the release
//! must see whether waiters queued), and a compare-and-swap each way, the
//! least a semaphore's state word can do.
//!
//! Run: `cargo bench -p backpressure-benches --bench semaphore -- two-threads-interleaved`

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;

const PER_THREAD: u64 = 1_000_000;
const ROUNDS: usize = 40;

type Case<'a> = (&'static str, Box<dyn Fn() -> f64 + 'a>);

/// Two threads take the permit through `op` (true when it was taken, and
/// given back) until one of them has had it `PER_THREAD` times; ns per
/// acquisition while both ran. (Counting to a fixed number on each thread
/// would time the last stretch of whichever thread is behind alone.)
fn round<S: Sync>(sem: &S, op: impl Fn(&S) -> bool + Sync) -> f64 {
    let barrier = Barrier::new(2);
    let stop = AtomicBool::new(false);
    let (start, took) = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    let mut done = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if op(sem) {
                            done += 1;
                            if done == PER_THREAD {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                    (start, done)
                })
            })
            .collect();
        let ends: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        (
            ends.iter().map(|e| e.0).min().unwrap(),
            ends.iter().map(|e| e.1).sum::<u64>(),
        )
    });
    start.elapsed().as_nanos() as f64 / took as f64
}

pub fn main() {
    let store = AtomicUsize::new(1);
    let cas = AtomicUsize::new(1);
    let ours = backpressure::Semaphore::new(1);
    let tokio = tokio::sync::Semaphore::new(1);
    let al = async_lock::Semaphore::new(1);
    let fi = futures_intrusive::sync::Semaphore::new(true, 1);
    let take = |f: &AtomicUsize| {
        f.compare_exchange(1, 0, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    };
    let cases: Vec<Case> = vec![
        (
            "floor (CAS 1->0, store 1)",
            Box::new(|| {
                round(&store, |f| {
                    take(f) && {
                        f.store(1, Ordering::Release);
                        true
                    }
                })
            }),
        ),
        (
            "floor (CAS 1->0, CAS 0->1)",
            Box::new(|| {
                round(&cas, |f| {
                    take(f)
                        && f.compare_exchange(0, 1, Ordering::Release, Ordering::Relaxed)
                            .is_ok()
                })
            }),
        ),
        (
            "backpressure",
            Box::new(|| round(&ours, |s| s.try_acquire().is_ok())),
        ),
        (
            "tokio",
            Box::new(|| round(&tokio, |s| s.try_acquire().is_ok())),
        ),
        (
            "async-lock",
            Box::new(|| round(&al, |s| s.try_acquire().is_some())),
        ),
        (
            "futures-intrusive",
            Box::new(|| round(&fi, |s| s.try_acquire(1).is_some())),
        ),
    ];
    let peers = ["tokio", "async-lock", "futures-intrusive"];
    // One warm-up round, then the measured ones.
    let mut times = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for r in 0..=ROUNDS {
        for (k, (_, case)) in cases.iter().enumerate() {
            let ns = case();
            if r > 0 {
                times[k].push(ns);
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("2 threads, 1 permit, ns per acquisition, {ROUNDS} interleaved rounds");
    for (k, (name, _)) in cases.iter().enumerate() {
        let to_best: Vec<f64> = (0..ROUNDS)
            .map(|r| {
                let best = cases
                    .iter()
                    .enumerate()
                    .filter(|(_, (n, _))| peers.contains(n))
                    .map(|(p, _)| times[p][r])
                    .fold(f64::MAX, f64::min);
                times[k][r] / best
            })
            .collect();
        let best = times[k].iter().copied().fold(f64::MAX, f64::min);
        println!(
            "{name:28} best {best:6.1}  median {:6.1}  ratio (median of rounds) to the best peer {:5.2}x",
            median(times[k].clone()),
            median(to_best)
        );
    }
}
