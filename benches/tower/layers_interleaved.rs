//! The tower layers beside tower's, measured the way a noisy shared
//! machine allows: each case runs 100,000 requests per round, the cases
//! interleaved round after round, and the best round of each is kept (the
//! one least disturbed by other processes). Ratios from one run.
//!
//! Run: `cargo bench -p backpressure-benches --features tower --bench tower -- interleaved`

use std::future::{ready, Ready};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use backpressure::tower::{ConcurrencyLimitLayer, RateLimitLayer};
use backpressure::{Quota, Semaphore, TokenBucket};
use futures::FutureExt;
use tower::{Layer, Service, ServiceExt};

/// The no-op service: answers its request at once.
#[derive(Clone, Copy, Debug)]
struct Noop;

impl Service<u64> for Noop {
    type Response = u64;
    type Error = std::convert::Infallible;
    type Future = Ready<Result<u64, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u64) -> Self::Future {
        ready(Ok(req))
    }
}

fn oneshot<S: Service<u64>>(svc: &mut S, req: u64) -> bool {
    svc.oneshot(req).now_or_never().unwrap().is_ok()
}

fn ready_call<S: Service<u64>>(svc: &mut S, req: u64) -> bool {
    let svc = svc.ready().now_or_never().unwrap().ok().unwrap();
    svc.call(req).now_or_never().unwrap().is_ok()
}

/// One case: a name and one request through it.
type Case = (&'static str, Box<dyn FnMut(u64) -> bool>);

const PER_ROUND: u64 = 100_000;
const ROUNDS: usize = 60;

pub fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // tower's RateLimit makes a tokio `Sleep` when it is built.
    let _enter = rt.enter();
    let admitting = Quota::with_period(Duration::from_nanos(1)).allow_burst(NonZeroU32::MAX);
    let mut rate = RateLimitLayer::new(Arc::new(TokenBucket::new(admitting))).layer(Noop);
    let mut tower_rate =
        tower::limit::RateLimitLayer::new(u64::MAX, Duration::from_secs(3600)).layer(Noop);
    let mut conc = ConcurrencyLimitLayer::new(64).layer(Noop);
    let mut tower_conc = tower::limit::ConcurrencyLimitLayer::new(64).layer(Noop);
    let bucket = TokenBucket::new(admitting);
    let sem = Arc::new(Semaphore::new(64));
    let tokio_sem = Arc::new(tokio::sync::Semaphore::new(64));

    let mut cases: Vec<Case> = vec![
        (
            "concurrency ready-call: backpressure",
            Box::new(move |i| ready_call(&mut conc, i)),
        ),
        (
            "concurrency ready-call: tower",
            Box::new(move |i| ready_call(&mut tower_conc, i)),
        ),
        (
            "rate ready-call: backpressure",
            Box::new(move |i| ready_call(&mut rate, i)),
        ),
        (
            "rate ready-call: tower",
            Box::new(move |i| ready_call(&mut tower_rate, i)),
        ),
        (
            "floor: TokenBucket::try_acquire",
            Box::new(move |_| bucket.try_acquire(1).is_ok()),
        ),
        (
            "floor: Instant::now",
            Box::new(|_| {
                black_box(Instant::now());
                true
            }),
        ),
        (
            "floor: Semaphore try_acquire_owned + drop",
            Box::new(move |_| sem.clone().try_acquire_owned().is_ok()),
        ),
        (
            "floor: tokio Semaphore try_acquire_owned + drop",
            Box::new(move |_| tokio_sem.clone().try_acquire_owned().is_ok()),
        ),
    ];
    // The oneshot drivers need their own services (a closure owns each).
    let mut rate2 = RateLimitLayer::new(Arc::new(TokenBucket::new(admitting))).layer(Noop);
    let mut tower_rate2 =
        tower::limit::RateLimitLayer::new(u64::MAX, Duration::from_secs(3600)).layer(Noop);
    let mut conc2 = ConcurrencyLimitLayer::new(64).layer(Noop);
    let mut tower_conc2 = tower::limit::ConcurrencyLimitLayer::new(64).layer(Noop);
    cases.push((
        "concurrency oneshot: backpressure",
        Box::new(move |i| oneshot(&mut conc2, i)),
    ));
    cases.push((
        "concurrency oneshot: tower",
        Box::new(move |i| oneshot(&mut tower_conc2, i)),
    ));
    cases.push((
        "rate oneshot: backpressure",
        Box::new(move |i| oneshot(&mut rate2, i)),
    ));
    cases.push((
        "rate oneshot: tower",
        Box::new(move |i| oneshot(&mut tower_rate2, i)),
    ));

    // `TOWER_BENCH_ONLY=<substring>` keeps the matching cases (for a profiler).
    if let Ok(only) = std::env::var("TOWER_BENCH_ONLY") {
        cases.retain(|(name, _)| name.contains(only.as_str()));
    }
    let mut best = vec![f64::MAX; cases.len()];
    for _ in 0..ROUNDS {
        for (k, (_, case)) in cases.iter_mut().enumerate() {
            let start = Instant::now();
            for i in 0..PER_ROUND {
                black_box(case(black_box(i)));
            }
            let ns = start.elapsed().as_nanos() as f64 / PER_ROUND as f64;
            best[k] = best[k].min(ns);
        }
    }
    for ((name, _), ns) in cases.iter().zip(&best) {
        println!("{name:50} {ns:7.1} ns");
    }
    let ratio = |a: &str, b: &str| {
        let at = |n: &str| Some(best[cases.iter().position(|(m, _)| *m == n)?]);
        Some(at(a)? / at(b)?)
    };
    for layer in [
        "concurrency ready-call",
        "concurrency oneshot",
        "rate ready-call",
        "rate oneshot",
    ] {
        let (ours, theirs) = (format!("{layer}: backpressure"), format!("{layer}: tower"));
        if let Some(r) = ratio(&ours, &theirs) {
            println!("{layer:50} {r:7.2}x tower");
        }
    }
}
