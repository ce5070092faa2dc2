//! Issue #61 item 1: a tool's own limit (a server that allows 3 calls of
//! `limited` in any second and refuses the rest with a text) is that
//! tool's capacity. Twelve distinct calls at once through the gate: after
//! the first refusal the server never sees more than the tool's limit in
//! a second (the calls queued behind the hold go out spaced, never
//! together at its end), the tool refuses once, and every call ends done
//! or told when its slot comes. On the code before, the server saw 7
//! refusals and 5 calls at once at the hold's end.

use std::time::Duration;

use backpressure::admission::Admission;
use backpressure::mcp::McpGate;
use backpressure::Status;
use rmcp::model::CallToolRequestParams;

use crate::mcp_server::{McpScripted, LIMITED_PER_SECOND};
use crate::scripted_server::Step;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_behind_a_tools_own_limit_go_out_spaced() {
    let server = McpScripted::start(vec![], Step::Answer(200, &[]), false).await;
    let gate = McpGate::new(Admission::builder().build(), "py", server.peer()).read("limited");
    let calls = (0..12).map(|i| {
        let mut params = CallToolRequestParams::new("limited");
        params.arguments = serde_json::json!({ "q": i }).as_object().cloned();
        gate.call_result(params)
    });
    let results = futures::future::join_all(calls).await;
    // Done, or told when its slot comes (a wait past the inline threshold
    // is the model's to plan with): never a failure.
    for r in &results {
        let told = r
            .throttled()
            .is_some_and(|t| t.status == Status::RateLimited);
        assert!(r.value().is_some() || told, "{r:?}");
    }
    // Spaced at the tool's pace, not slower: a call the hold sends back to
    // the queue may wait the inline threshold again from then, so all fit.
    let done = results.iter().filter(|r| r.value().is_some()).count();
    assert_eq!(done, 12, "only {done} of 12 done");
    let seen = server.limited();
    let first = seen
        .iter()
        .position(|(_, refused)| *refused)
        .expect("the burst meets the tool's limit");
    let after = &seen[first..];
    let refused = after.iter().filter(|(_, r)| *r).count();
    assert_eq!(refused, 1, "the tool refused again after its first refusal");
    for (at, _) in after {
        let in_second = after
            .iter()
            .filter(|(b, _)| *b >= *at && b.duration_since(*at) < Duration::from_secs(1))
            .count();
        assert!(
            in_second <= LIMITED_PER_SECOND,
            "{in_second} calls in a second after the first refusal (limit {LIMITED_PER_SECOND})"
        );
    }
}
