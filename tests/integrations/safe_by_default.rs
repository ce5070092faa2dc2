//! Issue #58: used as a new user would use it, with every default left
//! alone, the crate gave one user another user's answer, sent a write
//! twice, and buffered bodies nobody asked it to. One regression test per
//! bug, named after it (the cookie, `x-api-key`, `Accept`, follower and
//! write rows are in the conformance table, on every seam).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backpressure::admission::{Admission, Call, CallSpec, Reply, Runner};
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::retry::RequestDeadline;
use backpressure::tower::AdmissionLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{service_fn, Layer, ServiceExt};

/// Issue #58 item 2: `Runner` keyed reads by (tool, key) alone, so
/// tenants a, b and c all got tenant a's secret, c later through the
/// turn's cache.
#[tokio::test]
async fn runner_shared_a_result_across_credentials() {
    let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::from_secs(3));
    let sent = Arc::new(AtomicUsize::new(0));
    let call = |tenant: &'static str| {
        let sent = sent.clone();
        Call::new(CallSpec::new("get_secret", tenant), move || {
            let sent = sent.clone();
            async move {
                sent.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                Ok(Reply::new(200, format!("secret of {tenant}")))
            }
        })
        .coalesce_key("the secret")
    };
    let turn = runner
        .execute(vec![call("tenant-a"), call("tenant-b")])
        .await;
    let values: Vec<_> = turn.iter().map(|r| r.value().cloned()).collect();
    assert_eq!(
        values,
        [
            Some("secret of tenant-a".to_string()),
            Some("secret of tenant-b".to_string())
        ]
    );
    // Later, with tenant a's answer cached: tenant c gets its own.
    let later = runner.one(call("tenant-c")).await;
    assert_eq!(
        later.value().map(String::as_str),
        Some("secret of tenant-c")
    );
    assert_eq!(sent.load(Ordering::SeqCst), 3);
    // The same tenant again is served from the cache.
    let again = runner.one(call("tenant-a")).await;
    assert_eq!(
        again.value().map(String::as_str),
        Some("secret of tenant-a")
    );
    assert_eq!(sent.load(Ordering::SeqCst), 3);
}

/// Issue #58 item 3: the tower layer's `coalesce_reads` never checked
/// `CallSpec::write`: two charges (a `GET` the caller marks a write: it
/// has effects) went out as one request.
#[tokio::test]
async fn tower_coalesced_a_write() {
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let svc = AdmissionLayer::http(Admission::builder().build(), |_: &http::Request<()>| {
        CallSpec::new("charge", "key").write()
    })
    .coalesce_reads()
    .layer(service_fn(move |_: http::Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, std::io::Error>(http::Response::new(b"charged".to_vec()))
        }
    }));
    let charge = || {
        let req = http::Request::get("/charge?card=4242&usd=10")
            .body(())
            .unwrap();
        svc.clone().oneshot(req)
    };
    let (a, b) = tokio::join!(charge(), charge());
    assert_eq!(a.unwrap().body(), b"charged");
    assert_eq!(b.unwrap().body(), b"charged");
    assert_eq!(sent.load(Ordering::SeqCst), 2, "two charges, two requests");
}

/// Issue #58 item 1, on tower: a relative URI is the same for two hosts,
/// and requests for two hosts were merged.
#[tokio::test]
async fn tower_merged_relative_uris_of_two_hosts() {
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let svc = AdmissionLayer::http(Admission::builder().build(), |_: &http::Request<()>| {
        CallSpec::new("me", "anonymous")
    })
    .coalesce_reads()
    .layer(service_fn(move |req: http::Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        let host = req.headers()["host"].to_str().unwrap().to_string();
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, std::io::Error>(http::Response::new(host.into_bytes()))
        }
    }));
    let get = |host: &str| {
        let req = http::Request::get("/me")
            .header("host", host)
            .body(())
            .unwrap();
        svc.clone().oneshot(req)
    };
    let (a, b) = tokio::join!(get("a.example"), get("b.example"));
    assert_eq!(a.unwrap().body(), b"a.example");
    assert_eq!(b.unwrap().body(), b"b.example");
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

/// A server whose reply's head comes at once and whose body does not end
/// until `release` is set: `length` declares the body (a 40 MiB file), or
/// `None` streams lines (NDJSON) without one. It records the requests it
/// accepted and whether its body was ever finished.
async fn slow_body_server(
    length: Option<usize>,
    release: Arc<tokio::sync::Notify>,
) -> (String, Arc<AtomicUsize>, Arc<AtomicBool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/file", listener.local_addr().unwrap());
    let (accepted, finished) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (count, done) = (accepted.clone(), finished.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (release, done) = (release.clone(), done.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let chunk = vec![b'x'; 1 << 20];
                match length {
                    Some(n) => {
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {n}\r\n\r\n");
                        if s.write_all(head.as_bytes()).await.is_err()
                            || s.write_all(&chunk).await.is_err()
                        {
                            return;
                        }
                        release.notified().await;
                        for _ in 1..n / chunk.len() {
                            if s.write_all(&chunk).await.is_err() {
                                return;
                            }
                        }
                    }
                    None => {
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n";
                        let line = "b\r\n{\"n\":1234}\n\r\n";
                        if s.write_all(head.as_bytes()).await.is_err()
                            || s.write_all(line.as_bytes()).await.is_err()
                        {
                            return;
                        }
                        release.notified().await;
                        let _ = s.write_all(b"0\r\n\r\n").await;
                    }
                }
                done.store(true, Ordering::SeqCst);
            });
        }
    });
    (url, accepted, finished)
}

/// Issue #58 item 5: every GET through the middleware was read whole
/// before its caller got the headers (a 40 MiB file after 2.1 s; an
/// NDJSON stream never, past its deadline), whether or not anyone joined
/// it. Now the head comes back while the body is still on the wire, and
/// the caller that joined sends its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_get_was_buffered_whole_and_past_its_deadline() {
    for length in [Some(40 << 20), None] {
        let release = Arc::new(tokio::sync::Notify::new());
        let (url, accepted, finished) = slow_body_server(length, release.clone()).await;
        let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(AdmissionMiddleware::new(Admission::builder().build()))
            .build();
        let get = || {
            client
                .get(&url)
                .with_extension(RequestDeadline(Duration::from_secs(5)))
                .send()
        };
        // (A guard, not a bound: before the fix the heads never came, as
        // the bodies are held until `release`.)
        let both = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(get(), get())
        });
        let (a, b) = both
            .await
            .expect("the heads came back only with the whole body");
        let (a, b) = (a.unwrap(), b.unwrap());
        // Both heads are here, and no body has been finished.
        assert!(
            !finished.load(Ordering::SeqCst),
            "{length:?}: a body was read whole first"
        );
        assert_eq!(a.status(), 200);
        assert_eq!(b.status(), 200);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "{length:?}: the joined caller sent its own"
        );
        release.notify_waiters();
        // The body is the caller's to read, all of it.
        let body = a.bytes().await.unwrap();
        assert_eq!(body.len(), length.unwrap_or(11), "{length:?}");
    }
}
