//! A harness test written with the throttling fake (feature `testing`):
//! 40 parallel calls share one API key whose server quota is 20 per
//! second; our `TokenBucket` at that rate (burst 1) paces them. The
//! assertions are on what the *server* saw: counts and request start
//! times, not on what the client believes.
//!
//! Twice: against a server with no burst at all, where the network's
//! jitter alone (a request paced 50 ms after the last one arrives 47 ms
//! after it) earns 429s that no client-side test would see; then against a
//! server that tolerates one request of burst, as real GCRA limiters do,
//! where there must be none.
//!
//! Run: `cargo run --example throttling_server --features testing`

use std::sync::Arc;
use std::time::{Duration, Instant};

use backpressure::testing::{Limit, ThrottlingServer};
use backpressure::{DefaultSleeper, Quota, TokenBucket};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A minimal HTTP/1.1 GET; the status code.
async fn get(server: &ThrottlingServer, key: &str) -> std::io::Result<u16> {
    let mut s = tokio::net::TcpStream::connect(server.addr()).await?;
    let req = format!("GET /search HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {key}\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut response = String::new();
    s.read_to_string(&mut response).await?;
    Ok(response
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// 40 paced calls against a server allowing `server_burst`; the server.
async fn run(server_burst: u32) -> Arc<ThrottlingServer> {
    let period = Duration::from_millis(50); // 20 per second
    let server = Arc::new(
        ThrottlingServer::builder()
            .limit(Limit::Gcra {
                period,
                burst: server_burst,
            })
            .ietf_headers()
            .latency(Duration::from_millis(5))
            .start()
            .await
            .expect("bind loopback"),
    );
    let bucket = Arc::new(TokenBucket::new(Quota::with_period(period)));

    let started = Instant::now();
    let calls: Vec<_> = (0..40)
        .map(|_| {
            let (server, bucket) = (server.clone(), bucket.clone());
            tokio::spawn(async move {
                bucket
                    .until_ready(1, Duration::from_secs(10), &DefaultSleeper::new())
                    .await
                    .expect("within the budget");
                get(&server, "key-a").await.expect("loopback")
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.expect("task"));
    }

    // The witness: the server's own record.
    let starts = server.request_starts("key-a");
    let min_gap = starts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .min()
        .unwrap_or_default();
    println!(
        "server burst {server_burst}: {} requests in {:.2?}; server saw {} with {} throttled; \
         smallest gap between starts {:.2?}",
        statuses.len(),
        started.elapsed(),
        server.count("key-a"),
        server.throttled("key-a"),
        min_gap,
    );
    assert_eq!(server.count("key-a"), 40);
    server
}

#[tokio::main]
async fn main() {
    let strict = run(1).await;
    println!(
        "  (no burst: {} of 40 throttled by arrival jitter alone)",
        strict.throttled("key-a")
    );
    let tolerant = run(2).await;
    assert_eq!(
        tolerant.throttled("key-a"),
        0,
        "the bucket kept us under the quota"
    );
}
