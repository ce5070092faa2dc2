//! Issue #45, "done when": async-openai 0.43 on the crate's reqwest
//! middleware, installed as its HTTP service (`with_http_service`, so its
//! own retry is not in the stack and every attempt is the layer's), one
//! `Admission` told only the provider, three turns of 12 parallel
//! completions (8 distinct prompts: 4 asked twice) against the loopback
//! OpenAI counting a rolling second (3 requests and 2,000 tokens).
//!
//! What must hold, from the server's record and what async-openai returns:
//! * duplicates are sent once: one 200 per distinct prompt a turn;
//! * the server saw exactly the attempts the layer admitted;
//! * no tokens-429 after the first turn, and all 12 complete each turn;
//! * a caller with a deadline too short to wait gets a structured refusal
//!   (`OpenAIError::Boxed` holding the `Throttled`), nothing sent, and
//!   calls refused together are told different instants.
//!
//! The recipe between the `README` markers is the README's async-openai
//! section, checked line for line by `the_readme_shows_this_recipe`.
//!
//! Run with `cd llm-clients && cargo test` (`.ci/run` does).

#[allow(dead_code)] // each test uses a part of the loopback provider
mod server;

use std::collections::HashMap;
use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_openai::types::chat::{ChatCompletionRequestUserMessage, CreateChatCompletionRequest};
use async_openai::Client;
use backpressure::admission::{Admission, Provider};
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::{Status, Throttled};
use futures::future::join_all;
use server::{prompt, Enforce, Flavor, Limits, Refused, Server};

const CALLS: usize = 12;

fn request(i: usize) -> CreateChatCompletionRequest {
    CreateChatCompletionRequest {
        model: "gpt-test".into(),
        messages: vec![ChatCompletionRequestUserMessage::from(prompt(i % 8)).into()],
        max_completion_tokens: Some(105),
        ..Default::default()
    }
}

// README: async-openai begin
fn client(admission: &Admission, base: &str, deadline: Duration) -> Client<OpenAIConfig> {
    let middleware = AdmissionMiddleware::new(admission.clone())
        .deadline(deadline)
        .cost_from(|req| {
            let bytes = req.body().and_then(|b| b.as_bytes()).map_or(0, |b| b.len());
            vec![("tokens".into(), bytes as u32 / 4 + 105)] // prompt + max tokens
        })
        .usage_from_body(Provider::usage_in_body)
        .reads_when(|req| req.url().path().ends_with("/chat/completions"));
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new());
    let http = http.with(middleware).build();
    // async-openai's own retry is not in this stack: every attempt is the layer's.
    let service = tower::service_fn(move |factory: HttpRequestFactory| {
        let http = http.clone();
        async move {
            let request = factory.build().await?;
            http.execute(request)
                .await
                .map_err(AdmissionMiddleware::boxed_error)
        }
    });
    let config = OpenAIConfig::new().with_api_base(base);
    Client::with_config(config.with_api_key("key-a")).with_http_service(service)
}
// A refusal: `OpenAIError::Boxed(e)` with `e.downcast_ref::<Throttled>()`.
// README: async-openai end

/// Completion `i` of a turn.
async fn complete(
    openai: &Client<OpenAIConfig>,
    i: usize,
) -> Result<async_openai::types::chat::CreateChatCompletionResponse, OpenAIError> {
    openai.chat().create(request(i)).await
}

/// The refusal a caller gets, if the call was refused.
fn refusal(e: &OpenAIError) -> Option<&Throttled> {
    match e {
        OpenAIError::Boxed(e) => e.downcast_ref::<Throttled>(),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_openai_three_turns_keep_the_contract() {
    // A model takes its time: the 4 duplicates are in flight with their
    // first ask however late the runtime polls them (an instant reply let
    // a duplicate polled late under load find its read already done).
    let limits = Limits {
        latency: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = Server::start_with(Flavor::OpenAi, Enforce::Window, limits).await;
    let admission = Admission::builder()
        .provider(Provider::OpenAi)
        .inline_wait(Duration::from_secs(10))
        .build();
    let openai = client(&admission, &server.base_url(), Duration::from_secs(30));
    for turn in 1..=3 {
        let (before, admitted) = (server.log().len(), admission.stats().admitted);
        let results = join_all((0..CALLS).map(|i| complete(&openai, i))).await;
        let seen = server.log().split_off(before);
        let sent = admission.stats().admitted - admitted;
        let tokens_429 = seen
            .iter()
            .filter(|s| s.refused == Some(Refused::Tokens))
            .count();
        let mut served: HashMap<&str, usize> = HashMap::new();
        for s in seen.iter().filter(|s| s.refused.is_none()) {
            *served.entry(&s.body).or_default() += 1;
        }
        let done = results.iter().filter(|r| r.is_ok()).count();
        let t0 = seen.first().map(|s| s.start);
        let order: Vec<String> = seen
            .iter()
            .map(|s| {
                let id = s
                    .body
                    .find("prompt ")
                    .map_or("?", |i| &s.body[i + 7..i + 8]);
                let ms = s.start.duration_since(t0.unwrap()).as_millis();
                format!("{ms}:{id}{}", if s.refused.is_some() { "x" } else { "" })
            })
            .collect();
        println!("turn {turn}: {order:?}");
        println!(
            "turn {turn}: {} requests ({sent} admitted), {tokens_429} tokens-429s, \
             {} distinct prompts served, {done} done",
            seen.len(),
            served.len()
        );
        for r in &results {
            if let Err(e) = r {
                panic!("turn {turn}: {e:?}");
            }
        }
        assert_eq!(done, CALLS, "turn {turn}: every call completes");
        assert_eq!(
            seen.len() as u64,
            sent,
            "turn {turn}: requests are the admitted attempts"
        );
        assert_eq!(served.len(), 8, "turn {turn}: 8 distinct prompts");
        assert!(
            served.values().all(|&n| n == 1),
            "turn {turn}: a prompt sent twice"
        );
        if turn > 1 {
            assert_eq!(tokens_429, 0, "turn {turn}: a tokens 429");
        }
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    assert!(
        !admission.stats().provider_silent,
        "the provider's headers reached the layer"
    );
    // Learned from the replies' headers: 180 requests a minute is 3 a
    // second (not a rate climbing past the server's), and the tokens
    // quota is the server's, no longer unlimited.
    // (The layer names the key by a hash of its `authorization` header.)
    let key = admission.stats().credentials[0].credential.clone();
    let rate = admission.learned_rate(&key).expect("a learned rate");
    assert!((rate - 3.0).abs() < 1e-9, "learned {rate}/s");
    let tokens = admission.available(&key, "tokens");
    assert!(tokens.is_some_and(|t| t < u32::MAX), "tokens {tokens:?}");

    // An impatient caller on the same layer and key: the calls that cannot
    // go within 300 ms are refused before sending, each told its instant.
    // (A server that answers at once, so a call sent is a call done.)
    let server = Server::start(Flavor::OpenAi, Enforce::Window).await;
    let impatient = client(&admission, &server.base_url(), Duration::from_millis(300));
    let results = join_all((0..CALLS).map(|i| complete(&impatient, i))).await;
    let sent = server.log().len();
    let done = results.iter().filter(|r| r.is_ok()).count();
    let mut told: Vec<u64> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|e| {
            let t = refusal(e).unwrap_or_else(|| panic!("not a refusal: {e:?}"));
            assert_eq!(t.status, Status::RateLimited, "{t}");
            assert_eq!(t.attempts, 0, "{t}");
            t.retry_after_ms.expect("a wait")
        })
        .collect();
    println!("impatient: {sent} sent, {done} done, told {told:?} ms");
    assert!(!told.is_empty(), "12 calls at once fit a 300 ms wait");
    assert!(sent <= done, "a refused call reached the server");
    told.sort_unstable();
    told.dedup();
    assert!(
        told.len() > 1,
        "calls refused together were told one instant"
    );
}

/// The README's async-openai recipe is this file's, line for line.
#[test]
fn the_readme_shows_this_recipe() {
    let readme = include_str!("../../README.md");
    let this = include_str!("async_openai.rs");
    let recipe = server::block(
        this,
        "// README: async-openai begin",
        "// README: async-openai end",
    );
    let shown = server::block(
        readme,
        "```rust,ignore\n// async-openai 0.43, tower 0.5 and reqwest-middleware 0.5\n",
        "```",
    );
    assert_eq!(
        shown, recipe,
        "README.md's async-openai section drifted from this test"
    );
}
