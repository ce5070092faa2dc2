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
//! Run: `cargo bench -p backpressure-benches --bench admission -- --warm-up-time 1 --measurement-time 3`

use std::task::Context;

mod admit_interleaved;
use criterion::{criterion_group, Criterion};

#[path = "../support/admission_case.rs"]
mod admission_case;
use admission_case::{admit_once, Primitives};

fn admission(c: &mut Criterion) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let (layer, plain, weighted) = admission_case::layer();

    // The primitives, as admit uses them.
    let primitives = Primitives::new();

    let mut g = c.benchmark_group("admit + drop, 1 quota");
    g.bench_function("admission", |b| {
        b.iter(|| admit_once(&layer, &plain, &mut cx))
    });
    g.bench_function("sum of primitives", |b| b.iter(|| primitives.plain()));
    g.finish();

    let mut g = c.benchmark_group("admit + drop, 4 quotas");
    g.bench_function("admission", |b| {
        b.iter(|| admit_once(&layer, &weighted, &mut cx))
    });
    g.bench_function("sum of primitives", |b| b.iter(|| primitives.weighted()));
    g.finish();
}

criterion_group!(benches, admission);
/// `cargo bench -p backpressure-benches --bench admission` runs the criterion groups above;
/// `cargo bench -p backpressure-benches --bench admission -- interleaved` runs `admit_interleaved.rs` instead.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "interleaved") {
        return admit_interleaved::main();
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
