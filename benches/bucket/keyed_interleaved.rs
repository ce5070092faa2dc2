//! `Scoped` beside governor's keyed limiter, measured like
//! `bucket_interleaved` (its own binary, so neither file's code changes how
//! the other's peers are compiled): each case runs 200,000 calls per
//! round, the cases interleaved round after round; prints each case's
//! best round and the median over rounds of the per-round ratio to its
//! governor twin.
//!
//! 100,000 keys drawn Zipf-like (s = 1) and 1,000 keys round-robin, at
//! governor's benchmark quota (10^9/s, burst 10^9), as in `benches/bucket.rs`;
//! both sides read the quanta clock on every call.
//!
//! Run: `cargo bench -p backpressure-benches --bench bucket -- keyed-interleaved`

use std::cell::Cell;
use std::hint::black_box;
use std::num::NonZeroU32;

use backpressure::{Quota, Scoped};
use governor::{Quota as GQuota, RateLimiter};

use crate::walks::{round_robin, zipf};

const PER_ROUND: u32 = 200_000;
const ROUNDS: usize = 40;

use crate::interleaved;
use crate::interleaved::Case;

/// One keyed pair: ours and governor's, each walking `walk` cyclically.
fn keyed(names: [&'static str; 2], keys: u64, walk: Vec<u64>) -> [Case; 2] {
    let n = NonZeroU32::new(1_000_000_000).unwrap();
    let scoped: Scoped<u64> = Scoped::new(Quota::per_second(n)).with_max_keys(2 * keys as usize);
    let gov = RateLimiter::keyed(GQuota::per_second(n));
    for k in 0..keys {
        scoped.try_acquire(&k, 1).unwrap();
        gov.check_key(&k).unwrap();
    }
    let walk = std::rc::Rc::new(walk);
    let (w1, w2) = (walk.clone(), walk);
    let (i1, i2) = (Cell::new(0usize), Cell::new(0usize));
    let step = |i: &Cell<usize>, len: usize| {
        let next = if i.get() + 1 == len { 0 } else { i.get() + 1 };
        i.set(next);
        next
    };
    [
        (
            names[0],
            Box::new(move || {
                let k = w1[step(&i1, w1.len())];
                black_box(scoped.try_acquire(&k, 1)).is_ok()
            }),
        ),
        (
            names[1],
            Box::new(move || {
                let k = w2[step(&i2, w2.len())];
                black_box(gov.check_key(&k)).is_ok()
            }),
        ),
    ]
}

pub fn main() {
    let mut cases: Vec<Case> = Vec::new();
    cases.extend(keyed(
        [
            "keyed 100,000 zipf: backpressure",
            "keyed 100,000 zipf: governor",
        ],
        100_000,
        zipf(100_000, 1 << 20),
    ));
    cases.extend(keyed(
        [
            "keyed 1,000 round-robin: backpressure",
            "keyed 1,000 round-robin: governor",
        ],
        1_000,
        round_robin(1_000),
    ));
    let times = interleaved::rounds(&cases, ROUNDS, PER_ROUND);
    println!("one thread, ns per call, {ROUNDS} interleaved rounds of {PER_ROUND}");
    interleaved::print_pairs(&cases, &times);
}
