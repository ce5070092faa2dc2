//! `AdmissionLayer::hold_bodies` (features `tower`, `reqwest`): a streamed
//! reply from a loopback LLM, through a tower service over a reqwest
//! client, holds its call's slot until its body ends or is dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use backpressure::admission::CallSpec;
use backpressure::admission::Provider;
use backpressure::tower::AdmissionLayer;
use backpressure::Status;
use http_body_util::BodyExt;
use tower::{service_fn, Layer, ServiceExt};

use crate::stream_server::{admission, streaming_server};

type Req = http::Request<()>;

/// A tower service that sends each request to `url` with reqwest and
/// answers its streaming `http::Response`.
fn client(
    url: String,
) -> impl tower::Service<
    Req,
    Response = http::Response<reqwest::Body>,
    Error = reqwest::Error,
    Future = impl Send,
> + Clone {
    let client = reqwest::Client::new();
    service_fn(move |_req: Req| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let response = client.get(url).send().await?;
            Ok(http::Response::<reqwest::Body>::from(response))
        }
    })
}

/// Issue #23 item 5 on tower: with `hold_bodies` a streamed reply holds
/// its slot while it streams (a probe needing the one global slot is shed)
/// and the `usage` event at its end settles the 500-token estimate to the
/// 805 used; dropped half-read, it frees the slot and the estimate stands.
/// Without `hold_bodies` the slot comes back with the head.
#[tokio::test]
async fn held_bodies_keep_their_slot_until_read_and_settle_the_streamed_usage() {
    let finish = Arc::new(tokio::sync::Notify::new());
    let (addr, accepted) = streaming_server(finish.clone()).await;
    let url = format!("http://{addr}/v1/chat/completions");
    let admission = admission();
    let spec = |_: &Req| CallSpec::new("chat", "key").cost("tokens", 500);
    let svc = AdmissionLayer::http(admission.clone(), spec)
        .hold_bodies()
        .usage_from_stream(Provider::usage_in_event)
        .layer(client(url.clone()));
    let probe_spec = CallSpec::new("probe", "other");
    let probe = || admission.admit(&probe_spec);

    let response = svc.clone().oneshot(Req::new(())).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.body().holds_ticket());
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");
    assert_eq!(admission.stats().in_flight, 1, "the stream is in flight");
    assert_eq!(
        probe().await.unwrap_err().status,
        Status::Shed,
        "the stream holds the slot"
    );
    assert_eq!(admission.available("key", "tokens"), Some(9_500));
    finish.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(
        rest.ends_with(b"data: [DONE]\n\n"),
        "every byte reaches the caller"
    );
    assert_eq!(admission.stats().in_flight, 0);
    drop(probe().await.expect("read to the end: the slot is free"));
    assert_eq!(admission.available("key", "tokens"), Some(10_000 - 805));

    // Dropped half-read: the slot comes back, the estimate stands.
    let response = svc.clone().oneshot(Req::new(())).await.unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(probe().await.unwrap_err().status, Status::Shed);
    drop(body);
    drop(probe().await.expect("dropped: the slot is free"));
    assert_eq!(
        admission.available("key", "tokens"),
        Some(10_000 - 805 - 500)
    );

    // Without `hold_bodies`: the slot is back once the head is.
    let plain = AdmissionLayer::http(admission.clone(), spec).layer(client(url));
    let response = plain.oneshot(Req::new(())).await.unwrap();
    assert_eq!(admission.stats().in_flight, 0);
    drop(probe().await.expect("released with the head"));
    drop(response);
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}
