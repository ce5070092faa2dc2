//! The measurement the `*_interleaved` benches share, for a noisy shared
//! machine: every case runs `per_round` calls per round, the cases
//! interleaved round after round (one warm-up round first), so cases next
//! to each other in time see the same load.

use std::hint::black_box;
use std::time::Instant;

/// One case: a name and one call through it.
pub type Case = (&'static str, Box<dyn Fn() -> bool>);

/// Each case's time per call (ns) in every measured round.
pub fn rounds(cases: &[Case], rounds: usize, per_round: u32) -> Vec<Vec<f64>> {
    let mut times = vec![Vec::with_capacity(rounds); cases.len()];
    for round in 0..=rounds {
        for (k, (_, case)) in cases.iter().enumerate() {
            let start = Instant::now();
            for _ in 0..per_round {
                black_box(case());
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(per_round);
            // Round 0 is a warm-up.
            if round > 0 {
                times[k].push(ns);
            }
        }
    }
    times
}

/// Prints the cases two by two (ours, then its peer): each one's best
/// round, the median over rounds of the per-round ratio, and best/best.
pub fn print_pairs(cases: &[Case], times: &[Vec<f64>]) {
    let best = |k: usize| times[k].iter().copied().fold(f64::MAX, f64::min);
    for pair in (0..cases.len()).step_by(2) {
        let mut ratios: Vec<f64> = times[pair]
            .iter()
            .zip(&times[pair + 1])
            .map(|(a, b)| a / b)
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "{:40} best {:6.2}  {:36} best {:6.2}  ratio: median of rounds {:5.3}x, best/best {:5.3}x",
            cases[pair].0,
            best(pair),
            cases[pair + 1].0,
            best(pair + 1),
            ratios[ratios.len() / 2],
            best(pair) / best(pair + 1),
        );
    }
}
