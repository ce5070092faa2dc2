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
