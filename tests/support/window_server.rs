//! The throttling fake the reqwest and tower admission tests run against.

use std::time::Duration;

use backpressure::testing::{Limit, ThrottlingServer};

/// 10 requests per rolling 500 ms per key, IETF `RateLimit` headers, 5 ms
/// latency.
pub async fn window_server() -> ThrottlingServer {
    ThrottlingServer::builder()
        .limit(Limit::Window {
            requests: 10,
            window: Duration::from_millis(500),
        })
        .ietf_headers()
        .latency(Duration::from_millis(5))
        .start()
        .await
        .unwrap()
}

/// A client quota that fits the server's window: `burst + rate x window`
/// = 2 + 14 x 0.5 = 9 <= 10 in any window.
pub fn fitting_quota() -> backpressure::Quota {
    use std::num::NonZeroU32;
    backpressure::Quota::per_second(NonZeroU32::new(14).unwrap())
        .allow_burst(NonZeroU32::new(2).unwrap())
}
