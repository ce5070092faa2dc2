//! Issue #25, "done when": rig-core (0.44, its reqwest-middleware
//! transport) with `AdmissionMiddleware` in its client, one `Admission`
//! told only the provider (no quota), three turns of 12 parallel
//! completions (8 distinct prompts, ~805 tokens each) against a loopback
//! server with the provider's per-key RPM and TPM (180 and 120,000 a
//! minute, enforced a second at a time) and its own limit headers.
//!
//! What must hold, from the server's record (request start times and
//! statuses) and from what rig reports:
//! * no 429 for tokens after the first turn, and none at all in turns 2-3;
//! * the third turn completes at least as many calls as the first;
//! * after the first turn, no second of requests holds more than the
//!   server allows in one (3 requests, 2,000 tokens, plus a call's slack);
//! * a refusal reaches rig as the provider's 429 (status, `retry-after`,
//!   the `Throttled` in the body), never as a transport error, and calls
//!   refused together are told different instants.
//!
//! Run with `cd llm-clients && cargo test` (`.ci/run` does).

#[allow(dead_code)] // each test uses a part of the loopback provider
mod server;

use std::time::{Duration, Instant};

use backpressure::admission::{Admission, Provider};
use backpressure::reqwest::AdmissionMiddleware;
use futures::future::join_all;
use rig_core::completion::CompletionRequest;
use rig_core::{ErrorKind, ProviderError};
use server::{estimate, prompt, Enforce, Flavor, Refused, Seen, Server};

/// Calls a turn sends at once.
const CALLS: usize = 12;
/// Tokens a reply may use (the server answers with all of them).
const MAX_TOKENS: u64 = 105;

/// The middleware an agent harness puts in rig's client.
fn middleware(admission: &Admission, credential_header: &str) -> AdmissionMiddleware {
    AdmissionMiddleware::new(admission.clone())
        .credential_header(credential_header)
        .cost_from(estimate)
        .usage_from_body(backpressure::admission::Provider::usage_in_body)
        .refusals_as_responses()
}

/// One rig model of `flavor` through `middleware`, whatever its wire type,
/// as a closure sending prompt `i`.
enum Model {
    OpenAi(Box<rig_core::Model<rig_core::providers::openai::wire::Chat>>),
    Anthropic(Box<rig_core::Model<rig_core::providers::anthropic::Messages>>),
}

impl Model {
    fn new(flavor: Flavor, server: &Server, middleware: AdmissionMiddleware, key: &str) -> Model {
        let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(middleware)
            .build();
        let http = rig_reqwest::ReqwestMiddlewareClient::from(http);
        match flavor {
            Flavor::OpenAi => Model::OpenAi(Box::new(
                rig_core::providers::openai::OpenAIConfig::new(key)
                    .with_base_url(server.base_url())
                    .connect(http)
                    .chat("gpt-test"),
            )),
            Flavor::Anthropic => Model::Anthropic(Box::new(
                rig_core::providers::anthropic::AnthropicConfig::new(key)
                    .with_base_url(server.base_url())
                    .connect(http)
                    .completion("claude-test"),
            )),
            // Gemini states no limits to learn: `providers.rs` drives it.
            Flavor::Gemini => unreachable!("rig.rs drives OpenAI and Anthropic"),
        }
    }

    async fn send(&self, i: usize) -> Result<(), ProviderError> {
        let request = CompletionRequest::new(prompt(i % 8)).max_tokens(MAX_TOKENS);
        match self {
            Model::OpenAi(m) => m.call(request).await.map(drop),
            Model::Anthropic(m) => m.call(request).await.map(drop),
        }
    }

    async fn turn(&self) -> Vec<Result<(), ProviderError>> {
        join_all((0..CALLS).map(|i| self.send(i))).await
    }
}

/// A refusal as rig reports it: the provider's 429 with the wait in its
/// headers and the `Throttled` in its body. Returns the wait told.
fn refusal_wait(e: &ProviderError) -> Duration {
    let report = e.report();
    assert_eq!(report.kind, ErrorKind::ProviderResponse, "{report:?}");
    assert_eq!(
        e.provider_response_status().map(|s| s.as_u16()),
        Some(429),
        "{e}"
    );
    let headers = e.provider_response_headers().expect("the reply's headers");
    let ms: u64 = headers["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert!(
        headers.contains_key(backpressure::Throttled::REFUSAL_HEADER),
        "{headers:?}"
    );
    let body = e.provider_response_json().unwrap().expect("a JSON body");
    assert_eq!(body["error"]["type"], "rate_limited", "{body}");
    assert_eq!(body["error"]["retry_after_ms"], ms, "{body}");
    assert_eq!(body["error"]["attempts"], 0, "{body}");
    Duration::from_millis(ms)
}

/// Each request's start (ms from the first) and its status, `x` for a 429.
fn starts(seen: &[Seen]) -> Vec<String> {
    let Some(first) = seen.first() else {
        return Vec::new();
    };
    seen.iter()
        .map(|s| {
            let ms = s.start.duration_since(first.start).as_millis();
            if s.refused.is_some() {
                format!("{ms}x")
            } else {
                ms.to_string()
            }
        })
        .collect()
}

/// The most requests, and tokens, that started within any one second.
fn busiest_second(seen: &[Seen]) -> (usize, u64) {
    let sent: Vec<&Seen> = seen.iter().filter(|s| s.refused.is_none()).collect();
    let mut most = (0, 0);
    for (i, first) in sent.iter().enumerate() {
        let window = sent[i..]
            .iter()
            .take_while(|s| s.start.duration_since(first.start) < Duration::from_secs(1));
        let (n, tokens) = window.fold((0, 0), |(n, t), s| (n + 1, t + s.tokens));
        most = (most.0.max(n), most.1.max(tokens));
    }
    most
}

struct Turn {
    at_server: usize,
    tokens_429: usize,
    all_429: usize,
    done: usize,
    refused: usize,
}

async fn three_turns(flavor: Flavor, credential_header: &str) {
    three_turns_against(flavor, credential_header, Enforce::Bucket).await;
}

/// Three turns against a server counting its limits as `enforce` says,
/// then a turn of impatient calls. Turns 2 and 3 must draw no 429 and
/// complete every call: against a rolling window, the first turn's 429
/// (the bucket's burst plus its refill in one second) is learned from
/// (issue #41), and the turns are 2.5 s apart, so each starts from idle.
async fn three_turns_against(flavor: Flavor, credential_header: &str, enforce: Enforce) {
    let server = Server::start(flavor, enforce).await;
    // One process-wide layer, told the provider, no quota; a turn's calls
    // may wait up to 10 s for their turn (the default is 2 s).
    let admission = Admission::builder()
        .provider(match flavor {
            Flavor::OpenAi => Provider::OpenAi,
            Flavor::Anthropic => Provider::Anthropic,
            Flavor::Gemini => Provider::Gemini,
        })
        .inline_wait(Duration::from_secs(10))
        .build();
    let model = Model::new(
        flavor,
        &server,
        middleware(&admission, credential_header),
        "key-a",
    );

    let mut turns = Vec::new();
    for turn in 1..=3 {
        let before = server.log().len();
        let results = model.turn().await;
        let seen = server.log().split_off(before);
        let refused = results.iter().filter_map(|r| r.as_ref().err()).map(|e| {
            refusal_wait(e);
        });
        let t = Turn {
            at_server: seen.len(),
            tokens_429: seen
                .iter()
                .filter(|s| s.refused == Some(Refused::Tokens))
                .count(),
            all_429: seen.iter().filter(|s| s.refused.is_some()).count(),
            done: results.iter().filter(|r| r.is_ok()).count(),
            refused: refused.count(),
        };
        let (requests, tokens) = busiest_second(&seen);
        println!(
            "{flavor:?} {enforce:?} turn {turn}: {} at the server, {} 429s ({} for tokens), {} done, {} refused; \
             busiest second {requests} requests / {tokens} tokens; starts (ms) {:?}",
            t.at_server,
            t.all_429,
            t.tokens_429,
            t.done,
            t.refused,
            starts(&seen)
        );
        if turn > 1 {
            assert_eq!(t.tokens_429, 0, "{flavor:?} turn {turn}: a tokens 429");
            assert_eq!(t.all_429, 0, "{flavor:?} turn {turn}: a 429");
            // The server's second: 3 requests and 2,000 tokens, refilled
            // continuously; a window can hold one more call's worth.
            assert!(
                requests <= 4,
                "{flavor:?} turn {turn}: {requests} in a second"
            );
            assert!(
                tokens <= 2_000 + 2 * 805,
                "{flavor:?} turn {turn}: {tokens} in a second"
            );
        }
        if enforce == Enforce::Window {
            assert_eq!(
                t.done, CALLS,
                "{flavor:?} turn {turn}: every call completes"
            );
        }
        turns.push(t);
        // The model reads the results before its next turn.
        tokio::time::sleep(match enforce {
            Enforce::Bucket => Duration::from_secs(1),
            Enforce::Window => Duration::from_millis(2_500),
        })
        .await;
    }
    if enforce == Enforce::Window {
        let stats = admission.stats();
        let key = &stats.credentials[0];
        println!("{flavor:?} {enforce:?}: windowed {:?}", key.windowed);
        assert!(
            key.windowed.iter().any(|q| q == "tokens"),
            "{flavor:?}: the tokens 429 fitted the quota to a window: {:?}",
            key.windowed
        );
    }
    assert!(
        turns[2].done >= turns[0].done,
        "{flavor:?}: turn 3 completed {} calls, turn 1 {}",
        turns[2].done,
        turns[0].done
    );
    assert_eq!(
        turns[2].done, CALLS,
        "{flavor:?}: the learned limits fit a whole turn"
    );

    // An impatient caller (a 300 ms deadline) on the same layer and key:
    // refused calls come back as the provider's 429, each told its own
    // instant, and nothing refused reaches the server.
    let impatient = AdmissionMiddleware::new(admission.clone())
        .credential_header(credential_header)
        .cost_from(estimate)
        .usage_from_body(backpressure::admission::Provider::usage_in_body)
        .refusals_as_responses()
        .deadline(Duration::from_millis(300));
    let model = Model::new(flavor, &server, impatient, "key-a");
    let before = server.log().len();
    let started = Instant::now();
    let results = model.turn().await;
    let sent = server.log().len() - before;
    let mut waits: Vec<Duration> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(refusal_wait)
        .collect();
    let done = results.iter().filter(|r| r.is_ok()).count();
    println!(
        "{flavor:?} impatient turn: {sent} sent, {done} done, {} refused in {:?}, told {waits:?}",
        waits.len(),
        started.elapsed()
    );
    assert!(!waits.is_empty(), "12 calls at once fit a 300 ms wait");
    assert_eq!(sent, done, "{flavor:?}: a refused call reached the server");
    waits.sort();
    waits.dedup();
    assert!(
        waits.len() > 1,
        "{flavor:?}: calls refused together were told one instant: {waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rig_openai_three_turns_keep_the_contract() {
    three_turns(Flavor::OpenAi, "authorization").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rig_anthropic_three_turns_keep_the_contract() {
    three_turns(Flavor::Anthropic, "x-api-key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rig_openai_learns_a_rolling_window() {
    three_turns_against(Flavor::OpenAi, "authorization", Enforce::Window).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rig_anthropic_learns_a_rolling_window() {
    three_turns_against(Flavor::Anthropic, "x-api-key", Enforce::Window).await;
}

/// The README's rig recipe, line for line (`the_readme_shows_the_rig_recipe`
/// checks it), run for one turn of 12 completions against the loopback
/// OpenAI: all complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_rig_recipe_completes_a_turn() {
    let server = Server::start(Flavor::OpenAi, Enforce::Bucket).await;
    let (api_key, base_url) = ("key-a", server.base_url());
    // README: rig begin
    use backpressure::admission::{Admission, Provider};
    use backpressure::reqwest::AdmissionMiddleware;
    use rig_core::providers::openai::OpenAIConfig;

    // Once per process. A turn's calls may queue 10 s for their turn (default 2 s).
    let admission = Admission::builder()
        .provider(Provider::OpenAi)
        .inline_wait(std::time::Duration::from_secs(10))
        .build();
    let middleware = AdmissionMiddleware::new(admission)
        .credential_header("authorization") // x-api-key for Anthropic
        .refusals_as_responses()
        // An estimate from the request (reserved before it is sent) ...
        .cost_from(|req| {
            let bytes = req.body().and_then(|b| b.as_bytes()).map_or(0, |b| b.len());
            vec![("tokens".into(), bytes as u32 / 4 + 1_000)] // prompt + max_tokens
        })
        // ... settled to the `usage` the reply's body reports (OpenAI or
        // Anthropic; a streamed body is left alone).
        .usage_from_body(backpressure::admission::Provider::usage_in_body);
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new());
    let http = rig_reqwest::ReqwestMiddlewareClient::from(http.with(middleware).build());
    let openai = OpenAIConfig::new(api_key).with_base_url(base_url); // not OpenAI's own
    let model = openai.connect(http).chat("gpt-5.2");
    // A refusal is rig's `ProviderError` for a 429: `provider_response_status()`,
    // `provider_response_headers()["retry-after-ms"]`, the `Throttled` in the body.
    // README: rig end
    let calls = (0..CALLS)
        .map(|i| model.call(CompletionRequest::new(prompt(i % 8)).max_tokens(MAX_TOKENS)));
    let results = join_all(calls).await;
    let done = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(done, CALLS, "{:?}", results.iter().find(|r| r.is_err()));
}

/// The README's rig recipe is the code of the test above.
#[test]
fn the_readme_shows_the_rig_recipe() {
    let readme = include_str!("../../README.md");
    let this = include_str!("rig.rs");
    let recipe = server::block(this, "// README: rig begin", "// README: rig end");
    let shown = server::block(readme, "With rig-core 0.44:\n\n```rust,ignore\n", "```");
    assert_eq!(
        shown, recipe,
        "README.md's rig section drifted from this test"
    );
}
