//! Per-request overhead of the tower layers on a no-op service, beside
//! tower's own `ConcurrencyLimit` and `RateLimit` (feature `limit`) in the
//! same groups. Goal (DESIGN.md): <= 1.0x tower for both.
//!
//! Two drivers per layer: `ready().call()` on one service (the service is
//! kept, as a client driving `poll_ready` does), and `oneshot` (ready, call
//! and await in one future; on `&mut svc`, since tower's `RateLimit` is not
//! `Clone`). Futures are polled once with `now_or_never`: a no-op service
//! completes at the first poll, so no executor cost is measured.
//!
//! Run: `cargo bench -p backpressure-benches --features tower --bench tower -- --warm-up-time 1 --measurement-time 3`

use std::future::{ready, Ready};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use backpressure::tower::{ConcurrencyLimitLayer, KeyedRateLimitLayer, RateLimitLayer};
use backpressure::{Quota, Scoped, TokenBucket};
mod layers_interleaved;
use criterion::{criterion_group, Criterion};
use futures::FutureExt;
use tower::{Layer, Service, ServiceExt};

/// The no-op service: answers its request at once.
#[derive(Clone, Copy, Debug)]
struct Noop;

impl Service<u64> for Noop {
    type Response = u64;
    type Error = std::convert::Infallible;
    type Future = Ready<Result<u64, Self::Error>>;

    #[inline]
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    #[inline]
    fn call(&mut self, req: u64) -> Self::Future {
        ready(Ok(req))
    }
}

/// One request through `svc`: poll_ready, call, poll the response once.
#[inline]
fn ready_call<S>(svc: &mut S, req: u64) -> bool
where
    S: Service<u64>,
{
    let svc = svc.ready().now_or_never().unwrap().ok().unwrap();
    svc.call(req).now_or_never().unwrap().is_ok()
}

#[inline]
fn oneshot<S>(svc: &mut S, req: u64) -> bool
where
    S: Service<u64>,
{
    svc.oneshot(req).now_or_never().unwrap().is_ok()
}

/// Never denies: one cell per nanosecond, a burst of 2^32 - 1.
fn admitting() -> Quota {
    Quota::with_period(Duration::from_nanos(1)).allow_burst(NonZeroU32::MAX)
}

fn floor(c: &mut Criterion) {
    let mut g = c.benchmark_group("tower no layer (floor)");
    let mut svc = Noop;
    g.bench_function("ready-call", |b| {
        b.iter(|| ready_call(&mut svc, black_box(1)))
    });
    g.bench_function("oneshot", |b| b.iter(|| oneshot(&mut svc, black_box(1))));
    g.finish();
}

fn concurrency(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut g = c.benchmark_group("tower concurrency ready-call");
    let mut ours = ConcurrencyLimitLayer::new(64).layer(Noop);
    g.bench_function("backpressure", |b| {
        b.iter(|| ready_call(&mut ours, black_box(1)))
    });
    let mut shed = ConcurrencyLimitLayer::new(64)
        .reject(Duration::from_millis(1))
        .layer(Noop);
    g.bench_function("backpressure (reject)", |b| {
        b.iter(|| ready_call(&mut shed, black_box(1)))
    });
    let mut theirs = tower::limit::ConcurrencyLimitLayer::new(64).layer(Noop);
    g.bench_function("tower", |b| {
        b.iter(|| ready_call(&mut theirs, black_box(1)))
    });
    g.finish();

    let mut g = c.benchmark_group("tower concurrency oneshot");
    g.bench_function("backpressure", |b| {
        b.iter(|| oneshot(&mut ours, black_box(1)))
    });
    g.bench_function("tower", |b| b.iter(|| oneshot(&mut theirs, black_box(1))));
    // A fresh clone per request (tower's is Clone too).
    g.bench_function("backpressure (clone)", |b| {
        b.iter(|| {
            ours.clone()
                .oneshot(black_box(1))
                .now_or_never()
                .unwrap()
                .is_ok()
        })
    });
    g.bench_function("tower (clone)", |b| {
        b.iter(|| {
            theirs
                .clone()
                .oneshot(black_box(1))
                .now_or_never()
                .unwrap()
                .is_ok()
        })
    });
    g.finish();
}

fn rate(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // tower's RateLimit makes a tokio `Sleep` when it is built.
    let _enter = rt.enter();
    let mut ours = RateLimitLayer::new(Arc::new(TokenBucket::new(admitting()))).layer(Noop);
    let mut theirs =
        tower::limit::RateLimitLayer::new(u64::MAX, Duration::from_secs(3600)).layer(Noop);
    let mut keyed =
        KeyedRateLimitLayer::new(Arc::new(Scoped::new(admitting())), |r: &u64| *r & 7).layer(Noop);

    let mut g = c.benchmark_group("tower rate ready-call");
    let floor = TokenBucket::new(admitting());
    g.bench_function("floor: TokenBucket::try_acquire", |b| {
        b.iter(|| black_box(floor.try_acquire(1)).is_ok())
    });
    g.bench_function("floor: Instant::now", |b| {
        b.iter(|| black_box(std::time::Instant::now()))
    });
    g.bench_function("backpressure", |b| {
        b.iter(|| ready_call(&mut ours, black_box(1)))
    });
    g.bench_function("backpressure (keyed, 8 keys)", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i = i.wrapping_add(1);
            ready_call(&mut keyed, black_box(i))
        })
    });
    g.bench_function("tower", |b| {
        b.iter(|| ready_call(&mut theirs, black_box(1)))
    });
    g.finish();

    let mut g = c.benchmark_group("tower rate oneshot");
    g.bench_function("backpressure", |b| {
        b.iter(|| oneshot(&mut ours, black_box(1)))
    });
    g.bench_function("tower", |b| b.iter(|| oneshot(&mut theirs, black_box(1))));
    g.bench_function("backpressure (clone)", |b| {
        b.iter(|| {
            ours.clone()
                .oneshot(black_box(1))
                .now_or_never()
                .unwrap()
                .is_ok()
        })
    });
    g.finish();
}

criterion_group!(benches, floor, concurrency, rate);
/// `cargo bench -p backpressure-benches --bench tower` runs the criterion groups above;
/// `cargo bench -p backpressure-benches --bench tower -- interleaved` runs `layers_interleaved.rs` instead.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "interleaved") {
        return layers_interleaved::main();
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
