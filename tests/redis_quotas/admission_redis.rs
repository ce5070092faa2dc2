//! `Admission` with a credential shared across processes through Redis
//! (feature `redis`): two admission layers (two "processes", separate
//! connections) on one API key stay within the key's quota together, and a
//! 429 seen by one holds back the other.
#![cfg(all(feature = "redis", feature = "tokio"))]

use crate::redis_server;

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use backpressure::admission::{Admission, CallSpec};
use backpressure::headers::ServerHint;
use backpressure::Status;
use backpressure::{DefaultSleeper, FailPolicy, ManualClock, Quota, RedisBucket};
use redis_server::RedisServer;

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(50).unwrap()).allow_burst(NonZeroU32::new(5).unwrap())
}

fn admission(server: &RedisServer) -> Admission<DefaultSleeper> {
    let bucket = RedisBucket::builder(&server.url(), "org-key", quota())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    Admission::builder()
        .sleeper(DefaultSleeper::new())
        .global_concurrency(64)
        .default_tool(64, backpressure::admission::SlotPolicy::Wait)
        .shared_quota("org-key", bucket)
        .inline_wait(Duration::ZERO)
        .build()
}

/// A layer on `clock` (its rates and the shared bucket's calls alike),
/// keeping `org-key`'s request rate in Redis.
fn manual_admission(
    server: &RedisServer,
    clock: &ManualClock,
) -> Admission<ManualClock, ManualClock> {
    let bucket = RedisBucket::builder(&server.url(), "org-key", quota())
        .clock(clock.clone())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .global_concurrency(64)
        .default_tool(64, backpressure::admission::SlotPolicy::Wait)
        .shared_quota("org-key", bucket)
        .inline_wait(Duration::ZERO)
        .build()
}

/// Admits until refused (always `rate_limited`); returns the number
/// admitted.
async fn admit_all(adm: &Admission<ManualClock, ManualClock>) -> u64 {
    let mut admitted = 0;
    loop {
        match adm.admit(&CallSpec::new("search", "org-key")).await {
            Ok(ticket) => {
                admitted += 1;
                drop(ticket);
            }
            Err(t) => {
                assert_eq!(t.status, Status::RateLimited, "{t}");
                return admitted;
            }
        }
    }
}

/// Two layers (separate connections) on one shared `ManualClock`, both
/// admitting every millisecond for 1.5 s of it, each until refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admissions_share_one_key_within_its_quota() {
    if !redis_server::available("two_admissions_share_one_key_within_its_quota") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let (a, b) = (
        manual_admission(&server, &clock),
        manual_admission(&server, &clock),
    );
    const STEPS: u64 = 1500;
    let (mut x, mut y) = (0, 0);
    for step in 0..STEPS {
        // A cell every 20 ms: each asks first for every other one.
        if step / 20 % 2 == 0 {
            let (dx, dy) = tokio::join!(admit_all(&a), admit_all(&b));
            (x, y) = (x + dx, y + dy);
        } else {
            let (dy, dx) = tokio::join!(admit_all(&b), admit_all(&a));
            (x, y) = (x + dx, y + dy);
        }
        clock.advance(Duration::from_millis(1));
    }
    let admitted = x + y;
    // burst + rate * 1.5 s (the 1500th ms is not reached).
    let bound = 5 + STEPS / 20;
    assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
    // And the shared quota is really used (not refusing everything), by
    // both.
    assert!(admitted >= bound / 2, "admitted only {admitted} of {bound}");
    println!("redis, two layers: {admitted} admitted ({x} and {y}) of {bound}");
    assert!(x > 0 && y > 0, "admitted {x} and {y}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_seen_by_one_process_holds_back_the_other() {
    if !redis_server::available("a_429_seen_by_one_process_holds_back_the_other") {
        return;
    }
    let server = RedisServer::start();
    let (a, b) = (admission(&server), admission(&server));
    // B can call before.
    drop(b.admit(&CallSpec::new("search", "org-key")).await.unwrap());
    let ticket = a.admit(&CallSpec::new("search", "org-key")).await.unwrap();
    let hint = ServerHint::from_headers([("retry-after", "2")], SystemTime::now());
    ticket.observe(429, &hint);
    drop(ticket);
    a.sync_shared().await;
    let refused = b
        .admit(&CallSpec::new("get_usage", "org-key"))
        .await
        .unwrap_err();
    assert_eq!(refused.status, Status::RateLimited);
    assert_eq!(refused.scope, "api_key");
    let ms = refused.retry_after_ms.unwrap();
    assert!((1_000..=2_000).contains(&ms), "retry after {ms} ms");
}

/// Issue #10 item 7: `ReserveError::retry_after()` ignored `Unavailable`,
/// so a shared-quota outage reached callers as `rate_limited` with
/// `retry_after_ms: None`, dropping the configured wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_quota_outage_drops_the_configured_retry_after() {
    if !redis_server::available("a_shared_quota_outage_drops_the_configured_retry_after") {
        return;
    }
    // A port nothing listens on any more: every call is refused at once.
    let mut server = RedisServer::start();
    server.stop();
    let bucket = RedisBucket::builder(&server.url(), "org-key", quota())
        .timeout(Duration::from_millis(500))
        .fail_policy(FailPolicy::FailClosed {
            retry_after: Duration::from_millis(250),
        })
        .build()
        .unwrap();
    let admission = Admission::builder()
        .sleeper(DefaultSleeper::new())
        .shared_quota("org-key", bucket)
        .inline_wait(Duration::ZERO)
        .build();
    let refused = admission
        .admit(&CallSpec::new("search", "org-key"))
        .await
        .unwrap_err();
    assert_eq!(refused.status, Status::RateLimited, "{refused}");
    assert_eq!(refused.scope, "api_key");
    assert_eq!(refused.retry_after_ms, Some(250), "{refused}");
}

/// Issue #10 item 5, through `Admission::shared_quota`: one call with a
/// deadline shorter than the Redis round trip opened the breaker, and the
/// next calls, with their full 30 s, were refused with "the shared quota
/// store did not answer" while Redis was healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_impatient_call_fails_the_next_ones_on_a_shared_quota() {
    if !redis_server::available("one_impatient_call_fails_the_next_ones_on_a_shared_quota") {
        return;
    }
    let server = RedisServer::start();
    let bucket = RedisBucket::builder(&server.url(), "org-key", quota())
        .timeout(Duration::from_secs(1))
        // A tripped breaker would stay open through the test.
        .probe_interval(Duration::from_secs(60))
        .fail_policy(FailPolicy::FailClosed {
            retry_after: Duration::from_secs(7),
        })
        .build()
        .unwrap();
    let admission = Admission::builder()
        .sleeper(DefaultSleeper::new())
        .shared_quota("org-key", bucket)
        .build();
    // Connected, script loaded.
    drop(
        admission
            .admit(&CallSpec::new("search", "org-key"))
            .await
            .unwrap(),
    );

    // A frozen server: no reply can come within 2 ms.
    server.signal("-STOP");
    let impatient = CallSpec::new("search", "org-key").deadline(Duration::from_millis(2));
    let refused = admission.admit(&impatient).await.unwrap_err();
    server.signal("-CONT");
    assert_eq!(refused.status, Status::RateLimited, "{refused}");
    assert!(!refused.to_string().contains("did not answer"), "{refused}");

    for _ in 0..3 {
        let ticket = admission.admit(&CallSpec::new("search", "org-key")).await;
        drop(ticket.expect("redis is healthy: the next calls are admitted"));
    }
}

/// Per-tenant shared quotas: every credential's bucket comes from one
/// `RedisScoped` (one connection), and two admission layers on it keep each
/// tenant within its own quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_a_redis_scoped_each_keep_their_own_quota() {
    if !redis_server::available("credentials_from_a_redis_scoped_each_keep_their_own_quota") {
        return;
    }
    let server = RedisServer::start();
    let tenants = ["acme", "globex", "initech"];
    let build = || {
        let scoped = backpressure::RedisScoped::<&str>::builder(&server.url(), "tenant:", quota())
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let mut b = Admission::builder()
            .sleeper(DefaultSleeper::new())
            .global_concurrency(64)
            .default_tool(64, backpressure::admission::SlotPolicy::Wait)
            .inline_wait(Duration::ZERO);
        for t in tenants {
            b = b.shared_quota(t, scoped.bucket(&t));
        }
        b.build()
    };
    let (a, b) = (build(), build());
    // Burst 5 per tenant, shared by both layers: 5 admitted per tenant.
    for t in tenants {
        let mut admitted = 0;
        for adm in [&a, &b, &a, &b, &a, &b, &a, &b] {
            if let Ok(ticket) = adm.admit(&CallSpec::new("search", t)).await {
                admitted += 1;
                drop(ticket);
            }
        }
        assert!((5..=6).contains(&admitted), "{t}: {admitted}");
    }
}

/// Issue #15 item 2: every credential of a fleet admitted through Redis with
/// no builder call per key (`Builder::shared_quotas` over a `RedisScoped`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_scoped_resolves_every_tenant_without_a_builder_call_per_key() {
    if !redis_server::available(
        "a_redis_scoped_resolves_every_tenant_without_a_builder_call_per_key",
    ) {
        return;
    }
    let server = RedisServer::start();
    let build = || {
        let scoped =
            backpressure::RedisScoped::<String>::builder(&server.url(), "tenant:", quota())
                .timeout(Duration::from_millis(500))
                .build()
                .unwrap();
        Admission::builder()
            .sleeper(DefaultSleeper::new())
            .global_concurrency(64)
            .default_tool(64, backpressure::admission::SlotPolicy::Wait)
            .inline_wait(Duration::ZERO)
            .shared_quotas(move |credential| {
                Some(std::sync::Arc::new(scoped.bucket(&credential.to_string())))
            })
            .build()
    };
    let (a, b) = (build(), build());
    // Tenants never named to either builder; burst 5 each, shared by both.
    for t in ["t1", "t2", "t3", "t4"] {
        let mut admitted = 0;
        for adm in [&a, &b, &a, &b, &a, &b, &a, &b] {
            if let Ok(ticket) = adm.admit(&CallSpec::new("search", t)).await {
                admitted += 1;
                drop(ticket);
            }
        }
        assert!((5..=6).contains(&admitted), "{t}: {admitted}");
        // Shared: no local request bucket for it.
        assert_eq!(a.available(t, "requests"), None);
    }
}

/// A layer keeping `org-key`'s tokens in the Redis key `org-key:tokens`
/// (`quota` its own idea of it), on a connection of its own.
fn token_layer(
    server: &RedisServer,
    clock: &backpressure::ManualClock,
    quota: Quota,
) -> (std::sync::Arc<RedisBucket>, Admission) {
    let tokens = std::sync::Arc::new(
        RedisBucket::builder(&server.url(), "org-key:tokens", quota)
            .clock(clock.clone())
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    let layer = Admission::builder()
        .sleeper(DefaultSleeper::new())
        .fixed_rates()
        .shared_resource("org-key", "tokens", tokens.clone())
        .inline_wait(Duration::ZERO)
        .build();
    (tokens, layer)
}

/// Issue #43 item 1: a credential's tokens kept in Redis. Two layers
/// (separate connections) reserve their estimates in one key and settle
/// them there to the usage, both ways; on a manual clock, so the counts
/// are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admissions_settle_their_tokens_in_one_redis_key() {
    if !redis_server::available("two_admissions_settle_their_tokens_in_one_redis_key") {
        return;
    }
    let server = RedisServer::start();
    let clock = backpressure::ManualClock::new();
    let tpm = Quota::per_minute(NonZeroU32::new(10_000).unwrap());
    let ((ta, a), (tb, b)) = (
        token_layer(&server, &clock, tpm),
        token_layer(&server, &clock, tpm),
    );
    let spec = |n| CallSpec::new("complete", "org-key").cost("tokens", n);

    let mut first = a.admit(&spec(4_000)).await.unwrap();
    assert_eq!(tb.available().await, 6_000, "A's estimate, seen by B");
    let mut second = b.admit(&spec(5_000)).await.unwrap();
    assert_eq!(
        b.admit(&spec(2_000)).await.unwrap_err().scope,
        "quota:tokens"
    );
    assert_eq!(ta.available().await, 1_000, "the refusal took nothing");

    assert_eq!(first.settle("tokens", 1_000), -3_000);
    assert_eq!(second.settle("tokens", 5_500), 500);
    a.sync_shared().await;
    assert_eq!(
        tb.available().await,
        4_000,
        "A's refund landed, B's charge not yet"
    );
    b.sync_shared().await;
    assert_eq!(ta.available().await, 3_500);
    // Dropping the tickets changes nothing more: each settle went once.
    drop((first, second));
    a.sync_shared().await;
    b.sync_shared().await;
    assert_eq!(ta.available().await, 3_500);
}

/// Issue #43: every tenant's tokens in Redis with no builder call per key
/// (`Builder::shared_resources` over a `RedisScoped`): two layers on
/// connections of their own reserve and settle each tenant's tokens in
/// that tenant's key; on a manual clock, so the counts are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_scoped_keeps_every_tenants_tokens_without_a_builder_call_per_key() {
    if !redis_server::available(
        "a_redis_scoped_keeps_every_tenants_tokens_without_a_builder_call_per_key",
    ) {
        return;
    }
    let server = RedisServer::start();
    let clock = backpressure::ManualClock::new();
    let tpm = Quota::per_minute(NonZeroU32::new(10_000).unwrap());
    let scoped = || {
        backpressure::RedisScoped::<String>::builder(&server.url(), "tenant:", tpm)
            .clock(clock.clone())
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap()
    };
    let layer = || {
        let scoped = scoped();
        Admission::builder()
            .sleeper(DefaultSleeper::new())
            .fixed_rates()
            .inline_wait(Duration::ZERO)
            .shared_resources("tokens", move |credential| {
                Some(std::sync::Arc::new(
                    scoped.bucket(&format!("{credential}:tokens")),
                ))
            })
            .build()
    };
    let (a, b, watch) = (layer(), layer(), scoped());
    let left = |tenant: &str| {
        let bucket = watch.bucket(&format!("{tenant}:tokens"));
        async move { bucket.available().await }
    };
    let spec = |tenant: &str, n| CallSpec::new("complete", tenant).cost("tokens", n);

    let mut first = a.admit(&spec("t1", 4_000)).await.unwrap();
    assert_eq!(left("t1").await, 6_000, "A's estimate, in t1's key");
    assert_eq!(left("t2").await, 10_000, "t2's key untouched");
    assert_eq!(
        b.admit(&spec("t1", 7_000)).await.unwrap_err().scope,
        "quota:tokens",
        "B sees what A reserved"
    );
    let second = b.admit(&spec("t2", 7_000)).await.unwrap();
    assert_eq!(left("t2").await, 3_000);
    assert_eq!(first.settle("tokens", 1_000), -3_000);
    a.sync_shared().await;
    assert_eq!(left("t1").await, 9_000, "settled in t1's key");
    drop((first, second));
    assert_eq!(a.available("t1", "tokens"), None, "no local bucket for it");
}

/// Issue #43 item 2: a limit one layer is told is stored in the Redis key,
/// and the other layer (its own connection, told nothing) adopts it at its
/// next round trip; the same limit told again stores nothing new; tokens
/// one layer sees spent are held in Redis for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_one_admission_is_told_is_stored_in_the_redis_key_for_all() {
    if !redis_server::available("a_limit_one_admission_is_told_is_stored_in_the_redis_key_for_all")
    {
        return;
    }
    let server = RedisServer::start();
    let clock = backpressure::ManualClock::new();
    // A guess far above the key's 120,000 tokens a minute.
    let guess = Quota::per_minute(NonZeroU32::new(6_000_000).unwrap());
    let ((ta, a), (tb, b)) = (
        token_layer(&server, &clock, guess),
        token_layer(&server, &clock, guess),
    );
    let spec = |n| CallSpec::new("complete", "org-key").cost("tokens", n);
    let stated = ServerHint::from_headers(
        [("ratelimit-policy", r#""tokens";q=120000;w=60"#)],
        std::time::SystemTime::now(),
    );

    let first = a.admit(&spec(1_000)).await.unwrap();
    first.observe(200, &stated);
    a.sync_shared().await;
    // A second's worth of burst: the tokens' limit is the server's to say.
    let told = Quota::new(2_000.0, 2_000).unwrap();
    assert_eq!(ta.quota(), told);
    // B was told nothing: its next round trip brings it the stored quota
    // (A's 1,000 taken from the second's 2,000).
    let refused = b.admit(&spec(1_500)).await.unwrap_err();
    assert_eq!(refused.scope, "quota:tokens");
    assert_eq!(refused.retry_after_ms, Some(250));
    assert_eq!(tb.quota(), told);
    let stored_before = ta.stats().round_trips;
    // Told again, by both: the quota in force says it, nothing is sent.
    first.observe(200, &stated);
    a.sync_shared().await;
    b.observe("complete", "org-key", 200, &stated);
    b.sync_shared().await;
    assert_eq!(ta.stats().round_trips, stored_before);
    assert_eq!(tb.available().await, 1_000);

    // A sees the tokens spent for 20 s: B is held too.
    let spent = ServerHint::from_headers(
        [
            ("ratelimit-policy", r#""tokens";q=120000;w=60"#),
            ("ratelimit", r#""tokens";r=0;t=20"#),
        ],
        std::time::SystemTime::now(),
    );
    first.observe(429, &spent);
    a.sync_shared().await;
    let held = b.admit(&spec(10)).await.unwrap_err();
    assert_eq!(held.scope, "quota:tokens");
    let ms = held.retry_after_ms.unwrap();
    // The hold (less the time the round trips took), then its 10 tokens.
    assert!((19_000..=20_005).contains(&ms), "told {ms} ms");
    drop(first);
}
