//! `RedisBucket` decisions against a local `redis-server`: admitted calls
//! per second and p50/p99 latency per decision, with and without leasing,
//! with 1 and 8 concurrent callers.
//!
//! `cargo bench -p backpressure-benches --features redis --bench redis_bucket` (a plain `main`:
//! criterion's sampling does not fit a shared server and a tokio runtime
//! well). `BENCH_SECS` sets the seconds per case (default 2). Without
//! `--bench` (as `cargo test --all-targets` runs it) each case runs for
//! 50 ms as a smoke test. Skipped with a message when `redis-server` is
//! not installed.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use backpressure::{Quota, RedisBucket};
use redis_server::RedisServer;

struct Case {
    lease: Option<u32>,
    callers: usize,
}

struct Outcome {
    admitted: u64,
    denied: u64,
    secs: f64,
    latencies: Vec<u64>,
    round_trips: u64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

async fn run(server: &RedisServer, key: &str, case: &Case, secs: f64) -> Outcome {
    // Generous enough that the quota is rarely what limits: this measures
    // the cost of a decision.
    let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
        .allow_burst(NonZeroU32::new(1_000).unwrap());
    let mut builder =
        RedisBucket::builder(&server.url(), key, quota).timeout(Duration::from_millis(500));
    if let Some(k) = case.lease {
        builder = builder.lease(NonZeroU32::new(k).unwrap(), Duration::from_millis(50));
    }
    let bucket = std::sync::Arc::new(builder.build().unwrap());
    bucket.available().await; // connect and load the script
    let trips0 = bucket.stats().round_trips;
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..case.callers)
        .map(|_| {
            let bucket = bucket.clone();
            tokio::spawn(async move {
                let (mut admitted, mut denied, mut lat) = (0u64, 0u64, Vec::new());
                while Instant::now() < until {
                    let t = Instant::now();
                    let ok = bucket.try_acquire(1).await.is_ok();
                    lat.push(t.elapsed().as_nanos() as u64);
                    if ok {
                        admitted += 1;
                    } else {
                        denied += 1;
                    }
                }
                (admitted, denied, lat)
            })
        })
        .collect();
    let mut out = Outcome {
        admitted: 0,
        denied: 0,
        secs: 0.0,
        latencies: Vec::new(),
        round_trips: 0,
    };
    for t in tasks {
        let (a, d, l) = t.await.unwrap();
        out.admitted += a;
        out.denied += d;
        out.latencies.extend(l);
    }
    out.secs = start.elapsed().as_secs_f64();
    out.round_trips = bucket.stats().round_trips - trips0;
    bucket.release_lease().await;
    out.latencies.sort_unstable();
    out
}

fn main() {
    if !redis_server::available("benches/redis_bucket") {
        return;
    }
    let bench = std::env::args().any(|a| a == "--bench");
    let secs: f64 = if bench {
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0)
    } else {
        0.05
    };
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cases = [
        Case {
            lease: None,
            callers: 1,
        },
        Case {
            lease: None,
            callers: 8,
        },
        Case {
            lease: Some(64),
            callers: 1,
        },
        Case {
            lease: Some(64),
            callers: 8,
        },
    ];
    println!(
        "| leasing | callers | admitted/s | p50 µs | p99 µs | round trips / admitted | denied |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (i, case) in cases.iter().enumerate() {
        let o = runtime.block_on(run(&server, &format!("bench-{i}"), case, secs));
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.3} | {} |",
            case.lease
                .map_or("off".to_owned(), |k| format!("{k} cells")),
            case.callers,
            o.admitted as f64 / o.secs,
            percentile(&o.latencies, 0.50),
            percentile(&o.latencies, 0.99),
            o.round_trips as f64 / o.admitted.max(1) as f64,
            o.denied,
        );
    }
}
