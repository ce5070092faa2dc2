//! The fake server's connections: read one HTTP/1.1 request, decide,
//! record, answer, close.

use std::fmt::Write as _;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::limit::Verdict;
use super::{LimitHeaders, Overload, Shared};
use crate::headers::{retry_after_secs, RateLimitHeaders};

/// Longest request head read (line and headers), in bytes.
const MAX_HEAD: usize = 64 * 1024;
/// Longest body read and discarded.
const MAX_BODY: u64 = 16 * 1024 * 1024;

pub(super) async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, shared).await;
                });
            }
            // Out of file descriptors, say: back off a little, keep going.
            Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}

/// What to answer.
enum Answer {
    Ok {
        extra: Duration,
        verdict: Option<Verdict>,
    },
    TooMany {
        retry_after: Duration,
        verdict: Option<Verdict>,
    },
    Unavailable {
        retry_after: Duration,
    },
    /// Down: a 500.
    Down,
}

/// Decrements the in-flight counts when an admitted request ends (or its
/// connection task is dropped).
struct InFlight {
    shared: Arc<Shared>,
    key: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut stats = self.shared.stats.lock();
        stats.in_flight -= 1;
        if let Some(k) = stats.keys.get_mut(&self.key) {
            k.in_flight -= 1;
        }
    }
}

async fn serve(stream: TcpStream, shared: Arc<Shared>) -> io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut head = 0usize;
    if reader.read_line(&mut line).await? == 0 {
        return Ok(());
    }
    head += line.len();
    let mut key = String::new();
    let mut body = 0u64;
    loop {
        line.clear();
        let n = reader.read_line(&mut line).await?;
        head += n;
        if n == 0 || line == "\r\n" || line == "\n" || head > MAX_HEAD {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim();
            if name == shared.config.key_header {
                key = value.strip_prefix("Bearer ").unwrap_or(value).to_string();
            } else if name == "content-length" {
                body = value.parse().unwrap_or(0);
            }
        }
    }
    // Read the body so the client is not reset mid-send.
    let mut sink = tokio::io::sink();
    let _ = tokio::io::copy(&mut (&mut reader).take(body.min(MAX_BODY)), &mut sink).await;

    let (answer, _guard) = decide(&shared, &key, Instant::now());
    let response = match answer {
        Answer::Ok { extra, verdict } => {
            let latency = shared.config.latency.saturating_add(extra);
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let mut r = String::from("HTTP/1.1 200 OK\r\n");
            limit_headers(&shared, verdict, None, &mut r);
            r.push_str("Content-Length: 2\r\nConnection: close\r\n\r\nok");
            r
        }
        Answer::TooMany {
            retry_after,
            verdict,
        } => {
            let mut r = String::from("HTTP/1.1 429 Too Many Requests\r\n");
            limit_headers(&shared, verdict, Some(retry_after), &mut r);
            r.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
            r
        }
        Answer::Down => "HTTP/1.1 500 Internal Server Error\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
            .to_string(),
        Answer::Unavailable { retry_after } => format!(
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {}\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n",
            retry_after_secs(retry_after)
        ),
    };
    let mut stream = reader.into_inner();
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Records the request and decides its answer; an admitted request holds
/// the returned guard while it is served.
fn decide(shared: &Arc<Shared>, key: &str, now: Instant) -> (Answer, Option<InFlight>) {
    let config = &shared.config;
    let mut locked = shared.stats.lock();
    let stats = &mut *locked;
    stats.seen += 1;
    let nth = stats.seen;
    let k = stats.keys.entry(key.to_string()).or_default();
    k.starts.push(now);

    let answer = if now < shared.down_until {
        Answer::Down
    } else if let Some((_, retry_after)) = config.fail_first.filter(|&(k, _)| nth <= k) {
        Answer::TooMany {
            retry_after,
            verdict: None,
        }
    } else {
        let verdict = shared.limiter.lock().as_mut().map(|l| l.check(key, now));
        match verdict {
            Some(v) if !v.admitted => Answer::TooMany {
                retry_after: v.reset,
                verdict: Some(v),
            },
            _ => match config.capacity {
                Some((cap, overload)) if stats.in_flight >= cap => match overload {
                    Overload::Unavailable { retry_after } => Answer::Unavailable { retry_after },
                    Overload::Latency { per_request } => Answer::Ok {
                        extra: per_request.saturating_mul(
                            u32::try_from(stats.in_flight + 1 - cap).unwrap_or(u32::MAX),
                        ),
                        verdict,
                    },
                },
                _ => Answer::Ok {
                    extra: Duration::ZERO,
                    verdict,
                },
            },
        }
    };

    let guard = match answer {
        Answer::Ok { .. } => {
            stats.in_flight += 1;
            stats.max_in_flight = stats.max_in_flight.max(stats.in_flight);
            k.in_flight += 1;
            k.max_in_flight = k.max_in_flight.max(k.in_flight);
            Some(InFlight {
                shared: shared.clone(),
                key: key.to_string(),
            })
        }
        Answer::Down => {
            k.failed += 1;
            None
        }
        _ => {
            k.throttled += 1;
            None
        }
    };
    (answer, guard)
}

/// `Retry-After` (when refused) and the configured limit headers.
fn limit_headers(
    shared: &Shared,
    verdict: Option<Verdict>,
    retry_after: Option<Duration>,
    out: &mut String,
) {
    if shared.config.headers == LimitHeaders::Bare {
        return;
    }
    if let Some(d) = retry_after {
        let _ = write!(out, "Retry-After: {}\r\n", retry_after_secs(d));
    }
    let (Some(v), Some(limit)) = (verdict, shared.config.limit) else {
        return;
    };
    let (quota, window) = limit.announced();
    let headers = shared.config.headers;
    if matches!(headers, LimitHeaders::Ietf | LimitHeaders::Both) {
        let h = RateLimitHeaders::new("default", quota, window, v.remaining, v.reset);
        let _ = write!(
            out,
            "RateLimit-Policy: {}\r\nRateLimit: {}\r\n",
            h.policy(),
            h.rate_limit()
        );
    }
    if matches!(headers, LimitHeaders::XRateLimit | LimitHeaders::Both) {
        let _ = write!(
            out,
            "X-RateLimit-Limit: {quota}\r\nX-RateLimit-Remaining: {}\r\nX-RateLimit-Reset: {}\r\n",
            v.remaining,
            retry_after_secs(v.reset)
        );
    }
}
