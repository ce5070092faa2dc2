//! One permit handed over on one thread with no runtime: a future
//! queues behind the held permit (`Pending`), the permit is dropped (the
//! release hands it to the queued future and wakes it) and the future
//! is polled again (`Ready`), with a no-op waker. What is left is the
//! semaphore's own hand-off (queue, unqueue, two polls), without a
//! runtime's waker clone, wake and task polls, which
//! `contended_interleaved.rs`'s current-thread table adds on top.
//!
//! Cases interleave round after round; prints each case's median round
//! and the median of the per-round ratios to futures-intrusive.
//!
//! Run: `cargo bench -p backpressure-benches --bench semaphore -- handoff`

use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

const PER_ROUND: u32 = 200_000;
const ROUNDS: usize = 40;

/// One round of `PER_ROUND` hand-offs on a fresh 1-permit semaphore; ns
/// per hand-off. `$ready` maps the acquire's output to a permit.
macro_rules! handoffs {
    ($sem:expr, $try:ident($($t:expr),*), $acquire:ident($($a:expr),*), |$out:ident| $ready:expr) => {{
        let sem = $sem;
        let mut cx = Context::from_waker(Waker::noop());
        let mut held = sem.$try($($t),*).expect("the only permit");
        let start = Instant::now();
        for _ in 0..PER_ROUND {
            let mut fut = pin!(sem.$acquire($($a),*));
            assert!(fut.as_mut().poll(&mut cx).is_pending(), "the permit is held");
            drop(held);
            held = match fut.as_mut().poll(&mut cx) {
                Poll::Ready($out) => $ready,
                Poll::Pending => panic!("the release handed the permit over"),
            };
        }
        let ns = start.elapsed().as_nanos() as f64 / f64::from(PER_ROUND);
        drop(held);
        ns
    }};
}

pub fn main() {
    type Case = (&'static str, fn() -> f64);
    let cases: [Case; 4] = [
        ("backpressure", || {
            handoffs!(
                backpressure::Semaphore::new(1),
                try_acquire(),
                acquire(),
                |r| r.unwrap()
            )
        }),
        ("futures-intrusive", || {
            handoffs!(
                futures_intrusive::sync::Semaphore::new(true, 1),
                try_acquire(1),
                acquire(1),
                |p| p
            )
        }),
        ("tokio", || {
            handoffs!(
                tokio::sync::Semaphore::new(1),
                try_acquire(),
                acquire(),
                |r| r.unwrap()
            )
        }),
        ("async-lock", || {
            handoffs!(
                async_lock::Semaphore::new(1),
                try_acquire(),
                acquire(),
                |p| p
            )
        }),
    ];
    for (_, case) in &cases {
        case();
    }
    let mut times = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (k, (_, case)) in cases.iter().enumerate() {
            times[k].push(case());
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("one permit handed over on one thread, no runtime, ns per hand-off, {ROUNDS} interleaved rounds");
    for (k, (name, _)) in cases.iter().enumerate() {
        let ratio = median(times[k].iter().zip(&times[1]).map(|(a, b)| a / b).collect());
        println!(
            "{name:20} median {:6.1}  ratio (median of rounds) to futures-intrusive {ratio:4.2}x",
            median(times[k].clone())
        );
    }
}
