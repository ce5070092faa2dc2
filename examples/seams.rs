//! One model turn through each seam, against a rate-limited API: the
//! reqwest middleware and `Runner` (`Call::request`) must give the same
//! answers (issue "one contract on every seam").
//!
//! The turn is 20 parallel tool calls over 3 tools, with the duplicate reads
//! a model emits (12 distinct). The API limits each key to `--rate`
//! requests/s with a burst of 2 and answers 429 + `Retry-After: 1` beyond,
//! stating no limits: by default the crate's `ThrottlingServer` (GCRA), or
//! any server given with `--url` (the nginx `limit_req` of
//! `../shared/tools/limit-req-server`, keyed by `x-api-key`).
//!
//! Each seam runs with no quota told, a wrong guess (10/s, implied burst
//! 10) and the true limit (rate/s, burst 2). Columns: requests that reached
//! the API and its 429s (counted by a middleware inside the admission
//! layer), the calls done / throttled (a structured "not now") / failed,
//! and the turn's wall time.
//!
//! ```sh
//! cargo run --release --features reqwest,testing --example seams -- --runs 3
//! PORT=18500 RATE=4 BURST=2 ../shared/tools/limit-req-server   # prints nginx's pid
//! cargo run --release --features reqwest,testing --example seams -- --url http://127.0.0.1:18500/api --runs 3
//! ```

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backpressure::admission::{Admission, Call, CallResult, CallSpec, Runner};
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::retry::RequestDeadline;
use backpressure::testing::{Limit, ThrottlingServer};
use backpressure::{Quota, Throttled};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};

const KEY: &str = "key-a";

/// Counts what reaches the API (it sits inside the admission layer).
#[derive(Clone, Default)]
struct Counter {
    sent: Arc<AtomicUsize>,
    throttled: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Middleware for Counter {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        let r = next.run(req, extensions).await;
        if matches!(&r, Ok(resp) if resp.status() == 429) {
            self.throttled.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
}

/// The turn: (tool, args); 20 calls, 12 distinct.
fn turn() -> Vec<(&'static str, String)> {
    let mut calls = Vec::new();
    for i in 0..8 {
        calls.push(("search", format!("q=topic-{}", i % 5)));
    }
    for i in 0..7 {
        calls.push(("usage", format!("org=org-{}", i % 4)));
    }
    for i in 0..5 {
        calls.push(("customers", format!("page={}", i % 3)));
    }
    calls
}

#[derive(Clone, Copy, Debug)]
enum Told {
    Nothing,
    Guess,
    Truth,
}

fn admission(told: Told, rate: u32) -> Admission {
    let b = Admission::builder();
    match told {
        Told::Nothing => b,
        Told::Guess => b.default_quota(Quota::per_second(NonZeroU32::new(10).unwrap())),
        Told::Truth => b.default_quota(
            Quota::per_second(NonZeroU32::new(rate).unwrap())
                .allow_burst(NonZeroU32::new(2).unwrap()),
        ),
    }
    .build()
}

#[derive(Default)]
struct Row {
    sent: usize,
    throttled_429: usize,
    done: usize,
    throttled: usize,
    failed: usize,
    wall: Duration,
}

async fn through_middleware(url: &str, told: Told, rate: u32) -> Row {
    let counter = Counter::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(AdmissionMiddleware::new(admission(told, rate)).credential_header("x-api-key"))
        .with(counter.clone())
        .build();
    let start = Instant::now();
    let calls: Vec<_> = turn()
        .into_iter()
        .map(|(tool, args)| {
            let request = client
                .get(format!("{url}/{tool}?{args}"))
                .header("x-api-key", KEY)
                .with_extension(RequestDeadline(Duration::from_secs(10)));
            tokio::spawn(async move { request.send().await })
        })
        .collect();
    let mut row = Row::default();
    for c in calls {
        match c.await.expect("the call task") {
            Ok(r) if r.status().is_success() => row.done += 1,
            Err(reqwest_middleware::Error::Middleware(e))
                if e.downcast_ref::<Throttled>().is_some() =>
            {
                row.throttled += 1
            }
            _ => row.failed += 1,
        }
    }
    row.wall = start.elapsed();
    row.sent = counter.sent.load(Ordering::SeqCst);
    row.throttled_429 = counter.throttled.load(Ordering::SeqCst);
    row
}

async fn through_runner(url: &str, told: Told, rate: u32) -> Row {
    let counter = Counter::default();
    let client: ClientWithMiddleware = ClientBuilder::new(reqwest::Client::new())
        .with(counter.clone())
        .build();
    let runner: Runner<http::Response<Vec<u8>>, reqwest_middleware::Error> =
        Runner::new(admission(told, rate), Duration::ZERO);
    let start = Instant::now();
    let calls = turn()
        .into_iter()
        .map(|(tool, args)| {
            let request = client
                .get(format!("{url}/{tool}?{args}"))
                .header("x-api-key", KEY);
            let spec = CallSpec::new(tool, KEY).deadline(Duration::from_secs(10));
            Call::request(spec, request)
        })
        .collect();
    let mut row = Row::default();
    for r in runner.execute(calls).await {
        match r {
            CallResult::Done { value, .. } if value.status().is_success() => row.done += 1,
            CallResult::Throttled(_) => row.throttled += 1,
            _ => row.failed += 1,
        }
    }
    row.wall = start.elapsed();
    row.sent = counter.sent.load(Ordering::SeqCst);
    row.throttled_429 = counter.throttled.load(Ordering::SeqCst);
    row
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let rate: u32 = arg("--rate").and_then(|v| v.parse().ok()).unwrap_or(4);
    let runs: usize = arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(1);
    let external = arg("--url");
    println!(
        "API: {} at {rate} req/s, burst 2, 429 + Retry-After: 1; a turn of 20 calls (12 distinct) over 3 tools\n",
        external.as_deref().unwrap_or("ThrottlingServer (GCRA)")
    );
    println!("| seam | told | run | requests | 429s | done | throttled | failed | wall |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for seam in ["middleware", "runner"] {
        for told in [Told::Nothing, Told::Guess, Told::Truth] {
            for run in 1..=runs {
                // A fresh server (or, for an external one, a pause for its
                // limit to refill) per run.
                let server;
                let url = match &external {
                    Some(url) => {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        url.clone()
                    }
                    None => {
                        server = ThrottlingServer::builder()
                            .limit(Limit::Gcra {
                                period: Duration::from_secs(1) / rate.max(1),
                                burst: 2,
                            })
                            .key_header("x-api-key")
                            .start()
                            .await
                            .expect("bind loopback");
                        server.url()
                    }
                };
                let row = match seam {
                    "middleware" => through_middleware(&url, told, rate).await,
                    _ => through_runner(&url, told, rate).await,
                };
                println!(
                    "| {seam} | {told:?} | {run} | {} | {} | {} | {} | {} | {:.2} s |",
                    row.sent,
                    row.throttled_429,
                    row.done,
                    row.throttled,
                    row.failed,
                    row.wall.as_secs_f64()
                );
            }
        }
    }
}
