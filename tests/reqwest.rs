//! The reqwest middleware (feature `reqwest`) against the throttling fake
//! on loopback: counts of what the server saw, not client-side timings.

use std::time::Duration;

use backpressure::admission::Admission;
use backpressure::reqwest::{AdmissionMiddleware, RequestDeadline};
use backpressure::testing::ThrottlingServer;
use backpressure::throttled::Status;
use backpressure::Throttled;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

fn client(admission: Admission) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(AdmissionMiddleware::new(admission))
        .build()
}

/// 30 parallel calls with one key; every outcome: `Ok(status)` or the
/// `Throttled` of a refusal.
async fn fan_out(client: ClientWithMiddleware, url: String) -> Vec<Result<u16, Throttled>> {
    let calls: Vec<_> = (0..30)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let response = client
                    .get(format!("{url}/v1/search?q={i}"))
                    .header("authorization", "Bearer key-a")
                    .send()
                    .await;
                match response {
                    Ok(r) => Ok(r.status().as_u16()),
                    Err(reqwest_middleware::Error::Middleware(e)) => Err(e
                        .downcast_ref::<Throttled>()
                        .unwrap_or_else(|| panic!("not a Throttled: {e}"))
                        .clone()),
                    Err(e) => panic!("transport error: {e}"),
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

#[path = "support/window_server.rs"]
mod window_server;
use window_server::window_server as server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_quota_configured_no_request_is_throttled() {
    let server = server().await;
    let admission = Admission::builder()
        .default_quota(window_server::fitting_quota())
        .inline_wait(Duration::from_secs(10))
        .build();
    let outcomes = fan_out(client(admission), server.url()).await;
    assert!(outcomes.iter().all(|o| o == &Ok(200)), "{outcomes:?}");
    assert_eq!(server.count("key-a"), 30);
    assert_eq!(server.throttled("key-a"), 0);
    assert_eq!(server.request_starts("key-a").len(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_quota_configured_calls_succeed_or_are_throttled_with_few_429s() {
    let server = server().await;
    let admission = Admission::builder().build();
    let outcomes = fan_out(client(admission), server.url()).await;
    for o in &outcomes {
        match o {
            Ok(status) => assert_eq!(*status, 200, "{outcomes:?}"),
            Err(t) => assert!(
                matches!(
                    t.status,
                    Status::RateLimited | Status::TimedOut | Status::Shed
                ),
                "{t}"
            ),
        }
    }
    let throttled = server.throttled("key-a");
    eprintln!(
        "no quota: {} ok, {} refused; server saw {} requests, {throttled} answered 429",
        outcomes.iter().filter(|o| o.is_ok()).count(),
        outcomes.iter().filter(|o| o.is_err()).count(),
        server.count("key-a"),
    );
    assert!(throttled <= 5, "more than a handful of 429s: {throttled}");
    assert_eq!(server.request_starts("key-a").len(), server.count("key-a"));
}

#[tokio::test]
async fn a_server_wait_longer_than_the_deadline_is_a_throttled_not_a_sleep() {
    let server = ThrottlingServer::builder()
        .fail_first(1, Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let client = client(Admission::builder().build());
    let err = client
        .get(server.url())
        .with_extension(RequestDeadline(Duration::from_secs(5)))
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("{err}")
    };
    let t = e.downcast_ref::<Throttled>().unwrap();
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(server.total_count(), 1, "no retry was sent");
}

#[tokio::test]
async fn a_429_with_a_short_retry_after_is_retried() {
    let server = ThrottlingServer::builder()
        .fail_first(1, Duration::from_millis(1))
        .start()
        .await
        .unwrap();
    let client = client(Admission::builder().build());
    let response = client.get(server.url()).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(server.total_count(), 2);
}
