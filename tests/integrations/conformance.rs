//! One contract on every seam (issue #39): one table of scenarios, run
//! against each seam — `Runner` with `Call::request`, the reqwest
//! middleware (`AdmissionMiddleware::call_result`), the tower
//! `AdmissionLayer::http` stack (`CallResult::from_tower`) and, with
//! feature `mcp`, the MCP gate (`McpGate::call_result`, a read tool for a
//! GET and a write tool for a POST, each `tools/call` answered from the
//! script at rmcp's streamable HTTP transport) — against loopback servers. Each row
//! asserts, on every seam alike: the final status, the requests the call
//! sent, the requests the server saw (and the gaps between their starts),
//! and when the caller heard back against its deadline (orderings, never
//! a wall-clock bound).

use std::sync::Arc;
use std::time::{Duration, Instant};

use backpressure::admission::{
    Admission, Builder, Call, CallResult, CallSpec, CircuitBreaker, Runner,
};
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::retry::{Backoff, Jitter, RequestDeadline, RetryBudget, RetryPolicy};
use backpressure::tower::AdmissionLayer;
use backpressure::Status;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tower::{BoxError, Layer, Service, ServiceExt};

#[cfg(feature = "mcp")]
use backpressure::mcp::McpGate;
#[cfg(feature = "mcp")]
use rmcp::model::CallToolRequestParams;

use crate::scripted_server::{Scripted, Step};

/// How a call ended, the same words on every seam.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Done(u16),
    Throttled(Status),
    /// `status` is `None` for a transport error; `not_retried` is the
    /// status of the refusal that stopped the retries, if one did.
    Failed {
        status: Option<u16>,
        not_retried: Option<Status>,
    },
}

#[derive(Clone, Debug)]
struct Heard {
    kind: Kind,
    attempts: u32,
    retry_after: Option<Duration>,
    /// When the caller heard back, from the start of its call.
    after: Duration,
    /// The caller's own deadline.
    deadline: Duration,
}

impl Heard {
    fn of<V, E>(result: CallResult<V, E>, status: impl Fn(&V) -> u16, after: Duration) -> Heard {
        let (kind, attempts, retry_after) = match result {
            CallResult::Done {
                value, attempts, ..
            } => (Kind::Done(status(&value)), attempts, None),
            CallResult::Throttled(t) => (Kind::Throttled(t.status), t.attempts, t.retry_after()),
            CallResult::Failed {
                error,
                not_retried,
                attempts,
            } => (
                Kind::Failed {
                    status: (!error.is_transport()).then(|| error.http_status()),
                    not_retried: not_retried.map(|t| t.status),
                },
                attempts,
                None,
            ),
            _ => panic!("a call panicked"),
        };
        Heard {
            kind,
            attempts,
            retry_after,
            after,
            deadline: Duration::ZERO,
        }
    }

    fn within(mut self, deadline: Duration) -> Heard {
        self.deadline = deadline;
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seam {
    Runner,
    Middleware,
    Tower,
    #[cfg(feature = "mcp")]
    Mcp,
}

const SEAMS: &[Seam] = &[
    Seam::Runner,
    Seam::Middleware,
    Seam::Tower,
    #[cfg(feature = "mcp")]
    Seam::Mcp,
];

/// A row's server: the scripted HTTP server, or rmcp's behind the same
/// script.
enum Server {
    Http(Scripted),
    #[cfg(feature = "mcp")]
    Mcp(crate::mcp_server::McpScripted),
}

impl Server {
    async fn start(seam: Seam, row: &Row) -> Server {
        #[cfg(feature = "mcp")]
        if seam == Seam::Mcp {
            let (script, then) = (row.script.clone(), row.then.clone());
            return Server::Mcp(
                crate::mcp_server::McpScripted::start(script, then, row.refused).await,
            );
        }
        let _ = seam;
        Server::Http(if row.refused {
            Scripted::closed().await
        } else {
            Scripted::start(row.script.clone(), row.then.clone()).await
        })
    }

    fn seen_handle(&self) -> Arc<std::sync::Mutex<Vec<crate::scripted_server::Seen>>> {
        match self {
            Server::Http(s) => s.seen_handle(),
            #[cfg(feature = "mcp")]
            Server::Mcp(s) => s.seen_handle(),
        }
    }

    fn seen(&self) -> Vec<crate::scripted_server::Seen> {
        match self {
            Server::Http(s) => s.seen(),
            #[cfg(feature = "mcp")]
            Server::Mcp(s) => s.seen_handle().lock().unwrap().clone(),
        }
    }

    fn http(&self) -> &Scripted {
        match self {
            Server::Http(s) => s,
            #[cfg(feature = "mcp")]
            Server::Mcp(_) => unreachable!("an HTTP seam on the MCP server"),
        }
    }
}

/// The calls of one row.
#[derive(Clone, Copy, Debug)]
enum Calls {
    /// `n` identical `GET /item` at once.
    Reads(usize),
    /// `n` identical `POST /item` at once.
    Writes(usize),
    /// `n` `GET /item`, one after the other.
    InTurn(usize),
    /// Two `GET /item` at once, alike but in what `Differ` names (on MCP:
    /// two read calls, by two credentials or with two arguments).
    Apart(Differ),
    /// Two identical `GET /item`, the second 50 ms after the first, with
    /// these deadlines (the row's is the first's).
    Follower(Duration),
}

/// What two otherwise identical reads differ in (issue #58).
#[derive(Clone, Copy, Debug)]
enum Differ {
    /// Two users of one site: their `Cookie`.
    Cookie,
    /// Two tenants of one API: their `x-api-key`.
    ApiKey,
    /// Two representations: `Accept` (and `Range`).
    Accept,
}

struct Row {
    name: &'static str,
    script: Vec<Step>,
    then: Step,
    /// No server: the port refuses connections.
    refused: bool,
    calls: Calls,
    deadline: Duration,
    admission: fn() -> Builder,
    policy: fn() -> RetryPolicy,
    /// `close()` the admission once the server has seen a request.
    close: bool,
    /// What every call hears, in call order (reads may end in any order:
    /// then compared as sorted lists).
    kinds: Vec<Kind>,
    attempts: Vec<u32>,
    requests: usize,
    /// The least gap between consecutive requests the server saw.
    gap: Option<Duration>,
    /// Where the MCP gate must answer otherwise, and why: (kinds,
    /// attempts, requests).
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    mcp: Option<(&'static str, Vec<Kind>, Vec<u32>, usize)>,
}

const OK: Step = Step::Answer(200, &[]);

/// Quick and exact: a fixed 50 ms backoff, 3 retries, server waits up to
/// 2 s (the seams' default clamp).
fn quick() -> RetryPolicy {
    RetryPolicy::new(
        Backoff::new(Duration::from_millis(50), Duration::from_millis(50)).jitter(Jitter::None),
    )
    .max_retries(3)
    .clamp(Duration::from_secs(2))
}

fn slow_backoff() -> RetryPolicy {
    RetryPolicy::new(
        Backoff::new(Duration::from_secs(20), Duration::from_secs(20)).jitter(Jitter::None),
    )
    .max_retries(3)
}

fn no_budget() -> RetryPolicy {
    // A retry budget of 0% with no floor: no retry is ever paid for.
    quick().budget(Arc::new(RetryBudget::new(0.0, 0, Duration::from_secs(10))))
}

fn plain() -> Builder {
    Admission::builder()
}

fn breaker() -> Builder {
    Admission::builder().circuit_breaker(
        CircuitBreaker::new()
            .consecutive_failures(1)
            .cool_down(Duration::from_secs(60)),
    )
}

fn row(name: &'static str, script: Vec<Step>, then: Step) -> Row {
    Row {
        name,
        script,
        then,
        refused: false,
        calls: Calls::Reads(1),
        deadline: Duration::from_secs(5),
        admission: plain,
        policy: quick,
        close: false,
        kinds: Vec::new(),
        attempts: Vec::new(),
        requests: 0,
        gap: None,
        mcp: None,
    }
}

fn failed(status: Option<u16>, not_retried: Option<Status>) -> Kind {
    Kind::Failed {
        status,
        not_retried,
    }
}

fn table() -> Vec<Row> {
    let second = Duration::from_secs(1);
    vec![
        Row {
            kinds: vec![Kind::Done(200)],
            attempts: vec![2],
            requests: 2,
            gap: Some(second),
            ..row(
                "429 + Retry-After: 1 is waited out, invisibly",
                vec![Step::Answer(429, &[("retry-after", "1")])],
                OK,
            )
        },
        Row {
            kinds: vec![Kind::Throttled(Status::RateLimited)],
            attempts: vec![1],
            requests: 1,
            ..row(
                "429 past the clamp is rate_limited at once",
                vec![Step::Answer(429, &[("retry-after", "60")])],
                OK,
            )
        },
        Row {
            kinds: vec![Kind::Done(200)],
            attempts: vec![2],
            requests: 2,
            gap: Some(second),
            ..row(
                "a bare 429 waits the one-second hold",
                vec![Step::Answer(429, &[])],
                OK,
            )
        },
        Row {
            kinds: vec![Kind::Done(200)],
            attempts: vec![2],
            requests: 2,
            gap: Some(second),
            ..row(
                "503 + Retry-After: 1 is the server's capacity",
                vec![Step::Answer(503, &[("retry-after", "1")])],
                OK,
            )
        },
        Row {
            kinds: vec![failed(Some(503), None)],
            attempts: vec![4],
            requests: 4,
            ..row(
                "a bare 503 is a fault, retried, and stays one",
                vec![],
                Step::Answer(503, &[]),
            )
        },
        Row {
            kinds: vec![Kind::Done(200)],
            attempts: vec![2],
            requests: 2,
            ..row("500 then 200", vec![Step::Answer(500, &[])], OK)
        },
        Row {
            refused: true,
            kinds: vec![failed(None, None)],
            attempts: vec![4],
            requests: 0,
            ..row(
                "connection refused is a transport failure, never rate_limited",
                vec![],
                OK,
            )
        },
        Row {
            kinds: vec![failed(None, None)],
            attempts: vec![4],
            requests: 4,
            ..row(
                "connection reset is a transport failure",
                vec![],
                Step::Reset,
            )
        },
        Row {
            deadline: second,
            kinds: vec![Kind::Throttled(Status::TimedOut)],
            attempts: vec![1],
            requests: 1,
            ..row(
                "a server that never answers is timed_out at the deadline",
                vec![],
                Step::Silent,
            )
        },
        Row {
            calls: Calls::Reads(5),
            kinds: vec![Kind::Done(200); 5],
            attempts: vec![0, 0, 0, 0, 1],
            requests: 1,
            ..row(
                "five identical reads send one request",
                vec![],
                Step::Slow(200, Duration::from_millis(200)),
            )
        },
        Row {
            calls: Calls::Writes(1),
            kinds: vec![failed(None, None)],
            attempts: vec![1],
            requests: 1,
            ..row(
                "a write whose connection is reset is sent once: it may have run",
                vec![],
                Step::Reset,
            )
        },
        Row {
            calls: Calls::Writes(1),
            kinds: vec![failed(Some(500), None)],
            attempts: vec![1],
            requests: 1,
            ..row(
                "a write answered 500 is sent once: it may have run",
                vec![],
                Step::Answer(500, &[]),
            )
        },
        Row {
            calls: Calls::Writes(1),
            kinds: vec![Kind::Done(200)],
            attempts: vec![2],
            requests: 2,
            gap: Some(second),
            ..row(
                "a write refused 429 is sent again: the server did not run it",
                vec![Step::Answer(429, &[("retry-after", "1")])],
                OK,
            )
        },
        Row {
            calls: Calls::Apart(Differ::Cookie),
            kinds: vec![Kind::Done(200); 2],
            attempts: vec![1, 1],
            requests: 2,
            ..row(
                "two users of one URL, by cookie, send two",
                vec![],
                Step::Slow(200, Duration::from_millis(200)),
            )
        },
        Row {
            calls: Calls::Apart(Differ::ApiKey),
            kinds: vec![Kind::Done(200); 2],
            attempts: vec![1, 1],
            requests: 2,
            ..row(
                "two tenants of one URL, by x-api-key, send two",
                vec![],
                Step::Slow(200, Duration::from_millis(200)),
            )
        },
        Row {
            calls: Calls::Apart(Differ::Accept),
            kinds: vec![Kind::Done(200); 2],
            attempts: vec![1, 1],
            requests: 2,
            ..row(
                "one URL asked in two representations (Accept, Range) sends two",
                vec![],
                Step::Slow(200, Duration::from_millis(200)),
            )
        },
        Row {
            calls: Calls::Follower(Duration::from_millis(500)),
            kinds: vec![Kind::Done(200), Kind::Throttled(Status::TimedOut)],
            attempts: vec![1, 0],
            requests: 1,
            ..row(
                "a follower with a shorter deadline hears back by its own",
                vec![],
                Step::Slow(200, Duration::from_secs(2)),
            )
        },
        Row {
            deadline: Duration::from_millis(500),
            calls: Calls::Follower(Duration::from_secs(5)),
            kinds: vec![Kind::Throttled(Status::TimedOut), Kind::Done(200)],
            attempts: vec![1, 1],
            requests: 2,
            mcp: Some((
                "an MCP read's request runs on for the caller that joined it, and is \
                 cancelled only when none waits (issue #61): the follower takes its answer",
                vec![Kind::Throttled(Status::TimedOut), Kind::Done(200)],
                vec![1, 0],
                1,
            )),
            ..row(
                "a leader's timeout is not its follower's: the follower sends its own",
                vec![],
                Step::Slow(200, Duration::from_secs(1)),
            )
        },
        Row {
            calls: Calls::Writes(2),
            kinds: vec![Kind::Done(200); 2],
            attempts: vec![1, 1],
            requests: 2,
            ..row(
                "two identical writes send two",
                vec![],
                Step::Slow(200, Duration::from_millis(200)),
            )
        },
        Row {
            deadline: Duration::ZERO,
            kinds: vec![Kind::Throttled(Status::TimedOut)],
            attempts: vec![0],
            requests: 0,
            ..row("deadline 0 sends nothing", vec![], OK)
        },
        Row {
            policy: slow_backoff,
            deadline: Duration::from_secs(60),
            close: true,
            kinds: vec![failed(Some(500), Some(Status::Closed))],
            attempts: vec![1],
            requests: 1,
            ..row(
                "close() cuts a backoff short; the fault stands",
                vec![],
                Step::Answer(500, &[]),
            )
        },
        Row {
            admission: breaker,
            calls: Calls::InTurn(2),
            kinds: vec![
                failed(Some(500), Some(Status::Unavailable)),
                Kind::Throttled(Status::Unavailable),
            ],
            attempts: vec![1, 0],
            requests: 1,
            ..row(
                "an open breaker refuses the retry and the next call",
                vec![],
                Step::Answer(500, &[]),
            )
        },
        Row {
            policy: no_budget,
            kinds: vec![failed(Some(503), None)],
            attempts: vec![1],
            requests: 1,
            ..row(
                "a spent retry budget sends no retry",
                vec![],
                Step::Answer(503, &[]),
            )
        },
    ]
}

/// The requests of a row: (method, write).
fn requests(calls: Calls) -> (Vec<http::Method>, bool) {
    match calls {
        Calls::Reads(n) => (vec![http::Method::GET; n], false),
        Calls::Writes(n) => (vec![http::Method::POST; n], false),
        Calls::InTurn(n) => (vec![http::Method::GET; n], true),
        Calls::Apart(_) | Calls::Follower(_) => (vec![http::Method::GET; 2], false),
    }
}

/// A call's deadline, its headers beyond the credential's, and (on MCP)
/// its credential and arguments.
type Shape = (
    Duration,
    Vec<(&'static str, &'static str)>,
    Option<&'static str>,
    Option<&'static str>,
);

/// The `i`th call's deadline, its headers beyond the credential's, and (on
/// MCP) its credential and arguments.
fn call_shape(row: &Row, i: usize) -> Shape {
    let ab = |a, b| if i == 0 { a } else { b };
    match row.calls {
        Calls::Apart(Differ::Cookie) => (
            row.deadline,
            vec![("cookie", ab("session=alice", "session=bob"))],
            Some(ab("alice", "bob")),
            None,
        ),
        Calls::Apart(Differ::ApiKey) => (
            row.deadline,
            vec![("x-api-key", ab("tenant-a", "tenant-b"))],
            Some(ab("tenant-a", "tenant-b")),
            None,
        ),
        Calls::Apart(Differ::Accept) => (
            row.deadline,
            vec![
                ("accept", ab("text/csv", "application/json")),
                ("range", ab("bytes=0-9", "bytes=10-19")),
            ],
            None,
            Some(ab("csv", "json")),
        ),
        Calls::Follower(second) => (
            if i == 0 { row.deadline } else { second },
            vec![],
            None,
            None,
        ),
        _ => (row.deadline, vec![], None, None),
    }
}

/// A follower starts after its leader is in flight.
async fn stagger(row: &Row, i: usize) {
    if matches!(row.calls, Calls::Follower(_)) && i > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `calls` concurrently (or in turn) and times each from its start.
async fn timed<F, Fut>(n: usize, in_turn: bool, call: F) -> Vec<Heard>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = (Heard, Instant)>,
{
    let _ = n;
    if in_turn {
        let mut out = Vec::new();
        for i in 0..n {
            out.push(call(i).await.0);
        }
        out
    } else {
        futures::future::join_all((0..n).map(call))
            .await
            .into_iter()
            .map(|(h, _)| h)
            .collect()
    }
}

async fn through(seam: Seam, row: &Row, server: &Server, admission: Admission) -> Vec<Heard> {
    let (methods, in_turn) = requests(row.calls);
    let n = methods.len();
    #[cfg(feature = "mcp")]
    if let Server::Mcp(mcp) = server {
        // A GET is a call to a read tool, a POST to a write tool.
        let gate = McpGate::new(admission, "conformance", mcp.peer())
            .credential("key-a")
            .retry_policy((row.policy)())
            .read("read_item");
        let gate = &gate;
        return timed(n, in_turn, |i| {
            let tool = match methods[i] {
                http::Method::GET => "read_item",
                _ => "write_item",
            };
            let (deadline, _, credential, argument) = call_shape(row, i);
            let mut params = CallToolRequestParams::new(tool);
            if let Some(a) = argument {
                let args = serde_json::json!({ "format": a });
                params = params.with_arguments(args.as_object().unwrap().clone());
            }
            async move {
                stagger(row, i).await;
                let start = Instant::now();
                let mut spec = gate.spec(&params).deadline(deadline);
                if let Some(c) = credential {
                    spec.credential = c.to_string();
                }
                let r = gate.call(spec, params).await;
                (
                    Heard::of(r, |_| 200, start.elapsed()).within(deadline),
                    start,
                )
            }
        })
        .await;
    }
    let url = server.http().url("/item");
    let plain = reqwest::Client::new();
    match seam {
        Seam::Runner => {
            let runner: Runner<http::Response<Vec<u8>>, reqwest_middleware::Error> =
                Runner::new(admission, Duration::ZERO).retry_policy((row.policy)());
            let client = ClientWithMiddleware::from(plain);
            let runner = &runner;
            timed(n, in_turn, |i| {
                let method = methods[i].clone();
                let (deadline, headers, _, _) = call_shape(row, i);
                let mut spec = CallSpec::new("item", "key-a").deadline(deadline);
                if method == http::Method::POST {
                    spec = spec.write();
                }
                let mut request = client.request(method, &url).body("{}");
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let call = Call::request(spec, request);
                async move {
                    stagger(row, i).await;
                    let start = Instant::now();
                    let r = runner.one(call).await;
                    (
                        Heard::of(r, |v| v.status().as_u16(), start.elapsed()).within(deadline),
                        start,
                    )
                }
            })
            .await
        }
        Seam::Middleware => {
            let client = middleware(admission, (row.policy)());
            timed(n, in_turn, |i| {
                let (deadline, headers, _, _) = call_shape(row, i);
                let mut request = client
                    .request(methods[i].clone(), &url)
                    .header("authorization", "Bearer key-a")
                    .with_extension(RequestDeadline(deadline))
                    .body("{}");
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                async move {
                    stagger(row, i).await;
                    let start = Instant::now();
                    let r = AdmissionMiddleware::call_result(request).await;
                    (
                        Heard::of(r, |v| v.status().as_u16(), start.elapsed()).within(deadline),
                        start,
                    )
                }
            })
            .await
        }
        Seam::Tower => {
            let svc = tower_stack(admission, (row.policy)(), HttpClient(plain));
            timed(n, in_turn, |i| {
                let (deadline, headers, _, _) = call_shape(row, i);
                let mut request = http::Request::builder()
                    .method(methods[i].clone())
                    .uri(&url)
                    .header("authorization", "Bearer key-a");
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let request = request
                    .extension(RequestDeadline(deadline))
                    .body("{}".to_string())
                    .unwrap();
                let svc = svc.clone();
                async move {
                    stagger(row, i).await;
                    let start = Instant::now();
                    let r = CallResult::from_tower(svc.oneshot(request).await);
                    (
                        Heard::of(r, |v| v.status().as_u16(), start.elapsed()).within(deadline),
                        start,
                    )
                }
            })
            .await
        }
        #[cfg(feature = "mcp")]
        Seam::Mcp => unreachable!("the MCP seam runs on its own server"),
    }
}

// README: seams begin
/// The reqwest middleware: every request through the client is admitted,
/// retried within its deadline and answered as `Runner` answers.
fn middleware(admission: Admission, policy: RetryPolicy) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(AdmissionMiddleware::new(admission).retry_policy(policy))
        .build()
}

/// The tower stack over any `http` service: the same loop, the same answers.
fn tower_stack<S>(
    admission: Admission,
    policy: RetryPolicy,
    http: S,
) -> impl Service<Req, Response = Resp, Error = BoxError, Future: Send> + Clone
where
    S: Service<Req, Response = Resp, Error = BoxError, Future: Send> + Clone + Send + 'static,
{
    AdmissionLayer::http(admission, |req: &Req| {
        // The credential names quotas and may be logged: a hash of the key.
        let key = req.headers().get("authorization").map(|v| v.as_bytes());
        let credential = AdmissionMiddleware::credential_of(key.unwrap_or_default());
        CallSpec::new(req.uri().path(), credential)
    })
    .retry_policy(policy)
    .coalesce_reads() // identical GETs in flight share one request
    .layer(http)
}
// README: seams end

type Req = http::Request<String>;
type Resp = http::Response<Vec<u8>>;

/// The README shows the seams exactly as the table runs them.
#[test]
fn the_readme_shows_the_seams_the_table_runs() {
    let source = include_str!("conformance.rs");
    let begin = source.find("// README: seams begin\n").unwrap() + "// README: seams begin\n".len();
    let end = source.find("// README: seams end").unwrap();
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains(&source[begin..end]),
        "README.md lacks:\n{}",
        &source[begin..end]
    );
}

/// reqwest as a tower service over `http` types.
#[derive(Clone)]
struct HttpClient(reqwest::Client);

impl Service<http::Request<String>> for HttpClient {
    type Response = http::Response<Vec<u8>>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<String>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move {
            let request = reqwest::Request::try_from(req)?;
            let response = client.execute(request).await?;
            let mut out = http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                out = out.header(name, value);
            }
            Ok(out.body(response.bytes().await?.to_vec())?)
        })
    }
}

async fn check(seam: Seam, row: &Row) -> Vec<String> {
    let mut failures = Vec::new();
    let server = Server::start(seam, row).await;
    let admission = (row.admission)().build();
    let closer = row.close.then(|| {
        let (admission, seen) = (admission.clone(), server_seen(&server));
        tokio::spawn(async move {
            while seen().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The request is answered and its backoff (20 s) begun.
            tokio::time::sleep(Duration::from_millis(200)).await;
            admission.close();
        })
    });
    let started = Instant::now();
    let mut heard = through(seam, row, &server, admission).await;
    if let Some(closer) = closer {
        closer.await.unwrap();
    }
    let what = format!("{seam:?}: {}", row.name);
    let seen = server.seen();
    #[cfg(feature = "mcp")]
    let row = &match (&row.mcp, seam) {
        (Some((_why, kinds, attempts, requests)), Seam::Mcp) => Row {
            kinds: kinds.clone(),
            attempts: attempts.clone(),
            requests: *requests,
            script: row.script.clone(),
            then: row.then.clone(),
            mcp: None,
            ..*row
        },
        _ => Row {
            kinds: row.kinds.clone(),
            attempts: row.attempts.clone(),
            script: row.script.clone(),
            then: row.then.clone(),
            mcp: None,
            ..*row
        },
    };
    if matches!(row.calls, Calls::Writes(_)) && seen.iter().any(|s| s.method != "POST") {
        failures.push(format!("{what}: not every request was a POST: {seen:?}"));
    }
    if seen.len() != row.requests {
        failures.push(format!(
            "{what}: the server saw {} requests, not {}",
            seen.len(),
            row.requests
        ));
    }
    let mut kinds: Vec<Kind> = heard.iter().map(|h| h.kind.clone()).collect();
    let mut attempts: Vec<u32> = heard.iter().map(|h| h.attempts).collect();
    let (mut want_kinds, mut want_attempts) = (row.kinds.clone(), row.attempts.clone());
    if matches!(
        row.calls,
        Calls::Reads(_) | Calls::Writes(_) | Calls::Apart(_)
    ) {
        for v in [&mut kinds, &mut want_kinds] {
            v.sort_by_key(|k| format!("{k:?}"));
        }
        attempts.sort();
        want_attempts.sort();
    }
    if kinds != want_kinds {
        failures.push(format!("{what}: heard {kinds:?}, not {want_kinds:?}"));
    }
    if attempts != want_attempts {
        failures.push(format!(
            "{what}: attempts {attempts:?}, not {want_attempts:?}"
        ));
    }
    // The server's record against the deadline: nothing starts after it.
    let latest = heard
        .iter()
        .map(|h| h.deadline)
        .max()
        .unwrap_or(row.deadline);
    for s in &seen {
        if s.at.duration_since(started) > latest + Duration::from_millis(50) {
            failures.push(format!("{what}: a request started after the deadline"));
        }
    }
    if let Some(gap) = row.gap {
        for pair in seen.windows(2) {
            let between = pair[1].at.duration_since(pair[0].at);
            if between < gap - Duration::from_millis(5) {
                failures.push(format!("{what}: {between:?} between requests"));
            }
        }
    }
    // (Follower rows keep call order: leader, then follower.)
    if !matches!(row.calls, Calls::Follower(_)) {
        heard.sort_by_key(|h| h.after);
    }
    for h in &heard {
        match &h.kind {
            // Heard back no earlier than the deadline: the request was
            // given all of it.
            Kind::Throttled(Status::TimedOut) if !h.deadline.is_zero() && h.after < h.deadline => {
                failures.push(format!("{what}: timed out after {:?}", h.after))
            }
            // A server wait past the clamp: the server's whole wait is told.
            Kind::Throttled(Status::RateLimited)
                if h.retry_after != Some(Duration::from_secs(60)) =>
            {
                failures.push(format!("{what}: told {:?}", h.retry_after))
            }
            // Any other answer comes before the deadline: no seam holds a
            // caller past it (tower answered a closed port at 3.1 s of a
            // 2 s deadline before the one loop).
            Kind::Throttled(Status::TimedOut) => {}
            _ if h.after >= h.deadline => failures.push(format!(
                "{what}: heard back at {:?}, past its deadline",
                h.after
            )),
            _ => {}
        }
    }
    failures
}

fn server_seen(server: &Server) -> impl Fn() -> Vec<crate::scripted_server::Seen> + Send + 'static {
    let seen = server.seen_handle();
    move || seen.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_seam_answers_every_scenario_alike() {
    let mut failures = Vec::new();
    for row in table() {
        for &seam in SEAMS {
            failures.extend(check(seam, &row).await);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
