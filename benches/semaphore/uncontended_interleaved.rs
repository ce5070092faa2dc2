//! The semaphore's uncontended rows (one thread), measured the way a noisy
//! shared machine allows (see `support/interleaved.rs`): `try_acquire` +
//! drop and `acquire().await` + drop beside tokio's and async-lock's, and
//! the floor (one compare-and-swap pair, what any lock-free permit count
//! pays) beside tokio's `try_acquire`, which says how low a ratio this
//! machine allows at all.
//!
//! Run: `cargo bench -p backpressure-benches --bench semaphore -- uncontended-interleaved`

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::interleaved;
use crate::interleaved::Case;

const PER_ROUND: u32 = 200_000;
const ROUNDS: usize = 40;

fn now<F: Future>(fut: F) -> F::Output {
    let waker = futures::task::noop_waker();
    match pin!(fut).poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("uncontended"),
    }
}

pub fn main() {
    let ours = Arc::new(backpressure::Semaphore::new(8));
    let tokio = Arc::new(tokio::sync::Semaphore::new(8));
    let lock = Arc::new(async_lock::Semaphore::new(8));
    let floor = Arc::new(AtomicUsize::new(8 << 3));
    let cases: Vec<Case> = vec![
        ("try_acquire + drop: backpressure", {
            let s = ours.clone();
            Box::new(move || black_box(s.try_acquire()).is_ok())
        }),
        ("try_acquire + drop: tokio", {
            let s = tokio.clone();
            Box::new(move || black_box(s.try_acquire()).is_ok())
        }),
        ("acquire().await + drop: backpressure", {
            let s = ours.clone();
            Box::new(move || black_box(now(s.acquire())).is_ok())
        }),
        ("acquire().await + drop: async-lock", {
            let s = lock.clone();
            Box::new(move || {
                black_box(now(s.acquire()));
                true
            })
        }),
        ("acquire().await + drop: backpressure", {
            let s = ours.clone();
            Box::new(move || black_box(now(s.acquire())).is_ok())
        }),
        ("acquire().await + drop: tokio", {
            let s = tokio.clone();
            Box::new(move || black_box(now(s.acquire())).is_ok())
        }),
        ("floor (one CAS pair)", {
            Box::new(move || {
                let v = floor.load(Ordering::Relaxed);
                let a = floor.compare_exchange(v, v - 8, Ordering::Acquire, Ordering::Relaxed);
                let v = floor.load(Ordering::Relaxed);
                let b = floor.compare_exchange(v, v + 8, Ordering::Release, Ordering::Relaxed);
                a.is_ok() && b.is_ok()
            })
        }),
        ("try_acquire + drop: tokio", {
            let s = tokio.clone();
            Box::new(move || black_box(s.try_acquire()).is_ok())
        }),
    ];
    let times = interleaved::rounds(&cases, ROUNDS, PER_ROUND);
    println!("one thread, ns per call, {ROUNDS} interleaved rounds of {PER_ROUND}");
    interleaved::print_pairs(&cases, &times);
}
