//! The incident this crate exists for, reproduced on loopback.
//!
//! A real HTTP API (see `server.rs`) allows `--rate` requests and
//! `--tokens` tokens per second per API key, each over a rolling one-second
//! window (an LLM API's RPM and TPM), and answers 429 + Retry-After beyond
//! either. Every answer says how many tokens the request used. A "production sync job" uses the same key at
//! 40 % of the rate. An agent harness runs one model turn of `--turn` tool
//! calls (by default 8: 4 `search_tickets`, 3 `get_usage`, 1
//! `list_customers`, with the duplicates a model really emits), plus the
//! follow-up calls a model makes when it is told "tool failed".
//!
//! The turn runs twice, each against a fresh server:
//!
//! * **naive**: fan out everything at once; retry a 429 after a fixed,
//!   unjittered 200 ms (three times); report failures as a generic error,
//!   which makes the model call again;
//! * **backpressure**: the same calls through `Runner` + `Admission`:
//!   identical reads coalesced, per-tool concurrency, the key's request
//!   quota and its tokens quota (each call reserves its tool's estimate and
//!   is settled with what the server reports it used), the server's limit
//!   headers obeyed, waits up to 2 s kept invisible, longer
//!   ones returned as a structured `rate_limited` the model plans with;
//! * with `--features reqwest`, the same calls again through the reqwest
//!   middleware (`AdmissionMiddleware::call_result`), with the same
//!   admission and retry policy: the one attempt loop behind both, so the
//!   two columns read the same.
//!
//! ```sh
//! cargo run --release --example agent_fanout -- --rate 10 --tokens 4000 --turn 8 --seed 7
//! ```

mod server;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use backpressure::admission::{
    Admission, Call, CallFailure, CallResult, CallSpec, Reply, Runner, SlotPolicy,
};
use backpressure::headers::ServerHint;
use backpressure::retry::{Backoff, RetryPolicy};
use backpressure::Provenance;
use backpressure::Quota;

const KEY: &str = "org-key-1";

/// The harness's runner: string bodies, and the HTTP client's own error
/// (`std::io::Error`) when a request gets no answer.
type Harness = Runner<String, std::io::Error>;

#[derive(Clone, Debug)]
struct ToolCall {
    tool: &'static str,
    args: String,
}

impl ToolCall {
    fn path(&self) -> String {
        format!("/{}?{}", self.tool, self.args)
    }

    /// What the harness reserves before the call: a per-tool estimate on
    /// the high side (the server's real use is settled after the reply).
    /// The call a path names (its tool; the arguments do not matter here).
    #[cfg(feature = "reqwest")]
    fn tool_of(path: &str) -> ToolCall {
        let tool = match path.trim_start_matches('/') {
            "search_tickets" => "search_tickets",
            "get_usage" => "get_usage",
            _ => "list_customers",
        };
        ToolCall {
            tool,
            args: String::new(),
        }
    }

    fn token_estimate(&self) -> u32 {
        match self.tool {
            "search_tickets" => 1_100,
            "get_usage" => 350,
            _ => 750,
        }
    }
}

/// One model turn: `n` calls in the proportions of the incident (4 search,
/// 3 usage, 1 customers per 8), arguments drawn from small pools so a turn
/// repeats itself the way models do.
fn model_turn(n: usize, rng: &mut fastrand::Rng) -> Vec<ToolCall> {
    let queries = ["q=refund", "q=refund", "q=billing", "q=outage"];
    let orgs = ["org=acme", "org=acme", "org=globex"];
    (0..n)
        .map(|i| match i % 8 {
            0..=3 => ToolCall {
                tool: "search_tickets",
                args: queries[rng.usize(..queries.len())].to_string(),
            },
            4..=6 => ToolCall {
                tool: "get_usage",
                args: orgs[rng.usize(..orgs.len())].to_string(),
            },
            _ => ToolCall {
                tool: "list_customers",
                args: "page=1".to_string(),
            },
        })
        .collect()
}

/// What a model does when a tool "failed": it calls it again, and asks for
/// context it thinks it is missing.
fn follow_ups(failed: &[ToolCall]) -> Vec<ToolCall> {
    failed
        .iter()
        .flat_map(|c| {
            [
                c.clone(),
                ToolCall {
                    tool: "list_customers",
                    args: "page=1".to_string(),
                },
            ]
        })
        .collect()
}

#[derive(Debug, Default)]
struct Row {
    requests: usize,
    throttled: usize,
    throttled_tokens: usize,
    tokens: usize,
    surfaced_rate_limited: usize,
    generic_failures: usize,
    coalesced: usize,
    max_in_flight: usize,
    prod_failures: usize,
    prod_requests: usize,
    wall: Duration,
}

impl Row {
    const LABELS: [&'static str; 10] = [
        "HTTP requests sent (harness)",
        "429s received (harness)",
        "  of which for the tokens limit",
        "tokens used at the API (harness)",
        "calls surfaced as rate_limited",
        "calls reported as generic failures",
        "duplicate reads coalesced",
        "max requests in flight at the API",
        "production-job 429s",
        "wall time of the turn",
    ];

    fn cells(&self) -> [String; 10] {
        [
            self.requests.to_string(),
            self.throttled.to_string(),
            self.throttled_tokens.to_string(),
            self.tokens.to_string(),
            self.surfaced_rate_limited.to_string(),
            self.generic_failures.to_string(),
            self.coalesced.to_string(),
            self.max_in_flight.to_string(),
            format!("{}/{}", self.prod_failures, self.prod_requests),
            format!("{:.2} s", self.wall.as_secs_f64()),
        ]
    }
}

/// A fresh API with the production job already running on the key.
struct Stage {
    srv: server::Server,
    stop: Arc<AtomicBool>,
    prod: tokio::task::JoinHandle<()>,
    started: Instant,
}

impl Stage {
    async fn start(rate: u32, tokens: u32) -> Stage {
        let srv = server::start(
            rate as usize,
            tokens as usize,
            Duration::from_secs(1),
            Duration::from_millis(150),
        )
        .await;
        let stop = Arc::new(AtomicBool::new(false));
        let prod = start_prod_job(srv.addr, rate, stop.clone());
        // The job has been running for a while: its requests fill the window.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        Stage {
            srv,
            stop,
            prod,
            started: Instant::now(),
        }
    }

    /// Stops the job and fills in what the server saw.
    async fn finish(self, row: &mut Row) {
        row.wall = self.started.elapsed();
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.prod.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        fill_server_stats(row, &self.srv);
    }
}

/// The production job: steady requests on the same key until told to stop.
fn start_prod_job(
    addr: SocketAddr,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let every = Duration::from_secs_f64(1.0 / (rate as f64 * 0.4).max(0.5));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            tokio::spawn(async move {
                let _ = server::get(addr, "/sync?cursor=next", KEY, "prod").await;
            });
        }
    })
}

async fn naive(rate: u32, tokens: u32, turn: &[ToolCall]) -> Row {
    let stage = Stage::start(rate, tokens).await;
    let addr = stage.srv.addr;
    let mut row = Row::default();
    let mut round = turn.to_vec();
    for _ in 0..2 {
        let tasks: Vec<_> = round
            .iter()
            .cloned()
            .map(|c| {
                tokio::spawn(async move {
                    for _ in 0..4 {
                        match server::get(addr, &c.path(), KEY, "harness").await {
                            Ok(r) if r.status == 200 => return Ok(()),
                            // Fixed 200 ms, no jitter: every caller comes back at once.
                            _ => tokio::time::sleep(Duration::from_millis(200)).await,
                        }
                    }
                    Err(c)
                })
            })
            .collect();
        let mut failed = Vec::new();
        for t in tasks {
            if let Err(c) = t.await.unwrap() {
                failed.push(c);
            }
        }
        row.generic_failures += failed.len();
        if failed.is_empty() {
            break;
        }
        // "tool failed": the model tries again, and asks for more.
        round = follow_ups(&failed);
    }
    stage.finish(&mut row).await;
    row
}

async fn with_backpressure(rate: u32, tokens: u32, turn: &[ToolCall], seed: u64) -> Row {
    let stage = Stage::start(rate, tokens).await;

    let admission = harness_admission(rate, tokens);
    let runner: Harness =
        Runner::new(admission, Duration::from_secs(3)).retry_policy(harness_policy(seed));
    let addr = stage.srv.addr;
    let runner = &runner;
    rounds(stage, turn, |round| {
        let calls = round
            .iter()
            .map(|c| {
                let path = c.path();
                Call::new(
                    CallSpec::new(c.tool, KEY)
                        .cost("tokens", c.token_estimate())
                        .deadline(Duration::from_secs(20)),
                    move || {
                        let path = path.clone();
                        async move {
                            // A transport error stays an `io::Error`: the
                            // runner retries it and hands it back typed.
                            let r = server::get(addr, &path, KEY, "harness").await?;
                            let hint = ServerHint::from_headers(
                                r.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
                                SystemTime::now(),
                            );
                            // What the server counted replaces the estimate.
                            let used = header(&r, "x-usage-tokens").unwrap_or(0);
                            Ok(Reply::new(r.status, r.body)
                                .with_hint(hint)
                                .used("tokens", used))
                        }
                    },
                )
                .coalesce_key(c.args.clone())
            })
            .collect();
        async move { runner.execute(calls).await }
    })
    .await
}

/// The harness's admission: what it knows of the API, the same for every
/// seam it runs through.
fn harness_admission(rate: u32, tokens: u32) -> Admission {
    // The harness knows the API's published rate and the latency it sees;
    // Little's law gives the concurrency that rate can keep busy.
    let cap =
        backpressure::admission::Builder::concurrency_for(rate as f64, Duration::from_millis(150))
            as usize;
    Admission::builder()
        .global_concurrency(cap.max(2))
        .default_tool(cap.max(1), SlotPolicy::Wait)
        .default_quota(
            Quota::per_second(NonZeroU32::new(rate).unwrap())
                .allow_burst(NonZeroU32::new((rate / 2).max(1)).unwrap()),
        )
        // The key's tokens per second, as the API publishes them: every
        // call reserves its estimate, all or nothing with its request. A
        // rolling window of T per second allows at most T in any second,
        // while a GCRA admits `burst + rate x t`: half as burst, half as
        // rate keeps every second within T.
        .resource(
            "tokens",
            Quota::per_second(NonZeroU32::new((tokens / 2).max(1)).unwrap())
                .allow_burst(NonZeroU32::new((tokens / 2).max(1)).unwrap()),
        )
        .expected_latency(Duration::from_millis(150))
        .build()
}

/// The harness's retries, the same for every seam: 3, jittered from
/// 100 ms to 2 s, server waits slept up to 2 s.
fn harness_policy(seed: u64) -> RetryPolicy {
    RetryPolicy::new(Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).seed(seed))
        .max_retries(3)
        .clamp(Duration::from_secs(2))
}

/// Counts a round's results into `row`; the calls the model would see as
/// failed (and call again).
fn tally<V, E: std::fmt::Display>(
    row: &mut Row,
    round: &[ToolCall],
    results: &[CallResult<V, E>],
) -> Vec<ToolCall> {
    let mut failed = Vec::new();
    for (call, result) in round.iter().zip(results) {
        match result {
            CallResult::Done { provenance, .. } if *provenance != Provenance::Leader => {
                row.coalesced += 1
            }
            CallResult::Done { .. } => {}
            // Structured: the model sees `retry_after_ms` and plans
            // with it instead of calling again right away.
            CallResult::Throttled(t) => {
                row.surfaced_rate_limited += 1;
                println!("  surfaced to the model: {}", json(t));
            }
            CallResult::Failed {
                error: CallFailure::Transport(e),
                ..
            } => {
                println!("  {} got no answer: {e}", call.path());
                failed.push(call.clone())
            }
            _ => failed.push(call.clone()),
        }
    }
    row.generic_failures += failed.len();
    failed
}

/// The same turn through the reqwest middleware (feature `reqwest`): the
/// same admission, the same retries, the same answers.
#[cfg(feature = "reqwest")]
async fn through_middleware(rate: u32, tokens: u32, turn: &[ToolCall], seed: u64) -> Row {
    use backpressure::reqwest::AdmissionMiddleware;
    let stage = Stage::start(rate, tokens).await;
    let middleware = AdmissionMiddleware::new(harness_admission(rate, tokens))
        .retry_policy(harness_policy(seed))
        .deadline(Duration::from_secs(20))
        // The tool is the path's first segment, as the runner names it.
        .tool_from(|req| req.url().path().trim_start_matches('/').to_string())
        .credential_from(|_| KEY.to_string())
        .cost_from(|req| {
            let tool = ToolCall::tool_of(req.url().path());
            vec![("tokens".to_string(), tool.token_estimate())]
        })
        // What the server counted replaces the estimate.
        .usage_from(|resp| {
            let used = resp
                .headers()
                .get("x-usage-tokens")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            vec![("tokens".to_string(), used.unwrap_or(0))]
        });
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build();
    let addr = stage.srv.addr;
    let client = &client;
    rounds(stage, turn, |round| {
        let calls = round.iter().map(|c| {
            let url = format!("http://{}{}", addr, c.path());
            AdmissionMiddleware::call_result(
                client
                    .get(url)
                    .bearer_auth(KEY)
                    .header("x-client", "harness"),
            )
        });
        futures::future::join_all(calls)
    })
    .await
}

/// The model's turn, and its follow-ups when a call "failed" (two rounds
/// at most), each round's calls run by `run`; then what the server saw.
async fn rounds<V, E, F, Fut>(stage: Stage, turn: &[ToolCall], mut run: F) -> Row
where
    E: std::fmt::Display,
    F: FnMut(&[ToolCall]) -> Fut,
    Fut: std::future::Future<Output = Vec<CallResult<V, E>>>,
{
    let mut row = Row::default();
    let mut round = turn.to_vec();
    for _ in 0..2 {
        let results = run(&round).await;
        let failed = tally(&mut row, &round, &results);
        if failed.is_empty() {
            break;
        }
        round = follow_ups(&failed);
    }
    stage.finish(&mut row).await;
    row
}

fn json(t: &backpressure::Throttled) -> String {
    format!(
        "{{\"status\":\"{}\",\"scope\":\"{}\",\"retry_after_ms\":{},\"hint\":\"{}\"}}",
        t.status,
        t.scope,
        t.retry_after_ms
            .map_or("null".to_string(), |m| m.to_string()),
        t.hint.replace('"', "'")
    )
}

fn header(r: &server::Response, name: &str) -> Option<u32> {
    let (_, v) = r
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))?;
    std::str::from_utf8(v).ok()?.parse().ok()
}

fn fill_server_stats(row: &mut Row, srv: &server::Server) {
    let h = srv.stats.client("harness");
    let p = srv.stats.client("prod");
    row.requests = h.requests;
    row.throttled = h.throttled;
    row.throttled_tokens = h.throttled_tokens;
    row.tokens = h.tokens;
    row.prod_requests = p.requests;
    row.prod_failures = p.throttled;
    row.max_in_flight = srv.stats.max_in_flight.load(Ordering::SeqCst);
}

fn arg<T: std::str::FromStr>(args: &HashMap<String, String>, name: &str, default: T) -> T {
    match args.get(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("--{name}: cannot parse {v:?}");
            std::process::exit(2)
        }),
    }
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mut args = HashMap::new();
    for pair in raw.chunks(2) {
        match pair {
            [k, v] if k.starts_with("--") => {
                args.insert(k.trim_start_matches("--").to_string(), v.clone());
            }
            _ => {
                eprintln!("usage: agent_fanout [--rate N] [--tokens N] [--turn N] [--seed N]");
                std::process::exit(2);
            }
        }
    }
    let rate: u32 = arg(&args, "rate", 10u32).max(1);
    let tokens: u32 = arg(&args, "tokens", 4_000u32).max(1);
    let turn_size: usize = arg(&args, "turn", 8usize).max(1);
    let seed: u64 = arg(&args, "seed", 7u64);

    let mut rng = fastrand::Rng::with_seed(seed);
    let turn = model_turn(turn_size, &mut rng);
    println!(
        "API: {rate} req/s and {tokens} tokens/s per key (rolling 1 s windows), 150 ms per request; production job on the same key at {:.1} req/s, {} tokens each",
        rate as f64 * 0.4,
        server::tokens_for("/sync?cursor=next"),
    );
    println!(
        "model turn ({} calls): {}",
        turn.len(),
        turn.iter().map(|c| c.path()).collect::<Vec<_>>().join(" ")
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!("\nnaive run ...");
    let naive = rt.block_on(naive(rate, tokens, &turn));
    println!("backpressure run ...");
    let bp = rt.block_on(with_backpressure(rate, tokens, &turn, seed));
    #[cfg(feature = "reqwest")]
    let seams = {
        println!("backpressure run through the reqwest middleware ...");
        vec![
            ("Runner", bp),
            (
                "middleware",
                rt.block_on(through_middleware(rate, tokens, &turn, seed)),
            ),
        ]
    };
    #[cfg(not(feature = "reqwest"))]
    let seams = vec![("backpressure", bp)];

    println!();
    print!("| {:<38} | {:>8} |", "", "naive");
    for (name, _) in &seams {
        print!(" {name:>12} |");
    }
    print!("\n|{:-<40}|{:->10}|", "", "");
    for _ in &seams {
        print!("{:->14}|", "");
    }
    println!();
    let cells: Vec<[String; 10]> = seams.iter().map(|(_, row)| row.cells()).collect();
    for (i, (label, a)) in Row::LABELS.iter().zip(naive.cells()).enumerate() {
        print!("| {label:<38} | {a:>8} |");
        for c in &cells {
            print!(" {:>12} |", c[i]);
        }
        println!();
    }
    #[cfg(not(feature = "reqwest"))]
    println!(
        "\n(with `--features reqwest`, the same turn also runs through the reqwest middleware)"
    );
}
