//! Issue #63, "done when": providers as they count. rig-core (0.44, its
//! reqwest-middleware transport) with `AdmissionMiddleware` in its client,
//! turns of 12 parallel completions (8 distinct prompts, 700 prompt tokens
//! each) against the loopback provider as Gemini and as Anthropic with
//! cached prompts, the layer given the key's documented limits (as
//! `fleet.rs` gives them; Gemini states none in its replies).
//!
//! What must hold, from the server's record and what rig reports:
//! * Gemini (`generateContent`, the key in `?key=`; 180 requests and
//!   120,000 input tokens a minute, a second at a time; no limit headers,
//!   a 429's body names its quota and wait): no 429 after the first
//!   replies (the first second), and every call of three turns completes;
//! * Gemini with its requests-per-day quota spent by the first turn: in
//!   the next two turns every call ends `quota_exhausted` (the `Throttled`
//!   rig gets as a 429), one request sent for the first call of turn 2
//!   and none for the rest: no call sent twice. A layer meeting the spent
//!   day from idle sends what its quotas let go at once (two calls), each
//!   once, and nothing after;
//! * Anthropic, 90% of each prompt read from the cache and 5% written to
//!   it, its input limit (12,000 tokens a minute, a second at a time)
//!   counting uncached input and cache writes only, as its
//!   `anthropic-ratelimit-input-tokens-*` headers state it: every call
//!   completes, no 429 after the first replies, and in each turn the
//!   calls use at least 85% of the key's uncached input rate (measured as
//!   `fleet.rs` measures token use).
//!
//! The same Anthropic turns told only the provider (the limits learned
//! from the first reply) are ignored: not held yet (see the test).
//!
//! Run with `cd llm-clients && cargo test --test providers` (`.ci/run`
//! does); about 25 s.

#[allow(dead_code)] // each test uses a part of the loopback provider
mod server;

use std::time::{Duration, Instant};

use backpressure::admission::{Admission, Provider};
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::Quota;
use futures::future::join_all;
use rig_core::completion::CompletionRequest;
use rig_core::ProviderError;
use server::{prompt, Cache, Enforce, Flavor, Limits, Refused, Seen, Server};

/// Calls a turn sends at once.
const CALLS: usize = 12;
/// Tokens a reply may use.
const MAX_TOKENS: u64 = 105;
/// The first replies: 429s before this far into a run are the price of
/// not knowing the key yet (as in `fleet.rs`).
const FIRST_REPLIES: Duration = Duration::from_secs(1);

/// rig's client, through `middleware`.
fn http(middleware: AdmissionMiddleware) -> rig_reqwest::ReqwestMiddlewareClient {
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build();
    rig_reqwest::ReqwestMiddlewareClient::from(http)
}

/// The request of call `i` of a turn.
fn request(i: usize) -> CompletionRequest {
    CompletionRequest::new(prompt(i % 8)).max_tokens(MAX_TOKENS)
}

/// Each request's start (ms from `t0`) and its refusal: `r` requests,
/// `t` tokens, `d` the day's quota.
fn starts(seen: &[Seen], t0: Instant) -> Vec<String> {
    seen.iter()
        .map(|s| {
            let why = match s.refused {
                Some(Refused::Requests) => "r",
                Some(Refused::Tokens) => "t",
                Some(Refused::Daily) => "d",
                None => "",
            };
            format!("{}{why}", s.start.duration_since(t0).as_millis())
        })
        .collect()
}

/// The metered tokens served from the first request of `seen` to its
/// last served one, and what the key could serve in that time: its
/// second's worth of burst plus its rate (as `fleet.rs` measures it).
fn token_use(seen: &[Seen], per_sec: f64) -> (u64, f64) {
    let served: Vec<&Seen> = seen.iter().filter(|s| s.refused.is_none()).collect();
    let (first, last) = (seen[0].start, served.last().unwrap().start);
    let tokens = served.iter().map(|s| s.tokens).sum();
    (
        tokens,
        per_sec * (1.0 + last.duration_since(first).as_secs_f64()),
    )
}

/// The 429s after the first replies: when each started, from the run's
/// first request.
fn late_429s(seen: &[Seen]) -> Vec<Duration> {
    let Some(first) = seen.first() else {
        return Vec::new();
    };
    seen.iter()
        .map(|s| s.start.duration_since(first.start))
        .zip(seen)
        .filter(|(at, s)| s.refused.is_some() && *at >= FIRST_REPLIES)
        .map(|(at, _)| at)
        .collect()
}

/// The refusal rig reports for a call the layer ended: the synthetic 429
/// carrying the `Throttled`, as JSON.
fn throttled(e: &ProviderError) -> serde_json::Value {
    assert_eq!(
        e.provider_response_status().map(|s| s.as_u16()),
        Some(429),
        "{e}"
    );
    let headers = e.provider_response_headers().expect("the reply's headers");
    assert!(
        headers.contains_key(backpressure::Throttled::REFUSAL_HEADER),
        "not the layer's refusal: {headers:?}"
    );
    let body = e.provider_response_json().unwrap().expect("a JSON body");
    body["error"].clone()
}

// -- Gemini ------------------------------------------------------------------

/// Gemini's credential: the API key, from `x-goog-api-key` or (rig's
/// `generateContent`) the `key` query parameter, hashed.
fn gemini_key(req: &reqwest::Request) -> String {
    let header = req
        .headers()
        .get("x-goog-api-key")
        .map(|v| v.as_bytes().to_vec());
    let query = || {
        let (_, key) = req.url().query_pairs().find(|(name, _)| name == "key")?;
        Some(key.as_bytes().to_vec())
    };
    let key = header.or_else(query).unwrap_or_default();
    AdmissionMiddleware::credential_of(&key)
}

/// A Gemini request's input tokens, estimated from its body (~4 bytes a
/// token; the JSON around the prompt makes it a slight overestimate).
/// Gemini's per-minute token limit counts input only.
fn gemini_estimate(req: &reqwest::Request) -> Vec<(String, u32)> {
    let body = req.body().and_then(|b| b.as_bytes()).unwrap_or_default();
    vec![("input_tokens".to_string(), (body.len() / 4) as u32)]
}

/// One layer told Gemini and the key's published limits (Gemini states
/// none in its replies): 180 requests and 120,000 input tokens a minute,
/// a second's worth of burst each.
fn gemini_admission() -> Admission {
    let per_sec = |per_minute: u64| {
        let per_sec = per_minute as f64 / 60.0;
        Quota::new(per_sec, per_sec as u32).unwrap()
    };
    Admission::builder()
        .provider(Provider::Gemini)
        .default_quota(per_sec(server::RPM))
        .resource("input_tokens", per_sec(server::TPM))
        .inline_wait(Duration::from_secs(10))
        .build()
}

fn gemini_model(
    server: &Server,
    admission: &Admission,
) -> rig_core::Model<rig_core::providers::gemini::completion::GenerateContent> {
    let middleware = AdmissionMiddleware::new(admission.clone())
        .credential_from(gemini_key)
        .cost_from(gemini_estimate)
        .usage_from_body(Provider::usage_in_body)
        .refusals_as_responses();
    rig_core::providers::gemini::GeminiConfig::new("key-a")
        .with_base_url(server.base_url())
        .connect(http(middleware))
        .completion("gemini-test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_three_turns_keep_the_contract() {
    let server = Server::start(Flavor::Gemini, Enforce::Bucket).await;
    let admission = gemini_admission();
    let model = gemini_model(&server, &admission);
    let t0 = Instant::now();
    for turn in 1..=3 {
        let before = server.log().len();
        let started = Instant::now();
        let results = join_all((0..CALLS).map(|i| model.call(request(i)))).await;
        let seen = server.log().split_off(before);
        let done = results.iter().filter(|r| r.is_ok()).count();
        let refused = seen.iter().filter(|s| s.refused.is_some()).count();
        if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
            panic!("Gemini turn {turn}: {e}");
        }
        let (tokens, could) = token_use(&seen, server::TPM as f64 / 60.0);
        println!(
            "Gemini turn {turn}: {} requests, {refused} 429s, {done} done in {:?}; \
             {tokens} input tokens of {could:.0} the key could serve ({:.1}%); starts {:?}",
            seen.len(),
            started.elapsed(),
            100.0 * tokens as f64 / could,
            starts(&seen, t0)
        );
        assert_eq!(done, CALLS, "Gemini turn {turn}: every call completes");
        // The model reads the results before its next turn.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let seen = server.log();
    let late = late_429s(&seen);
    assert!(
        late.is_empty(),
        "Gemini: 429s after the first replies, at {late:?}"
    );
    assert!(
        seen.iter().all(|s| s.key == "key-a"),
        "Gemini: the key came in the query"
    );
}

/// A turn of 12 calls on a spent day: the server's record of it, and
/// each call's refusal (the `Throttled` rig got).
async fn spent_day_turn(
    model: &rig_core::Model<rig_core::providers::gemini::completion::GenerateContent>,
    server: &Server,
    what: &str,
) -> (Vec<Seen>, Vec<serde_json::Value>) {
    let before = server.log().len();
    let started = Instant::now();
    let results = join_all((0..CALLS).map(|i| model.call(request(i)))).await;
    let elapsed = started.elapsed();
    let seen = server.log().split_off(before);
    let done = results.iter().filter(|r| r.is_ok()).count();
    let ended: Vec<serde_json::Value> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(throttled)
        .collect();
    if let Some(t) = ended.iter().find(|t| t["attempts"] == 1) {
        println!("Gemini per-day, {what}: a sent call's refusal: {t}");
    }
    let field = |name: &str| -> Vec<String> {
        ended
            .iter()
            .map(|t| {
                t[name]
                    .as_str()
                    .map_or_else(|| t[name].to_string(), str::to_string)
            })
            .collect()
    };
    println!(
        "Gemini per-day, {what}: {} requests ({:?}), {done} done, {} refused in {elapsed:?}: \
         {:?}, attempts {:?}, told {:?} ms",
        seen.len(),
        seen.iter().map(|s| s.refused).collect::<Vec<_>>(),
        ended.len(),
        field("type"),
        field("attempts"),
        field("retry_after_ms"),
    );
    assert_eq!(done, 0, "{what}: a call completed on a spent day");
    assert!(
        seen.iter().all(|s| s.refused == Some(Refused::Daily)),
        "{what}: {:?}",
        seen.iter().map(|s| s.refused).collect::<Vec<_>>()
    );
    for t in &ended {
        // A spent day, not the 20 s `RetryInfo`: `quota_exhausted`, and
        // the wait told is the layer's capped hold (`max_retry_after`,
        // 5 min: it asks the server again then), the reset (midnight
        // Pacific) named in its message.
        assert_eq!(t["type"], "quota_exhausted", "{what}: {t}");
        let ms = t["retry_after_ms"].as_u64().expect("a wait");
        assert!((20_000..=300_000).contains(&ms), "{what}: told {ms} ms");
        assert!(t["attempts"] == 0 || t["attempts"] == 1, "{what}: {t}");
    }
    // Each request the server saw is one call's only attempt.
    let sent: u64 = ended.iter().map(|t| t["attempts"].as_u64().unwrap()).sum();
    assert_eq!(sent, seen.len() as u64, "{what}: requests and attempts");
    (seen, ended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_per_day_quota_ends_the_run_quota_exhausted_without_a_retry() {
    // The first turn spends the day's 12 requests, its calls paced at the
    // key's per-minute limits; the day runs out under the next turn.
    let limits = Limits {
        rpd: Some(CALLS as u64),
        ..Limits::default()
    };
    let server = Server::start_with(Flavor::Gemini, Enforce::Bucket, limits).await;
    let admission = gemini_admission();
    let model = gemini_model(&server, &admission);
    let before = server.log().len();
    let results = join_all((0..CALLS).map(|i| model.call(request(i)))).await;
    let seen = server.log().split_off(before);
    println!(
        "Gemini per-day, turn 1: {} requests, all served",
        seen.len()
    );
    assert!(results.iter().all(|r| r.is_ok()), "the day covers turn 1");
    assert!(seen.iter().all(|s| s.refused.is_none()), "a 429 in turn 1");
    // Turn 2: the first call is sent and told the day is spent; none is
    // retried, and the other eleven are refused without a request.
    let (seen, _) = spent_day_turn(&model, &server, "turn 2").await;
    assert_eq!(seen.len(), 1, "turn 2: requests sent on a spent day");
    // Turn 3: nothing sent.
    let (seen, _) = spent_day_turn(&model, &server, "turn 3").await;
    assert_eq!(seen.len(), 0, "turn 3: requests sent on a spent day");

    // A layer that meets the spent day from idle: what its quotas let go
    // at once before the first reply (two calls' input tokens) is sent,
    // each call once; nothing after.
    let limits = Limits {
        rpd: Some(0),
        ..Limits::default()
    };
    let server = Server::start_with(Flavor::Gemini, Enforce::Bucket, limits).await;
    let admission = gemini_admission();
    let model = gemini_model(&server, &admission);
    let (seen, _) = spent_day_turn(&model, &server, "from idle").await;
    assert!(
        (1..=2).contains(&seen.len()),
        "from idle: {} requests sent on a spent day",
        seen.len()
    );
}

// -- Anthropic with cached prompts --------------------------------------------

/// The key: 600 requests a minute, so that its input limit binds: 12,000
/// input tokens a minute (200 a second), counting uncached input and
/// cache writes. A call's 700-token prompt is 630 cache reads, 35 cache
/// writes and 35 uncached: 70 counted, so the key serves ~2.9 calls a
/// second (counting the reads, it would serve 0.29).
const CACHED: Limits = Limits {
    rpm: 600,
    tpm: 12_000,
    rpd: None,
    cache: Some(Cache {
        read: 0.9,
        write: 0.05,
    }),
    latency: Duration::ZERO,
};

/// An Anthropic request's cost, estimated as the input limit will count
/// it: a harness that marks its prompt's cached prefix (`cache_control`)
/// estimates the input after the breakpoint, here a tenth of the prompt
/// (~4 bytes a token; the server reads the other 90% from the cache and
/// states 5% of it as written), and `max_tokens` of output. The reply's
/// usage settles it.
///
/// Not the whole prompt: calls that queue are paced at their estimates
/// (an over-estimate comes back only while no call has reserved behind
/// it), and a whole prompt is more than the input limit's burst, a
/// second's worth (BENCHMARKS.md, "Providers as they count").
fn anthropic_estimate(req: &reqwest::Request) -> Vec<(String, u32)> {
    let body = req.body().and_then(|b| b.as_bytes()).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let output = json["max_tokens"].as_u64().unwrap_or(1_000) as u32;
    let input = (body.len() as f64 / 4.0 / 10.0).ceil() as u32;
    vec![
        ("input_tokens".to_string(), input),
        ("output_tokens".to_string(), output),
    ]
}

/// Three turns, a second apart, against the loopback Anthropic with
/// cached prompts ([`CACHED`]): every call completes, no 429 after the
/// first replies, and in each turn the calls use at least 85% of the
/// key's uncached input rate. `told`: the layer is given the key's
/// documented limits (as `fleet.rs` gives them); else only the provider,
/// and it learns them from the first reply's headers.
async fn cached_turns(told: bool) {
    let server = Server::start_with(Flavor::Anthropic, Enforce::Bucket, CACHED).await;
    let mut admission = Admission::builder()
        .provider(Provider::Anthropic)
        .inline_wait(Duration::from_secs(20));
    if told {
        let per_sec = |per_minute: u64| {
            let per_sec = per_minute as f64 / 60.0;
            Quota::new(per_sec, per_sec as u32).unwrap()
        };
        admission = admission
            .default_quota(per_sec(CACHED.rpm))
            .resource("input_tokens", per_sec(CACHED.tpm));
    }
    let admission = admission.build();
    let middleware = AdmissionMiddleware::new(admission.clone())
        .credential_header("x-api-key")
        .cost_from(anthropic_estimate)
        .usage_from_body(Provider::usage_in_body)
        .refusals_as_responses();
    let model = rig_core::providers::anthropic::AnthropicConfig::new("key-a")
        .with_base_url(server.base_url())
        .connect(http(middleware))
        .completion("claude-test");
    let per_sec = CACHED.tpm as f64 / 60.0;
    let t0 = Instant::now();
    let mut shares = Vec::new();
    for turn in 1..=3 {
        let before = server.log().len();
        let started = Instant::now();
        let results = join_all((0..CALLS).map(|i| model.call(request(i)))).await;
        let seen = server.log().split_off(before);
        let done = results.iter().filter(|r| r.is_ok()).count();
        let refused = seen.iter().filter(|s| s.refused.is_some()).count();
        if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
            panic!("Anthropic turn {turn}: {e}");
        }
        let (tokens, could) = token_use(&seen, per_sec);
        println!(
            "Anthropic cached (told {told}) turn {turn}: {} requests, {refused} 429s, {done} done in {:?}; \
             {tokens} uncached input tokens of {could:.0} the key could serve ({:.1}%); starts {:?}",
            seen.len(),
            started.elapsed(),
            100.0 * tokens as f64 / could,
            starts(&seen, t0)
        );
        assert_eq!(done, CALLS, "Anthropic turn {turn}: every call completes");
        shares.push(tokens as f64 / could);
        // The model reads the results before its next turn.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let windowed = admission.stats().credentials[0].windowed.clone();
    println!("Anthropic cached (told {told}): windowed {windowed:?}");
    let late = late_429s(&server.log());
    assert!(
        late.is_empty(),
        "Anthropic: 429s after the first replies, at {late:?}"
    );
    for (turn, share) in shares.iter().enumerate() {
        assert!(
            *share >= 0.85,
            "Anthropic turn {}: {:.1}% of the key's uncached input rate",
            turn + 1,
            100.0 * share
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_with_cache_reads_uses_the_keys_uncached_input_rate() {
    cached_turns(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "not held yet: told only the provider, the first call's tokens are not in the learned input quota, so the first turn draws a 429 (0.3 s in), which fits a rolling window: about 60% of the uncached input rate (BENCHMARKS.md, \"Providers as they count\"); run with --ignored"]
async fn anthropic_with_cache_reads_learned_from_the_headers_uses_the_keys_uncached_input_rate() {
    cached_turns(false).await;
}
