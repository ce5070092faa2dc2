//! A refusal as an HTTP response (feature `http`): a closed layer's 503
//! carries no retry headers.

use backpressure::{Status, Throttled};

#[test]
fn a_closed_layer_answers_503_and_no_retry_time_sends_no_retry_headers() {
    let r = Throttled::new(Status::Closed, "admission", "shutting down").to_response();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_none());
    let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
    assert_eq!(body["error"]["code"], "closed");
    assert_eq!(body["error"]["message"], "shutting down");
    assert!(body["error"]["retry_after_ms"].is_null());
}
