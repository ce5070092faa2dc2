//! A loopback LLM API: OpenAI's chat completions or Anthropic's messages,
//! limited per API key like the providers are (a per-minute limit on
//! requests and on tokens, enforced in one-second slices: a bucket of a
//! second's worth refilling continuously, or a rolling second), with the provider's own limit
//! headers on every reply and `retry-after` on a 429. Hand-written on
//! tokio's TCP, one request per connection, so it judges the client
//! without sharing its code.

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
    /// `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`.
    Anthropic,
}

/// Requests a minute per key (3 a second).
pub const RPM: u64 = 180;
/// Tokens a minute per key (2,000 a second).
pub const TPM: u64 = 120_000;

/// Why the server refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Requests,
    Tokens,
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub start: Instant,
    pub tokens: u64,
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
    at: Instant,
    /// `Enforce::Window`: the admitted requests of the last second, as
    /// `(start, tokens)`.
    log: std::collections::VecDeque<(Instant, u64)>,
}

impl Key {
    fn refill(&mut self, now: Instant) {
        let dt = now.duration_since(self.at).as_secs_f64();
        self.requests = (self.requests + dt * per_sec(RPM)).min(per_sec(RPM));
        self.tokens = (self.tokens + dt * per_sec(TPM)).min(per_sec(TPM));
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
        self.requests = per_sec(RPM) - self.log.len() as f64;
        self.tokens = per_sec(TPM) - used as f64;
        // Until enough of the log leaves for one more request of `cost`.
        let (mut n, mut tokens) = (self.log.len() as f64, used as f64);
        for (t, spent) in &self.log {
            if n < per_sec(RPM) && tokens + cost as f64 <= per_sec(TPM) {
                break;
            }
            n -= 1.0;
            tokens -= *spent as f64;
            let leaves = (*t + Duration::from_secs(1)).duration_since(now);
            if n < per_sec(RPM) && tokens + cost as f64 <= per_sec(TPM) {
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

impl Server {
    pub async fn start(flavor: Flavor, enforce: Enforce) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, flavor, enforce, state).await;
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
            Flavor::Anthropic => format!("http://{}", self.addr),
        }
    }

    /// Every request so far, in arrival order.
    pub fn log(&self) -> Vec<Seen> {
        self.state.lock().unwrap().log.clone()
    }
}

async fn serve(
    stream: TcpStream,
    flavor: Flavor,
    enforce: Enforce,
    state: Arc<Mutex<State>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let start = Instant::now();
    let (mut length, mut key) = (0usize, String::new());
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
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    let (input, output) = usage(&body);
    let cost = input + output;

    let (refused, headers) = {
        let mut st = state.lock().unwrap();
        let k = st.keys.entry(key).or_insert(Key {
            requests: per_sec(RPM),
            tokens: per_sec(TPM),
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
        let refused = if k.requests < 1.0 {
            Some(Refused::Requests)
        } else if k.tokens < cost as f64 {
            Some(Refused::Tokens)
        } else {
            k.requests -= 1.0;
            k.tokens -= cost as f64;
            if enforce == Enforce::Window {
                k.log.push_back((start, cost));
            }
            None
        };
        let wait = match (refused, window_wait) {
            (None, _) => 0.0,
            (Some(_), Some(wait)) => wait,
            (Some(Refused::Requests), None) => (1.0 - k.requests) / per_sec(RPM),
            (Some(Refused::Tokens), None) => (cost as f64 - k.tokens) / per_sec(TPM),
        };
        let headers = limit_headers(flavor, k, wait);
        st.log.push(Seen {
            start,
            tokens: cost,
            refused,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        (refused, headers)
    };
    let (status, body) = match (refused, flavor) {
        (None, Flavor::OpenAi) => (
            "200 OK",
            serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-test",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": cost},
            }),
        ),
        (None, Flavor::Anthropic) => (
            "200 OK",
            serde_json::json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": input, "output_tokens": output},
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
                "message": format!("Rate limit reached on {why:?} per minute"),
            }}),
        ),
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
    let mut stream = reader.into_inner();
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}

/// What a request uses: its messages' text at ~4 characters a token, and
/// up to 105 tokens of reply (`max_tokens` caps it).
fn usage(body: &[u8]) -> (u64, u64) {
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
    let output = json["max_tokens"]
        .as_u64()
        .or(json["max_completion_tokens"].as_u64())
        .unwrap_or(105)
        .min(105);
    (chars.div_ceil(4) as u64, output)
}

/// The provider's limit headers for key state `k`; `wait` (seconds) is
/// the `retry-after` of a refusal.
fn limit_headers(flavor: Flavor, k: &Key, wait: f64) -> Vec<(String, String)> {
    // Remaining on the minute's scale, as the providers report it: the
    // limit less what the slice is short of full.
    let left = |limit: u64, level: f64, full: f64| limit - (full - level).ceil().max(0.0) as u64;
    let requests_left = left(RPM, k.requests, per_sec(RPM));
    let tokens_left = left(TPM, k.tokens, per_sec(TPM));
    let requests_reset = (per_sec(RPM) - k.requests) / per_sec(RPM);
    let tokens_reset = (per_sec(TPM) - k.tokens) / per_sec(TPM);
    let mut h: Vec<(String, String)> = match flavor {
        Flavor::OpenAi => vec![
            ("x-ratelimit-limit-requests".into(), RPM.to_string()),
            ("x-ratelimit-limit-tokens".into(), TPM.to_string()),
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
        Flavor::Anthropic => vec![
            ("anthropic-ratelimit-requests-limit".into(), RPM.to_string()),
            (
                "anthropic-ratelimit-requests-remaining".into(),
                requests_left.to_string(),
            ),
            (
                "anthropic-ratelimit-requests-reset".into(),
                rfc3339_in(requests_reset),
            ),
            ("anthropic-ratelimit-tokens-limit".into(), TPM.to_string()),
            (
                "anthropic-ratelimit-tokens-remaining".into(),
                tokens_left.to_string(),
            ),
            (
                "anthropic-ratelimit-tokens-reset".into(),
                rfc3339_in(tokens_reset),
            ),
        ],
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
