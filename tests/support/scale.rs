//! The scale run shared by tests/redis_quotas/redis_scale.rs (P clients in one
//! process, each with its own connection) and examples/redis_scale.rs (P
//! processes): T tasks per client admit through `RedisScoped` on one key
//! or on many, from one wall-clock instant to another, and the counts are
//! checked against the GCRA bound.
//!
//! Every call is a `reserve(1, max_wait)` whose `max_wait` never reaches
//! past the end of the run; an admitted call is scheduled at its reserved
//! instant (the task does not sleep it: the demand stays saturating, as in
//! a fleet with more work than quota), so every cell admitted is used
//! inside `[start, end]`. On one key a refused task sleeps the
//! `retry_after`; on many keys it moves on to another key (after 1 ms). So the cells
//! are used inside the window, and Redis decides on the same
//! host clock (`TIME`) as the run's `SystemTime` window. So, per key,
//! `admitted <= burst + floor((end - start) / period)` exactly: cells
//! leased inside the window were taken from Redis inside it too (the
//! documented `+ P * lease` only matters for windows that start after a
//! lease was taken).

#![allow(dead_code)]

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure::{FailPolicy, Quota, RedisScoped, ReserveError};

/// One scale scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Redis URL(s): one node, or comma-separated cluster seeds.
    pub url: String,
    /// A prefix no earlier run used (fresh, full keys).
    pub prefix: String,
    pub keys: u32,
    pub tasks: u32,
    /// Lease size (0: no leases).
    pub lease: u32,
    pub quota: Quota,
    /// Wall-clock window, µs since the epoch.
    pub start_us: u64,
    pub end_us: u64,
}

/// What one client (or process) saw.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub admitted: Vec<u64>,
    pub calls: u64,
    pub round_trips: u64,
    pub failures: u64,
    pub leased: u64,
}

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// Runs one client: its own `RedisScoped` (its own connection), `tasks`
/// tasks, until the end of the window.
pub async fn client(s: &Scenario, seed: u64) -> Outcome {
    let mut b = RedisScoped::<u32>::builder(&s.url, s.prefix.clone(), s.quota)
        .timeout(Duration::from_millis(500))
        .idle(Duration::from_secs(3600))
        .fail_policy(FailPolicy::FailClosed {
            retry_after: Duration::from_millis(20),
        });
    if s.lease > 0 {
        b = b.lease(nz(s.lease), Duration::from_millis(200));
    }
    let scoped = std::sync::Arc::new(b.build().expect("a valid scenario"));
    // Connect (and load the script) before the window opens.
    let _ = scoped.bucket(&u32::MAX).available().await;
    let before: u64 = scoped.bucket(&u32::MAX).stats().round_trips;
    let wait = s.start_us.saturating_sub(now_us());
    tokio::time::sleep(Duration::from_micros(wait)).await;
    let mut handles = Vec::new();
    for t in 0..s.tasks {
        let (scoped, s) = (scoped.clone(), s.clone());
        let mut rng = fastrand::Rng::with_seed(seed * 1_000 + t as u64);
        handles.push(tokio::spawn(async move {
            let mut admitted = vec![0u64; s.keys as usize];
            let mut calls = 0;
            loop {
                let now = now_us();
                if now >= s.end_us {
                    break;
                }
                let left = Duration::from_micros(s.end_us - now);
                let key = rng.u32(0..s.keys);
                let bucket = scoped.bucket(&key);
                calls += 1;
                let reserved = bucket
                    .reserve(1, left.min(Duration::from_secs(1)))
                    .await
                    .map(|r| r.keep());
                match reserved {
                    // Runs at its reserved instant, inside the window.
                    Ok(_wait) => admitted[key as usize] += 1,
                    // Another key; a short pause keeps a task whose
                    // keys are all reserved a second ahead from spinning.
                    Err(ReserveError::RateLimited { .. }) if s.keys > 1 => {
                        tokio::time::sleep(Duration::from_millis(1)).await
                    }
                    Err(ReserveError::RateLimited { retry_after }) => {
                        let left = Duration::from_micros(s.end_us.saturating_sub(now_us()));
                        tokio::time::sleep(retry_after.min(left).min(Duration::from_millis(50)))
                            .await;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            (admitted, calls)
        }));
    }
    let mut out = Outcome {
        admitted: vec![0; s.keys as usize],
        ..Outcome::default()
    };
    for h in handles {
        let (admitted, calls) = h.await.expect("a task");
        for (a, b) in out.admitted.iter_mut().zip(admitted) {
            *a += b;
        }
        out.calls += calls;
    }
    for k in 0..s.keys {
        let st = scoped.bucket(&k).stats();
        out.round_trips += st.round_trips;
        out.failures += st.failures;
        out.leased += st.leased;
    }
    out.round_trips += scoped.bucket(&u32::MAX).stats().round_trips - before;
    out
}

/// The totals of a run and its check.
#[derive(Clone, Debug)]
pub struct Report {
    pub processes: u32,
    pub admitted: u64,
    /// Sum over keys of `burst + floor(t / period)`.
    pub bound: u64,
    /// `bound + P * lease` per key: the documented bound with leases.
    pub bound_leases: u64,
    /// The largest `admitted - bound` of any key (<= 0 when it holds).
    pub worst_excess: i64,
    pub secs: f64,
    pub calls: u64,
    pub round_trips: u64,
    pub failures: u64,
}

impl Report {
    pub fn new(s: &Scenario, outcomes: &[Outcome]) -> Report {
        let t_us = s.end_us - s.start_us;
        let period_us = (s.quota.period().as_nanos() as u64).div_ceil(1000);
        let per_key = s.quota.burst().get() as u64 + t_us / period_us;
        let p = outcomes.len() as u32;
        let mut worst = i64::MIN;
        let mut admitted = 0;
        for k in 0..s.keys as usize {
            let a: u64 = outcomes.iter().map(|o| o.admitted[k]).sum();
            admitted += a;
            worst = worst.max(a as i64 - per_key as i64);
        }
        Report {
            processes: p,
            admitted,
            bound: per_key * s.keys as u64,
            bound_leases: (per_key + (p * s.lease) as u64) * s.keys as u64,
            worst_excess: worst,
            secs: t_us as f64 / 1e6,
            calls: outcomes.iter().map(|o| o.calls).sum(),
            round_trips: outcomes.iter().map(|o| o.round_trips).sum(),
            failures: outcomes.iter().map(|o| o.failures).sum(),
        }
    }

    /// admitted / bound.
    pub fn utilisation(&self) -> f64 {
        self.admitted as f64 / self.bound as f64
    }

    pub fn header() -> &'static str {
        "| topology | keys | P × T | lease | admitted | bound (+P×lease) | worst key vs its bound | utilisation | admitted/s (per process) | round trips / admitted call | failures |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    }

    pub fn row(&self, topology: &str, s: &Scenario) -> String {
        format!(
            "| {topology} | {} | {} × {} | {} | {} | {} ({}) | {:+} | {:.1}% | {:.0} ({:.0}) | {:.2} | {} |",
            s.keys,
            self.processes,
            s.tasks,
            if s.lease == 0 { "-".to_owned() } else { s.lease.to_string() },
            self.admitted,
            self.bound,
            self.bound_leases,
            self.worst_excess,
            100.0 * self.utilisation(),
            self.admitted as f64 / self.secs,
            self.admitted as f64 / self.secs / self.processes as f64,
            self.round_trips as f64 / self.admitted.max(1) as f64,
            self.failures,
        )
    }
}
