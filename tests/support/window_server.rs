//! The throttling fake the reqwest and tower admission tests run against.

use std::time::Duration;

use backpressure::testing::{Limit, LimitHeaders, ThrottlingServer};

/// 10 requests per rolling 500 ms per key, IETF `RateLimit` headers, 5 ms
/// latency.
pub async fn window_server() -> ThrottlingServer {
    ThrottlingServer::builder()
        .limit(Limit::Window {
            requests: 10,
            window: Duration::from_millis(500),
        })
        .headers(LimitHeaders::Ietf)
        .latency(Duration::from_millis(5))
        .start()
        .await
        .unwrap()
}
