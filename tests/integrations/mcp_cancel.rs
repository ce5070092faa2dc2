//! Issue #61 item 4: an MCP call the gate abandons at its deadline is
//! cancelled at the server. rmcp's `call_tool` sends
//! `notifications/cancelled` when its future is dropped unfinished, and
//! the gate drops it at the deadline; this holds that true against rmcp's
//! own streamable HTTP server, by the request id the server saw.

use std::time::Duration;

use backpressure::admission::Admission;
use backpressure::mcp::McpGate;
use backpressure::Status;
use rmcp::model::CallToolRequestParams;

use crate::mcp_server::McpScripted;
use crate::scripted_server::Step;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_mcp_call_is_cancelled_at_the_server() {
    // The first call is never answered; any later one at once.
    let server = McpScripted::start(vec![Step::Silent], Step::Answer(200, &[]), false).await;
    let gate = McpGate::new(Admission::builder().build(), "silent", server.peer()).read("lookup");
    let params = CallToolRequestParams::new("lookup");
    let spec = gate.spec(&params).deadline(Duration::from_millis(300));
    let ended = gate.call(spec, params).await;
    let refused = ended.throttled().expect("no answer by the deadline");
    assert_eq!(refused.status, Status::TimedOut, "{refused}");
    assert_eq!(server.calls().len(), 1, "sent once, not retried");

    // The notification travels on its own POST: wait for it by polls
    // (a bound on polls, not a measured duration).
    let id = server.calls()[0].clone();
    let mut cancelled = server.cancelled();
    for _ in 0..500 {
        if !cancelled.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        cancelled = server.cancelled();
    }
    assert_eq!(
        cancelled,
        vec![id],
        "the abandoned request is cancelled, by its id"
    );
}

/// Polls (a bound on polls, not a measured duration) until the server has
/// recorded `n` cancellations, and returns what it recorded.
async fn cancellations(server: &McpScripted, n: usize) -> Vec<serde_json::Value> {
    for _ in 0..500 {
        if server.cancelled().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.cancelled()
}

/// A read with a 200 ms deadline, and an identical one with `joiner`'s that
/// joins once the first's request is at the server: how each ended.
async fn led_and_joined(
    server: &McpScripted,
    gate: &McpGate,
    params: &CallToolRequestParams,
    joiner: Duration,
) -> (Outcome, Outcome) {
    let first = gate.spec(params).deadline(Duration::from_millis(200));
    let joiner = gate.spec(params).deadline(joiner);
    let led = gate.call(first, params.clone());
    let joined = async {
        while server.calls().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        gate.call(joiner, params.clone()).await
    };
    tokio::join!(led, joined)
}

type Outcome = backpressure::admission::CallResult<rmcp::model::CallToolResult, rmcp::ServiceError>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_read_runs_on_for_the_callers_that_joined_it() {
    // The first call is answered after 800 ms.
    let slow = Step::Slow(200, Duration::from_millis(800));
    let server = McpScripted::start(vec![slow], Step::Answer(200, &[]), false).await;
    let gate = McpGate::new(Admission::builder().build(), "slow", server.peer()).read("lookup");
    let params = CallToolRequestParams::new("lookup");
    let (led, joined) = led_and_joined(&server, &gate, &params, Duration::from_secs(10)).await;
    let refused = led.throttled().expect("the first call's deadline passed");
    assert_eq!(refused.status, Status::TimedOut, "{refused}");
    let (value, provenance, attempts) = match joined {
        backpressure::admission::CallResult::Done {
            value,
            provenance,
            attempts,
        } => (value, provenance, attempts),
        other => panic!("the joiner has the answer: {other:?}"),
    };
    assert_ne!(value.is_error, Some(true), "the tool answered");
    assert_eq!(
        (provenance, attempts),
        (backpressure::Provenance::Joined, 0)
    );
    assert_eq!(server.calls().len(), 1, "one request for both callers");
    assert!(
        server.cancelled().is_empty(),
        "a request someone waits for is not cancelled: {:?}",
        server.cancelled()
    );

    // Both callers give up: the request is cancelled, once.
    let silent = McpScripted::start(vec![Step::Silent], Step::Answer(200, &[]), false).await;
    let gate = McpGate::new(Admission::builder().build(), "silent", silent.peer()).read("lookup");
    let (led, joined) = led_and_joined(&silent, &gate, &params, Duration::from_millis(600)).await;
    for ended in [led, joined] {
        let refused = ended.throttled().expect("nobody answered");
        assert_eq!(refused.status, Status::TimedOut, "{refused}");
    }
    assert_eq!(
        silent.calls().len(),
        1,
        "the joiner sent nothing of its own"
    );
    let id = silent.calls()[0].clone();
    assert_eq!(cancellations(&silent, 1).await, vec![id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_write_says_it_may_have_run() {
    let server = McpScripted::start(vec![Step::Silent], Step::Answer(200, &[]), false).await;
    let gate = McpGate::new(Admission::builder().build(), "silent", server.peer());
    let params = CallToolRequestParams::new("charge");
    let spec = gate.spec(&params).deadline(Duration::from_millis(300));
    assert!(spec.write, "a tool not declared a read is a write");
    let ended = gate.call(spec, params).await;
    let refused = ended.throttled().expect("no answer by the deadline");
    assert_eq!((refused.status, refused.attempts), (Status::TimedOut, 1));
    assert!(refused.hint.contains("may have run"), "{refused}");
    let id = server.calls()[0].clone();
    assert_eq!(cancellations(&server, 1).await, vec![id]);
}
