//! Two loopback HTTP/1.1 servers that do not say their limits, for
//! `examples/adaptive`: hand-written on tokio's TCP so the example builds
//! fast; one request per connection (`Connection: close`).
//!
//! * [`rate`]: GCRA per API key at R requests/s with a burst of 2, like
//!   nginx `limit_req`: beyond it, `429` with `Retry-After: 1` and no
//!   `RateLimit` headers.
//! * [`capacity`]: C workers, each request holding one for the base latency;
//!   beyond C, up to C more requests wait in a FIFO queue (latency grows);
//!   beyond that, `503`. C can be changed while it runs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What a server answered, counted at the server.
#[derive(Debug, Default)]
pub struct Counts {
    pub requests: AtomicU64,
    pub ok: AtomicU64,
    pub rejected: AtomicU64,
}

impl Counts {
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.requests.load(Ordering::SeqCst),
            self.ok.load(Ordering::SeqCst),
            self.rejected.load(Ordering::SeqCst),
        )
    }
}

pub struct Server<S> {
    pub addr: SocketAddr,
    pub state: Arc<S>,
}

// ---------------------------------------------------------------------------
// Rate-limited server

/// GCRA at `rate` requests/s, burst 2, for every key together (the example
/// uses one key).
pub struct RateState {
    period_ns: u64,
    burst: u64,
    epoch: Instant,
    tat: Mutex<u64>,
    pub counts: Counts,
    /// `ADAPTIVE_TRACE` set: every request's arrival and answer to stderr.
    trace: bool,
}

impl RateState {
    fn check(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let mut tat = self.tat.lock().unwrap();
        let t = (*tat).max(now);
        // Admit while the debt after this request stays within the burst.
        if t + self.period_ns - now <= self.burst * self.period_ns {
            *tat = t + self.period_ns;
            true
        } else {
            false
        }
    }
}

pub async fn rate(rate: f64) -> Server<RateState> {
    let state = Arc::new(RateState {
        period_ns: (1e9 / rate) as u64,
        burst: 2,
        epoch: Instant::now(),
        tat: Mutex::new(0),
        counts: Counts::default(),
        trace: std::env::var_os("ADAPTIVE_TRACE").is_some(),
    });
    let st = state.clone();
    let addr = listen(move |_path| {
        let st = st.clone();
        async move {
            st.counts.requests.fetch_add(1, Ordering::SeqCst);
            let admitted = st.check();
            if st.trace {
                let ms = st.epoch.elapsed().as_secs_f64() * 1e3;
                eprintln!("{ms:9.1} ms {}", if admitted { "200" } else { "429" });
            }
            if admitted {
                st.counts.ok.fetch_add(1, Ordering::SeqCst);
                // A little work, so requests overlap as real ones do.
                tokio::time::sleep(Duration::from_millis(5)).await;
                ok()
            } else {
                st.counts.rejected.fetch_add(1, Ordering::SeqCst);
                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\
                 Connection: close\r\n\r\n"
                    .to_string()
            }
        }
    })
    .await;
    Server { addr, state }
}

// ---------------------------------------------------------------------------
// Capacity-limited server

/// `capacity` workers; a request takes the worker that frees up first and
/// holds it for `latency`. If it has to wait, it joins a FIFO queue of at
/// most `capacity` requests (the queue follows the capacity: "C workers, C
/// more queued"); beyond that, `503` at once.
///
/// The schedule is exact, on a timeline of its own: each worker keeps the
/// instant it frees up, and a request's answer is due at
/// `max(arrival, first free worker) + latency`. Timer lateness (tokio's
/// timer has a 1 ms tick) delays an answer's delivery but never a worker,
/// so the server serves exactly `capacity / latency` requests a second,
/// in arrival order, and the round trips the callers measure are its
/// queueing plus its latency, not polling ticks of the harness.
///
/// When the capacity falls, the workers that free up last leave (after
/// finishing what they were given); when it rises, new workers are free at
/// once.
pub struct CapacityState {
    inner: Mutex<Workers>,
    latency: Duration,
    pub counts: Counts,
}

struct Workers {
    capacity: usize,
    /// When each worker frees up (the earliest on top).
    free_at: BinaryHeap<Reverse<Instant>>,
    /// When each waiting request starts, oldest first (non-decreasing).
    starts: VecDeque<Instant>,
}

impl CapacityState {
    pub fn set_capacity(&self, c: usize) {
        let now = Instant::now();
        let c = c.max(1);
        let mut w = self.inner.lock().unwrap();
        w.capacity = c;
        let mut free: Vec<Instant> = w.free_at.drain().map(|Reverse(t)| t).collect();
        free.sort_unstable();
        free.truncate(c);
        free.resize(c, now);
        w.free_at = free.into_iter().map(Reverse).collect();
    }

    /// When the request's answer is due, or `None` if it is rejected.
    fn admit(&self, now: Instant) -> Option<Instant> {
        let mut w = self.inner.lock().unwrap();
        while w.starts.front().is_some_and(|&s| s <= now) {
            w.starts.pop_front();
        }
        let Reverse(free) = *w.free_at.peek().expect("capacity >= 1");
        let start = free.max(now);
        if start > now {
            if w.starts.len() >= w.capacity {
                return None;
            }
            w.starts.push_back(start);
        }
        w.free_at.pop();
        w.free_at.push(Reverse(start + self.latency));
        Some(start + self.latency)
    }
}

pub async fn capacity(capacity: usize, latency: Duration) -> Server<CapacityState> {
    let now = Instant::now();
    let capacity = capacity.max(1);
    let state = Arc::new(CapacityState {
        inner: Mutex::new(Workers {
            capacity,
            free_at: (0..capacity).map(|_| Reverse(now)).collect(),
            starts: VecDeque::new(),
        }),
        latency,
        counts: Counts::default(),
    });
    let st = state.clone();
    let addr = listen(move |_path| {
        let st = st.clone();
        async move {
            st.counts.requests.fetch_add(1, Ordering::SeqCst);
            let arrived = Instant::now();
            let Some(due) = st.admit(arrived) else {
                st.counts.rejected.fetch_add(1, Ordering::SeqCst);
                return "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\
                        Connection: close\r\n\r\n"
                    .to_string();
            };
            tokio::time::sleep_until(due.into()).await;
            st.counts.ok.fetch_add(1, Ordering::SeqCst);
            // The server's own share of the round trip (queue + latency),
            // so the caller can tell it from the harness's.
            let body = "{\"ok\":true}";
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Server-Timing: app;dur={:.3}\r\nConnection: close\r\n\r\n{body}",
                body.len(),
                (due - arrived).as_secs_f64() * 1e3,
            )
        }
    })
    .await;
    Server { addr, state }
}

// ---------------------------------------------------------------------------
// HTTP plumbing

fn ok() -> String {
    let body = "{\"ok\":true}";
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn listen<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = String> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    let handler = Arc::new(handler);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let _ = serve(stream, &*handler).await;
            });
        }
    });
    addr
}

async fn serve<F, Fut>(stream: TcpStream, handler: &F) -> std::io::Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
    }
    let response = handler(path).await;
    let mut stream = reader.into_inner();
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// A parsed response: the status and the headers.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// One GET over a fresh connection.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let head = text.split_once("\r\n\r\n").map_or(&*text, |(h, _)| h);
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
    Ok(Response { status, headers })
}
