//! A loopback LLM API: OpenAI's chat completions, Anthropic's messages or
//! Gemini's `generateContent`, limited per API key like the providers are
//! (a per-minute limit on requests and on tokens, enforced in one-second
//! slices: a bucket of a second's worth refilling continuously, or a
//! rolling second). OpenAI and Anthropic send their own limit headers on
//! every reply and `retry-after` on a 429; Gemini sends none, and states a
//! 429's quota and wait in its body, as Google publishes it. Each counts
//! tokens as its provider does ([`Limits`]). Hand-written on tokio's TCP,
//! one request per connection, so it judges the client without sharing
//! its code.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Whose API the server imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `POST /v1/chat/completions`, `authorization: Bearer <key>`,
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
    OpenAi,
    /// `POST /v1/messages`, `x-api-key`,
    /// `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`;
    /// with [`Limits::cache`], `-{requests,input-tokens}-*`.
    Anthropic,
    /// `POST /v1beta/models/{model}:generateContent`, the key in
    /// `x-goog-api-key` or `?key=`; no limit headers: a 429's body names
    /// the quota (`google.rpc.QuotaFailure`) and the wait
    /// (`google.rpc.RetryInfo`). Any other path is a 404.
    Gemini,
}

/// Requests a minute per key (3 a second).
pub const RPM: u64 = 180;
/// Tokens a minute per key (2,000 a second).
pub const TPM: u64 = 120_000;

/// A key's limits, and how its tokens limit counts.
///
/// | flavor | the tokens limit counts | stated as |
/// | --- | --- | --- |
/// | OpenAI | prompt and completion | `x-ratelimit-*-tokens` |
/// | Anthropic | input and output | `anthropic-ratelimit-tokens-*` |
/// | Anthropic with `cache` | uncached input and cache writes, not cache reads nor output (Anthropic's input-tokens-per-minute limit, current models) | `anthropic-ratelimit-input-tokens-*` |
/// | Gemini | the prompt (cached content included), not the output (its input tokens per minute) | nothing: a 429's `QuotaFailure` |
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Requests a minute.
    pub rpm: u64,
    /// Tokens a minute, counted as the table says.
    pub tpm: u64,
    /// Gemini: requests a day. Once the day's are spent, every request is
    /// refused naming the per-day quota (with a short `RetryInfo`, as
    /// Gemini sends it).
    pub rpd: Option<u64>,
    /// Anthropic: how much of each prompt the usage states as cache reads
    /// and as cache writes (the rest is `input_tokens`).
    pub cache: Option<Cache>,
    /// How long a served reply takes (a model's time), after its start is
    /// recorded; a refusal comes at once.
    pub latency: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            rpm: RPM,
            tpm: TPM,
            rpd: None,
            cache: None,
            latency: Duration::ZERO,
        }
    }
}

/// The shares of a prompt read from, and written to, Anthropic's cache.
#[derive(Clone, Copy, Debug)]
pub struct Cache {
    pub read: f64,
    pub write: f64,
}

/// Why the server refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Requests,
    Tokens,
    /// Gemini: the day's requests are spent.
    Daily,
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub start: Instant,
    /// What the request counted against the tokens limit (see [`Limits`]).
    pub tokens: u64,
    /// The API key it came with.
    pub key: String,
    pub refused: Option<Refused>,
    /// The request's body, to tell identical requests apart.
    pub body: String,
}

/// How the server counts a minute's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforce {
    /// A bucket of a second's worth per limit, refilling continuously
    /// (GCRA: up to a second's worth at once, then the rate).
    Bucket,
    /// At most a second's worth in any rolling second (a sliding log, as
    /// many gateways count; issue #41).
    Window,
}

/// A key's two buckets (levels in units; full is a second's worth). Under
/// [`Enforce::Window`] the levels are what the last second's log leaves.
struct Key {
    requests: f64,
    tokens: f64,
    /// Requests a second, tokens a second.
    rps: f64,
    tps: f64,
    /// Requests admitted so far (the day's, for `Limits::rpd`).
    today: u64,
    at: Instant,
    /// `Enforce::Window`: the admitted requests of the last second, as
    /// `(start, tokens)`.
    log: std::collections::VecDeque<(Instant, u64)>,
}

impl Key {
    fn refill(&mut self, now: Instant) {
        let dt = now.duration_since(self.at).as_secs_f64();
        self.requests = (self.requests + dt * self.rps).min(self.rps);
        self.tokens = (self.tokens + dt * self.tps).min(self.tps);
        self.at = now;
    }

    /// `Enforce::Window`: forgets what left the last second, sets the
    /// levels to what is left of it, and returns how long until `cost`
    /// tokens (and a request) would fit.
    fn slide(&mut self, now: Instant, cost: u64) -> f64 {
        while self
            .log
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.log.pop_front();
        }
        let used: u64 = self.log.iter().map(|(_, t)| t).sum();
        self.requests = self.rps - self.log.len() as f64;
        self.tokens = self.tps - used as f64;
        // Until enough of the log leaves for one more request of `cost`.
        let (mut n, mut tokens) = (self.log.len() as f64, used as f64);
        for (t, spent) in &self.log {
            if n < self.rps && tokens + cost as f64 <= self.tps {
                break;
            }
            n -= 1.0;
            tokens -= *spent as f64;
            let leaves = (*t + Duration::from_secs(1)).duration_since(now);
            if n < self.rps && tokens + cost as f64 <= self.tps {
                return leaves.as_secs_f64();
            }
        }
        0.0
    }
}

fn per_sec(per_minute: u64) -> f64 {
    per_minute as f64 / 60.0
}

#[derive(Default)]
struct State {
    keys: HashMap<String, Key>,
    log: Vec<Seen>,
}

pub struct Server {
    pub addr: SocketAddr,
    flavor: Flavor,
    state: Arc<Mutex<State>>,
}

/// What the server is: whose API, how it counts, its limits.
#[derive(Clone, Copy)]
struct Config {
    flavor: Flavor,
    enforce: Enforce,
    limits: Limits,
}

impl Server {
    /// The flavor's server with the default limits ([`RPM`], [`TPM`]).
    pub async fn start(flavor: Flavor, enforce: Enforce) -> Server {
        Server::start_with(flavor, enforce, Limits::default()).await
    }

    pub async fn start_with(flavor: Flavor, enforce: Enforce, limits: Limits) -> Server {
        let config = Config {
            flavor,
            enforce,
            limits,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, config, state).await;
                });
            }
        });
        Server {
            addr,
            flavor,
            state,
        }
    }

    /// The base URL the provider's client is configured with.
    pub fn base_url(&self) -> String {
        match self.flavor {
            Flavor::OpenAi => format!("http://{}/v1", self.addr),
            Flavor::Anthropic | Flavor::Gemini => format!("http://{}", self.addr),
        }
    }

    /// Every request so far, in arrival order.
    pub fn log(&self) -> Vec<Seen> {
        self.state.lock().unwrap().log.clone()
    }
}

async fn serve(stream: TcpStream, config: Config, state: Arc<Mutex<State>>) -> std::io::Result<()> {
    let Config {
        flavor,
        enforce,
        limits,
    } = config;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let start = Instant::now();
    // `POST /v1beta/models/gemini-test:generateContent?key=... HTTP/1.1`
    let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let (mut length, mut key) = (0usize, String::new());
    if flavor == Flavor::Gemini {
        if let Some(k) = query.split('&').find_map(|p| p.strip_prefix("key=")) {
            key = k.to_string();
        }
    }
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
        let Some((name, value)) = line.trim_end().split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().unwrap_or(0),
            "authorization" if flavor == Flavor::OpenAi => {
                key = value.trim_start_matches("Bearer ").to_string()
            }
            "x-api-key" if flavor == Flavor::Anthropic => key = value.to_string(),
            "x-goog-api-key" if flavor == Flavor::Gemini => key = value.to_string(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    let mut stream = reader.into_inner();
    if flavor == Flavor::Gemini
        && !(path.starts_with("/v1beta/models/") && path.ends_with(":generateContent"))
    {
        let out = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        stream.write_all(out.as_bytes()).await?;
        return stream.shutdown().await;
    }
    let used = usage(flavor, &limits, &body);
    let cost = used.metered;

    let (refused, headers, wait) = {
        let mut st = state.lock().unwrap();
        let k = st.keys.entry(key.clone()).or_insert(Key {
            requests: per_sec(limits.rpm),
            tokens: per_sec(limits.tpm),
            rps: per_sec(limits.rpm),
            tps: per_sec(limits.tpm),
            today: 0,
            at: start,
            log: Default::default(),
        });
        let window_wait = match enforce {
            Enforce::Bucket => {
                k.refill(start);
                None
            }
            Enforce::Window => Some(k.slide(start, cost)),
        };
        let refused = if limits.rpd.is_some_and(|day| k.today >= day) {
            Some(Refused::Daily)
        } else if k.requests < 1.0 {
            Some(Refused::Requests)
        } else if k.tokens < cost as f64 {
            Some(Refused::Tokens)
        } else {
            k.requests -= 1.0;
            k.tokens -= cost as f64;
            k.today += 1;
            if enforce == Enforce::Window {
                k.log.push_back((start, cost));
            }
            None
        };
        let wait = match (refused, window_wait) {
            (None, _) => 0.0,
            // Gemini's `RetryInfo` on a spent day: a short delay, as it
            // sends (the quota's name says when it really resets).
            (Some(Refused::Daily), _) => 20.0,
            (Some(_), Some(wait)) => wait,
            (Some(Refused::Requests), None) => (1.0 - k.requests) / k.rps,
            (Some(Refused::Tokens), None) => (cost as f64 - k.tokens) / k.tps,
        };
        let headers = limit_headers(flavor, &limits, k, wait);
        st.log.push(Seen {
            start,
            tokens: cost,
            key,
            refused,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        (refused, headers, wait)
    };
    if refused.is_none() && !limits.latency.is_zero() {
        tokio::time::sleep(limits.latency).await;
    }
    let Usage {
        input,
        output,
        cache_read,
        cache_write,
        ..
    } = used;
    let (status, body) = match (refused, flavor) {
        (None, Flavor::OpenAi) => (
            "200 OK",
            serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-test",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
            }),
        ),
        (None, Flavor::Anthropic) => {
            let usage = match limits.cache {
                None => serde_json::json!({"input_tokens": input, "output_tokens": output}),
                // `input_tokens` is what follows the last cache breakpoint.
                Some(_) => serde_json::json!({
                    "input_tokens": input - cache_read - cache_write,
                    "cache_creation_input_tokens": cache_write,
                    "cache_read_input_tokens": cache_read,
                    "output_tokens": output,
                }),
            };
            (
                "200 OK",
                serde_json::json!({
                    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                    "content": [{"type": "text", "text": "ok"}],
                    "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": usage,
                }),
            )
        }
        (None, Flavor::Gemini) => (
            "200 OK",
            serde_json::json!({
                "candidates": [{
                    "content": {"parts": [{"text": "ok"}], "role": "model"},
                    "finishReason": "STOP", "index": 0,
                }],
                "usageMetadata": {
                    "promptTokenCount": input, "candidatesTokenCount": output,
                    "totalTokenCount": input + output,
                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": input}],
                },
                "modelVersion": "gemini-test", "responseId": "loopback-1",
            }),
        ),
        (Some(why), Flavor::OpenAi) => (
            "429 Too Many Requests",
            serde_json::json!({"error": {
                "message": format!("Rate limit reached on {why:?} per min"),
                "type": if why == Refused::Tokens { "tokens" } else { "requests" },
                "param": null, "code": "rate_limit_exceeded",
            }}),
        ),
        (Some(why), Flavor::Anthropic) => (
            "429 Too Many Requests",
            serde_json::json!({"type": "error", "error": {
                "type": "rate_limit_error",
                "message": match (why, limits.cache) {
                    (Refused::Tokens, Some(_)) => format!(
                        "This request would exceed the rate limit for your organization of {} input tokens per minute.",
                        limits.tpm
                    ),
                    _ => format!("Rate limit reached on {why:?} per minute"),
                },
            }}),
        ),
        (Some(why), Flavor::Gemini) => {
            ("429 Too Many Requests", gemini_refusal(why, &limits, wait))
        }
    };
    let body = body.to_string();
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&body);
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}

/// Gemini's 429 as Google publishes it (the Gemini API's "Rate limits"
/// and error pages, `google.rpc` error details): the quota that ran out
/// in a `QuotaFailure`, and the wait, in whole seconds, in `RetryInfo`.
fn gemini_refusal(why: Refused, limits: &Limits, wait: f64) -> serde_json::Value {
    let (metric, quota_id, value) = match why {
        Refused::Requests => (
            "generativelanguage.googleapis.com/generate_content_requests",
            "GenerateRequestsPerMinutePerProjectPerModel",
            limits.rpm,
        ),
        Refused::Tokens => (
            "generativelanguage.googleapis.com/generate_content_input_token_count",
            "GenerateContentInputTokensPerModelPerMinute",
            limits.tpm,
        ),
        Refused::Daily => (
            "generativelanguage.googleapis.com/generate_content_requests",
            "GenerateRequestsPerDayPerProjectPerModel",
            limits.rpd.unwrap_or(0),
        ),
    };
    let delay = (wait.ceil() as u64).max(1);
    serde_json::json!({"error": {
        "code": 429,
        "message": format!(
            "You exceeded your current quota, please check your plan and billing details. \
             For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. \
             Quota exceeded for metric: {metric}, limit: {value}. Please retry in {delay}s."
        ),
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{
                    "quotaMetric": metric,
                    "quotaId": quota_id,
                    "quotaDimensions": {"location": "global", "model": "gemini-test"},
                    "quotaValue": value.to_string(),
                }],
            },
            {
                "@type": "type.googleapis.com/google.rpc.Help",
                "links": [{
                    "description": "Learn more about Gemini API quotas",
                    "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                }],
            },
            {
                "@type": "type.googleapis.com/google.rpc.RetryInfo",
                "retryDelay": format!("{delay}s"),
            },
        ],
    }})
}

/// What a request uses, in tokens.
#[derive(Clone, Copy, Debug)]
struct Usage {
    /// The whole prompt.
    input: u64,
    output: u64,
    /// Anthropic with `Limits::cache`: the prompt's tokens read from and
    /// written to the cache (part of `input`).
    cache_read: u64,
    cache_write: u64,
    /// What the key's tokens limit counts (see [`Limits`]).
    metered: u64,
}

/// What a request uses: its messages' text at ~4 characters a token, and
/// up to 105 tokens of reply (`max_tokens` caps it).
fn usage(flavor: Flavor, limits: &Limits, body: &[u8]) -> Usage {
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let mut chars = 0;
    let mut count = |v: &serde_json::Value| {
        if let Some(s) = v.as_str() {
            chars += s.len();
        }
    };
    for m in json["messages"].as_array().into_iter().flatten() {
        match &m["content"] {
            serde_json::Value::Array(parts) => parts.iter().for_each(|p| count(&p["text"])),
            other => count(other),
        }
    }
    // Gemini: `contents[].parts[].text` and `systemInstruction.parts[].text`.
    let contents = json["contents"].as_array().into_iter().flatten();
    for c in contents.chain(std::iter::once(&json["systemInstruction"])) {
        c["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .for_each(|p| count(&p["text"]));
    }
    let output = json["max_tokens"]
        .as_u64()
        .or(json["max_completion_tokens"].as_u64())
        .or(json["generationConfig"]["maxOutputTokens"].as_u64())
        .unwrap_or(105)
        .min(105);
    let input = chars.div_ceil(4) as u64;
    let (cache_read, cache_write) = match (flavor, limits.cache) {
        (Flavor::Anthropic, Some(c)) => (
            (input as f64 * c.read).floor() as u64,
            (input as f64 * c.write).floor() as u64,
        ),
        _ => (0, 0),
    };
    let metered = match (flavor, limits.cache) {
        (Flavor::Anthropic, Some(_)) => input - cache_read,
        (Flavor::Gemini, _) => input,
        _ => input + output,
    };
    Usage {
        input,
        output,
        cache_read,
        cache_write,
        metered,
    }
}

/// The provider's limit headers for key state `k`; `wait` (seconds) is
/// the `retry-after` of a refusal. Gemini sends none.
fn limit_headers(flavor: Flavor, limits: &Limits, k: &Key, wait: f64) -> Vec<(String, String)> {
    // Remaining on the minute's scale, as the providers report it: the
    // limit less what the slice is short of full.
    let left = |limit: u64, level: f64, full: f64| limit - (full - level).ceil().max(0.0) as u64;
    let (rpm, tpm) = (limits.rpm, limits.tpm);
    let requests_left = left(rpm, k.requests, k.rps);
    let tokens_left = left(tpm, k.tokens, k.tps);
    let requests_reset = (k.rps - k.requests) / k.rps;
    let tokens_reset = (k.tps - k.tokens) / k.tps;
    let mut h: Vec<(String, String)> = match flavor {
        Flavor::OpenAi => vec![
            ("x-ratelimit-limit-requests".into(), rpm.to_string()),
            ("x-ratelimit-limit-tokens".into(), tpm.to_string()),
            (
                "x-ratelimit-remaining-requests".into(),
                requests_left.to_string(),
            ),
            (
                "x-ratelimit-remaining-tokens".into(),
                tokens_left.to_string(),
            ),
            (
                "x-ratelimit-reset-requests".into(),
                go_duration(requests_reset),
            ),
            ("x-ratelimit-reset-tokens".into(), go_duration(tokens_reset)),
        ],
        Flavor::Anthropic => {
            // With the cache, the tokens limit is Anthropic's input limit.
            let tokens = match limits.cache {
                None => "tokens",
                Some(_) => "input-tokens",
            };
            vec![
                ("anthropic-ratelimit-requests-limit".into(), rpm.to_string()),
                (
                    "anthropic-ratelimit-requests-remaining".into(),
                    requests_left.to_string(),
                ),
                (
                    "anthropic-ratelimit-requests-reset".into(),
                    rfc3339_in(requests_reset),
                ),
                (
                    format!("anthropic-ratelimit-{tokens}-limit"),
                    tpm.to_string(),
                ),
                (
                    format!("anthropic-ratelimit-{tokens}-remaining"),
                    tokens_left.to_string(),
                ),
                (
                    format!("anthropic-ratelimit-{tokens}-reset"),
                    rfc3339_in(tokens_reset),
                ),
            ]
        }
        Flavor::Gemini => return Vec::new(),
    };
    if wait > 0.0 {
        // Whole seconds, rounded up, as both providers send it.
        h.push((
            "retry-after".into(),
            (wait.ceil() as u64).max(1).to_string(),
        ));
    }
    h
}

/// OpenAI's reset form: `207ms`, `1.5s`.
fn go_duration(secs: f64) -> String {
    if secs < 1.0 {
        format!("{}ms", (secs * 1000.0).ceil() as u64)
    } else {
        format!("{:.3}s", secs)
    }
}

/// Anthropic's reset form: the instant `secs` from now, RFC 3339 in UTC,
/// rounded up to the second.
fn rfc3339_in(secs: f64) -> String {
    let at = SystemTime::now() + Duration::from_secs_f64(secs.max(0.0));
    let unix = at.duration_since(UNIX_EPOCH).unwrap();
    let t = unix.as_secs() + u64::from(unix.subsec_nanos() > 0);
    let (days, rem) = ((t / 86_400) as i64, t % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Prompt `i` of 8: 2,800 characters (700 tokens at ~4 a token).
pub fn prompt(i: usize) -> String {
    let head = format!("prompt {i}: summarise the incident report. ");
    let mut p = head.repeat(2_800 / head.len() + 1);
    p.truncate(2_800);
    p
}

/// What a request will cost, from its body: ~4 bytes a token (the JSON
/// around the prompt makes it a slight overestimate) plus the reply's
/// `max_tokens`. The reply's `usage` settles it.
pub fn estimate(req: &reqwest::Request) -> Vec<(String, u32)> {
    let body = req.body().and_then(|b| b.as_bytes()).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let reply = json["max_tokens"]
        .as_u64()
        .or(json["max_completion_tokens"].as_u64())
        .unwrap_or(1_000);
    vec![("tokens".to_string(), (body.len() as u64 / 4 + reply) as u32)]
}

/// The non-empty lines, trimmed, of `text` between `start` and the next
/// `end`: a README code block, or the recipe a test marks as one.
pub fn block(text: &'static str, start: &str, end: &str) -> Vec<&'static str> {
    let from = text.find(start).expect(start) + start.len();
    let to = from + text[from..].find(end).expect(end);
    text[from..to]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}
