//! A server that is down (500 to everything) for `DOWN`, then recovers,
//! and the one check every path's circuit-breaker test makes against it
//! (issue #23 item 3): the server's record of request start times, and
//! what the caller was told.

use std::future::Future;
use std::time::{Duration, Instant};

use backpressure::admission::CircuitBreaker;
use backpressure::testing::ThrottlingServer;
use backpressure::{Status, Throttled};

/// How long the server answers 500.
pub const DOWN: Duration = Duration::from_secs(2);
/// The breaker's cool-down.
pub const COOL_DOWN: Duration = Duration::from_millis(400);
/// Failures in a row that open it.
pub const FAILURES: usize = 3;
/// The caller sends a call this often, whatever it was told (a flood).
const EVERY: Duration = Duration::from_millis(40);
/// And stops this long after the server started.
const UNTIL: Duration = Duration::from_millis(3_000);

pub async fn down_server() -> ThrottlingServer {
    ThrottlingServer::builder()
        .down_for(DOWN)
        .start()
        .await
        .unwrap()
}

/// An admission layer with the breaker, as every path's twin uses it.
pub fn admission() -> backpressure::admission::Admission {
    backpressure::admission::Admission::builder()
        .circuit_breaker(breaker())
        .build()
}

pub fn breaker() -> CircuitBreaker {
    CircuitBreaker::new()
        .consecutive_failures(FAILURES as u32)
        .cool_down(COOL_DOWN)
}

/// What one call came back with.
#[derive(Debug)]
pub enum Seen {
    /// The server's status.
    Status(u16),
    /// A refusal.
    Refused(Throttled),
}

/// One call at a time, every `EVERY`, until `UNTIL` after `started`.
pub async fn drive<F, Fut>(started: Instant, mut call: F) -> Vec<Seen>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u16, Throttled>>,
{
    let mut seen = Vec::new();
    while started.elapsed() < UNTIL {
        seen.push(match call().await {
            Ok(status) => Seen::Status(status),
            Err(t) => Seen::Refused(t),
        });
        tokio::time::sleep(EVERY).await;
    }
    seen
}

/// The breaker's promises, on the server's record and the caller's.
pub fn check(server: &ThrottlingServer, key: &str, seen: &[Seen]) {
    let starts = server.request_starts(key);
    let failed = server.failed(key);
    // Down, then back: it failed at least the breaker's run, and served after.
    assert!(
        failed >= FAILURES && failed < starts.len(),
        "{failed} failed of {}",
        starts.len()
    );
    // No request is sent while the breaker is open: from the run that opened
    // it on, each request (a trial) starts a cool-down after the one before.
    for i in FAILURES..=failed {
        let gap = starts[i] - starts[i - 1];
        assert!(gap >= COOL_DOWN, "request {i} came {gap:?} after the last");
    }
    // One trial per cool-down while the server is down.
    let trials = (DOWN.as_millis() / COOL_DOWN.as_millis()) as usize + 1;
    assert!(failed <= FAILURES + trials, "{failed} failed requests");
    // Nothing refused was sent.
    let answered = seen.iter().filter(|s| matches!(s, Seen::Status(_))).count();
    assert_eq!(answered, starts.len(), "{seen:?}");
    // Traffic is back within one trial: after the first answer, every call
    // is answered.
    let first_ok = seen
        .iter()
        .position(|s| matches!(s, Seen::Status(200)))
        .expect("the server recovered");
    for s in &seen[first_ok..] {
        assert!(matches!(s, Seen::Status(200)), "after recovery: {s:?}");
    }
    // Refusals: `unavailable`, scoped to the circuit. The one caller asks
    // every 40 ms, one call at a time: it is told the cool-down left each
    // time, never more (issue #40: each promise still ahead pushed the
    // next a step further, to 109.6 s for a 1 s cool-down); so the
    // instants it is told never move past the end of the cool-down.
    let mut refused = 0;
    for s in &seen[..first_ok] {
        if let Seen::Refused(t) = s {
            refused += 1;
            assert_eq!(t.status, Status::Unavailable, "{t:?}");
            assert!(t.scope.starts_with("circuit:"), "{t:?}");
            assert!(
                t.retry_after_ms
                    .is_some_and(|ms| ms > 0 && ms <= COOL_DOWN.as_millis() as u64),
                "told more than the cool-down: {t:?}"
            );
        }
    }
    assert!(refused > 0, "the breaker never opened: {seen:?}");
}
