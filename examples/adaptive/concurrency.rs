//! The concurrency half of the example: a server with C workers whose
//! capacity halves and doubles back, and four limiters in front of it.
//!
//! Columns: throughput is served calls over what the server could serve
//! (`C / L` in each phase); p50 and p99 are the callers' round trips of
//! served calls, from permit to answer; "p99 at server" is the server's
//! own share of them (queue + L, its `Server-Timing`), so what the harness
//! adds (connect, scheduling on a busy machine) shows as the difference.
//! "Reconverged" is how long after a capacity change the goals held again
//! for the rest of the phase (see [`reconverged`]). `ADAPTIVE_TRACE=1`
//! prints every 250 ms window and the limit every 250 ms to stderr.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backpressure::adaptive::{AdaptiveLimiter, Aimd, Gradient2};
use backpressure::Semaphore;

use crate::server;

/// Server capacity (workers) at the start and at the end.
const C: usize = 16;
/// The time a worker takes per request.
const L: Duration = Duration::from_millis(20);

enum Limit {
    Fixed(Arc<Semaphore>),
    Adaptive(AdaptiveLimiter),
}

impl Limit {
    fn limit(&self, fixed: usize) -> usize {
        match self {
            Limit::Fixed(_) => fixed,
            Limit::Adaptive(a) => a.limit(),
        }
    }
}

/// One finished request: when it was sent (since the start), its round trip,
/// and whether the server took it.
#[derive(Clone, Copy)]
struct Record {
    sent: Duration,
    rtt: Duration,
    /// The server's share of `rtt` (its `Server-Timing`): queue + latency.
    at_server: Duration,
    ok: bool,
}

/// The `Server-Timing: app;dur=<ms>` of a response.
fn server_timing(r: &server::Response) -> Option<Duration> {
    let (_, v) = r
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("server-timing"))?;
    let ms: f64 = std::str::from_utf8(v)
        .ok()?
        .split("dur=")
        .nth(1)?
        .parse()
        .ok()?;
    Some(Duration::from_secs_f64(ms / 1e3))
}

struct Row {
    strategy: &'static str,
    requests: usize,
    errors: usize,
    share: f64,
    p50: Duration,
    p99: Duration,
    p99_server: Duration,
    reconverge: [Option<Duration>; 2],
    limits: String,
}

async fn one(strategy: &'static str, fixed: usize, seconds: u64) -> Row {
    let srv = server::capacity(C, L).await;
    let limit = Arc::new(match strategy {
        "AIMD" => Limit::Adaptive(AdaptiveLimiter::new(Aimd::new())),
        "Gradient2" => Limit::Adaptive(AdaptiveLimiter::new(Gradient2::new())),
        _ => Limit::Fixed(Arc::new(Semaphore::new(fixed))),
    });
    let total = Duration::from_secs(seconds);
    let changes = [total / 3, total * 2 / 3];
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let records = Arc::new(Mutex::new(Vec::<Record>::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 * C {
        let (limit, stop, records) = (limit.clone(), stop.clone(), records.clone());
        let addr = srv.addr;
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let permit = match &*limit {
                    Limit::Fixed(s) => Ok(s.clone().acquire_owned().await.map(|p| (Some(p), None))),
                    Limit::Adaptive(a) => Err(a.acquire().await.map(|p| (None, Some(p)))),
                };
                let (fixed_permit, adaptive_permit) = match permit {
                    Ok(Ok(p)) | Err(Ok(p)) => p,
                    _ => return,
                };
                let sent = start.elapsed();
                let t = Instant::now();
                let response = server::get(addr, "/work").await;
                let rtt = t.elapsed();
                let ok = matches!(&response, Ok(r) if r.status == 200);
                let at_server = response.ok().and_then(|r| server_timing(&r)).unwrap_or(rtt);
                if let Some(p) = adaptive_permit {
                    if ok {
                        p.success()
                    } else {
                        p.dropped()
                    }
                }
                drop(fixed_permit);
                records.lock().unwrap().push(Record {
                    sent,
                    rtt,
                    at_server,
                    ok,
                });
            }
        }));
    }
    // With ADAPTIVE_TRACE, the limit every 250 ms.
    if std::env::var_os("ADAPTIVE_TRACE").is_some() {
        let (limit, stop) = (limit.clone(), stop.clone());
        tokio::spawn(async move {
            let mut trace = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                trace.push(limit.limit(fixed).to_string());
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            eprintln!("{strategy} limit every 250 ms: {}", trace.join(" "));
        });
    }
    // Change the capacity at a third and two thirds; sample the limit.
    let mut limits = Vec::new();
    let state = srv.state.clone();
    let sample = |limits: &mut Vec<usize>| limits.push(limit.limit(fixed));
    tokio::time::sleep(changes[0]).await;
    sample(&mut limits);
    state.set_capacity(C / 2);
    tokio::time::sleep(changes[1] - changes[0]).await;
    sample(&mut limits);
    state.set_capacity(C);
    tokio::time::sleep(total - changes[1]).await;
    sample(&mut limits);
    stop.store(true, Ordering::Relaxed);
    if let Limit::Adaptive(a) = &*limit {
        a.close();
    }
    for t in tasks {
        let _ = t.await;
    }
    let records = records.lock().unwrap().clone();
    if std::env::var_os("ADAPTIVE_TRACE").is_some() {
        trace(strategy, &records, changes, total);
    }
    summarize(strategy, &records, changes, total, limits)
}

/// Per 250 ms window: served share of capacity, errors, p50, p99.
fn trace(strategy: &str, records: &[Record], changes: [Duration; 2], total: Duration) {
    let w = Duration::from_millis(250);
    let mut t = Duration::ZERO;
    eprintln!("{strategy}");
    while t + w <= total {
        let inw: Vec<&Record> = records
            .iter()
            .filter(|r| r.sent + r.rtt >= t && r.sent + r.rtt < t + w)
            .collect();
        let mut rtts: Vec<f64> = inw
            .iter()
            .filter(|r| r.ok)
            .map(|r| r.rtt.as_secs_f64() * 1e3)
            .collect();
        rtts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let cap = capacity_at(t, changes) as f64 * w.as_secs_f64() / L.as_secs_f64();
        let p = |q: f64| {
            rtts.get(((rtts.len() as f64 * q) as usize).min(rtts.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        eprintln!(
            "  t={:>5.2} served {:>5.1}% err {:>3} p50 {:>5.1} p99 {:>5.1}",
            t.as_secs_f64(),
            100.0 * rtts.len() as f64 / cap,
            inw.len() - rtts.len(),
            p(0.5),
            p(0.99)
        );
        t += w;
    }
}

fn capacity_at(t: Duration, changes: [Duration; 2]) -> usize {
    if t >= changes[0] && t < changes[1] {
        C / 2
    } else {
        C
    }
}

fn summarize(
    strategy: &'static str,
    records: &[Record],
    changes: [Duration; 2],
    total: Duration,
    limits: Vec<usize>,
) -> Row {
    let ok: Vec<&Record> = records.iter().filter(|r| r.ok).collect();
    let errors = records.len() - ok.len();
    // The most the server could serve: capacity / latency, over each phase.
    let possible = [
        (changes[0], C),
        (changes[1] - changes[0], C / 2),
        (total - changes[1], C),
    ]
    .iter()
    .map(|(d, c)| d.as_secs_f64() * *c as f64 / L.as_secs_f64())
    .sum::<f64>();
    let mut rtts: Vec<Duration> = ok.iter().map(|r| r.rtt).collect();
    rtts.sort_unstable();
    let pct = |p: f64| {
        rtts.get(((rtts.len() as f64 * p) as usize).min(rtts.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let reconverge = [0, 1].map(|i| {
        let end = if i == 0 { changes[1] } else { total };
        reconverged(records, changes[i], end, capacity_at(changes[i], changes))
    });
    Row {
        strategy,
        requests: records.len(),
        errors,
        share: ok.len() as f64 / possible,
        p50: pct(0.50),
        p99: pct(0.99),
        p99_server: {
            let mut at: Vec<Duration> = ok.iter().map(|r| r.at_server).collect();
            at.sort_unstable();
            at.get((at.len() * 99 / 100).min(at.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        },
        reconverge,
        limits: limits
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(" / "),
    }
}

/// Whether the calls that ended in `[from, to)` meet the goals on a server
/// of `capacity` workers: at least 90% of `capacity / L` served, at most 1%
/// errors and, if `p99` is set, a 99th-percentile round trip of at most 2L.
fn meets(records: &[Record], from: Duration, to: Duration, capacity: usize, p99: bool) -> bool {
    let mut rtts = Vec::new();
    let mut errors = 0;
    for r in records
        .iter()
        .filter(|r| r.sent + r.rtt >= from && r.sent + r.rtt < to)
    {
        if r.ok {
            rtts.push(r.rtt);
        } else {
            errors += 1;
        }
    }
    let possible = capacity as f64 * (to - from).as_secs_f64() / L.as_secs_f64();
    let n = rtts.len();
    if (n as f64) < 0.9 * possible || errors * 100 > n + errors {
        return false;
    }
    rtts.sort_unstable();
    !p99 || rtts[(n * 99 / 100).min(n - 1)] <= 2 * L
}

/// How long after the capacity changed at `change` the run met the goals
/// again for the rest of the phase (which ends at `end`), on a 100 ms grid:
/// the first `t` such that
///
/// * the calls that ended in `[t, end)`, taken together, meet all three
///   goals (>= 90% of the new capacity served, p99 <= 2L, <= 1% errors);
/// * and so does every 500 ms window in it (on the 100 ms grid) for
///   throughput and errors, so a good stretch cannot hide a bad one.
///
/// The p99 is judged over the whole rest of the phase, as the goal states
/// it: the p99 of one 500 ms window is its 2nd to 4th slowest call, one
/// scheduling hiccup of a busy machine. At least the last second of the
/// phase must remain; otherwise `None` (never).
fn reconverged(
    records: &[Record],
    change: Duration,
    end: Duration,
    capacity: usize,
) -> Option<Duration> {
    let step = Duration::from_millis(100);
    let window = Duration::from_millis(500);
    let mut t = change;
    while t + Duration::from_secs(1) <= end {
        let windows_ok = {
            let mut u = t;
            let mut ok = true;
            while u + window <= end {
                if !meets(records, u, u + window, capacity, false) {
                    ok = false;
                    break;
                }
                u += step;
            }
            ok
        };
        if windows_ok && meets(records, t, end, capacity, true) {
            return Some(t - change);
        }
        t += step;
    }
    None
}

pub async fn run(seconds: u64) {
    println!(
        "concurrency: server of C = {C} workers, {} ms each, C more queued (the queue follows C), then 503; \
         C halves at {:.1} s and doubles back at {:.1} s; {} callers, closed loop, {seconds} s per row\n",
        L.as_millis(),
        seconds as f64 / 3.0,
        seconds as f64 * 2.0 / 3.0,
        4 * C,
    );
    let mut rows = Vec::new();
    for (strategy, fixed) in [
        ("fixed C/4", C / 4),
        ("fixed 4C", 4 * C),
        ("AIMD", 0),
        ("Gradient2", 0),
    ] {
        rows.push(one(strategy, fixed, seconds).await);
    }
    println!(
        "| strategy   | requests | errors         | throughput     | p50     | p99     | p99 at server | reconverged (halved / doubled) | limit at 1/3, 2/3, end |"
    );
    println!(
        "|------------|----------|----------------|----------------|---------|---------|---------------|--------------------------------|------------------------|"
    );
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let secs = |d: Option<Duration>| {
        d.map_or_else(
            || "never".to_string(),
            |d| format!("{:.1} s", d.as_secs_f64()),
        )
    };
    for r in rows {
        println!(
            "| {:<10} | {:>8} | {:>6} ({:>4.1}%) | {:>5.1}% of C/L | {:>7} | {:>7} | {:>13} | {:>14} / {:<15} | {:>22} |",
            r.strategy,
            r.requests,
            r.errors,
            100.0 * r.errors as f64 / r.requests.max(1) as f64,
            100.0 * r.share,
            ms(r.p50),
            ms(r.p99),
            ms(r.p99_server),
            secs(r.reconverge[0]),
            secs(r.reconverge[1]),
            r.limits,
        );
    }
}
