//! Limits learned from a server that does not say them, on loopback.
//!
//! **Rate.** A server allows R requests/s per key (GCRA, burst 2) and
//! answers `429` + `Retry-After: 1` beyond, with no `RateLimit` headers,
//! like nginx `limit_req`. Eight callers run a closed loop of calls through
//! `Runner` + `Admission` for `--seconds`, each waiting out a `Throttled`'s
//! `retry_after_ms` before its next call, as a model told "rate_limited"
//! does. Told nothing, the layer used to run every key at its default
//! 10/s: below that it stormed (half its requests were 429s), above it,
//! it left capacity unused. Two strategies, each on a fresh server, for R
//! below and above that guess:
//!
//! * `fixed 10/s`: the old default (`Builder::fixed_rates`);
//! * `adaptive`: the default now: the rate is learned from 429s
//!   (`AdaptiveRate`).
//!
//! **Concurrency.** A server with C workers (base latency L) queues beyond
//! C and answers 503 beyond its queue; C halves a third of the way through
//! the run and doubles back at two thirds. 4C callers run a closed loop
//! through four limiters: fixed C/4, fixed 4C, AIMD and Gradient2
//! (`AdaptiveLimiter`).
//!
//! ```sh
//! cargo run --release --example adaptive -- --seconds 20
//! ```
//!
//! `ADAPTIVE_TRACE=1` prints, for the rate servers, every request's
//! arrival (ms since the server started) and its answer to stderr: where a
//! run loses its share of R (a hold, a guessed cut, a slow climb) shows in
//! the gaps between them.

mod concurrency;
mod server;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use backpressure::adaptive::AdaptiveRate;
use backpressure::admission::{Admission, Call, CallResult, CallSpec, Reply, Runner};
use backpressure::headers::ServerHint;

const KEY: &str = "org-key-1";
const CALLERS: usize = 8;

struct Args {
    seconds: u64,
    rates: Vec<f64>,
    only: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 20,
        rates: vec![4.0, 25.0],
        only: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--seconds" => a.seconds = value.parse().expect("--seconds N"),
            "--rates" => {
                a.rates = value
                    .split(',')
                    .map(|r| r.parse().expect("--rates 4,25"))
                    .collect()
            }
            "--only" => a.only = Some(value),
            other => panic!(
                "unknown flag {other}; flags: --seconds N --rates 4,25 --only rate|concurrency"
            ),
        }
        i += 2;
    }
    a
}

/// One strategy's run against a rate-limited server.
struct RateRow {
    strategy: &'static str,
    rate: f64,
    requests: u64,
    ok: u64,
    throttled: u64,
    failed: usize,
    learned: Option<f64>,
    seconds: f64,
}

async fn rate_run(strategy: &'static str, rate: f64, seconds: u64) -> RateRow {
    let server = server::rate(rate).await;
    let builder =
        Admission::builder().tool("fetch", CALLERS, backpressure::admission::SlotPolicy::Wait);
    let admission = match strategy {
        "fixed 10/s" => builder.fixed_rates().build(),
        _ => builder.adaptive_rate(AdaptiveRate::new()).build(),
    };
    let runner: Arc<Runner<u16>> = Arc::new(Runner::new(admission, Duration::ZERO));
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CALLERS {
        let (runner, stop, failed) = (runner.clone(), stop.clone(), failed.clone());
        let addr = server.addr;
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let call = Call::new(CallSpec::new("fetch", KEY), move || async move {
                    let r = server::get(addr, "/fetch")
                        .await
                        .map_err(|e| e.to_string())?;
                    let hint = ServerHint::from_headers(
                        r.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
                        SystemTime::now(),
                    );
                    Ok(Reply::new(r.status, r.status).with_hint(hint))
                });
                match runner.one(call).await {
                    CallResult::Throttled(t) => {
                        // A model told "rate_limited" waits before it asks again.
                        let wait = t.retry_after().unwrap_or(Duration::from_secs(1));
                        tokio::time::sleep(wait).await;
                    }
                    CallResult::Done { .. } => {}
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let (requests, ok, throttled) = server.state.counts.snapshot();
    let elapsed = start.elapsed().as_secs_f64();
    runner.admission().close();
    for t in tasks {
        let _ = t.await;
    }
    RateRow {
        strategy,
        rate,
        requests,
        ok,
        throttled,
        failed: failed.load(Ordering::Relaxed),
        learned: runner.admission().learned_rate(KEY),
        seconds: elapsed,
    }
}

fn print_rate_table(rows: &[RateRow]) {
    println!(
        "| server limit | strategy   | requests | 429s        | failures | achieved     | learned rate |"
    );
    println!(
        "|--------------|------------|----------|-------------|----------|--------------|--------------|"
    );
    for r in rows {
        let share = r.ok as f64 / (r.rate * r.seconds);
        println!(
            "| {:>6.1} r/s   | {:<10} | {:>8} | {:>4} ({:>4.1}%) | {:>8} | {:>5.1}% of R | {:>12} |",
            r.rate,
            r.strategy,
            r.requests,
            r.throttled,
            100.0 * r.throttled as f64 / r.requests.max(1) as f64,
            r.failed,
            100.0 * share,
            r.learned
                .map_or_else(|| "-".to_string(), |l| format!("{l:.2} r/s")),
        );
    }
}

fn main() {
    let args = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        if args.only.as_deref() != Some("concurrency") {
            println!(
                "rate: server GCRA at R r/s, burst 2, 429 + Retry-After: 1, no limit headers; \
                 {CALLERS} callers, closed loop, {} s per row\n",
                args.seconds
            );
            let mut rows = Vec::new();
            for &rate in &args.rates {
                for strategy in ["fixed 10/s", "adaptive"] {
                    rows.push(rate_run(strategy, rate, args.seconds).await);
                }
            }
            print_rate_table(&rows);
            println!();
        }
        if args.only.as_deref() != Some("rate") {
            concurrency::run(args.seconds).await;
        }
    });
}
