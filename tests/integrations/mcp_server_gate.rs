//! Issue #61: an rmcp server behind `ServerGate` limits `tools/call` per
//! client and tool, and its refusal is one a client's gate reads as a
//! limit. Asserted on the handler's own record: runs and peak in flight.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backpressure::admission::{Admission, CallResult, SlotPolicy};
use backpressure::mcp::{McpGate, ServerGate};
use backpressure::Quota;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{RequestContext, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

/// A tool that takes 50 ms, counting its runs and the most in flight.
#[derive(Clone, Default)]
struct Work {
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
}

impl ServerHandler for Work {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        let text = ContentBlock::text(request.name.to_string());
        Ok(CallToolResult::success(vec![text]).into())
    }
}

fn per_second(n: u32) -> Quota {
    Quota::per_second(NonZeroU32::new(n).unwrap())
}

/// `gate` served over a duplex, and a client connected to it.
async fn over_duplex(gate: ServerGate<Work>) -> RunningService<RoleClient, ()> {
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(server) = gate.serve(server_io).await {
            let _ = server.waiting().await;
        }
    });
    ().serve(client_io).await.expect("the client connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_server_holds_its_slots_and_refuses_with_a_throttled() {
    let work = Work::default();
    let admission = Admission::builder()
        .tool("work", 2, SlotPolicy::Wait)
        .default_quota(per_second(3))
        .inline_wait(Duration::from_millis(500))
        .build();
    let client = over_duplex(ServerGate::new(admission, work.clone())).await;
    let calls = (0..12).map(|i| {
        let peer = client.peer().clone();
        let mut params = CallToolRequestParams::new("work");
        params.arguments = serde_json::json!({ "i": i }).as_object().cloned();
        async move { peer.call_tool(params).await.expect("an answer") }
    });
    let results = futures::future::join_all(calls).await;
    let refused: Vec<_> = results
        .iter()
        .filter(|r| r.is_error == Some(true))
        .collect();
    assert_eq!(work.runs.load(Ordering::SeqCst) + refused.len(), 12);
    assert!(!refused.is_empty(), "12 at once against 3 a second");
    assert!(work.runs.load(Ordering::SeqCst) >= 3, "the burst ran");
    for r in refused {
        let t = r.structured_content.as_ref().expect("the Throttled");
        assert_eq!(t["status"], "rate_limited", "{t}");
        assert!(t["retry_after_ms"].as_u64().unwrap() > 0, "{t}");
    }
    assert!(work.peak.load(Ordering::SeqCst) <= 2, "two slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gate_reads_a_gated_servers_refusal_as_a_limit() {
    let work = Work::default();
    let server = Admission::builder()
        .default_quota(per_second(4))
        .inline_wait(Duration::ZERO)
        .build();
    let client = over_duplex(ServerGate::new(server, work.clone())).await;
    // The client's gate knows nothing of the server's limit, and `work` is
    // a write: a refusal that ran nothing is the one thing it may resend.
    let gate = McpGate::new(Admission::builder().build(), "gated", client.peer().clone());
    let calls = (0..6).map(|i| {
        let mut params = CallToolRequestParams::new("work");
        params.arguments = serde_json::json!({ "i": i }).as_object().cloned();
        gate.call_result(params)
    });
    let results = futures::future::join_all(calls).await;
    let mut sent = 0;
    for r in &results {
        match r {
            CallResult::Done { attempts, .. } => sent += attempts,
            other => panic!("every call is done within its waits: {other:?}"),
        }
    }
    assert_eq!(work.runs.load(Ordering::SeqCst), 6, "each ran once");
    assert!(sent > 6, "some were refused, then sent again: {sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_each_client_has_its_own_quota() {
    let work = Work::default();
    let admission = Admission::builder()
        .default_quota(per_second(1))
        .inline_wait(Duration::ZERO)
        .build();
    let gate = ServerGate::new(admission.clone(), work.clone());
    let service: StreamableHttpService<ServerGate<Work>, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(gate.clone()),
            Default::default(),
            StreamableHttpServerConfig::default(),
        );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let connect = |key: &'static str| async move {
        let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"))
            .auth_header(key);
        let transport = StreamableHttpClientTransport::from_config(config);
        ().serve(transport).await.expect("the client connects")
    };
    let (a, b) = (connect("key-a").await, connect("key-b").await);
    let call = |peer: rmcp::Peer<RoleClient>| async move {
        let r = peer.call_tool(CallToolRequestParams::new("work")).await;
        r.expect("an answer").is_error == Some(true)
    };
    // One a second each: a's second call is refused; b's first is not.
    assert!(!call(a.peer().clone()).await, "a's first call runs");
    assert!(call(a.peer().clone()).await, "a's second call is refused");
    assert!(!call(b.peer().clone()).await, "b has a quota of its own");
    assert_eq!(work.runs.load(Ordering::SeqCst), 2);
    served.abort();
}
