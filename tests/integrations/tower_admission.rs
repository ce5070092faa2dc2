//! `AdmissionLayer` (features `tower`, `http`) in front of an HTTP/1.1
//! client, against the throttling fake on loopback: counts and the start
//! times the server recorded, never client-side timings.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use backpressure::admission::{Admission, CallSpec, SlotPolicy};
use backpressure::retry::{Attempts, RequestDeadline};
use backpressure::testing::ThrottlingServer;
use backpressure::tower::AdmissionLayer;
use backpressure::Status;
use backpressure::{Quota, Throttled};
use std::task::{Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::window_server;
use window_server::window_server;

type Req = http::Request<()>;
type Resp = http::Response<String>;

/// One request over a fresh connection (the fake serves one per
/// connection and then closes it).
async fn send(addr: SocketAddr, req: Req) -> Result<Resp, BoxError> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut head = format!("{} {} HTTP/1.1\r\nHost: api\r\n", req.method(), req.uri());
    for (name, value) in req.headers() {
        head.push_str(&format!("{name}: {}\r\n", value.to_str()?));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or("truncated response")?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.get(9..12))
        .ok_or("no status")?
        .parse()?;
    let mut response = http::Response::builder().status(status);
    for (name, value) in lines.filter_map(|l| l.split_once(": ")) {
        response = response.header(name, value);
    }
    Ok(response.body(body.to_string())?)
}

type Spec = fn(&Req) -> CallSpec;

/// The tool is the path, the credential the bearer token.
fn spec(req: &Req) -> CallSpec {
    let credential = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("anonymous");
    CallSpec::new(req.uri().path(), credential)
}

type BoxFut = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Resp, BoxError>> + Send>>;

/// The HTTP client under the layer: [`send`] as a `Clone` service.
#[derive(Clone, Copy, Debug)]
struct HttpClient(SocketAddr);

impl Service<Req> for HttpClient {
    type Response = Resp;
    type Error = BoxError;
    type Future = BoxFut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> BoxFut {
        Box::pin(send(self.0, req))
    }
}

/// The layered client; its service type is not nameable, so `impl Service`.
fn client(
    admission: Admission,
    addr: SocketAddr,
) -> impl Service<Req, Response = Resp, Error = BoxError, Future: Send> + Clone + Send + 'static {
    AdmissionLayer::http(admission, spec as Spec)
        .deadline(Duration::from_secs(30))
        .layer(HttpClient(addr))
}

fn get(path: &str) -> Req {
    http::Request::get(path)
        .header("authorization", "Bearer key-a")
        .body(())
        .unwrap()
}

fn throttled(e: &BoxError) -> &Throttled {
    e.downcast_ref::<Throttled>()
        .unwrap_or_else(|| panic!("not a Throttled: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_quota_configured_parallel_calls_draw_no_429() {
    // 10 requests per rolling 500 ms per key.
    let server = window_server().await;
    let admission = Admission::builder()
        .default_quota(window_server::fitting_quota())
        .inline_wait(Duration::from_secs(10))
        .build();
    let svc = client(admission.clone(), server.addr());
    let calls: Vec<_> = (0..30)
        .map(|i| tokio::spawn(svc.clone().oneshot(get(&format!("/v1/search?q={i}")))))
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(server.count("key-a"), 30);
    assert_eq!(server.throttled("key-a"), 0);
    // The GCRA spread them: 30 <= 2 + 14 * t needs t >= 2 s between the
    // first start and the last (unlimited, they would start within a few
    // milliseconds of each other).
    let starts = server.request_starts("key-a");
    let span = starts
        .iter()
        .max()
        .unwrap()
        .duration_since(*starts.iter().min().unwrap());
    assert!(span >= Duration::from_millis(1_500), "spread over {span:?}");
    assert_eq!(admission.stats().admitted, 30);
    assert_eq!(admission.stats().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_seen_through_the_layer_holds_back_later_calls() {
    // The first request gets 429 with `Retry-After: 1`; no other limit.
    let server = ThrottlingServer::builder()
        .fail_first(1, Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    let admission = Admission::builder()
        .inline_wait(Duration::from_secs(5))
        .build();
    let svc = client(admission, server.addr());
    // Issue #39: a one-second wait is waited out below the caller (as
    // `Runner` and the middleware do): the first call is answered 200
    // after two requests, never with a plain 429.
    let first = svc.clone().oneshot(get("/v1/search")).await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.extensions().get::<Attempts>(), Some(&Attempts(2)));
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(svc.clone().oneshot(get("/v1/search"))))
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(server.count("key-a"), 7);
    assert_eq!(server.throttled("key-a"), 1);
    // The hold began when the 429 was observed, after the first request
    // started: every later request starts a second after it (less a
    // margin for the two clocks' readings).
    let mut starts = server.request_starts("key-a");
    starts.sort();
    for later in &starts[1..] {
        let after = later.duration_since(starts[0]);
        assert!(
            after >= Duration::from_millis(950),
            "started {after:?} after the 429"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_response_futures_mid_flight_returns_every_ticket() {
    let server = ThrottlingServer::builder()
        .latency(Duration::from_millis(30))
        .start()
        .await
        .unwrap();
    // Two slots, a queue, and 100 requests per second: calls are dropped
    // while they wait for a slot, for a rate cell, or for the server.
    let admission = Admission::builder()
        .global_concurrency(2)
        .default_quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
        .inline_wait(Duration::from_secs(1))
        .build();
    let svc = client(admission.clone(), server.addr());
    let tasks: Vec<_> = (0..8u64)
        .map(|t| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let (mut ok, mut dropped) = (0, 0);
                for i in 0..10u64 {
                    let budget = Duration::from_millis(1 + (t * 7 + i * 13) % 45);
                    match tokio::time::timeout(budget, svc.clone().oneshot(get("/v1/slow"))).await {
                        Ok(r) => {
                            assert_eq!(r.unwrap().status(), 200);
                            ok += 1;
                        }
                        Err(_) => dropped += 1,
                    }
                }
                (ok, dropped)
            })
        })
        .collect();
    let (mut ok, mut dropped) = (0, 0);
    for t in tasks {
        let (o, d) = t.await.unwrap();
        ok += o;
        dropped += d;
    }
    assert_eq!(ok + dropped, 80);
    assert!(dropped > 0, "no future was dropped");
    let stats = admission.stats();
    // Some were dropped before admission, some after the server saw them.
    assert!(stats.admitted < 80, "every call was admitted: {stats:?}");
    assert!(server.count("key-a") > ok, "no call was dropped in flight");
    // ... and every slot and ticket came back.
    assert_eq!((stats.in_flight, stats.waiting), (0, 0), "{stats:?}");
    for tool in &stats.tools {
        assert_eq!((tool.in_flight, tool.waiting), (0, 0), "{tool:?}");
    }
    for credential in &stats.credentials {
        assert_eq!(credential.in_flight, 0, "{credential:?}");
    }
    // The layer still admits.
    assert_eq!(svc.oneshot(get("/v1/slow")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_refusal_is_a_throttled_and_the_request_is_not_sent() {
    let server = ThrottlingServer::builder().start().await.unwrap();
    // One request per 200 ms.
    let admission = Admission::builder()
        .default_quota(Quota::with_period(Duration::from_millis(200)).allow_burst(NonZeroU32::MIN))
        .inline_wait(Duration::from_secs(5))
        .build();
    let mut svc = client(admission, server.addr());
    assert_eq!(
        svc.clone().oneshot(get("/v1/a")).await.unwrap().status(),
        200
    );
    // This request may wait 1 ms (its own deadline): refused at once.
    let mut hurried = get("/v1/a");
    hurried
        .extensions_mut()
        .insert(RequestDeadline(Duration::from_millis(1)));
    let err = svc.ready().await.unwrap().call(hurried).await.unwrap_err();
    let t = throttled(&err);
    assert_eq!(t.status, Status::RateLimited);
    let wait = t.retry_after().unwrap();
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_millis(200),
        "{wait:?}"
    );
    assert_eq!(server.count("key-a"), 1, "a refused request was sent");
    // Without it, the layer's 30 s deadline lets the next one wait.
    assert_eq!(svc.oneshot(get("/v1/a")).await.unwrap().status(), 200);
    assert_eq!(server.count("key-a"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_fail_fast_tool_is_shed_with_its_scope() {
    let server = ThrottlingServer::builder()
        .latency(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let admission = Admission::builder()
        .tool("/v1/refund", 1, SlotPolicy::FailFast)
        .build();
    let svc = client(admission.clone(), server.addr());
    let first = tokio::spawn(svc.clone().oneshot(get("/v1/refund")));
    // The first call holds the tool's slot while the server serves it.
    tokio::time::timeout(Duration::from_secs(10), async {
        while admission.stats().in_flight == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the first call was never admitted");
    let err = svc.clone().oneshot(get("/v1/refund")).await.unwrap_err();
    let t = throttled(&err);
    assert_eq!(t.status, Status::Shed);
    assert_eq!(t.scope, "tool:/v1/refund");
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    assert_eq!(server.count("key-a"), 1);
    assert_eq!(admission.stats().in_flight, 0);
}

/// The deadline bounded only the wait for admission: a server that never
/// answers held the call past it. The inner call is dropped at the
/// deadline, the caller hears `timed_out`, and the ticket comes back.
#[tokio::test]
async fn a_server_that_never_answers_is_dropped_at_the_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(socket);
        }
    });
    let admission = Admission::builder().build();
    let svc = client(admission.clone(), addr);
    let mut req = get("/v1/search");
    req.extensions_mut()
        .insert(RequestDeadline(Duration::from_millis(300)));
    let err = tokio::time::timeout(Duration::from_secs(20), svc.oneshot(req))
        .await
        .expect("the call outlived its deadline")
        .unwrap_err();
    let t = err.downcast_ref::<Throttled>().unwrap();
    assert_eq!(
        (t.status, t.scope.as_str(), t.attempts),
        (Status::TimedOut, "deadline", 1)
    );
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(admission.stats().in_flight, 0, "the ticket came back");
}

/// Issue #25, item 1 (tower): with `refusals_as_responses`, the layer's
/// own refusals reach an HTTP client as a 429 it keeps (status, retry
/// headers, a provider-style JSON error), and nothing is sent for them;
/// a synthetic refusal from an inner layer is never taken for the
/// server's (the outer layer's learned rate does not move).
#[tokio::test]
async fn refusals_as_responses_answer_429s_a_client_keeps() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let api = tower::service_fn(move |_req: http::Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(http::Response::new(b"{\"ok\":true}".to_vec())) }
    });
    let spec = |_: &http::Request<()>| CallSpec::new("chat", "key-a");
    let inner = AdmissionLayer::http(Admission::builder().run_budget(2).build(), spec)
        .refusals_as_responses()
        .layer(api);
    let outer_admission = Admission::builder().build();
    let svc = AdmissionLayer::http(outer_admission.clone(), spec)
        .refusals_as_responses()
        .layer(inner);
    for _ in 0..2 {
        let ok = svc.clone().oneshot(http::Request::new(())).await.unwrap();
        assert_eq!(ok.status(), 200);
    }
    let rate = outer_admission.learned_rate("key-a");
    for _ in 0..3 {
        let refused = svc.clone().oneshot(http::Request::new(())).await.unwrap();
        assert_eq!(refused.status(), 429);
        assert!(backpressure::Throttled::is_refusal(refused.headers()));
        let body: serde_json::Value = serde_json::from_slice(refused.body()).unwrap();
        assert_eq!(body["error"]["type"], "budget_exhausted", "{body}");
    }
    assert_eq!(sent.load(Ordering::SeqCst), 2, "a refused request was sent");
    assert_eq!(
        outer_admission.learned_rate("key-a"),
        rate,
        "the outer layer learned from a synthetic 429"
    );

    // Past its deadline, a request that never answers is a 429 too, with
    // the time it was given.
    let hang = tower::service_fn(|_req: http::Request<()>| async {
        std::future::pending::<Result<http::Response<Vec<u8>>, BoxError>>().await
    });
    let svc = AdmissionLayer::http(Admission::builder().build(), spec)
        .deadline(Duration::from_millis(50))
        .refusals_as_responses()
        .layer(hang);
    let timed_out = svc.oneshot(http::Request::new(())).await.unwrap();
    assert_eq!(timed_out.status(), 429);
    let body: serde_json::Value = serde_json::from_slice(timed_out.body()).unwrap();
    assert_eq!(body["error"]["type"], "timed_out", "{body}");
}

/// Issue #23 item 3, through the tower layer: a server down for 2 s is
/// sent nothing while its circuit is open, one trial per cool-down, and
/// traffic is back with the first trial that is answered.
#[tokio::test]
async fn a_failing_server_is_sent_nothing_while_its_circuit_is_open_through_the_layer() {
    use crate::down_server;
    let started = std::time::Instant::now();
    let server = down_server::down_server().await;
    let admission = down_server::admission();
    // One request per call, as the other seams' twins send.
    let svc = AdmissionLayer::http(admission, spec as Spec)
        .deadline(Duration::from_secs(30))
        .retry_policy(backpressure::retry::RetryPolicy::default().max_retries(0))
        .layer(HttpClient(server.addr()));
    let seen = down_server::drive(started, || {
        let svc = svc.clone();
        async move {
            match svc.oneshot(get("/v1/search")).await {
                Ok(r) => Ok(r.status().as_u16()),
                Err(e) => Err(throttled(&e).clone()),
            }
        }
    })
    .await;
    down_server::check(&server, "key-a", &seen);
}

/// A request the server never answers counts against its circuit: with
/// one failure to open, the second call is refused and nothing more is sent.
#[tokio::test]
async fn a_request_dropped_at_its_deadline_opens_the_circuit() {
    use backpressure::admission::CircuitBreaker;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(s); // accepts, never answers
        }
    });
    let admission = Admission::builder()
        .circuit_breaker(CircuitBreaker::new().consecutive_failures(1))
        .build();
    let svc = AdmissionLayer::http(admission, spec as Spec)
        .deadline(Duration::from_millis(200))
        .layer(HttpClient(addr));
    let first = svc.clone().oneshot(get("/v1/search")).await.unwrap_err();
    assert_eq!(throttled(&first).status, Status::TimedOut);
    let second = svc.clone().oneshot(get("/v1/search")).await.unwrap_err();
    assert_eq!(throttled(&second).status, Status::Unavailable);
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}
