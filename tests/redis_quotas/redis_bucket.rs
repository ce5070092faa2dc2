//! `RedisBucket` against a real `redis-server` (feature `redis`).
//!
//! Each test starts its own server on a free loopback port, without
//! persistence, and kills it at the end. Without `redis-server` the tests
//! print a skip message, or fail when `CI` is set.
#![cfg(feature = "redis")]

use crate::redis_server;

use std::num::NonZeroU32;
use std::time::Duration;

use backpressure::{
    CheckError, FailPolicy, ManualClock, Quota, RedisBucket, RedisBucketBuilder, ReserveError,
    TokenBucket,
};
use redis_server::RedisServer;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// 50 per second, burst 5: the quota of the sharing tests.
fn shared_quota() -> Quota {
    Quota::per_second(nz(50)).allow_burst(nz(5))
}

/// A bound no test's own calls should get near: a hang detector only.
const HANG: Duration = Duration::from_secs(2);

/// Calls `try_acquire(1)` until refused; returns the number admitted.
async fn take_all(bucket: &RedisBucket) -> u64 {
    let mut admitted = 0;
    loop {
        match tokio::time::timeout(HANG, bucket.try_acquire(1))
            .await
            .expect("a decision never hangs")
        {
            Ok(()) => admitted += 1,
            Err(CheckError::NotUntil { .. }) => return admitted,
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

/// Steps of the sharing tests: two seconds of a shared `ManualClock` in
/// 1 ms steps (the 2000th is not reached).
const STEPS: u64 = 2000;

/// Two clients with separate connections share one key on one
/// `ManualClock` (sent with each call instead of Redis's `TIME`): every
/// millisecond both ask at once, each until refused, taking turns at
/// asking first for each new cell. Returns the number admitted.
async fn two_clients(server: &RedisServer, key: &str, lease: Option<u32>) -> u64 {
    let clock = ManualClock::starting_at(1_000_000_000);
    let build = || {
        let mut b = RedisBucket::builder(&server.url(), key, shared_quota())
            .clock(clock.clone())
            .timeout(Duration::from_millis(500));
        if let Some(k) = lease {
            b = b.lease(nz(k), Duration::from_millis(100));
        }
        b.build().unwrap()
    };
    let (a, b) = (build(), build());
    // Connect (and load the script) first.
    assert_eq!(a.available().await, 5);
    assert_eq!(b.available().await, 5);
    let (mut x, mut y) = (0, 0);
    for step in 0..STEPS {
        // A cell every 20 ms: each asks first for every other one.
        if step / 20 % 2 == 0 {
            let (dx, dy) = tokio::join!(take_all(&a), take_all(&b));
            (x, y) = (x + dx, y + dy);
        } else {
            let (dy, dx) = tokio::join!(take_all(&b), take_all(&a));
            (x, y) = (x + dx, y + dy);
        }
        clock.advance(Duration::from_millis(1));
    }
    // Each client really took part.
    println!("redis, {key}: the clients admitted {x} and {y}");
    assert!(x > 10 && y > 10, "admitted {x} and {y}");
    x + y
}

/// burst + rate * elapsed, +1 for the edges.
fn single_key_bound(elapsed: f64) -> f64 {
    5.0 + 50.0 * elapsed + 1.0
}

/// What the key gives out when asked every millisecond for `STEPS`: the
/// burst, then a cell every 20 ms (the 2000th ms is not reached).
const SHARED_EXACT: u64 = 5 + STEPS / 20 - 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_on_one_key_stay_within_the_quota() {
    if !redis_server::available("two_clients_on_one_key_stay_within_the_quota") {
        return;
    }
    let server = RedisServer::start();
    let admitted = two_clients(&server, "shared", None).await;
    let bound = single_key_bound(STEPS as f64 / 1000.0);
    println!("redis, two clients: {admitted} admitted in {STEPS} ms (bound {bound:.0})");
    assert!(admitted as f64 <= bound, "{admitted} > {bound}");
    // And the quota is used, not starved: asked every millisecond, the key
    // gives out every cell.
    assert_eq!(admitted, SHARED_EXACT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_clients_stay_within_the_quota_plus_their_leases() {
    if !redis_server::available("two_leasing_clients_stay_within_the_quota_plus_their_leases") {
        return;
    }
    let server = RedisServer::start();
    let lease = 3;
    let admitted = two_clients(&server, "leased", Some(lease)).await;
    let bound = single_key_bound(STEPS as f64 / 1000.0) + 2.0 * lease as f64;
    println!("redis, two leasing clients: {admitted} admitted in {STEPS} ms (bound {bound:.0})");
    assert!(admitted as f64 <= bound, "{admitted} > {bound}");
    // Not starved: leases give out at least 80% of the key's cells.
    assert!(
        admitted as f64 >= 0.8 * SHARED_EXACT as f64,
        "only {admitted}"
    );
}

/// What a local limiter cannot prevent: two processes, each with its own
/// bucket at the key's quota, together admit about twice the key's rate.
#[test]
fn two_local_buckets_on_one_key_double_the_rate() {
    let clock = ManualClock::new();
    let a = TokenBucket::with_clock(shared_quota(), clock.clone());
    let b = TokenBucket::with_clock(shared_quota(), clock.clone());
    let mut admitted = 0;
    // Two seconds in 1 ms steps, both processes asking every step.
    for _ in 0..2000 {
        admitted += a.try_acquire(1).is_ok() as u64 + b.try_acquire(1).is_ok() as u64;
        clock.advance(Duration::from_millis(1));
    }
    let bound = single_key_bound(2.0);
    println!("local, two buckets: {admitted} admitted in 2.00 s (bound {bound:.0})");
    assert_eq!(admitted, 2 * (5 + 100 - 1)); // the 2000th ms is not reached
    assert!(admitted as f64 > 1.9 * bound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalize_from_one_client_holds_back_the_other() {
    if !redis_server::available("penalize_from_one_client_holds_back_the_other") {
        return;
    }
    let server = RedisServer::start();
    let build = || {
        RedisBucket::builder(&server.url(), "penalized", shared_quota())
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    assert!(b.try_acquire(1).await.is_ok());
    a.penalize(Duration::from_millis(400)).await;
    // B has no local state: the refusal comes from the shared key.
    let wait = match b.try_acquire(1).await {
        Err(CheckError::NotUntil { wait }) => wait,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(wait > Duration::from_millis(200) && wait <= Duration::from_millis(400));
    assert!(b
        .reserve(1, Duration::from_millis(100))
        .await
        .unwrap_err()
        .is_rate_limited());
    // Once the retry time has passed, one cell fits, then one per period.
    tokio::time::sleep(wait + Duration::from_millis(5)).await;
    assert_eq!(b.try_acquire(1).await, Ok(()));
    assert!(b.try_acquire(1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_cuts_round_trips() {
    if !redis_server::available("leasing_cuts_round_trips") {
        return;
    }
    let server = RedisServer::start();
    // Manual time: no refill, so every count below is exact.
    let clock = ManualClock::starting_at(1_000_000_000);
    let quota = Quota::per_second(nz(1000)).allow_burst(nz(100));
    let plain = RedisBucket::builder(&server.url(), "plain", quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    let leasing = RedisBucket::builder(&server.url(), "leasing", quota)
        .clock(clock.clone())
        .lease(nz(10), Duration::from_millis(50))
        .build()
        .unwrap();
    // Load the script once (the first EVALSHA on a fresh server is a
    // NOSCRIPT and an EVAL), so both start from the steady state.
    assert_eq!(plain.available().await, 100);
    let (p0, l0) = (plain.stats().round_trips, leasing.stats().round_trips);
    for _ in 0..100 {
        plain.try_acquire(1).await.unwrap();
        leasing.try_acquire(1).await.unwrap();
    }
    let (p, l) = (plain.stats(), leasing.stats());
    println!(
        "round trips per admitted call: {:.2} without leasing, {:.2} with leases of 10",
        (p.round_trips - p0) as f64 / p.admitted as f64,
        (l.round_trips - l0) as f64 / l.admitted as f64,
    );
    assert_eq!((p.round_trips - p0, p.admitted), (100, 100));
    assert_eq!((l.round_trips - l0, l.admitted, l.leased), (10, 100, 90));
    // The key is empty for both, and a lease never takes past the burst.
    assert!(plain.try_acquire(1).await.is_err());
    assert!(leasing.try_acquire(1).await.is_err());

    // Unused leased cells go back, with `release_lease`...
    clock.advance(Duration::from_millis(100)); // 100 cells refilled
    leasing.try_acquire(1).await.unwrap(); // leases 10: 90 in Redis, 9 here
    assert_eq!(leasing.available().await, 99);
    leasing.release_lease().await;
    assert_eq!(leasing.available().await, 99); // all in Redis now
                                               // ... with the next round trip when the lease cannot cover a call ...
    leasing.try_acquire(1).await.unwrap(); // 89 in Redis, 9 here
    assert_eq!(
        leasing.try_acquire(100).await,
        Err(CheckError::NotUntil {
            wait: Duration::from_millis(2)
        }), // 98 of 100
    );
    assert_eq!(leasing.available().await, 98);
    // ... and when the lease expires.
    let other = RedisBucket::builder(&server.url(), "leasing", quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    leasing.try_acquire(1).await.unwrap(); // 88 in Redis, 9 here
    other.try_acquire(88).await.unwrap(); // Redis empty
    clock.advance(Duration::from_millis(50)); // lease expired; 50 refilled
    assert_eq!(leasing.available().await, 50);
    assert_eq!(leasing.try_acquire(59).await, Ok(())); // 50 + the 9 returned
    assert!(other.try_acquire(1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_expires_when_the_bucket_is_full_again() {
    if !redis_server::available("the_key_expires_when_the_bucket_is_full_again") {
        return;
    }
    let server = RedisServer::start();
    let bucket = RedisBucket::builder(&server.url(), "expiring", shared_quota())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    bucket.try_acquire(5).await.unwrap();
    // Full again 100 ms (5 cells * 20 ms) after the take.
    let pttl: i64 = server.command(&["PTTL", "expiring"]).unwrap()[1..]
        .parse()
        .unwrap();
    assert!(pttl > 0 && pttl <= 100, "pttl {pttl}");
    // A flushed script cache costs one EVAL, not a failure.
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]).as_deref(), Some("+OK"));
    let trips = bucket.stats().round_trips;
    assert_eq!(bucket.available().await, 0);
    assert_eq!(bucket.stats().round_trips - trips, 2);
    assert_eq!(bucket.stats().failures, 0);
}

/// Calls `try_acquire(1)` `k` times, each under the hang detector.
async fn decisions(bucket: &RedisBucket, k: usize) -> Vec<Result<(), CheckError>> {
    let mut out = Vec::new();
    for _ in 0..k {
        out.push(
            tokio::time::timeout(HANG, bucket.try_acquire(1))
                .await
                .expect("a decision never hangs"),
        );
    }
    out
}

/// Retries until Redis decides again (at most ~5 s), returning whether it
/// did.
async fn recovered(bucket: &RedisBucket) -> bool {
    for _ in 0..100 {
        let trips = bucket.stats().round_trips;
        let fallback = bucket.stats().fallback;
        let r = tokio::time::timeout(HANG, bucket.try_acquire(1))
            .await
            .expect("a decision never hangs");
        if r.is_ok() && bucket.stats().round_trips > trips && bucket.stats().fallback == fallback {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_while_redis_is_away_and_recovers() {
    if !redis_server::available("fail_closed_refuses_while_redis_is_away_and_recovers") {
        return;
    }
    let mut server = RedisServer::start();
    let retry_after = Duration::from_millis(250);
    let bucket = RedisBucket::builder(&server.url(), "closed", shared_quota())
        .timeout(Duration::from_millis(50))
        .probe_interval(Duration::from_millis(100))
        .fail_policy(FailPolicy::FailClosed { retry_after })
        .build()
        .unwrap();
    assert_eq!(bucket.try_acquire(1).await, Ok(()));

    // A frozen server: connected, silent. Every call times out, or skips
    // Redis after a failure; none hangs, none admits.
    server.signal("-STOP");
    for r in decisions(&bucket, 5).await {
        assert_eq!(r, Err(CheckError::Unavailable { retry_after }));
    }
    let failures = bucket.stats().failures;
    let r = tokio::time::timeout(HANG, bucket.reserve(1, Duration::from_secs(1)))
        .await
        .expect("a reserve never hangs");
    assert_eq!(r.unwrap_err(), ReserveError::Unavailable { retry_after });
    // One decision, failed once: a skip, or one round trip cut at the
    // store timeout (50 ms, inside the second it could afford). No retry,
    // no wait on the fallback.
    assert_eq!(
        bucket.stats().failures - failures,
        1,
        "reserve tried more than once"
    );
    assert!(bucket.stats().failures >= 6);
    server.signal("-CONT");
    assert!(recovered(&bucket).await, "no recovery after SIGCONT");

    // A dead server, then a fresh one on the same port.
    server.stop();
    for r in decisions(&bucket, 5).await {
        assert_eq!(r, Err(CheckError::Unavailable { retry_after }));
    }
    server.restart();
    assert!(recovered(&bucket).await, "no recovery after a restart");
    // Redis decides again: the fresh key has its burst, then refuses.
    let mut admitted = 1; // `recovered` took one
    while bucket.try_acquire(1).await.is_ok() {
        admitted += 1;
    }
    assert!((5..=6).contains(&admitted), "admitted {admitted}");
    assert_eq!(bucket.stats().fallback, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_falls_back_to_its_share_and_recovers() {
    if !redis_server::available("fail_open_falls_back_to_its_share_and_recovers") {
        return;
    }
    let mut server = RedisServer::start();
    // 10/s burst 10 shared; half of it alone: 5/s burst 5.
    let quota = Quota::per_second(nz(10));
    let bucket = RedisBucket::builder(&server.url(), "open", quota)
        .timeout(Duration::from_millis(50))
        .probe_interval(Duration::from_secs(1))
        .fail_policy(FailPolicy::FailOpen { share: 0.5 })
        .build()
        .unwrap();
    assert_eq!(bucket.try_acquire(1).await, Ok(()));

    server.signal("-STOP");
    let results = decisions(&bucket, 10).await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    // The fallback's burst of 5 (one more if a refill landed meanwhile);
    // the rest are plain rate limits, not "unavailable".
    assert!((5..=6).contains(&admitted), "admitted {admitted}");
    assert!(results
        .iter()
        .all(|r| r.is_ok() || matches!(r, Err(CheckError::NotUntil { .. }))));
    assert_eq!(bucket.stats().fallback, 10);
    let r = tokio::time::timeout(HANG, bucket.reserve(1, Duration::from_secs(1)))
        .await
        .expect("a reserve never hangs")
        .unwrap();
    assert!(r.is_fallback() && r.wait() <= Duration::from_secs(1));

    server.signal("-CONT");
    server.stop();
    server.restart();
    assert!(recovered(&bucket).await, "no recovery after a restart");
    // Redis decides again, with the full shared burst of 10.
    let mut admitted = 1;
    while bucket.try_acquire(1).await.is_ok() {
        admitted += 1;
    }
    assert!((10..=11).contains(&admitted), "admitted {admitted}");
}

/// Issue #10 item 5: a `reserve` whose `max_wait` was shorter than the
/// round trip timed out, counted as a store failure and opened the breaker
/// for `probe_interval`, so the next caller, with a 30 s budget, got
/// `Unavailable` at once while Redis was healthy.
///
/// The slow round trip is a frozen server (`SIGSTOP`): no reply can come
/// within the short budget, whatever the machine's load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_budget_trips_the_breaker_for_everyone() {
    if !redis_server::available("a_short_budget_trips_the_breaker_for_everyone") {
        return;
    }
    let server = RedisServer::start();
    let retry_after = Duration::from_secs(7);
    let bucket = RedisBucket::builder(&server.url(), "impatient", shared_quota())
        .timeout(Duration::from_secs(1))
        // Long enough that a tripped breaker stays open through the test.
        .probe_interval(Duration::from_secs(60))
        .fail_policy(FailPolicy::FailClosed { retry_after })
        .build()
        .unwrap();
    // Connect and load the script first.
    assert_eq!(bucket.available().await, 5);

    server.signal("-STOP");
    let short = Duration::from_millis(2);
    let refused = tokio::time::timeout(HANG, bucket.reserve(1, short))
        .await
        .expect("a reserve never hangs");
    server.signal("-CONT");
    // The caller's refusal: rate limited, not "the store did not answer".
    assert_eq!(
        refused.unwrap_err(),
        ReserveError::RateLimited { retry_after: short }
    );
    let stats = bucket.stats();
    assert_eq!((stats.failures, stats.out_of_budget), (0, 1), "{stats:?}");

    // The breaker is closed: a patient caller is decided by Redis.
    let trips = stats.round_trips;
    let r = tokio::time::timeout(HANG, bucket.reserve(1, Duration::from_secs(30)))
        .await
        .expect("a reserve never hangs")
        .expect("redis is healthy");
    assert!(!r.is_fallback());
    assert_eq!(bucket.try_acquire(1).await, Ok(()));
    let stats = bucket.stats();
    assert_eq!(stats.round_trips - trips, 2, "{stats:?}");
    assert_eq!((stats.failures, stats.fallback), (0, 0), "{stats:?}");
}

/// The store timeout still opens the breaker: a `max_wait` longer than the
/// timeout does not turn a silent Redis into a rate limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_timeout_under_a_long_budget_still_opens_the_breaker() {
    if !redis_server::available("a_store_timeout_under_a_long_budget_still_opens_the_breaker") {
        return;
    }
    let server = RedisServer::start();
    let retry_after = Duration::from_secs(7);
    let bucket = RedisBucket::builder(&server.url(), "patient", shared_quota())
        .timeout(Duration::from_millis(50))
        .probe_interval(Duration::from_secs(60))
        .fail_policy(FailPolicy::FailClosed { retry_after })
        .build()
        .unwrap();
    assert_eq!(bucket.available().await, 5);
    server.signal("-STOP");
    let first = tokio::time::timeout(HANG, bucket.reserve(1, Duration::from_secs(1))).await;
    let trips = bucket.stats().round_trips;
    // Skipped: the breaker is open.
    let second = tokio::time::timeout(HANG, bucket.try_acquire(1)).await;
    server.signal("-CONT");
    assert_eq!(
        first.expect("a reserve never hangs").unwrap_err(),
        ReserveError::Unavailable { retry_after }
    );
    assert_eq!(
        second.expect("a decision never hangs"),
        Err(CheckError::Unavailable { retry_after })
    );
    let stats = bucket.stats();
    assert_eq!((stats.failures, stats.out_of_budget), (2, 0), "{stats:?}");
    assert_eq!(stats.round_trips, trips);
}

/// A `max_wait` on a manual clock was also a real-time timeout on the
/// round trip, so `lua_decisions_match_the_local_bucket` refused at random
/// under load (a 1 ms budget against a slow round trip). On an explicit
/// clock only the store timeout bounds the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_clock_budget_timed_out_in_real_time() {
    if !redis_server::available("a_manual_clock_budget_timed_out_in_real_time") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let bucket = RedisBucket::builder(&server.url(), "manual", shared_quota())
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert_eq!(bucket.available().await, 5);
    server.signal("-STOP");
    let reserve = tokio::spawn(async move {
        let r = bucket.reserve(1, Duration::from_millis(1)).await;
        (r.map(|r| r.wait()), bucket.stats())
    });
    // Long past the 1 ms of real time, none of the manual clock.
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.signal("-CONT");
    let (r, stats) = reserve.await.unwrap();
    assert_eq!(r, Ok(Duration::ZERO));
    assert_eq!((stats.failures, stats.out_of_budget), (0, 0), "{stats:?}");
}

/// Issue #10 item 6: `timeout(Duration::ZERO)` was accepted (every call
/// fails), and `timeout(Duration::MAX)` too, which waits forever on a
/// server that accepts and never answers.
#[test]
fn timeout_accepts_zero_and_duration_max() {
    let build = |timeout| {
        RedisBucket::builder("redis://127.0.0.1/", "k", shared_quota())
            .timeout(timeout)
            .build()
    };
    let max = RedisBucketBuilder::MAX_TIMEOUT;
    for bad in [Duration::ZERO, max + Duration::from_nanos(1), Duration::MAX] {
        let err = build(bad).unwrap_err();
        assert!(
            err.to_string().starts_with("invalid timeout"),
            "{bad:?}: {err}"
        );
    }
    for good in [Duration::from_nanos(1), Duration::from_millis(50), max] {
        assert!(build(good).is_ok(), "{good:?}");
    }
}

/// Issue #10 item 6: a key holding garbage (`t = 1e300`) replied a wait
/// that does not fit an integer, read as a denial with `wait: 0ns`, a
/// retry-now spin; `abc` or `-1` read as a full bucket. The script now
/// repairs such a key to an empty bucket: a denial with a real wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_key_reads_as_a_zero_wait_denial() {
    if !redis_server::available("a_corrupted_key_reads_as_a_zero_wait_denial") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let period = Duration::from_millis(20); // shared_quota(): 50/s, burst 5
    let garbage: &[&[&str]] = &[
        &["HSET", "{k}", "t", "1e300"],
        &["HSET", "{k}", "t", "-1e300"],
        &["HSET", "{k}", "t", "abc"],
        &["HSET", "{k}", "t", "-1"],
        &["HSET", "{k}", "t", "1.5"],
        &["HSET", "{k}", "t", "inf"],
        &["HSET", "{k}", "t", "nan"],
        &["HSET", "{k}", "t", "0", "p", "1e300"],
        &["SET", "{k}", "garbage"],
    ];
    for (i, cmd) in garbage.iter().enumerate() {
        let key = format!("corrupt-{i}");
        let cmd: Vec<&str> = cmd
            .iter()
            .map(|a| if *a == "{k}" { key.as_str() } else { a })
            .collect();
        assert!(server.command(&cmd).is_some(), "{cmd:?}");
        let bucket = RedisBucket::builder(&server.url(), key.as_str(), shared_quota())
            .clock(clock.clone())
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        // An empty bucket: the next cell in one period; nothing else fits.
        assert_eq!(
            bucket.try_acquire(1).await,
            Err(CheckError::NotUntil { wait: period }),
            "{cmd:?}"
        );
        assert_eq!(
            bucket
                .reserve(1, Duration::from_millis(10))
                .await
                .unwrap_err(),
            ReserveError::RateLimited {
                retry_after: period
            },
            "{cmd:?}"
        );
        assert_eq!(bucket.available().await, 0, "{cmd:?}");
        assert_eq!(bucket.stats().failures, 0, "{cmd:?}");
        // The key was rewritten as a hash with a sane (7-digit, about
        // 1.1 * 10^6 µs) tat, and refills from there.
        assert_eq!(server.command(&["TYPE", &key]).as_deref(), Some("+hash"));
        let t = server.command(&["HGET", &key, "t"]).unwrap();
        assert_eq!(t, "$7", "{cmd:?}: tat of {t} bytes");
        clock.advance(period);
        assert_eq!(bucket.try_acquire(1).await, Ok(()), "{cmd:?}");
        assert!(bucket.try_acquire(1).await.is_err(), "{cmd:?}");
        clock.advance(4 * period);
    }
}

// ---------------------------------------------------------------------------
// Script correctness: the Lua decisions against the local bucket, on one
// manual clock.

#[derive(Clone, Copy, Debug)]
enum Step {
    Acquire(u32),
    /// n, max_wait in ms.
    Reserve(u32, u64),
    /// Cancel the i-th reservation still held (modulo their number).
    Cancel(usize),
    /// Penalize for ms. Held reservations are dropped first (see below).
    Penalize(u64),
    Available,
    /// Advance the clock by µs.
    Advance(u64),
    /// `set_quota(requotas()[i])` on both.
    SetQuota(usize),
    /// `reset` on both.
    Reset,
}

/// The quotas `Step::SetQuota` switches between (µs-exact periods).
fn requotas() -> [Quota; 4] {
    [
        shared_quota(),
        Quota::with_period(Duration::from_millis(7)).allow_burst(nz(3)),
        Quota::per_second(nz(1)),
        Quota::with_period(Duration::from_micros(250)).allow_burst(nz(10)),
    ]
}

/// Runs `steps` on a local bucket and on Redis; every answer must match.
///
/// One documented difference is kept out: Redis keeps a penalty through a
/// refund (the `p` field), the local bucket lets a cancel lower `tat` below
/// a penalty that did not raise it. So a penalty drops the reservations
/// held before it.
///
/// And one rounding: `set_quota` converts the debt with a ceiling, in
/// nanoseconds locally and in microseconds in Redis, so each quota change
/// may leave a Redis wait up to 1 µs longer (never shorter: the safe
/// side), and the difference so far, being debt in cells, scales with the
/// period at the next change. Waits are compared within that slack.
async fn compare(server: &RedisServer, key: &str, quota: Quota, steps: &[Step]) {
    let clock = ManualClock::starting_at(1_000_000_000);
    let local = TokenBucket::with_clock(quota, clock.clone());
    let remote = RedisBucket::builder(&server.url(), key, quota)
        .clock(clock.clone())
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut held = Vec::new();
    let mut slack = Duration::ZERO;
    let close = |l: Duration, r: Duration, slack: Duration, at: &str| {
        assert!(l <= r && r <= l + slack, "{at}: local {l:?}, redis {r:?}");
    };
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{key} step {i} {step:?}");
        match *step {
            Step::Acquire(n) => match (local.try_acquire(n), remote.try_acquire(n).await) {
                (Err(CheckError::NotUntil { wait: l }), Err(CheckError::NotUntil { wait: r })) => {
                    close(l, r, slack, &at)
                }
                (l, r) => assert_eq!(l, r, "{at}"),
            },
            Step::Reserve(n, ms) => {
                let max = Duration::from_millis(ms);
                match (local.reserve(n, max), remote.reserve(n, max).await) {
                    (Ok(l), Ok(r)) => {
                        close(l.wait(), r.wait(), slack, &at);
                        held.push((l, r));
                    }
                    (
                        Err(ReserveError::RateLimited { retry_after: l }),
                        Err(ReserveError::RateLimited { retry_after: r }),
                    ) => close(l, r, slack, &at),
                    (l, r) => assert_eq!(l.map(|_| ()), r.map(|_| ()), "{at}"),
                }
            }
            Step::Cancel(j) if !held.is_empty() => {
                let (l, r) = held.remove(j % held.len());
                assert_eq!(l.cancel(), r.cancel().await, "{at}");
            }
            Step::Cancel(_) => {}
            Step::Penalize(ms) => {
                // Dropped as used: a local reservation's drop keeps its
                // cells, a Redis one's before its wait would give them back.
                for (_, r) in held.drain(..) {
                    r.keep();
                }
                local.penalize(Duration::from_millis(ms));
                remote.penalize(Duration::from_millis(ms)).await;
            }
            Step::Available => {
                assert_eq!(local.available(), remote.available().await, "{at}");
            }
            Step::Advance(us) => clock.advance(Duration::from_micros(us)),
            Step::SetQuota(i) => {
                let q = requotas()[i % 4];
                let old = local.quota();
                if q != old {
                    // The slack so far is cells' worth of debt: it scales
                    // with the period (never below itself: a hold's part
                    // is kept as time), plus this change's rounding.
                    let ratio = q.period().as_secs_f64() / old.period().as_secs_f64();
                    slack = slack.mul_f64(ratio.max(1.0)) + Duration::from_micros(1);
                }
                local.set_quota(q);
                remote.set_quota(q).await.unwrap();
                assert_eq!(local.quota(), remote.quota(), "{at}");
            }
            Step::Reset => {
                local.reset();
                remote.reset().await.unwrap();
            }
        }
    }
    assert_eq!(remote.stats().failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_decisions_match_the_local_bucket() {
    if !redis_server::available("lua_decisions_match_the_local_bucket") {
        return;
    }
    let server = RedisServer::start();
    use Step::*;
    let tables: &[(&str, Quota, &[Step])] = &[
        (
            "burst-then-period",
            shared_quota(),
            &[
                Available,
                Acquire(5),
                Acquire(1),
                Available,
                Advance(19_999),
                Acquire(1),
                Advance(1),
                Acquire(1),
                Acquire(6),
                Acquire(0),
            ],
        ),
        (
            "reserve-edges",
            Quota::per_second(nz(2)),
            &[
                Acquire(2),
                Reserve(1, 499),
                Reserve(1, 500),
                Reserve(1, 999),
                Reserve(1, 1000),
                Cancel(0),
                Cancel(0),
                Reserve(1, 1000),
                Reserve(3, 10_000),
                Available,
            ],
        ),
        (
            "penalty",
            Quota::per_second(nz(10)),
            &[
                Acquire(3),
                Penalize(2_000),
                Acquire(1),
                Reserve(1, 1_999),
                Advance(2_000_000),
                Acquire(1),
                Acquire(1),
                Advance(100_000),
                Available,
                Penalize(10),
                Acquire(1),
            ],
        ),
    ];
    for (key, quota, steps) in tables {
        compare(&server, key, *quota, steps).await;
    }

    // Seeded random sequences over a few quotas, with µs-exact periods,
    // switching between them (`set_quota`: debt kept in cells) and
    // resetting now and then.
    let quotas = requotas();
    for (q, quota) in quotas.iter().enumerate() {
        let mut rng = fastrand::Rng::with_seed(q as u64);
        let burst = quota.burst().get();
        let period = quota.period().as_micros() as u64;
        let steps: Vec<Step> = (0..300)
            .map(|_| match rng.u8(0..10) {
                0..=2 => Acquire(rng.u32(0..=burst + 1)),
                3..=4 => Reserve(
                    rng.u32(1..=burst),
                    rng.u64(0..=3 * period * burst as u64 / 1000),
                ),
                5 => Cancel(rng.usize(0..4)),
                6 if rng.u8(0..5) == 0 => Penalize(rng.u64(0..=2 * period / 1000 + 1)),
                7 => Available,
                8 if rng.u8(0..3) == 0 => SetQuota(rng.usize(0..4)),
                9 if rng.u8(0..8) == 0 => Reset,
                _ => Advance(rng.u64(0..=2 * period)),
            })
            .collect();
        compare(&server, &format!("random-{q}"), *quota, &steps).await;
    }
}

/// Issue #62: a store whose scripts may not call `TIME` (as ElastiCache
/// Serverless refuses it): on Redis's clock every decision fails; on the
/// processes' wall clock the key keeps its quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_time_is_served_on_the_wall_clock() {
    if !redis_server::available("a_store_that_refuses_time_is_served_on_the_wall_clock") {
        return;
    }
    let server = RedisServer::start_with(&["--rename-command", "TIME", ""]);
    // A cell a minute: no refill while the test runs.
    let quota = Quota::per_minute(nz(1)).allow_burst(nz(5));
    let on_time = RedisBucket::builder(&server.url(), "no-time:a", quota)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    assert!(
        matches!(
            on_time.try_acquire(1).await,
            Err(CheckError::Unavailable { .. })
        ),
        "the script's TIME is refused: fail closed"
    );
    // Two processes' buckets on one key, each on its wall clock.
    let fleet: Vec<RedisBucket> = (0..2)
        .map(|_| {
            RedisBucket::builder(&server.url(), "no-time:b", quota)
                .timeout(Duration::from_secs(1))
                .wall_clock()
                .build()
                .unwrap()
        })
        .collect();
    let (a, b) = (take_all(&fleet[0]).await, take_all(&fleet[1]).await);
    assert_eq!((a, b), (5, 0), "one burst for the key, shared");
    assert_eq!(fleet[0].stats().failures + fleet[1].stats().failures, 0);
}

/// Issue #62, item 4: a settle whose reply was lost (the server frozen past
/// the store timeout: the request may still run once it thaws) is sent
/// again with the next round trip and applied once, whichever copy Redis
/// runs first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_whose_reply_was_lost_is_applied_once() {
    if !redis_server::available("a_settle_whose_reply_was_lost_is_applied_once") {
        return;
    }
    let server = RedisServer::start();
    // A cell a minute, a burst of 100: no refill while the test runs.
    let quota = Quota::per_minute(nz(1)).allow_burst(nz(100));
    let bucket = RedisBucket::builder(&server.url(), "settle:once", quota)
        .timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_millis(1))
        .build()
        .unwrap();
    bucket.try_acquire(10).await.unwrap();
    assert_eq!(bucket.available().await, 90);
    server.signal("-STOP");
    bucket.charge(5).await;
    bucket.refund(2).await;
    assert!(bucket.stats().failures >= 2, "both timed out");
    server.signal("-CONT");
    for _ in 0..3 {
        assert_eq!(bucket.available().await, 87, "+5 and -2, each once");
    }
}

/// A settle that never reached Redis (down, then back empty) goes with the
/// next round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_redis_never_saw_is_sent_again() {
    if !redis_server::available("a_settle_redis_never_saw_is_sent_again") {
        return;
    }
    let mut server = RedisServer::start();
    let quota = Quota::per_minute(nz(1)).allow_burst(nz(100));
    let bucket = RedisBucket::builder(&server.url(), "settle:lost", quota)
        .timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_millis(1))
        .build()
        .unwrap();
    assert_eq!(bucket.available().await, 100);
    server.stop();
    bucket.charge(5).await;
    bucket.refund(2).await;
    assert!(bucket.stats().failures >= 2);
    server.restart();
    assert_eq!(
        bucket.available().await,
        97,
        "both settles, sent again in order"
    );
    assert_eq!(bucket.available().await, 97, "once");
}

/// A writer's applied sequence is only advice: one raised by someone who
/// can write the key (to skip every later settle) is taken as none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_settle_sequence_skips_nothing() {
    if !redis_server::available("a_forged_settle_sequence_skips_nothing") {
        return;
    }
    let server = RedisServer::start();
    let quota = Quota::per_minute(nz(1)).allow_burst(nz(100));
    let bucket = RedisBucket::builder(&server.url(), "settle:forged", quota)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    bucket.charge(5).await;
    assert_eq!(bucket.available().await, 95);
    // The writer's field is the key's one `w<id>`: raise it far past.
    let mut conn = redis::Client::open(server.url()).unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg("settle:forged")
        .query(&mut conn)
        .unwrap();
    let writer = fields
        .iter()
        .find(|f| f.starts_with('w'))
        .expect("the writer's field");
    let _: () = redis::cmd("HSET")
        .arg("settle:forged")
        .arg(writer)
        .arg("1000000000000")
        .query(&mut conn)
        .unwrap();
    bucket.charge(5).await;
    assert_eq!(bucket.available().await, 90, "the next charge is applied");
}
