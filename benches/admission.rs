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

use std::hint::black_box;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use backpressure::{Scoped, Semaphore};
use criterion::{criterion_group, criterion_main, Criterion};

#[path = "support/admission_case.rs"]
mod admission_case;
use admission_case::{admit_once, open, RESOURCES};

fn admission(c: &mut Criterion) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let (layer, plain, weighted) = admission_case::layer();

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
