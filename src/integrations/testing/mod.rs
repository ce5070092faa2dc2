//! A throttling fake downstream for your own tests (feature `testing`).
//!
//! [`ThrottlingServer`] is a server that throttles like a real one: real
//! HTTP/1.1 on a free loopback port (one request per connection), limited
//! per key, with the headers real APIs send, and a record of when each
//! request started. Assert on what the server saw, not on what the client
//! says happened.
//!
//! # Examples
//!
//! ```
//! use backpressure::testing::{Limit, ThrottlingServer};
//! use std::time::Duration;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let server = ThrottlingServer::builder()
//!     .limit(Limit::Window { requests: 2, window: Duration::from_secs(60) })
//!     .start()
//!     .await
//!     .unwrap();
//!
//! // Three requests with one API key: the third is a 429.
//! let mut statuses = Vec::new();
//! for _ in 0..3 {
//!     let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
//!     s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n\r\n").await.unwrap();
//!     let mut response = String::new();
//!     s.read_to_string(&mut response).await.unwrap();
//!     statuses.push(response[9..12].to_string());
//! }
//! assert_eq!(statuses, ["200", "200", "429"]);
//! assert_eq!(server.count("key-a"), 3);
//! assert_eq!(server.throttled("key-a"), 1);
//! assert_eq!(server.request_starts("key-a").len(), 3);
//! # });
//! ```

mod limit;
mod serve;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use limit::Limit;

/// What the server does with requests beyond its capacity (across keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overload {
    /// Latency grows by `per_request` per request in flight beyond capacity.
    Latency {
        /// Added latency per excess request.
        per_request: Duration,
    },
    /// `503 Service Unavailable` with `Retry-After`.
    Unavailable {
        /// The `Retry-After` sent (rounded up to whole seconds).
        retry_after: Duration,
    },
}

/// Which rate-limit headers the server sends (beside `Retry-After`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum LimitHeaders {
    /// Only `Retry-After` on 429/503, like nginx `limit_req`.
    #[default]
    RetryAfterOnly,
    /// IETF `RateLimit-Policy` and `RateLimit` (draft-10) on every response.
    Ietf,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` on every response.
    XRateLimit,
    /// Both.
    Both,
    /// Not even `Retry-After` on a 429: a bare 429.
    Bare,
}

/// Configures and starts a [`ThrottlingServer`].
///
/// Defaults: no limit, no latency, no capacity, key header
/// `authorization` (a `Bearer ` prefix is dropped; a request without the
/// header has the key `""`).
///
/// # Examples
///
/// ```
/// use backpressure::testing::{Limit, ThrottlingServer};
/// use std::time::Duration;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let server = ThrottlingServer::builder()
///     .limit(Limit::Gcra { period: Duration::from_millis(100), burst: 2 })
///     .ietf_headers()
///     .key_header("x-api-key")
///     .latency(Duration::from_millis(1))
///     .fail_first(1, Duration::from_secs(1))
///     .refuse_beyond(8, Duration::from_secs(1))
///     .start()
///     .await
///     .unwrap();
/// assert!(server.url().starts_with("http://127.0.0.1:"));
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct Builder {
    config: Config,
}

#[derive(Clone, Debug)]
struct Config {
    limit: Option<Limit>,
    headers: LimitHeaders,
    key_header: String,
    latency: Duration,
    fail_first: Option<(usize, Duration)>,
    capacity: Option<(usize, Overload)>,
    /// Answers 500 to everything this long after `start`.
    down_for: Duration,
}

impl Builder {
    /// Limits each key with `limit`; a refused request gets `429` with
    /// `Retry-After` (the exact wait, rounded up to whole seconds).
    pub fn limit(mut self, limit: Limit) -> Self {
        self.config.limit = Some(limit);
        self
    }

    /// Sends the IETF `RateLimit-Policy` and `RateLimit` fields (draft-10)
    /// on every response (by default only `Retry-After`, on 429 and 503,
    /// like nginx `limit_req`). With
    /// [`x_ratelimit_headers`](Self::x_ratelimit_headers), both.
    pub fn ietf_headers(mut self) -> Self {
        self.config.headers = match self.config.headers {
            LimitHeaders::XRateLimit | LimitHeaders::Both => LimitHeaders::Both,
            _ => LimitHeaders::Ietf,
        };
        self
    }

    /// Sends `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delta seconds)
    /// on every response, as GitHub-style APIs do. With
    /// [`ietf_headers`](Self::ietf_headers), both.
    pub fn x_ratelimit_headers(mut self) -> Self {
        self.config.headers = match self.config.headers {
            LimitHeaders::Ietf | LimitHeaders::Both => LimitHeaders::Both,
            _ => LimitHeaders::XRateLimit,
        };
        self
    }

    /// Sends no limit header at all, not even `Retry-After` on a 429: bare
    /// 429s, as some proxies send. Replaces the header choices above.
    pub fn bare_429s(mut self) -> Self {
        self.config.headers = LimitHeaders::Bare;
        self
    }

    /// The request header whose value is the key (case-insensitive).
    pub fn key_header(mut self, name: impl Into<String>) -> Self {
        self.config.key_header = name.into().to_ascii_lowercase();
        self
    }

    /// How long an admitted request takes to serve.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.config.latency = latency;
        self
    }

    /// The first `k` requests (across keys) get `429` with
    /// `Retry-After: retry_after`, whatever the limit: a server that
    /// throttles before it has told anyone its quota.
    pub fn fail_first(mut self, k: usize, retry_after: Duration) -> Self {
        self.config.fail_first = Some((k, retry_after));
        self
    }

    /// Answers every request with `500 Internal Server Error` (no
    /// `Retry-After`) for `d` after [`start`](Self::start), then serves
    /// normally: a server that is down, then recovers (to test a circuit
    /// breaker). [`ThrottlingServer::failed`] counts those answers.
    pub fn down_for(mut self, d: Duration) -> Self {
        self.config.down_for = d;
        self
    }

    /// At most `capacity` requests served at once (across keys); beyond
    /// it, latency grows by `per_request` for each request in flight past
    /// the capacity (a queue building up).
    pub fn queue_beyond(mut self, capacity: usize, per_request: Duration) -> Self {
        self.config.capacity = Some((capacity, Overload::Latency { per_request }));
        self
    }

    /// At most `capacity` requests served at once (across keys); beyond
    /// it, `503 Service Unavailable` with `Retry-After: retry_after`
    /// (rounded up to whole seconds).
    pub fn refuse_beyond(mut self, capacity: usize, retry_after: Duration) -> Self {
        self.config.capacity = Some((capacity, Overload::Unavailable { retry_after }));
        self
    }

    /// Binds a free loopback port and starts serving on the current tokio
    /// runtime (needs the `net` and `time` drivers: a runtime built with
    /// `enable_all`, or `#[tokio::test]`).
    ///
    /// # Errors
    ///
    /// The bind's I/O error.
    ///
    /// # Examples
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let server = backpressure::testing::ThrottlingServer::builder().start().await.unwrap();
    /// assert!(server.addr().ip().is_loopback());
    /// # });
    /// ```
    pub async fn start(self) -> io::Result<ThrottlingServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(self.config));
        let accept = tokio::spawn(serve::accept(listener, shared.clone()));
        Ok(ThrottlingServer {
            addr,
            shared,
            accept,
        })
    }
}

/// A throttling HTTP/1.1 fake on a free loopback port: see the
/// [module docs](self). Stops (closes its port) when dropped. Per key it
/// records every request's start time, how many were refused (429 or 503),
/// and the peak number of admitted requests in flight.
///
/// # Examples
///
/// ```
/// use backpressure::testing::ThrottlingServer;
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let server = ThrottlingServer::builder().start().await.unwrap();
/// assert_eq!(server.total_count(), 0);
/// assert!(server.keys().is_empty());
/// # });
/// ```
#[derive(Debug)]
pub struct ThrottlingServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl ThrottlingServer {
    /// A builder with the defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// let b = backpressure::testing::ThrottlingServer::builder();
    /// # drop(b);
    /// ```
    pub fn builder() -> Builder {
        Builder {
            config: Config {
                limit: None,
                headers: LimitHeaders::default(),
                key_header: "authorization".to_string(),
                latency: Duration::ZERO,
                fail_first: None,
                capacity: None,
                down_for: Duration::ZERO,
            },
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests seen with `key` (admitted or not).
    pub fn count(&self, key: &str) -> usize {
        self.with_key(key, |k| k.starts.len())
    }

    /// Requests with `key` answered 429 or 503.
    pub fn throttled(&self, key: &str) -> usize {
        self.with_key(key, |k| k.throttled)
    }

    /// Requests with `key` answered 500 while the server was down (see
    /// [`Builder::down_for`]).
    pub fn failed(&self, key: &str) -> usize {
        self.with_key(key, |k| k.failed)
    }

    /// When each request with `key` started (its headers were read), in
    /// arrival order.
    pub fn request_starts(&self, key: &str) -> Vec<Instant> {
        self.with_key(key, |k| k.starts.clone())
    }

    /// The most admitted requests with `key` being served at once.
    pub fn max_in_flight(&self, key: &str) -> usize {
        self.with_key(key, |k| k.max_in_flight)
    }

    /// Requests seen, across keys.
    pub fn total_count(&self) -> usize {
        self.shared
            .stats
            .lock()
            .keys
            .values()
            .map(|k| k.starts.len())
            .sum()
    }

    /// The most admitted requests served at once, across keys.
    pub fn max_in_flight_total(&self) -> usize {
        self.shared.stats.lock().max_in_flight
    }

    /// Every key seen, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.shared.stats.lock().keys.keys().cloned().collect();
        keys.sort();
        keys
    }

    fn with_key<R: Default>(&self, key: &str, f: impl FnOnce(&KeyStats) -> R) -> R {
        self.shared
            .stats
            .lock()
            .keys
            .get(key)
            .map(f)
            .unwrap_or_default()
    }
}

impl Drop for ThrottlingServer {
    fn drop(&mut self) {
        // The accept loop owns the listener: aborting it closes the port.
        self.accept.abort();
    }
}

/// State shared by the accept loop, the connections and the handle.
#[derive(Debug)]
struct Shared {
    config: Config,
    /// Until when it answers 500 (see `down_for`).
    down_until: Instant,
    limiter: Mutex<Option<limit::Limiter>>,
    stats: Mutex<Stats>,
}

impl Shared {
    fn new(config: Config) -> Self {
        let now = Instant::now();
        Shared {
            down_until: now.checked_add(config.down_for).unwrap_or(now),
            limiter: Mutex::new(config.limit.map(limit::Limiter::new)),
            config,
            stats: Mutex::new(Stats::default()),
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    seen: usize,
    in_flight: usize,
    max_in_flight: usize,
    keys: HashMap<String, KeyStats>,
}

#[derive(Debug, Default)]
struct KeyStats {
    starts: Vec<Instant>,
    throttled: usize,
    failed: usize,
    in_flight: usize,
    max_in_flight: usize,
}
