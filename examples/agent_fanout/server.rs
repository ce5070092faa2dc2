//! A real HTTP/1.1 API on loopback, rated per API key with a rolling window
//! on requests *and* on tokens (like an LLM API's RPM and TPM), answering
//! 429 + Retry-After when a key is over either: the downstream of the
//! incident. Each answer reports the tokens the request used
//! (`x-usage-tokens`) and what is left of the key's token window
//! (`x-ratelimit-*-tokens`, OpenAI's names). Hand-written on tokio's TCP so the example builds fast;
//! one request per connection (`Connection: close`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the server saw, per client tag (`X-Client` header).
#[derive(Debug, Default, Clone)]
pub struct ClientStats {
    pub requests: usize,
    /// 429s, for either limit.
    pub throttled: usize,
    /// Of those, 429s for the tokens limit.
    pub throttled_tokens: usize,
    /// Tokens used by the requests that were served.
    pub tokens: usize,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub by_client: Mutex<HashMap<String, ClientStats>>,
}

impl Stats {
    pub fn client(&self, tag: &str) -> ClientStats {
        self.by_client
            .lock()
            .unwrap()
            .get(tag)
            .cloned()
            .unwrap_or_default()
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
}

struct Limiter {
    limit: usize,
    window: Duration,
    accepted: HashMap<String, VecDeque<Instant>>,
}

impl Limiter {
    /// `Ok(remaining)` or `Err(wait until a slot frees)`.
    fn check(&mut self, key: &str, now: Instant) -> Result<usize, Duration> {
        let q = self.accepted.entry(key.to_string()).or_default();
        while q
            .front()
            .is_some_and(|&t| now.duration_since(t) >= self.window)
        {
            q.pop_front();
        }
        if q.len() >= self.limit {
            let oldest = *q.front().expect("limit > 0");
            return Err(self.window - now.duration_since(oldest));
        }
        q.push_back(now);
        Ok(self.limit - q.len())
    }
}

/// The rolling window of tokens used per key.
struct TokenWindow {
    limit: usize,
    window: Duration,
    used: HashMap<String, VecDeque<(Instant, usize)>>,
}

impl TokenWindow {
    /// `Ok(remaining)` after charging `tokens`, or `Err(wait until enough
    /// tokens leave the window)` with nothing charged.
    fn charge(&mut self, key: &str, tokens: usize, now: Instant) -> Result<usize, Duration> {
        let q = self.used.entry(key.to_string()).or_default();
        while q
            .front()
            .is_some_and(|&(t, _)| now.duration_since(t) >= self.window)
        {
            q.pop_front();
        }
        let mut in_window: usize = q.iter().map(|&(_, n)| n).sum();
        if in_window + tokens <= self.limit {
            q.push_back((now, tokens));
            return Ok(self.limit - in_window - tokens);
        }
        // The wait until enough of the oldest usage has left the window.
        for &(t, n) in q.iter() {
            in_window -= n;
            if in_window + tokens <= self.limit {
                return Err(self.window - now.duration_since(t));
            }
        }
        Err(self.window)
    }
}

/// The tokens a request uses: fixed per path (so a repeated read costs the
/// same), in a range per tool.
pub fn tokens_for(path: &str) -> usize {
    let h = path.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let (lo, span) = match path.split('?').next().unwrap_or("") {
        "/search_tickets" => (700, 400),
        "/get_usage" => (200, 150),
        "/list_customers" => (500, 250),
        _ => (150, 1),
    };
    lo + (h % span) as usize
}

/// Starts the API: `limit` requests and `token_limit` tokens per `window`
/// per API key, each request taking `latency` to serve.
pub async fn start(
    limit: usize,
    token_limit: usize,
    window: Duration,
    latency: Duration,
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(Stats::default());
    let limiter = Arc::new(Mutex::new(Limiter {
        limit,
        window,
        accepted: HashMap::new(),
    }));
    let tokens = Arc::new(Mutex::new(TokenWindow {
        limit: token_limit,
        window,
        used: HashMap::new(),
    }));
    let st = stats.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (st, limiter, tokens) = (st.clone(), limiter.clone(), tokens.clone());
            tokio::spawn(async move {
                let _ = serve(stream, &st, &limiter, &tokens, window, latency).await;
            });
        }
    });
    Server { addr, stats }
}

async fn serve(
    stream: TcpStream,
    stats: &Stats,
    limiter: &Mutex<Limiter>,
    tokens: &Mutex<TokenWindow>,
    window: Duration,
    latency: Duration,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (mut key, mut client) = (String::new(), String::from("unknown"));
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "authorization" => key = value.trim_start_matches("Bearer ").to_string(),
                "x-client" => client = value.to_string(),
                _ => {}
            }
        }
    }
    let now = Instant::now();
    let used = tokens_for(&path);
    // The request counts against the request window even when the tokens
    // window then refuses it, as real APIs count it.
    let verdict = limiter
        .lock()
        .unwrap()
        .check(&key, now)
        .map_err(|w| (w, false));
    let verdict = verdict.and_then(|left| {
        let charged = tokens.lock().unwrap().charge(&key, used, now);
        charged
            .map(|tokens_left| (left, tokens_left))
            .map_err(|w| (w, true))
    });
    {
        let mut by = stats.by_client.lock().unwrap();
        let c = by.entry(client).or_default();
        c.requests += 1;
        match verdict {
            Err((_, for_tokens)) => {
                c.throttled += 1;
                c.throttled_tokens += usize::from(for_tokens);
            }
            Ok(_) => c.tokens += used,
        }
    }
    let (limit, token_limit) = (limiter.lock().unwrap().limit, tokens.lock().unwrap().limit);
    let w = window.as_secs().max(1);
    let response = match verdict {
        Err((wait, for_tokens)) => {
            let secs = wait.as_secs_f64().ceil() as u64;
            // A spent tokens window says so by name; the request window
            // answers with its IETF RateLimit fields.
            let which = if for_tokens {
                format!(
                    "x-ratelimit-limit-tokens: {token_limit}\r\nx-ratelimit-remaining-tokens: 0\r\n\
                     x-ratelimit-reset-tokens: {}ms\r\n",
                    wait.as_millis().max(1)
                )
            } else {
                format!("RateLimit-Policy: \"default\";q={limit};w={w}\r\nRateLimit: \"default\";r=0;t={secs}\r\n")
            };
            format!(
                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {secs}\r\nretry-after-ms: {}\r\n{which}\
                 Content-Length: 0\r\nConnection: close\r\n\r\n",
                wait.as_millis().max(1),
            )
        }
        Ok((remaining, tokens_left)) => {
            let now_in = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            stats.max_in_flight.fetch_max(now_in, Ordering::SeqCst);
            tokio::time::sleep(latency).await;
            stats.in_flight.fetch_sub(1, Ordering::SeqCst);
            let body = format!("{{\"ok\":true,\"path\":\"{path}\"}}");
            format!(
                "HTTP/1.1 200 OK\r\nRateLimit-Policy: \"default\";q={limit};w={w}\r\n\
                 RateLimit: \"default\";r={remaining};t={w}\r\nx-usage-tokens: {used}\r\n\
                 x-ratelimit-limit-tokens: {token_limit}\r\nx-ratelimit-remaining-tokens: {tokens_left}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len(),
            )
        }
    };
    let mut stream = reader.into_inner();
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: String,
}

/// One GET over a fresh connection.
pub async fn get(
    addr: SocketAddr,
    path: &str,
    key: &str,
    client: &str,
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nX-Client: {client}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("malformed status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().as_bytes().to_vec()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_string(),
    })
}
