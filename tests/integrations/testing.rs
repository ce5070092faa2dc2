//! The throttling fake (feature `testing`) with real requests on loopback.
//! Assertions are on counts and on what the server recorded.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use backpressure::headers::ServerHint;
use backpressure::testing::{Limit, ThrottlingServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request; the status and the response headers.
async fn get(addr: SocketAddr, key: &str) -> (u16, Vec<(String, String)>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /v1/search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).await.unwrap();
    parse(&response)
}

fn parse(response: &str) -> (u16, Vec<(String, String)>) {
    let (head, _) = response.split_once("\r\n\r\n").expect("a full response");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    (status, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn window_limit_throttles_each_key_and_records_every_request() {
    let server = ThrottlingServer::builder()
        .limit(Limit::Window {
            requests: 3,
            window: Duration::from_secs(60),
        })
        .start()
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(get(server.addr(), "a").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(get(server.addr(), "b").await.0, 200);

    let (status, headers) = get(server.addr(), "a").await;
    assert_eq!(status, 429);
    let retry_after: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        header(&headers, "ratelimit"),
        None,
        "RetryAfterOnly by default"
    );

    assert_eq!(server.count("a"), 6);
    assert_eq!(server.throttled("a"), 3);
    assert_eq!(server.count("b"), 1);
    assert_eq!(server.keys(), ["a", "b"]);
    assert_eq!(server.total_count(), 7);
    let starts = server.request_starts("a");
    assert_eq!(starts.len(), 6);
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "in arrival order");
    assert_eq!(server.max_in_flight("a"), 1);
    assert_eq!(server.count("nobody"), 0);
}

#[tokio::test]
async fn gcra_limit_headers_are_read_back_by_server_hint() {
    let server = ThrottlingServer::builder()
        .limit(Limit::Gcra {
            period: Duration::from_secs(10),
            burst: 2,
        })
        .ietf_headers()
        .x_ratelimit_headers()
        .start()
        .await
        .unwrap();
    let (status, headers) = get(server.addr(), "k").await;
    assert_eq!(status, 200);
    let hint = ServerHint::from_headers(
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        SystemTime::now(),
    );
    assert_eq!(hint.remaining, Some(1));
    assert_eq!(hint.limit, Some(2));
    assert_eq!(hint.wait(), None);
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("1"));

    assert_eq!(get(server.addr(), "k").await.0, 200);
    let (status, headers) = get(server.addr(), "k").await;
    assert_eq!(status, 429);
    let hint = ServerHint::from_headers(
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        SystemTime::now(),
    );
    assert_eq!(hint.remaining, Some(0));
    // The next request fits in just under 10 s: written rounded up.
    assert_eq!(hint.wait(), Some(Duration::from_secs(10)));
    assert_eq!(
        header(&headers, "RateLimit-Policy"),
        Some(r#""default";q=2;w=20"#)
    );
}

#[tokio::test]
async fn fail_first_answers_429_to_the_first_k_requests_across_keys() {
    let server = ThrottlingServer::builder()
        .fail_first(3, Duration::from_millis(1500))
        .start()
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for key in ["a", "b", "a", "b", "a"] {
        let (status, headers) = get(server.addr(), key).await;
        if status == 429 {
            assert_eq!(header(&headers, "retry-after"), Some("2"));
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [429, 429, 429, 200, 200]);
    assert_eq!(server.throttled("a") + server.throttled("b"), 3);
}

/// Waits (polling the server's own record, no clock) until `n` admitted
/// requests are in flight.
async fn until_in_flight(server: &ThrottlingServer, n: usize) {
    for _ in 0..10_000 {
        if server.max_in_flight_total() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never reached {n} in flight");
}

fn spawn_get(addr: SocketAddr, key: &'static str) -> tokio::task::JoinHandle<u16> {
    tokio::spawn(async move { get(addr, key).await.0 })
}

#[tokio::test]
async fn beyond_capacity_it_answers_503() {
    let server = ThrottlingServer::builder()
        .latency(Duration::from_secs(3600))
        .refuse_beyond(2, Duration::from_secs(5))
        .start()
        .await
        .unwrap();
    let held = [spawn_get(server.addr(), "a"), spawn_get(server.addr(), "b")];
    until_in_flight(&server, 2).await;
    let (status, headers) = get(server.addr(), "c").await;
    assert_eq!(status, 503);
    assert_eq!(header(&headers, "retry-after"), Some("5"));
    assert_eq!(server.throttled("c"), 1);
    assert_eq!(server.max_in_flight_total(), 2);
    assert_eq!(server.max_in_flight("a"), 1);
    for h in held {
        h.abort();
    }
}

#[tokio::test]
async fn beyond_capacity_in_latency_mode_requests_are_admitted_slower() {
    let server = ThrottlingServer::builder()
        .latency(Duration::from_secs(3600))
        .queue_beyond(1, Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    let held = [spawn_get(server.addr(), "k"), spawn_get(server.addr(), "k")];
    // Not refused: both are being served (the second more slowly).
    until_in_flight(&server, 2).await;
    assert_eq!(server.max_in_flight("k"), 2);
    assert_eq!(server.throttled("k"), 0);
    for h in held {
        h.abort();
    }
}

#[tokio::test]
async fn a_dropped_server_closes_its_port() {
    let server = ThrottlingServer::builder().start().await.unwrap();
    let addr = server.addr();
    assert_eq!(get(addr, "k").await.0, 200);
    drop(server);
    for _ in 0..1_000 {
        if TcpStream::connect(addr).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("still accepting after drop");
}
