//! `admit` + drop beside the sum of its primitives, and a whole call
//! through `Runner::one` (the attempt loop, `drive`, with an exchange that
//! answers at once) beside `admit` + drop, measured the way a noisy shared
//! machine allows: each case runs 100,000 calls per round, the cases
//! interleaved round after round, and the best round of each is kept (the
//! one least disturbed by other processes). Ratios from one run; the
//! criterion groups in `main.rs` are the other version.
//!
//! Run: `cargo bench -p backpressure-benches --bench admission -- interleaved`

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Context;
use std::time::Instant;

use crate::admission_case;
use crate::admission_case::{admit_once, Primitives};

/// One case: a name, what to prepare before a round (untimed), and one
/// call through it.
type Case = (&'static str, Box<dyn FnMut()>, Box<dyn FnMut()>);

const PER_ROUND: u32 = 100_000;
const ROUNDS: usize = 40;

pub fn main() {
    let waker = futures::task::noop_waker();
    let (layer, plain, weighted) = admission_case::layer();
    let primitives = Arc::new(Primitives::new());

    let nothing = || Box::new(|| ()) as Box<dyn FnMut()>;
    // The whole call: Calls are built before the round (a Call boxes its
    // closure and owns its spec), so the round times `one` alone.
    let runner = admission_case::runner(&layer);
    let calls = Rc::new(RefCell::new(Vec::with_capacity(PER_ROUND as usize)));
    let mut cases: Vec<Case> = vec![
        ("admission, 1 quota", nothing(), {
            let (layer, plain, waker) = (layer.clone(), plain.clone(), waker.clone());
            Box::new(move || admit_once(&layer, &plain, &mut Context::from_waker(&waker)))
        }),
        ("primitives, 1 quota", nothing(), {
            let primitives = primitives.clone();
            Box::new(move || primitives.plain())
        }),
        ("admission, 4 quotas", nothing(), {
            let (layer, weighted, waker) = (layer.clone(), weighted.clone(), waker.clone());
            Box::new(move || admit_once(&layer, &weighted, &mut Context::from_waker(&waker)))
        }),
        (
            "primitives, 4 quotas",
            nothing(),
            Box::new(move || primitives.weighted()),
        ),
        (
            "call through drive",
            {
                let (calls, plain) = (calls.clone(), plain.clone());
                Box::new(move || {
                    let mut calls = calls.borrow_mut();
                    calls.extend((0..PER_ROUND).map(|_| admission_case::ready_call(&plain)));
                })
            },
            {
                let waker = waker.clone();
                Box::new(move || {
                    let call = calls.borrow_mut().pop().expect("prepared");
                    admission_case::call_once(&runner, call, &mut Context::from_waker(&waker));
                })
            },
        ),
    ];
    let mut best = vec![f64::MAX; cases.len()];
    for _ in 0..ROUNDS {
        for (i, (_, prepare, case)) in cases.iter_mut().enumerate() {
            prepare();
            let start = Instant::now();
            for _ in 0..PER_ROUND {
                case();
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(PER_ROUND);
            best[i] = best[i].min(ns);
        }
    }
    for (i, (name, _, _)) in cases.iter().enumerate() {
        println!("{name:<24} {:>8.1} ns", best[i]);
    }
    println!(
        "admit + drop / primitives, 1 quota: {:.2}x; 4 quotas: {:.2}x (goal <= 1.3x)",
        best[0] / best[1],
        best[2] / best[3]
    );
    println!(
        "call through drive / admit + drop, 1 quota: {:.2}x (goal <= 2x)",
        best[4] / best[0]
    );
}
