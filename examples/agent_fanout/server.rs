//! A real HTTP/1.1 API on loopback, rated per API key with a rolling window,
//! answering 429 + Retry-After when a key is over its rate: the downstream
//! of the incident. Hand-written on tokio's TCP so the example builds fast;
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
    pub throttled: usize,
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

/// Starts the API: `limit` requests per `window` per API key, each request
/// taking `latency` to serve.
pub async fn start(limit: usize, window: Duration, latency: Duration) -> Server {
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
    let st = stats.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (st, limiter) = (st.clone(), limiter.clone());
            tokio::spawn(async move {
                let _ = serve(stream, &st, &limiter, limit, window, latency).await;
            });
        }
    });
    Server { addr, stats }
}

async fn serve(
    stream: TcpStream,
    stats: &Stats,
    limiter: &Mutex<Limiter>,
    limit: usize,
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
    let verdict = limiter.lock().unwrap().check(&key, now);
    {
        let mut by = stats.by_client.lock().unwrap();
        let c = by.entry(client).or_default();
        c.requests += 1;
        if verdict.is_err() {
            c.throttled += 1;
        }
    }
    let response = match verdict {
        Err(wait) => {
            let secs = wait.as_secs_f64();
            format!(
                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {}\r\nretry-after-ms: {}\r\n\
                 RateLimit-Policy: \"default\";q={limit};w={}\r\nRateLimit: \"default\";r=0;t={}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n",
                secs.ceil() as u64,
                wait.as_millis().max(1),
                window.as_secs().max(1),
                secs.ceil() as u64,
            )
        }
        Ok(remaining) => {
            let now_in = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            stats.max_in_flight.fetch_max(now_in, Ordering::SeqCst);
            tokio::time::sleep(latency).await;
            stats.in_flight.fetch_sub(1, Ordering::SeqCst);
            let body = format!("{{\"ok\":true,\"path\":\"{path}\"}}");
            format!(
                "HTTP/1.1 200 OK\r\nRateLimit-Policy: \"default\";q={limit};w={}\r\n\
                 RateLimit: \"default\";r={remaining};t={}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                window.as_secs().max(1),
                window.as_secs().max(1),
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
