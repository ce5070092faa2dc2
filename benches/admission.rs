//! The cost of `admit` + drop of an uncontended call, beside the sum of the
//! primitives it is made of (issue #12 item 6: at most 2x, no allocation).
//!
//! * `plain`: tool slot + global slot + one request quota;
//! * `weighted`: the same plus 3 weighted quotas (4 quotas in all).
//!
//! The "sum of primitives" case does exactly the atomic work: two
//! semaphore `try_acquire_owned` + drop, and one keyed bucket `reserve`
//! per quota, on the same clock.
//!
//! Run: `cargo bench --bench admission -- --warm-up-time 1 --measurement-time 3`

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use backpressure::admission::{Admission, CallSpec, SlotPolicy};
use backpressure::{Quota, Scoped, Semaphore};
use criterion::{criterion_group, criterion_main, Criterion};

/// Never binds: one cell per nanosecond, a burst of 2^32 - 1.
fn open() -> Quota {
    Quota::with_period(Duration::from_nanos(1)).allow_burst(NonZeroU32::MAX)
}

const RESOURCES: [&str; 3] = ["tokens", "input_tokens", "output_tokens"];

fn admit_once<S: backpressure::Sleeper, C: backpressure::Clock>(
    admission: &Admission<S, C>,
    spec: &CallSpec,
    cx: &mut Context<'_>,
) {
    match pin!(admission.admit(spec)).as_mut().poll(cx) {
        Poll::Ready(Ok(ticket)) => drop(black_box(ticket)),
        _ => panic!("an uncontended call is admitted at once"),
    }
}

fn admission(c: &mut Criterion) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut builder = Admission::builder()
        .fixed_rates()
        .default_quota(open())
        .tool("search", 64, SlotPolicy::Wait)
        .global_concurrency(64);
    for r in RESOURCES {
        builder = builder.resource(r, open());
    }
    let layer = builder.build();
    let plain = CallSpec::new("search", "key");
    let weighted = RESOURCES
        .iter()
        .fold(CallSpec::new("search", "key"), |s, r| s.cost(*r, 10));
    admit_once(&layer, &plain, &mut cx);
    admit_once(&layer, &weighted, &mut cx);

    // The primitives, as admit uses them.
    let tool = Arc::new(Semaphore::new(64));
    let global = Arc::new(Semaphore::new(64));
    let requests = Scoped::new(open());
    let quotas: Vec<Scoped<String>> = RESOURCES.iter().map(|_| Scoped::new(open())).collect();
    let key = "key".to_string();

    let mut g = c.benchmark_group("admit + drop, 1 quota");
    g.bench_function("admission", |b| {
        b.iter(|| admit_once(&layer, &plain, &mut cx))
    });
    g.bench_function("sum of primitives", |b| {
        b.iter(|| {
            let t = tool.clone().try_acquire_owned().unwrap();
            let g = global.clone().try_acquire_owned().unwrap();
            let r = requests.reserve(&key, 1, Duration::ZERO).unwrap();
            drop(black_box((t, g, r)));
        })
    });
    g.finish();

    let mut g = c.benchmark_group("admit + drop, 4 quotas");
    g.bench_function("admission", |b| {
        b.iter(|| admit_once(&layer, &weighted, &mut cx))
    });
    g.bench_function("sum of primitives", |b| {
        b.iter(|| {
            let t = tool.clone().try_acquire_owned().unwrap();
            let g = global.clone().try_acquire_owned().unwrap();
            let r = requests.reserve(&key, 1, Duration::ZERO).unwrap();
            let rs: [_; 3] =
                core::array::from_fn(|i| quotas[i].reserve(&key, 10, Duration::ZERO).unwrap());
            drop(black_box((t, g, r, rs)));
        })
    });
    g.finish();
}

criterion_group!(benches, admission);
criterion_main!(benches);
