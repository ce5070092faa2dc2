//! The conformance table's server for the MCP column (issue #42): rmcp's
//! streamable HTTP service on loopback, behind a front that answers each
//! `tools/call` POST from the same script as `scripted_server` (a status
//! with its headers at the transport, a reply after a delay, a broken
//! body for a reset, silence) and records its start. Everything else
//! (the handshake, the event stream) passes through untouched.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
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
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt};

use crate::scripted_server::{Seen, Step};

/// Every tool answers at once, with its name; `limited` allows
/// `LIMITED_PER_SECOND` calls in any second and refuses the rest with a
/// text, as a server written with the official Python SDK does.
#[derive(Clone)]
struct Tools {
    limited: Arc<Mutex<Vec<(Instant, bool)>>>,
}

/// The `limited` tool's own limit.
pub const LIMITED_PER_SECOND: usize = 3;

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == "limited" {
            let mut seen = self.limited.lock().unwrap();
            let now = Instant::now();
            let window = std::time::Duration::from_secs(1);
            let recent = seen
                .iter()
                .filter(|(at, refused)| !refused && now.duration_since(*at) < window)
                .count();
            let refused = recent >= LIMITED_PER_SECOND;
            seen.push((now, refused));
            if refused {
                let text = ContentBlock::text("Rate limit exceeded, retry after 1 seconds");
                return Ok(CallToolResult::error(vec![text]).into());
            }
        }
        let text = ContentBlock::text(request.name.to_string());
        Ok(CallToolResult::success(vec![text]).into())
    }
}

struct Script {
    steps: Vec<Step>,
    then: Step,
    next: AtomicUsize,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// The `requestId` of every `notifications/cancelled` the client sent.
    cancelled: Arc<Mutex<Vec<serde_json::Value>>>,
    /// The JSON-RPC `id` of every `tools/call`.
    calls: Arc<Mutex<Vec<serde_json::Value>>>,
}

pub struct McpScripted {
    seen: Arc<Mutex<Vec<Seen>>>,
    limited: Arc<Mutex<Vec<(Instant, bool)>>>,
    cancelled: Arc<Mutex<Vec<serde_json::Value>>>,
    calls: Arc<Mutex<Vec<serde_json::Value>>>,
    server: tokio::task::JoinHandle<()>,
    client: RunningService<RoleClient, ()>,
}

impl McpScripted {
    /// A server answering `tools/call` `i` with `steps[i]` (later ones
    /// with `then`), and a client connected to it. With `refused`, the
    /// server stops listening once the client is connected: every call's
    /// connection is refused.
    pub async fn start(steps: Vec<Step>, then: Step, refused: bool) -> McpScripted {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(Mutex::new(Vec::new()));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Script {
            steps,
            then,
            next: AtomicUsize::new(0),
            seen: seen.clone(),
            cancelled: cancelled.clone(),
            calls: calls.clone(),
        });
        let config = StreamableHttpServerConfig::default();
        let limited = Arc::new(Mutex::new(Vec::new()));
        let tools = Tools {
            limited: limited.clone(),
        };
        let service: StreamableHttpService<Tools, LocalSessionManager> =
            StreamableHttpService::new(move || Ok(tools.clone()), Default::default(), config);
        let app = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(script, front));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        // A connection per request, so a closed port refuses each.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"));
        let transport = StreamableHttpClientTransport::with_client(http, config);
        let client = ().serve(transport).await.expect("the MCP client connects");
        let mut server = server;
        if refused {
            server.abort();
            // Cancelled: the listener is dropped, the port closed.
            let _ = (&mut server).await;
        }
        McpScripted {
            seen,
            limited,
            cancelled,
            calls,
            server,
            client,
        }
    }

    pub fn peer(&self) -> Peer<RoleClient> {
        self.client.peer().clone()
    }

    /// The request ids the client cancelled (`notifications/cancelled`).
    #[allow(dead_code)] // used by the MCP tests only
    pub fn cancelled(&self) -> Vec<serde_json::Value> {
        self.cancelled.lock().unwrap().clone()
    }

    /// The JSON-RPC ids of the `tools/call` requests, in arrival order.
    #[allow(dead_code)] // used by the MCP tests only
    pub fn calls(&self) -> Vec<serde_json::Value> {
        self.calls.lock().unwrap().clone()
    }

    /// Every call of the `limited` tool: when it arrived, and whether the
    /// tool refused it.
    #[allow(dead_code)] // used by the MCP tests only
    pub fn limited(&self) -> Vec<(Instant, bool)> {
        self.limited.lock().unwrap().clone()
    }

    /// The record itself, for a task that watches it.
    pub fn seen_handle(&self) -> Arc<Mutex<Vec<Seen>>> {
        self.seen.clone()
    }
}

impl Drop for McpScripted {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Answers a `tools/call` POST from the script; passes the rest through.
async fn front(State(script): State<Arc<Script>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let message: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if message["method"] == "notifications/cancelled" {
        let id = message["params"]["requestId"].clone();
        script.cancelled.lock().unwrap().push(id);
    }
    if message["method"] != "tools/call" {
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    }
    script.calls.lock().unwrap().push(message["id"].clone());
    let i = script.next.fetch_add(1, Ordering::SeqCst);
    script.seen.lock().unwrap().push(Seen {
        at: Instant::now(),
        method: parts.method.to_string(),
    });
    let forward = Request::from_parts(parts, Body::from(bytes));
    match script.steps.get(i).unwrap_or(&script.then).clone() {
        Step::Answer(200, _) => next.run(forward).await,
        Step::Answer(status, headers) => {
            let mut response = Response::builder().status(StatusCode::from_u16(status).unwrap());
            for (name, value) in headers {
                response = response.header(*name, *value);
            }
            response.body(Body::from("not now")).unwrap()
        }
        Step::Body(status, body) => Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap(),
        Step::Slow(_, delay) => {
            tokio::time::sleep(delay).await;
            next.run(forward).await
        }
        // The head, then a body that breaks: the connection is cut
        // mid-reply.
        Step::Reset => {
            let broken = futures::stream::once(async {
                Err::<Bytes, _>(std::io::Error::other("connection reset"))
            });
            Response::builder()
                .header("content-type", "application/json")
                .body(Body::from_stream(broken))
                .unwrap()
        }
        Step::Silent => {
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}
