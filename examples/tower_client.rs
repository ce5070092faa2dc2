//! A tower stack in front of an HTTP client (features `tower` and
//! `testing`): a shared rate limit that waits up to a budget, a
//! concurrency limit, and a retry policy that reads `Retry-After` and
//! gives up with a `Throttled` rather than sleep past the call's deadline.
//! The downstream is the crate's throttling fake: 429 to the first two
//! requests, then 10 per second per key.
//!
//! Run: `cargo run --example tower_client --features tower,testing`

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backpressure::headers::ServerHint;
use backpressure::retry::{Backoff, RetryPolicy};
use backpressure::testing::{Limit, ThrottlingServer};
use backpressure::tower::{ConcurrencyLimitLayer, HintRetry, RateLimitLayer};
use backpressure::{DefaultSleeper, Quota, Throttled, TokenBucket};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::retry::RetryLayer;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

/// The client: one GET, answered with the status and what the server said.
async fn get(addr: std::net::SocketAddr, path: String) -> Result<(u16, ServerHint), BoxError> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer key-a\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut response = String::new();
    s.read_to_string(&mut response).await?;
    let (head, _) = response
        .split_once("\r\n\r\n")
        .ok_or("truncated response")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.get(9..12))
        .ok_or("no status")?
        .parse()?;
    let headers = lines.filter_map(|l| l.split_once(": "));
    Ok((status, ServerHint::from_headers(headers, SystemTime::now())))
}

/// Retry 429/503 (with the server's hint) and transport errors.
fn classify(r: &Result<(u16, ServerHint), BoxError>) -> Option<(Option<u16>, ServerHint)> {
    match r {
        Ok((status @ (429 | 503), hint)) => Some((Some(*status), hint.clone())),
        Ok(_) => None,
        Err(_) => Some((None, ServerHint::default())),
    }
}

#[tokio::main]
async fn main() {
    let server = ThrottlingServer::builder()
        .fail_first(2, Duration::from_secs(1))
        .limit(Limit::Gcra {
            period: Duration::from_millis(100),
            burst: 2,
        })
        .ietf_headers()
        .latency(Duration::from_millis(20))
        .start()
        .await
        .expect("bind loopback");
    let addr = server.addr();

    // Our side of the quota: 10 per second, waiting up to 2 s for a cell.
    let bucket = Arc::new(TokenBucket::new(
        Quota::per_second(NonZeroU32::new(10).unwrap()).allow_burst(NonZeroU32::new(2).unwrap()),
    ));
    let retry = HintRetry::new(
        RetryPolicy::new(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(1),
        )),
        Duration::from_secs(5),
        classify,
    );
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(retry))
        .layer(
            RateLimitLayer::new(bucket).wait_up_to(Duration::from_secs(2), DefaultSleeper::new()),
        )
        .layer(ConcurrencyLimitLayer::new(4))
        .service(service_fn(move |path: String| get(addr, path)));

    let calls: Vec<_> = (0..12)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.oneshot(format!("/item/{i}")).await })
        })
        .collect();
    let (mut ok, mut throttled) = (0, 0);
    for c in calls {
        match c.await.expect("task") {
            Ok((200, _)) => ok += 1,
            Ok((status, _)) => println!("gave up with HTTP {status}"),
            Err(e) => match e.downcast_ref::<Throttled>() {
                Some(t) => {
                    throttled += 1;
                    println!("throttled: {t}");
                }
                None => println!("error: {e}"),
            },
        }
    }
    println!(
        "{ok} ok, {throttled} throttled; the server saw {} requests, {} answered 429, at most {} in flight",
        server.count("key-a"),
        server.throttled("key-a"),
        server.max_in_flight("key-a"),
    );
}
