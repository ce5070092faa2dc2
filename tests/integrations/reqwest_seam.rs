//! The reqwest middleware (feature `reqwest`) against the throttling fake
//! on loopback: counts of what the server saw, not client-side timings.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backpressure::admission::Admission;
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::retry::RetryPolicy;
use backpressure::retry::{Attempts, RequestDeadline};
use backpressure::testing::{Limit, ThrottlingServer};
use backpressure::Status;
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
            tokio::spawn(sent(
                client
                    .get(format!("{url}/v1/search?q={i}"))
                    .header("authorization", "Bearer key-a"),
            ))
        })
        .collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

/// Sends `request`: the server's status, or the `Throttled` of a refusal
/// (a transport error fails the test).
async fn sent(request: reqwest_middleware::RequestBuilder) -> Result<u16, Throttled> {
    match request.send().await {
        Ok(r) => Ok(r.status().as_u16()),
        Err(reqwest_middleware::Error::Middleware(e)) => Err(e
            .downcast_ref::<Throttled>()
            .unwrap_or_else(|| panic!("not a Throttled: {e}"))
            .clone()),
        Err(e) => panic!("transport error: {e}"),
    }
}

use crate::stream_server;
use crate::window_server;
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
    // The requests it took travel with the response.
    assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(2)));
}

/// The `Throttled` inside a middleware error.
fn throttled(err: reqwest_middleware::Error) -> Throttled {
    match err {
        reqwest_middleware::Error::Middleware(e) => e
            .downcast_ref::<Throttled>()
            .unwrap_or_else(|| panic!("not a Throttled: {e}"))
            .clone(),
        other => panic!("not a refusal: {other}"),
    }
}

/// Gaps between consecutive request starts.
fn gaps(starts: &[Instant]) -> Vec<Duration> {
    starts.windows(2).map(|w| w[1] - w[0]).collect()
}

/// A server that answers every request 429 (a window of 0 per second),
/// with `Retry-After` or (`bare`) with no header at all.
async fn refusing_server(bare: bool) -> ThrottlingServer {
    let server = ThrottlingServer::builder().limit(Limit::Window {
        requests: 0,
        window: Duration::from_secs(1),
    });
    let server = if bare { server.bare_429s() } else { server };
    server.start().await.unwrap()
}

/// The middleware with no quota and at most `retries` retries.
fn retrying_client(retries: u32) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(
            AdmissionMiddleware::new(Admission::builder().build())
                .retry_policy(RetryPolicy::default().max_retries(retries)),
        )
        .build()
}

/// Past the retries, a 429 used to come back as a plain `Ok(429)`. It is a
/// `rate_limited` with the server's wait and the requests it sent.
#[tokio::test]
async fn a_429_that_outlasts_the_retries_is_rate_limited_not_a_plain_429() {
    let server = refusing_server(false).await;
    let client = retrying_client(1);
    let t = throttled(client.get(server.url()).send().await.unwrap_err());
    assert_eq!(t.status, Status::RateLimited, "{t}");
    assert_eq!(t.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(t.attempts, 2, "{t}");
    let starts = server.request_starts("");
    assert_eq!(starts.len(), 2);
    // The retry waited the server's second.
    assert!(gaps(&starts)[0] >= Duration::from_millis(950), "{starts:?}");
}

/// A 429 without `Retry-After` was retried on the 100 ms backoff (6
/// requests in 1.3 s); it waits the bare-429 hold, as `Runner` does.
#[tokio::test]
async fn a_bare_429_waits_the_bare_429_hold_not_the_backoff() {
    let server = refusing_server(true).await;
    let client = retrying_client(2);
    let t = throttled(client.get(server.url()).send().await.unwrap_err());
    assert_eq!(t.status, Status::RateLimited, "{t}");
    assert_eq!(t.retry_after(), Some(RetryPolicy::BARE_429_HOLD));
    let starts = server.request_starts("");
    assert_eq!(starts.len(), 3, "{starts:?}");
    assert!(
        gaps(&starts)
            .iter()
            .all(|g| *g >= Duration::from_millis(950)),
        "{:?}",
        gaps(&starts)
    );
}

/// A listener that accepts connections and never answers; counts them.
async fn silent_server() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    (url, accepted)
}

/// The deadline bounded only the waits: a server that never answers held
/// the request past it. The request is dropped at the deadline and the
/// call is `timed_out`, with the one request it sent.
#[tokio::test]
async fn a_server_that_never_answers_is_dropped_at_the_deadline() {
    let (url, accepted) = silent_server().await;
    let client = client(Admission::builder().build());
    let request = client
        .get(url)
        .with_extension(RequestDeadline(Duration::from_millis(300)))
        .send();
    // A hang fails here rather than blocking the suite.
    let err = tokio::time::timeout(Duration::from_secs(20), request)
        .await
        .expect("the request outlived its deadline")
        .unwrap_err();
    let t = throttled(err);
    assert_eq!(t.status, Status::TimedOut, "{t}");
    assert_eq!(t.scope, "deadline");
    assert_eq!(t.attempts, 1);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "no retry after the deadline"
    );
}

/// Under a client that reports middleware errors as transport failures
/// (an LLM client), a refusal is answered as the 429 such clients keep.
#[tokio::test]
async fn a_refusal_can_be_answered_as_a_429_response_with_the_throttled_as_body() {
    let server = ThrottlingServer::builder().start().await.unwrap();
    let admission = Admission::builder().run_budget(1).build();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(AdmissionMiddleware::new(admission).refusals_as_responses())
        .build();
    let first = client.get(server.url()).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(!Throttled::is_refusal(first.headers()));
    let refused = client.get(server.url()).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(Throttled::is_refusal(refused.headers()));
    assert_eq!(refused.extensions().get::<Attempts>(), Some(&Attempts(0)));
    let body: serde_json::Value = serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["type"], "budget_exhausted");
    assert_eq!(body["error"]["scope"], "run");
    assert_eq!(server.total_count(), 1, "the refused call sent nothing");
}

/// Six calls refused together through the middleware are told six
/// different instants, one period apart.
#[tokio::test]
async fn calls_refused_together_are_told_staggered_retry_times() {
    use std::num::NonZeroU32;
    let server = ThrottlingServer::builder().start().await.unwrap();
    let admission = Admission::builder()
        .fixed_rates()
        .default_quota(backpressure::Quota::per_second(NonZeroU32::new(2).unwrap()))
        .inline_wait(Duration::ZERO)
        .build();
    let client = client(admission);
    let mut told = Vec::new();
    for _ in 0..8 {
        match client.get(server.url()).send().await {
            Ok(r) => assert_eq!(r.status(), 200),
            Err(e) => told.push(throttled(e).retry_after_ms.unwrap()),
        }
    }
    assert_eq!(server.total_count(), 2);
    assert_eq!(told.len(), 6);
    assert!(
        told.windows(2).all(|w| w[1] >= w[0] + 490),
        "not staggered: {told:?}"
    );
}

/// `Runner` over reqwest: identical reads of one turn send one request,
/// even against a server that answers at once (the leader may finish
/// inside its first poll), with one admission per request.
#[tokio::test]
async fn runner_over_reqwest_sends_one_request_per_distinct_read() {
    use backpressure::admission::{Call, CallSpec, Runner};
    use backpressure::Provenance;
    let server = ThrottlingServer::builder().start().await.unwrap();
    let admission = Admission::builder().build();
    let runner: Runner<http::Response<Vec<u8>>, reqwest_middleware::Error> =
        Runner::new(admission.clone(), Duration::ZERO);
    let client = ClientWithMiddleware::from(reqwest::Client::new());
    let calls = (0..12)
        .map(|i| {
            let request = client
                .get(format!("{}/v1/search?q={}", server.url(), i % 4))
                .header("authorization", "Bearer key-a");
            Call::request(CallSpec::new("search", "key-a"), request)
        })
        .collect();
    let results = runner.execute(calls).await;
    assert_eq!(server.total_count(), 4, "one request per distinct read");
    assert_eq!(admission.stats().admitted, 4, "one admission per request");
    for (i, r) in results.iter().enumerate() {
        let (status, attempts, provenance) = match r {
            backpressure::admission::CallResult::Done {
                value,
                attempts,
                provenance,
            } => (value.status().as_u16(), *attempts, *provenance),
            other => panic!("{other:?}"),
        };
        assert_eq!(status, 200);
        if i < 4 {
            assert_eq!((attempts, provenance), (1, Provenance::Leader));
        } else {
            assert_eq!((attempts, provenance), (0, Provenance::Joined), "call {i}");
        }
    }
}

/// `Runner` over reqwest keeps its promises: a 429 is retried after the
/// server's wait and the call says how many requests it sent.
#[tokio::test]
async fn runner_over_reqwest_retries_a_429_after_the_servers_wait() {
    use backpressure::admission::{Call, CallSpec, Runner};
    let server = ThrottlingServer::builder()
        .fail_first(1, Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    let runner: Runner<http::Response<Vec<u8>>, reqwest_middleware::Error> =
        Runner::new(Admission::builder().build(), Duration::ZERO);
    let client = ClientWithMiddleware::from(reqwest::Client::new());
    let call = Call::request(CallSpec::new("search", "key-a"), client.get(server.url()));
    let result = runner.one(call).await;
    let backpressure::admission::CallResult::Done {
        value, attempts, ..
    } = &result
    else {
        panic!("{result:?}")
    };
    assert_eq!((value.status().as_u16(), *attempts), (200, 2));
    let starts = server.request_starts("");
    assert_eq!(starts.len(), 2);
    assert!(gaps(&starts)[0] >= Duration::from_millis(950), "{starts:?}");
}

/// Issue #25, item 2: the tokens a reply's body says it used are settled
/// on the request's ticket (the estimate's surplus comes back), and the
/// caller still reads the same body, status, headers and URL.
#[tokio::test]
async fn usage_from_the_body_settles_the_estimate_and_keeps_the_body() {
    use backpressure::{ManualClock, Quota};
    use std::num::NonZeroU32;

    const BODY: &str = r#"{"id":"chatcmpl-1","usage":{"prompt_tokens":700,"completion_tokens":105,"total_tokens":805}}"#;
    let (addr, served) = fixed_reply_server(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: r1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    ))
    .await;
    let admission = Admission::builder()
        .clock(ManualClock::new())
        .resource("tokens", Quota::per_minute(NonZeroU32::new(2_000).unwrap()))
        .build();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            AdmissionMiddleware::new(admission.clone())
                .cost_from(|_req| vec![("tokens".to_string(), 1_000)])
                .usage_from_body(backpressure::admission::Provider::usage_in_body),
        )
        .build();
    let url = format!("http://{addr}/v1/chat/completions");
    let response = client
        .post(&url)
        .header("authorization", "Bearer key-a")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.url().as_str(), url);
    assert_eq!(response.headers()["x-request-id"], "r1");
    assert_eq!(response.text().await.unwrap(), BODY);
    assert_eq!(served.load(Ordering::SeqCst), 1);
    let key = AdmissionMiddleware::credential_of(b"Bearer key-a");
    // 1,000 reserved, 805 used: 2,000 - 805 left, not 2,000 - 1,000.
    assert_eq!(admission.available(&key, "tokens"), Some(1_195));
}

/// Issue #23, item 4, through the middleware: a server answering 503 to
/// everything sees at most (1 + ratio) x calls requests with a shared
/// retry budget (20%, no floor), against 4 a call without.
#[tokio::test]
async fn a_retry_budget_holds_the_middleware_to_its_ratio() {
    use backpressure::retry::{Backoff, RetryBudget};
    const CALLS: usize = 20;
    let (addr, served) = fixed_reply_server(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            .to_string(),
    )
    .await;
    let policy = |budget: Option<Arc<RetryBudget>>| {
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        let p = RetryPolicy::new(backoff).max_retries(3);
        match budget {
            Some(b) => p.budget(b),
            None => p,
        }
    };
    for (budget, most) in [
        (None, 4 * CALLS),
        (
            Some(Arc::new(RetryBudget::new(0.2, 0, Duration::from_secs(60)))),
            CALLS + CALLS / 5,
        ),
    ] {
        served.store(0, Ordering::SeqCst);
        let admission = Admission::builder()
            .fixed_rates()
            .default_quota(backpressure::Quota::per_second(
                std::num::NonZeroU32::new(1_000_000).unwrap(),
            ))
            .global_concurrency(64)
            .default_tool(64, backpressure::admission::SlotPolicy::Wait)
            .build();
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(AdmissionMiddleware::new(admission).retry_policy(policy(budget.clone())))
            .build();
        let url = format!("http://{addr}/v1/x");
        // Distinct URLs: identical reads in flight would share one request.
        let replies = futures::future::join_all(
            (0..CALLS).map(|i| client.get(format!("{url}?i={i}")).send()),
        )
        .await;
        for r in replies {
            assert_eq!(r.unwrap().status(), 503, "the last answer stands");
        }
        let sent = served.load(Ordering::SeqCst);
        assert!(
            sent >= CALLS && sent <= most,
            "{sent} requests for {CALLS} calls (at most {most})"
        );
        if budget.is_none() {
            assert_eq!(sent, 4 * CALLS);
        }
    }
}

/// A loopback server that answers every request with `reply` (one per
/// connection), counting the requests it was sent.
async fn fixed_reply_server(reply: String) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let reply: Arc<str> = reply.into();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (addr, served)
}

/// Issue #23 item 3, through the middleware: a server down for 2 s is
/// sent nothing while its circuit is open, one trial per cool-down, and
/// traffic is back with the first trial that is answered.
#[tokio::test]
async fn a_failing_server_is_sent_nothing_while_its_circuit_is_open_through_the_middleware() {
    use crate::down_server::{self, Seen};
    let started = Instant::now();
    let server = down_server::down_server().await;
    let admission = down_server::admission();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            AdmissionMiddleware::new(admission.clone())
                .retry_policy(RetryPolicy::default().max_retries(0)),
        )
        .build();
    let url = server.url();
    let seen = down_server::drive(started, || {
        let request = client.get(&url).header("authorization", "Bearer key-a");
        sent(request)
    })
    .await;
    down_server::check(&server, "key-a", &seen);
    let refused = seen
        .iter()
        .filter(|s| matches!(s, Seen::Refused(..)))
        .count();
    assert_eq!(admission.stats().refused.unavailable, refused as u64);
}

/// Issue #23 item 3, through `Runner`: the same promises.
#[tokio::test]
async fn a_failing_server_is_sent_nothing_while_its_circuit_is_open_through_runner() {
    use crate::down_server;
    use backpressure::admission::{Call, CallResult, CallSpec, Runner};
    let started = Instant::now();
    let server = down_server::down_server().await;
    let admission = down_server::admission();
    let runner: Runner<http::Response<Vec<u8>>, reqwest_middleware::Error> =
        Runner::new(admission, Duration::ZERO).retry_policy(RetryPolicy::default().max_retries(0));
    let client = ClientWithMiddleware::from(reqwest::Client::new());
    let url = server.url();
    let seen = down_server::drive(started, || {
        let request = client.get(&url).header("authorization", "Bearer key-a");
        let call = Call::request(CallSpec::new("search", "key-a"), request);
        let runner = &runner;
        async move {
            match runner.one(call).await {
                CallResult::Done { value, .. } => Ok(value.status().as_u16()),
                CallResult::Failed {
                    error: backpressure::admission::CallFailure::Status { status },
                    ..
                } => Ok(status),
                CallResult::Throttled(t) => Err(t),
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
    down_server::check(&server, "key-a", &seen);
}

/// Issue #23 item 1: 100 background calls flood a layer with priority
/// lanes (4 global slots, background at most `share` of them), then 4
/// interactive calls arrive. On the server's record, no more background
/// requests start between the interactive calls' arrival and the last of
/// their starts than the background cap (already handed their slots):
/// the interactive ones go first. Every background call ends with an
/// answer or a structured refusal.
async fn interactive_calls_go_before_a_flood(share: f64, bg_cap: usize) {
    use backpressure::admission::Priority;
    let server = ThrottlingServer::builder()
        .latency(Duration::from_millis(150))
        .start()
        .await
        .unwrap();
    let admission = Admission::builder()
        .global_concurrency(4)
        .priority_lanes(share)
        .build();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            AdmissionMiddleware::new(admission.clone())
                .retry_policy(RetryPolicy::default().max_retries(0)),
        )
        .build();
    // Distinct URLs: identical reads in flight would share one request.
    let send = |key: &'static str, i: usize, priority: Priority, deadline: Duration| {
        let request = client
            .get(format!("{}?i={i}", server.url()))
            .header("authorization", format!("Bearer {key}"))
            .with_extension(priority)
            .with_extension(RequestDeadline(deadline));
        sent(request)
    };
    let background: Vec<_> = (0..100)
        .map(|i| tokio::spawn(send("bg", i, Priority::BACKGROUND, Duration::from_secs(2))))
        .collect();
    // The flood is queued and running.
    while server.count("bg") < 2 || admission.waiting() < 90 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let arrived = Instant::now();
    let interactive: Vec<_> = (0..4)
        .map(|i| tokio::spawn(send("fg", i, Priority::INTERACTIVE, Duration::from_secs(2))))
        .collect();
    for call in interactive {
        assert_eq!(call.await.unwrap(), Ok(200));
    }
    let fg = server.request_starts("fg");
    assert_eq!(fg.len(), 4);
    let last_fg = *fg.iter().max().unwrap();
    let bg_meanwhile = server
        .request_starts("bg")
        .iter()
        .filter(|&&t| t > arrived && t < last_fg)
        .count();
    assert!(
        bg_meanwhile <= bg_cap,
        "{bg_meanwhile} background requests went first"
    );
    let (mut done, mut dropped, mut held_back) = (0, 0, 0);
    for call in background {
        match tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("ended")
            .unwrap()
        {
            Ok(200) => done += 1,
            Ok(status) => panic!("status {status}"),
            // Its credential's rate (learned from 10/s) would not fit.
            Err(t) if t.status == Status::RateLimited => assert_eq!(t.attempts, 0),
            Err(t) => {
                assert_eq!(t.status, Status::TimedOut, "{t:?}");
                match t.attempts {
                    // Sent, and still running at its deadline.
                    1 => {
                        assert_eq!(t.scope, "deadline", "{t:?}");
                        dropped += 1;
                    }
                    // Never sent: held back for its class (under a cap),
                    // or waiting for a global slot or its tool behind the
                    // calls before it.
                    _ if t.scope == "global:background" => held_back += 1,
                    _ => assert!(t.scope == "global" || t.scope.starts_with("tool:"), "{t:?}"),
                }
            }
        }
    }
    // Every request the server saw was answered or dropped at its
    // deadline; one dropped just after it left may not have reached the
    // server yet.
    let seen = server.count("bg");
    assert!(
        done <= seen && seen <= done + dropped,
        "every request sent is accounted for: {done} done, {dropped} dropped, {seen} seen"
    );
    assert!(done >= 4, "background calls still ran: {done}");
    // A request dropped at its deadline frees its slot at once, and the
    // server may still be working on it: one more in flight per drop.
    let max = server.max_in_flight("bg");
    assert!(
        (bg_cap..=bg_cap + dropped).contains(&max),
        "the background cap: {max} in flight, {dropped} dropped"
    );
    // Only a cap refuses for the class (under load the calls held back may
    // end on their credential's rate first, so a cap need not show one).
    if bg_cap == 4 {
        assert_eq!(held_back, 0, "no cap, no refusal for the class");
    }
}

/// Capped at half the global slots: the interactive calls find the
/// other half free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_calls_go_before_a_flood_of_background_ones_held_to_half_the_slots() {
    interactive_calls_go_before_a_flood(0.5, 2).await;
}

/// No cap: the background calls hold every slot, and each slot freed goes
/// to an interactive call first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_calls_go_before_a_flood_of_background_ones_holding_every_slot() {
    interactive_calls_go_before_a_flood(1.0, 4).await;
}

/// Issue #23 item 6: a server that counts "10 per rolling 250 ms" (a
/// sliding log), met by a `RollingWindow` standing for the credential's
/// request quota: 30 parallel calls, no 429, and on the server's record
/// never more than 10 in any 250 ms. The client's window is 300 ms: the
/// margin absorbs the jitter between a reserved instant and the
/// request's arrival (a GCRA quota would need `burst + rate x W <= 10`
/// instead, e.g. burst 2 at 32/s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_window_quota_meets_a_sliding_log_server_without_a_429() {
    use backpressure::RollingWindow;
    use std::num::NonZeroU32;
    let window = Duration::from_millis(250);
    let server = ThrottlingServer::builder()
        .limit(Limit::Window {
            requests: 10,
            window,
        })
        .start()
        .await
        .unwrap();
    let credential = AdmissionMiddleware::credential_of(b"Bearer key-a");
    let admission = Admission::builder()
        .shared_quota(
            credential,
            RollingWindow::new(NonZeroU32::new(10).unwrap(), Duration::from_millis(300)),
        )
        .inline_wait(Duration::from_secs(30))
        .build();
    let outcomes = fan_out(client(admission), server.url()).await;
    assert!(outcomes.iter().all(|o| o == &Ok(200)), "{outcomes:?}");
    assert_eq!(server.throttled("key-a"), 0);
    let starts = server.request_starts("key-a");
    assert_eq!(starts.len(), 30);
    let most = starts
        .iter()
        .map(|&t| starts.iter().filter(|&&u| u >= t && u < t + window).count())
        .max()
        .unwrap();
    assert!(most <= 10, "{most} requests in one window");
    // The whole limit went at once: the window is not halved into a burst.
    assert_eq!(
        starts
            .iter()
            .filter(|&&u| u < starts[0] + Duration::from_millis(100))
            .count(),
        10
    );
}

/// Issue #23 item 2: a harness that shares the org's key with a
/// production job (20 requests per 2 s window, stated in `RateLimit`
/// headers) takes half of it. The job has spent 12; the harness's first
/// call reads 7 left, below the 10 kept for the job, and holds back: its
/// next four calls are refused at once (nothing sent) and the job's next
/// 7 requests all pass. Without the share, the harness's calls take the
/// key's last requests and the job hears four 429s.
#[tokio::test]
async fn a_key_share_leaves_the_other_users_of_the_key_their_headroom() {
    async fn run(share: Option<f64>) -> (Vec<Result<u16, Throttled>>, usize) {
        let server = ThrottlingServer::builder()
            .limit(Limit::Window {
                requests: 20,
                window: Duration::from_secs(2),
            })
            .ietf_headers()
            .start()
            .await
            .unwrap();
        let job = reqwest::Client::new();
        let job_sends = |n: usize| {
            let (job, url) = (job.clone(), server.url());
            async move {
                let mut refused = 0;
                for _ in 0..n {
                    let r = job.get(&url).bearer_auth("org").send().await.unwrap();
                    refused += usize::from(r.status() == 429);
                }
                refused
            }
        };
        assert_eq!(job_sends(12).await, 0);
        // Rate waits are slept (up to 1 s); the 2 s hold is not.
        let mut builder = Admission::builder().inline_wait(Duration::from_secs(1));
        if let Some(share) = share {
            builder = builder.key_share(share);
        }
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(
                AdmissionMiddleware::new(builder.build())
                    .retry_policy(RetryPolicy::default().max_retries(0)),
            )
            .build();
        let mut mine = Vec::new();
        for _ in 0..5 {
            mine.push(sent(client.get(server.url()).bearer_auth("org")).await);
        }
        let job_refused = job_sends(7).await;
        assert_eq!(
            server.count("org"),
            12 + mine.iter().filter(|m| m.is_ok()).count() + 7
        );
        (mine, job_refused)
    }
    let (mine, job_refused) = run(Some(0.5)).await;
    assert_eq!(mine[0], Ok(200));
    // Held until the window resets (within 2 s), each told its own turn.
    let told: Vec<u64> = mine[1..]
        .iter()
        .map(|m| {
            let t = m.as_ref().expect_err("held back");
            assert_eq!(t.status, Status::RateLimited, "{t:?}");
            t.retry_after_ms.expect("a wait")
        })
        .collect();
    assert!(told[0] > 0 && told[0] <= 2_000, "{told:?}");
    assert!(told.windows(2).all(|w| w[0] < w[1]), "{told:?}");
    assert_eq!(job_refused, 0, "the job kept its headroom");
    let (mine, job_refused) = run(None).await;
    assert!(mine.iter().all(|m| m == &Ok(200)), "{mine:?}");
    assert_eq!(job_refused, 4, "without the share the job pays");
}

/// Issue #23 item 5: a streamed reply holds its call's slot until its body
/// is read to the end (a probe call needing the one global slot is shed
/// meanwhile), and the `usage` event at the stream's end settles the
/// 500-token estimate to the 805 used. A stream dropped half-read frees
/// the slot too, and settles nothing.
#[tokio::test]
async fn a_streamed_reply_holds_its_slot_until_read_and_settles_its_usage() {
    use backpressure::admission::CallSpec;
    let finish = Arc::new(tokio::sync::Notify::new());
    let (addr, accepted) = stream_server::streaming_server(finish.clone()).await;
    let admission = stream_server::admission();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            AdmissionMiddleware::new(admission.clone())
                .cost_from(|_| vec![("tokens".to_string(), 500)])
                .usage_from_stream(backpressure::admission::Provider::usage_in_event),
        )
        .build();
    let key = AdmissionMiddleware::credential_of(b"Bearer key-a");
    let probe_spec = CallSpec::new("probe", "other");
    let probe = || admission.admit(&probe_spec);
    let url = format!("http://{addr}/v1/chat/completions");

    let mut response = client.get(&url).bearer_auth("key-a").send().await.unwrap();
    assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(1)));
    let first = response.chunk().await.unwrap().expect("the first event");
    assert!(first.starts_with(b"data: "));
    assert_eq!(
        probe().await.unwrap_err().status,
        Status::Shed,
        "the stream holds the slot"
    );
    assert_eq!(admission.available(&key, "tokens"), Some(9_500));
    finish.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert!(
        rest.ends_with(b"data: [DONE]\n\n"),
        "the caller reads every byte"
    );
    drop(probe().await.expect("read to the end: the slot is free"));
    assert_eq!(admission.available(&key, "tokens"), Some(10_000 - 805));

    // Dropped half-read: the slot comes back, the estimate stands.
    let mut response = client.get(&url).bearer_auth("key-a").send().await.unwrap();
    response.chunk().await.unwrap().expect("the first event");
    assert_eq!(probe().await.unwrap_err().status, Status::Shed);
    drop(response);
    drop(probe().await.expect("dropped: the slot is free"));
    assert_eq!(
        admission.available(&key, "tokens"),
        Some(10_000 - 805 - 500)
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// Issue #45: identical POSTs the caller declares reads (the same prompt
/// asked twice in one turn) share one request, keyed with their body; a
/// different body, or no declaration, sends its own.
#[tokio::test]
async fn posts_declared_reads_share_one_request_by_body() {
    let server = ThrottlingServer::builder()
        .latency(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    for (declared, expect) in [(true, 2), (false, 4)] {
        let before = server.total_count();
        let mut middleware = AdmissionMiddleware::new(Admission::builder().build());
        if declared {
            middleware = middleware.reads_when(|req| req.url().path().ends_with("/completions"));
        }
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(middleware)
            .build();
        let bodies = ["prompt a", "prompt a", "prompt a", "prompt b"];
        let sends = bodies.map(|body| {
            client
                .post(format!("{}/v1/chat/completions", server.url()))
                .header("authorization", "Bearer key-a")
                .body(body)
                .send()
        });
        let answers = futures::future::join_all(sends).await;
        let attempts: Vec<u32> = answers
            .into_iter()
            .map(|r| {
                let r = r.expect("answered");
                assert_eq!(r.status(), 200);
                r.extensions().get::<Attempts>().expect("attempts").0
            })
            .collect();
        assert_eq!(
            server.total_count() - before,
            expect,
            "declared: {declared}"
        );
        // The joined copies say they sent nothing.
        let joined = attempts.iter().filter(|&&a| a == 0).count();
        assert_eq!(joined, 4 - expect, "{attempts:?}");
    }
}

/// Issue #63: Gemini states its wait in a 429's body, not a header.
mod gemini_bodies {
    use super::*;
    use crate::scripted_server::{Scripted, Step};
    use backpressure::admission::CallResult;

    const RETRY_30S: &str = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}"#;
    const PER_DAY: &str = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
        {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"50"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}"#;

    async fn call(
        client: &ClientWithMiddleware,
        server: &Scripted,
    ) -> CallResult<reqwest::Response, reqwest_middleware::Error> {
        let request = client
            .post(server.url("/v1beta/models/gemini:generateContent"))
            .header("x-goog-api-key", "key-a")
            .with_extension(RequestDeadline(Duration::from_secs(60)));
        AdmissionMiddleware::call_result(request).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stated_delay_past_what_a_call_waits_is_surfaced_not_retried() {
        let server =
            Scripted::start(vec![Step::Body(429, RETRY_30S)], Step::Answer(200, &[])).await;
        let client = client(Admission::builder().build());
        let refused = call(&client, &server).await;
        let t = refused
            .throttled()
            .expect("a 30 s wait is past the call's 2 s");
        assert_eq!(
            (t.status, t.retry_after_ms, t.attempts),
            (Status::RateLimited, Some(30_000), 1)
        );
        assert_eq!(server.seen().len(), 1, "not sent again on a bare hold");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spent_daily_quota_ends_the_calls_at_once() {
        let server = Scripted::start(vec![Step::Body(429, PER_DAY)], Step::Answer(200, &[])).await;
        let client = client(Admission::builder().build());
        let first = call(&client, &server).await;
        let t = first.throttled().expect("the day's quota is spent");
        assert_eq!((t.status, t.attempts), (Status::QuotaExhausted, 1), "{t}");
        // The calls after it are told at once, without a request.
        for _ in 0..3 {
            let later = call(&client, &server).await;
            let t = later.throttled().expect("still spent");
            assert_eq!((t.status, t.attempts), (Status::QuotaExhausted, 0), "{t}");
        }
        assert_eq!(server.seen().len(), 1, "one request in all");
    }
}
