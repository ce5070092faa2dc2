//! The adaptive rate against a simulated server, event by event on a
//! `ManualClock`: no wall clock anywhere.
//!
//! The client is what the admission layer does with a credential: a
//! `TokenBucket` whose quota the controller sets, `penalize(1 s)` on every
//! 429 (the server's `Retry-After: 1`), and callers that always have work,
//! so the next request leaves at the bucket's next ready time. The server
//! is GCRA at `R`/s with a burst of 2 and answers 429 beyond, 5 ms after
//! the request left.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use backpressure::adaptive::{AdaptiveRate, RateOutcome};
use backpressure::{Clock, ManualClock, TokenBucket};

const SEC: u64 = 1_000_000_000;

/// GCRA at `rate`/s, burst `burst`; refused requests cost nothing.
struct Server {
    period: u64,
    tolerance: u64,
    tat: u64,
}

impl Server {
    fn new(rate: f64, burst: u64) -> Self {
        let period = (SEC as f64 / rate).round() as u64;
        Server {
            period,
            tolerance: burst * period,
            tat: 0,
        }
    }

    fn admit(&mut self, at: u64) -> bool {
        if self.tat.saturating_sub(self.tolerance - self.period) <= at {
            self.tat = self.tat.max(at) + self.period;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Default)]
struct Run {
    requests: u64,
    throttled: u64,
    successes: u64,
    min_rate: f64,
    max_rate: f64,
    /// (when, rate) at every quota change, for a failing test's message.
    trace: Vec<(f64, f64)>,
}

impl Run {
    fn share(&self, rate: f64, secs: u64) -> f64 {
        self.successes as f64 / (rate * secs as f64)
    }

    fn throttled_share(&self) -> f64 {
        self.throttled as f64 / self.requests.max(1) as f64
    }
}

/// Runs `secs` simulated seconds against a server at `rate`/s, burst
/// `server_burst`, each reply `latency` after its request left.
fn simulate(cfg: &AdaptiveRate, rate: f64, server_burst: u64, secs: u64, latency: u64) -> Run {
    simulate_with(cfg, rate, server_burst, secs, || latency)
}

/// As [`simulate`], with each request's round trip drawn from `latency`
/// (replies may overtake each other); the server sees a request halfway.
fn simulate_with(
    cfg: &AdaptiveRate,
    rate: f64,
    server_burst: u64,
    secs: u64,
    mut latency: impl FnMut() -> u64,
) -> Run {
    let clock = ManualClock::new();
    let controller = cfg.controller(clock.now_nanos());
    let bucket = TokenBucket::with_clock(controller.quota(), clock.clone());
    let mut server = Server::new(rate, server_burst);
    // (reply at, sent at, accepted), earliest reply first.
    let mut in_flight: BinaryHeap<Reverse<(u64, u64, bool)>> = BinaryHeap::new();
    let end = secs * SEC;
    let mut run = Run {
        min_rate: controller.rate(),
        max_rate: controller.rate(),
        ..Run::default()
    };
    loop {
        let now = clock.now_nanos();
        // Replies due now, then any request the bucket lets out now.
        while let Some(&Reverse((at, sent, ok))) = in_flight.peek() {
            if at > now {
                break;
            }
            in_flight.pop();
            let outcome = if ok {
                RateOutcome::Success
            } else {
                RateOutcome::Throttled
            };
            if let Some(q) = controller.on_reply(now, sent, outcome) {
                bucket.set_quota(q);
                let r = controller.rate();
                run.min_rate = run.min_rate.min(r);
                run.max_rate = run.max_rate.max(r);
                run.trace.push((now as f64 / SEC as f64, r));
            }
            if !ok {
                bucket.penalize(Duration::from_secs(1));
            }
        }
        let next_send = match bucket.try_acquire(1) {
            Ok(()) => {
                let rtt = latency();
                let ok = server.admit(now + rtt / 2);
                run.requests += 1;
                if ok {
                    run.successes += 1;
                } else {
                    run.throttled += 1;
                }
                in_flight.push(Reverse((now + rtt, now, ok)));
                continue;
            }
            Err(e) => now + e.wait().expect("a wait, not a capacity error").as_nanos() as u64,
        };
        let next = in_flight
            .peek()
            .map_or(next_send, |&Reverse((at, _, _))| at.min(next_send));
        if next >= end {
            break;
        }
        clock.set(next);
    }
    run
}

fn print_table(title: &str, rows: &[(f64, u64, &Run)]) {
    println!("\n{title}");
    println!("| R (req/s) | seconds | requests | 429s | 429 share | successes | share of R | rate range |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for (r, secs, run) in rows {
        println!(
            "| {r} | {secs} | {} | {} | {:.1}% | {} | {:.1}% | {:.2}..{:.2} |",
            run.requests,
            run.throttled,
            100.0 * run.throttled_share(),
            run.successes,
            100.0 * run.share(*r, *secs),
            run.min_rate,
            run.max_rate,
        );
    }
}

#[test]
fn simulated_servers_are_found_without_a_429_storm() {
    let cfg = AdaptiveRate::new(); // initial guess 10/s
    let secs = 30;
    let rates = [2.0, 4.0, 25.0, 60.0];
    let runs: Vec<Run> = rates
        .iter()
        .map(|&r| simulate(&cfg, r, 2, secs, 5_000_000))
        .collect();
    let rows: Vec<(f64, u64, &Run)> = rates.iter().zip(&runs).map(|(&r, run)| (r, secs, run)).collect();
    print_table("GCRA server, burst 2, Retry-After 1 s, latency 5 ms, guess 10/s", &rows);
    for (&r, run) in rates.iter().zip(&runs) {
        println!("R={r}: {:?}", run.trace);
    }
}

#[test]
fn explore() {
    let cfg = AdaptiveRate::new();
    let secs = 30;
    let rates = [2.0, 4.0, 10.0, 25.0, 60.0];
    for (name, lat) in [("50ms", 50u64), ("200ms", 200)] {
        let runs: Vec<Run> = rates.iter().map(|&r| simulate(&cfg, r, 2, secs, lat * 1_000_000)).collect();
        let rows: Vec<(f64, u64, &Run)> = rates.iter().zip(&runs).map(|(&r, run)| (r, secs, run)).collect();
        print_table(&format!("latency {name}"), &rows);
    }
    let runs: Vec<Run> = rates.iter().map(|&r| {
        let mut rng = fastrand::Rng::with_seed(7);
        simulate_with(&cfg, r, 2, secs, move || rng.u64(5_000_000..150_000_000))
    }).collect();
    let rows: Vec<(f64, u64, &Run)> = rates.iter().zip(&runs).map(|(&r, run)| (r, secs, run)).collect();
    print_table("jitter 5..150ms", &rows);
    let runs: Vec<Run> = rates.iter().map(|&r| {
        let mut rng = fastrand::Rng::with_seed(7);
        simulate_with(&cfg, r, 2, secs, move || rng.u64(5_000_000..30_000_000))
    }).collect();
    let rows: Vec<(f64, u64, &Run)> = rates.iter().zip(&runs).map(|(&r, run)| (r, secs, run)).collect();
    print_table("jitter 5..30ms", &rows);
    for b in [1u64, 4, 10] {
        let runs: Vec<Run> = rates.iter().map(|&r| simulate(&cfg, r, b, secs, 5_000_000)).collect();
        let rows: Vec<(f64, u64, &Run)> = rates.iter().zip(&runs).map(|(&r, run)| (r, secs, run)).collect();
        print_table(&format!("server burst {b}"), &rows);
    }
    let runs: Vec<Run> = rates.iter().map(|&r| simulate(&cfg, r, 2, 120, 5_000_000)).collect();
    let rows: Vec<(f64, u64, &Run)> = rates.iter().zip(&runs).map(|(&r, run)| (r, 120, run)).collect();
    print_table("120 s", &rows);
}

#[test]
fn debug_one() {
    let cfg = AdaptiveRate::new();
    let r: f64 = std::env::var("R").unwrap().parse().unwrap();
    let lat: u64 = std::env::var("LAT").unwrap().parse().unwrap();
    let b: u64 = std::env::var("B").map_or(2, |b| b.parse().unwrap());
    let jit: u64 = std::env::var("JIT").map_or(0, |b| b.parse().unwrap());
    let mut rng = fastrand::Rng::with_seed(7);
    let run = simulate_with(&cfg, r, b, 30, move || lat * 1_000_000 + rng.u64(0..=jit * 1_000_000));
    print_table("debug", &[(r, 30, &run)]);
    for (t, r) in &run.trace { println!("{t:.3} {r:.2}"); }
}

#[test]
fn explore_fixed() {
    for (r, fixed) in [(25.0, 12.0), (25.0, 15.0), (25.0, 20.0), (25.0, 22.5), (60.0, 20.0), (60.0, 30.0), (60.0, 40.0), (60.0, 54.0)] {
        let cfg = AdaptiveRate::new().initial(Some(fixed)).min_rate(fixed).max_rate(fixed);
        let mut rng = fastrand::Rng::with_seed(7);
        let run = simulate_with(&cfg, r, 2, 30, move || rng.u64(5_000_000..150_000_000));
        print_table(&format!("fixed {fixed} jitter 5..150"), &[(r, 30, &run)]);
    }
}
