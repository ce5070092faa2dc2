//! The first turn against a server that states nothing (issue #41, item
//! 2): `--calls` distinct GETs at once through the reqwest middleware,
//! one `Admission` told nothing, each call allowed `--deadline` seconds
//! (waited inline). Prints the requests that reached the server, its
//! 429s, the calls done / throttled / failed, the wall time, and the
//! best an obeying client can do: the first burst, the 1 s hold, then the
//! rest at the rate, `1 + (calls - 2 x burst) / rate`.
//!
//! ```sh
//! PORT=18500 RATE=25 BURST=2 ../shared/tools/limit-req-server   # prints nginx's pid
//! cargo run --release --features reqwest --example first_turn -- \
//!     --url http://127.0.0.1:18500/api --rate 25 --burst 2 --runs 3
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backpressure::admission::Admission;
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::retry::RequestDeadline;
use backpressure::Throttled;
use reqwest_middleware::{ClientBuilder, Middleware, Next};

/// Each request that reached the server: when it left (from the turn's
/// start) and whether it drew a 429. It sits inside the admission layer.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(Duration, bool)>>>, Option<Instant>);

#[async_trait::async_trait]
impl Middleware for Log {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let at = self.1.expect("started").elapsed();
        let r = next.run(req, extensions).await;
        let refused = matches!(&r, Ok(resp) if resp.status() == 429);
        self.0.lock().unwrap().push((at, refused));
        r
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let url = arg("--url").expect("--url http://127.0.0.1:18500/api");
    let rate: f64 = arg("--rate").and_then(|v| v.parse().ok()).unwrap_or(25.0);
    let burst: f64 = arg("--burst").and_then(|v| v.parse().ok()).unwrap_or(2.0);
    let calls: usize = arg("--calls").and_then(|v| v.parse().ok()).unwrap_or(60);
    let runs: usize = arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(1);
    let deadline = Duration::from_secs(arg("--deadline").and_then(|v| v.parse().ok()).unwrap_or(5));
    let best = 1.0 + (calls as f64 - 2.0 * burst).max(0.0) / rate;
    println!("{calls} calls, {rate} r/s burst {burst}; the obeying best {best:.2} s");
    println!(
        "| run | requests | 429s | done / throttled / failed | wall | x best | 429s at (ms) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for run in 1..=runs {
        // The server's limit refills between runs.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let admission = Admission::builder().inline_wait(deadline).build();
        let start = Instant::now();
        let log = Log(Arc::default(), Some(start));
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(AdmissionMiddleware::new(admission).credential_header("x-api-key"))
            .with(log.clone())
            .build();
        let tasks: Vec<_> = (0..calls)
            .map(|i| {
                let request = client
                    .get(format!("{url}/item-{i}"))
                    .header("x-api-key", format!("key-{run}"))
                    .with_extension(RequestDeadline(deadline));
                tokio::spawn(async move { request.send().await })
            })
            .collect();
        let (mut done, mut throttled, mut failed) = (0, 0, 0);
        for t in tasks {
            match t.await.expect("the call task") {
                Ok(r) if r.status().is_success() => done += 1,
                Err(reqwest_middleware::Error::Middleware(e))
                    if e.downcast_ref::<Throttled>().is_some() =>
                {
                    throttled += 1
                }
                _ => failed += 1,
            }
        }
        let wall = start.elapsed();
        let seen = log.0.lock().unwrap().clone();
        let refused: Vec<u128> = seen
            .iter()
            .filter(|s| s.1)
            .map(|s| s.0.as_millis())
            .collect();
        println!(
            "| {run} | {} | {} | {done} / {throttled} / {failed} | {:.2} s | {:.2}x | {refused:?} |",
            seen.len(),
            refused.len(),
            wall.as_secs_f64(),
            wall.as_secs_f64() / best
        );
        if std::env::var_os("SHOW_STARTS").is_some() {
            let mut starts: Vec<_> = seen.iter().map(|s| s.0.as_millis()).collect();
            starts.sort();
            println!("starts (ms): {starts:?}");
        }
    }
}
