//! `admit` + drop beside the sum of its primitives (issue #12 item 6),
//! measured the way a noisy shared machine allows: each case runs 100,000
//! calls per round, the cases interleaved round after round, and the best
//! round of each is kept (the one least disturbed by other processes).
//! Ratios from one run; `benches/admission.rs` is the criterion version.
//!
//! Run: `cargo bench -p backpressure-benches --bench admission -- interleaved`

use std::sync::Arc;
use std::task::Context;
use std::time::Instant;

use crate::admission_case;
use crate::admission_case::{admit_once, Primitives};

/// One case: a name and one call through it.
type Case = (&'static str, Box<dyn FnMut()>);

const PER_ROUND: u32 = 100_000;
const ROUNDS: usize = 40;

pub fn main() {
    let waker = futures::task::noop_waker();
    let (layer, plain, weighted) = admission_case::layer();
    let primitives = Arc::new(Primitives::new());

    let mut cases: Vec<Case> = vec![
        ("admission, 1 quota", {
            let (layer, plain, waker) = (layer.clone(), plain.clone(), waker.clone());
            Box::new(move || admit_once(&layer, &plain, &mut Context::from_waker(&waker)))
        }),
        ("primitives, 1 quota", {
            let primitives = primitives.clone();
            Box::new(move || primitives.plain())
        }),
        ("admission, 4 quotas", {
            let (layer, weighted, waker) = (layer.clone(), weighted.clone(), waker.clone());
            Box::new(move || admit_once(&layer, &weighted, &mut Context::from_waker(&waker)))
        }),
        (
            "primitives, 4 quotas",
            Box::new(move || primitives.weighted()),
        ),
    ];
    let mut best = vec![f64::MAX; cases.len()];
    for _ in 0..ROUNDS {
        for (i, (_, case)) in cases.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..PER_ROUND {
                case();
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(PER_ROUND);
            best[i] = best[i].min(ns);
        }
    }
    for (i, (name, _)) in cases.iter().enumerate() {
        println!("{name:<24} {:>8.1} ns", best[i]);
    }
    println!(
        "ratio, 1 quota: {:.2}x; 4 quotas: {:.2}x (goal <= 2x)",
        best[0] / best[1],
        best[2] / best[3]
    );
}
