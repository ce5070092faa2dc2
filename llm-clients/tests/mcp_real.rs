//! Turns of parallel `tools/call`s against a real MCP server (issue #61):
//! through `backpressure::mcp::McpGate` or straight through the rmcp peer,
//! printing a turn table (per call: start and end offsets in the turn, and
//! how it ended). Ignored: it needs a server you start yourself.
//!
//! Streamable HTTP (here server-everything behind nginx's `limit_req`):
//!
//! ```text
//! PORT=3001 npx @modelcontextprotocol/server-everything streamableHttp &
//! PORT=18500 RATE=5 BURST=2 UPSTREAM=3001 ../shared/tools/limit-req-server  # prints nginx's pid
//! MCP_REAL_URL=http://127.0.0.1:18500/mcp MCP_REAL_TOOL=echo \
//!   MCP_REAL_ARGS='{"message":"{id}"}' MCP_REAL_DUPS=2 MCP_REAL_MODE=gate \
//!   MCP_REAL_MARK=http://127.0.0.1:18500/api/ \
//!   cargo test --test mcp_real -- --ignored --nocapture
//! ```
//!
//! The Python SDK's server (`tests/servers/python_search_server.py`):
//!
//! ```text
//! python3 tests/servers/python_search_server.py --port 18611 --log /tmp/py.jsonl &
//! MCP_REAL_URL=http://127.0.0.1:18611/mcp MCP_REAL_TOOL=search MCP_REAL_MODE=bare \
//!   cargo test --test mcp_real -- --ignored --nocapture
//! ```
//!
//! Stdio: `MCP_REAL_CMD="npx @modelcontextprotocol/server-everything stdio"`
//! (split on whitespace, no shell) instead of `MCP_REAL_URL`.
//!
//! | variable | default | what |
//! | --- | --- | --- |
//! | `MCP_REAL_URL` / `MCP_REAL_CMD` | (one is needed) | the server |
//! | `MCP_REAL_TOOL` | `search` | the tool every call names |
//! | `MCP_REAL_ARGS` | `{"q":"{id}"}` | the arguments; `{id}` becomes `t<turn>q<call>` |
//! | `MCP_REAL_TURNS`, `MCP_REAL_CALLS` | 3, 12 | turns, parallel calls per turn |
//! | `MCP_REAL_DUPS` | 0 | the last N calls of a turn repeat the first N's arguments |
//! | `MCP_REAL_MODE` | `gate` | `gate` (`McpGate`, the tool declared a read) or `bare` (rmcp's peer) |
//! | `MCP_REAL_DEADLINE_S` | 20 | the gate's deadline per call |
//! | `MCP_REAL_SETTLE_MS`, `MCP_REAL_PAUSE_MS` | 1500, 0 | wait after connecting; pause between turns |
//! | `MCP_REAL_MARK` | unset | a URL prefix GET before and after each turn (`mark-t<k>-start`/`-end`), to split a proxy's access log by turn |
//!
//! Each turn also prints its window in unix seconds, to split a server's
//! own log by turn.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use backpressure::admission::{Admission, CallFailure, CallResult};
use backpressure::mcp::McpGate;
use backpressure::Status;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::{
    HttpStatusError, StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
    StreamableHttpError,
};
use rmcp::{ServiceError, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn env_n(name: &str, default: u64) -> u64 {
    env(name, &default.to_string())
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.clone())
        .collect()
}

/// The HTTP status rmcp's streamable HTTP client reports, if any.
fn http_status(e: &ServiceError) -> Option<&HttpStatusError> {
    let ServiceError::TransportSend(e) = e else {
        return None;
    };
    if let Some(StreamableHttpError::HttpStatus(h)) = e
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        return Some(h);
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&*e.error);
    while let Some(e) = next {
        if let Some(h) = e.downcast_ref::<HttpStatusError>() {
            return Some(h);
        }
        next = e.source();
    }
    None
}

fn error_line(e: &ServiceError) -> String {
    match http_status(e) {
        Some(h) => format!("http {} retry-after={:?}", h.status, h.retry_after),
        None => format!("{e}"),
    }
}

/// How one call ended: its class (a table column) and a line for the log.
fn ended_gate(r: &CallResult<CallToolResult, ServiceError>) -> (String, String) {
    match r {
        CallResult::Done {
            value,
            provenance,
            attempts,
        } => {
            let class = if value.is_error == Some(true) {
                "isError"
            } else {
                "done"
            };
            let line = format!("{class} ({provenance:?}, {attempts} sent) {}", text(value));
            (class.to_string(), line)
        }
        CallResult::Throttled(t) => {
            let class = match t.status {
                Status::RateLimited => "rate_limited".to_string(),
                other => other.to_string(),
            };
            let line = format!(
                "{class} retry_after_ms={:?} scope={} attempts={} ({})",
                t.retry_after_ms, t.scope, t.attempts, t.hint
            );
            (class, line)
        }
        CallResult::Failed {
            error, attempts, ..
        } => {
            let line = match error {
                CallFailure::Status { status } => format!("error: status {status}"),
                CallFailure::Transport(e) => format!("error: {}", error_line(e)),
                other => format!("error: {other:?}"),
            };
            ("error".to_string(), format!("{line} ({attempts} sent)"))
        }
        CallResult::Panicked { message } => ("panicked".to_string(), message.clone()),
        other => ("other".to_string(), format!("{other:?}")),
    }
}

fn ended_bare(r: &Result<CallToolResult, ServiceError>) -> (String, String) {
    match r {
        Ok(v) if v.is_error == Some(true) => {
            ("isError".to_string(), format!("isError {}", text(v)))
        }
        Ok(v) => ("done".to_string(), format!("done {}", text(v))),
        Err(e) => ("error".to_string(), format!("error: {}", error_line(e))),
    }
}

/// A GET whose only use is its line in a proxy's access log.
async fn mark(prefix: &str, what: &str) {
    let rest = prefix
        .strip_prefix("http://")
        .expect("MCP_REAL_MARK is http://");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = tokio::net::TcpStream::connect(host).await.expect("mark");
    let req = format!("GET /{path}{what} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink).await;
}

async fn connect() -> (RunningService<RoleClient, ()>, Option<std::process::Child>) {
    if let Ok(url) = std::env::var("MCP_REAL_URL") {
        let config = StreamableHttpClientTransportConfig::with_uri(url);
        let transport = StreamableHttpClientTransport::from_config(config);
        return (().serve(transport).await.expect("connects"), None);
    }
    let cmd = std::env::var("MCP_REAL_CMD").expect("MCP_REAL_URL or MCP_REAL_CMD");
    let mut parts = cmd.split_whitespace();
    let mut child = std::process::Command::new(parts.next().expect("a command"))
        .args(parts)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the server starts");
    // Pipes as tokio's (no `process` feature needed).
    let out: OwnedFd = child.stdout.take().unwrap().into();
    let inp: OwnedFd = child.stdin.take().unwrap().into();
    let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(out).unwrap();
    let tx = tokio::net::unix::pipe::Sender::from_owned_fd(inp).unwrap();
    (().serve((rx, tx)).await.expect("connects"), Some(child))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real MCP server: see the top of tests/mcp_real.rs"]
async fn turns_against_a_real_server() {
    let tool = env("MCP_REAL_TOOL", "search");
    let template = env("MCP_REAL_ARGS", r#"{"q":"{id}"}"#);
    let turns = env_n("MCP_REAL_TURNS", 3);
    let calls = env_n("MCP_REAL_CALLS", 12) as usize;
    let dups = env_n("MCP_REAL_DUPS", 0) as usize;
    let mode = env("MCP_REAL_MODE", "gate");
    let deadline = Duration::from_secs(env_n("MCP_REAL_DEADLINE_S", 20));
    let settle = Duration::from_millis(env_n("MCP_REAL_SETTLE_MS", 1500));
    let pause = Duration::from_millis(env_n("MCP_REAL_PAUSE_MS", 0));
    let marks = std::env::var("MCP_REAL_MARK").ok();
    assert!(
        mode == "gate" || mode == "bare",
        "MCP_REAL_MODE is gate or bare"
    );
    assert!(dups <= calls / 2, "MCP_REAL_DUPS is at most half the calls");

    let (client, mut child) = connect().await;
    let info = client.peer().peer_info().map(|i| i.server_info.clone());
    println!(
        "mode {mode}, tool {tool}, {turns} turns of {calls} ({dups} duplicates), server {info:?}"
    );
    let gate = McpGate::new(
        Admission::builder().build(),
        "server",
        client.peer().clone(),
    )
    .read(tool.clone())
    .deadline(deadline);
    tokio::time::sleep(settle).await;

    let mut summary = Vec::new();
    for turn in 1..=turns {
        let params: Vec<CallToolRequestParams> = (0..calls)
            .map(|n| {
                let n = if n >= calls - dups {
                    n - (calls - dups)
                } else {
                    n
                };
                let args = template.replace("{id}", &format!("t{turn}q{n}"));
                let args: Value = serde_json::from_str(&args).expect("MCP_REAL_ARGS is JSON");
                let mut p = CallToolRequestParams::new(tool.clone());
                p.arguments = args.as_object().cloned();
                p
            })
            .collect();
        if let Some(m) = &marks {
            mark(m, &format!("mark-t{turn}-start")).await;
        }
        let (t0, wall0) = (Instant::now(), SystemTime::now());
        let runs = params.into_iter().map(|p| {
            let (gate, peer, mode) = (&gate, client.peer(), mode.as_str());
            async move {
                let args = serde_json::to_string(&p.arguments).unwrap();
                let start = t0.elapsed();
                let (class, line) = if mode == "gate" {
                    ended_gate(&gate.call_result(p).await)
                } else {
                    ended_bare(&peer.call_tool(p).await)
                };
                (args, start, t0.elapsed(), class, line)
            }
        });
        let ended = futures::future::join_all(runs).await;
        let wall1 = SystemTime::now();
        if let Some(m) = &marks {
            mark(m, &format!("mark-t{turn}-end")).await;
        }
        println!(
            "\nturn {turn}: unix {:.3} .. {:.3}",
            unix(wall0),
            unix(wall1)
        );
        println!("  {:<26} {:>6} {:>6}  ended", "arguments", "start", "end");
        let mut classes: BTreeMap<String, usize> = BTreeMap::new();
        for (args, start, end, class, line) in &ended {
            println!(
                "  {args:<26} {:>6.3} {:>6.3}  {line}",
                start.as_secs_f64(),
                end.as_secs_f64()
            );
            *classes.entry(class.clone()).or_default() += 1;
        }
        let last = ended.iter().map(|e| e.2).max().unwrap_or_default();
        println!(
            "  turn {turn} ended: {classes:?}, last call at {:.3} s",
            last.as_secs_f64()
        );
        summary.push((turn, classes, last));
        tokio::time::sleep(pause).await;
    }
    println!("\nsummary ({mode}):");
    for (turn, classes, last) in &summary {
        println!(
            "  turn {turn}: {classes:?}, last at {:.3} s",
            last.as_secs_f64()
        );
    }
    drop(gate);
    let _ = client.cancel().await;
    if let Some(child) = &mut child {
        let _ = child.kill();
        let _ = child.wait();
    }
}
