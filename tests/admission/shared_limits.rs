//! Learned limits shared (issue #43 item 2): a limit one process is told
//! by the server becomes the shared quota every process admits against,
//! stored once however many processes are told it, and a weighted quota
//! one process sees spent is held for every process. Each "process" is an
//! `Admission` of its own; the shared limiter is a `TokenBucket` on a
//! manual clock behind a wrapper that counts the quotas stored in it (a
//! `RedisBucket` stores them in its key: `tests/redis_quotas`).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backpressure::admission::{Admission, CallSpec};
use backpressure::headers::ServerHint;
use backpressure::{
    CheckError, ManualClock, Quota, RateLimiter, ReserveError, Status, TokenBucket,
};
use futures::executor::block_on;

/// A shared limiter that counts the quotas stored in it, on a clock of
/// its own.
struct Counted {
    bucket: TokenBucket<ManualClock>,
    clock: ManualClock,
    stored: AtomicU32,
}

impl RateLimiter for Counted {
    async fn try_acquire(&self, n: u32) -> Result<(), CheckError> {
        self.bucket.try_acquire(n)
    }
    async fn reserve(&self, n: u32, max_wait: Duration) -> Result<Duration, ReserveError> {
        RateLimiter::reserve(&self.bucket, n, max_wait).await
    }
    async fn penalize(&self, retry_after: Duration) {
        self.bucket.penalize(retry_after);
    }
    async fn available(&self) -> u32 {
        self.bucket.available()
    }
    async fn charge(&self, n: u32) {
        RateLimiter::charge(&self.bucket, n).await;
    }
    async fn refund(&self, n: u32) {
        RateLimiter::refund(&self.bucket, n).await;
    }
    fn quota(&self) -> Option<Quota> {
        Some(self.bucket.quota())
    }
    async fn set_quota(&self, quota: Quota) {
        self.stored.fetch_add(1, Ordering::Relaxed);
        self.bucket.set_quota(quota);
    }
}

fn counted(quota: Quota) -> Arc<Counted> {
    let clock = ManualClock::new();
    Arc::new(Counted {
        bucket: TokenBucket::with_clock(quota, clock.clone()),
        clock,
        stored: AtomicU32::new(0),
    })
}

fn stored(limiter: &Counted) -> u32 {
    limiter.stored.load(Ordering::Relaxed)
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

type Layer = Admission<ManualClock, ManualClock>;

/// A process keeping the key's request quota in `requests` and its
/// tokens in `tokens` (whose limit it leaves to the server, unless
/// `tokens_limit` configures one), with adaptive rates unless `fixed`.
fn process(
    requests: &Arc<Counted>,
    tokens: &Arc<Counted>,
    tokens_limit: Option<Quota>,
    fixed: bool,
) -> Layer {
    let clock = ManualClock::new();
    let mut b = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock)
        .inline_wait(Duration::ZERO)
        .shared_quota("key", requests.clone())
        .shared_resource("key", "tokens", tokens.clone());
    if let Some(q) = tokens_limit {
        b = b.resource("tokens", q);
    }
    if fixed {
        b = b.fixed_rates();
    }
    b.build()
}

/// Two processes of the fleet of `a_limit_one_process_is_told_...`.
fn learning(requests: &Arc<Counted>, tokens: &Arc<Counted>) -> Layer {
    process(requests, tokens, None, false)
}

fn complete(tokens: u32) -> CallSpec {
    CallSpec::new("complete", "key").cost("tokens", tokens)
}

/// The server's statement: 60 requests and 120,000 tokens a minute.
fn stated() -> ServerHint {
    ServerHint::from_headers(
        [(
            "ratelimit-policy",
            r#""requests";q=60;w=60, "tokens";q=120000;w=60"#,
        )],
        SystemTime::now(),
    )
}

#[test]
fn a_limit_one_process_is_told_becomes_every_processs_quota() {
    // Both processes start from a guess far above the key's limits.
    let requests = counted(per_minute(6_000));
    let tokens = counted(per_minute(6_000_000));
    let (a, b) = (learning(&requests, &tokens), learning(&requests, &tokens));
    let ticket = block_on(a.admit(&complete(1_000))).unwrap();
    ticket.observe(200, &stated());
    assert_eq!(stored(&requests), 0, "queued: observe cannot await");
    block_on(a.sync_shared());
    // Stored, with a second's worth of burst: the server enforces its
    // minute's limits a second at a time.
    assert_eq!(requests.bucket.quota(), Quota::new(1.0, 1).unwrap());
    assert_eq!(tokens.bucket.quota(), Quota::new(2_000.0, 2_000).unwrap());
    // B was told nothing and admits against the stored limits: A's 1,000
    // tokens are taken from the second's 2,000.
    requests.clock.advance(Duration::from_secs(1));
    let refused = block_on(b.admit(&complete(1_500))).unwrap_err();
    assert_eq!(refused.status, Status::RateLimited);
    assert_eq!(refused.scope, "quota:tokens");
    assert_eq!(
        refused.retry_after_ms,
        Some(250),
        "500 tokens at 2,000 a second"
    );
    drop(ticket);
}

#[test]
fn processes_told_the_same_limit_store_it_once() {
    let requests = counted(per_minute(6_000));
    let tokens = counted(per_minute(6_000_000));
    let (a, b) = (learning(&requests, &tokens), learning(&requests, &tokens));
    let first = block_on(a.admit(&complete(1_000))).unwrap();
    let second = block_on(b.admit(&complete(1_000))).unwrap();
    first.observe(200, &stated());
    block_on(a.sync_shared());
    assert_eq!((stored(&requests), stored(&tokens)), (1, 1));
    let left = tokens.bucket.available();
    // B is told the same numbers: the quota in force already says them.
    second.observe(200, &stated());
    block_on(b.sync_shared());
    first.observe(200, &stated());
    block_on(a.sync_shared());
    assert_eq!(
        (stored(&requests), stored(&tokens)),
        (1, 1),
        "nothing stored twice"
    );
    assert_eq!(tokens.bucket.available(), left);
}

#[test]
fn a_configured_shared_quota_is_only_lowered_and_a_fixed_one_kept() {
    // The operator leaves part of the key's tokens to others (60,000 of
    // 120,000 a minute), with a local limit configured for them.
    let requests = counted(per_minute(30));
    let tokens = counted(per_minute(60_000));
    let a = process(&requests, &tokens, Some(per_minute(60_000)), false);
    let t = block_on(a.admit(&complete(100))).unwrap();
    t.observe(200, &stated());
    block_on(a.sync_shared());
    assert_eq!(stored(&tokens), 0, "120,000 stated: 60,000 left alone");
    assert_eq!(tokens.bucket.quota(), per_minute(60_000));
    // Told less than configured: lowered, keeping its burst (up to the
    // limit).
    let lower = ServerHint::from_headers(
        [("ratelimit-policy", r#""tokens";q=30000;w=60"#)],
        SystemTime::now(),
    );
    t.observe(200, &lower);
    block_on(a.sync_shared());
    assert_eq!(tokens.bucket.quota(), Quota::new(500.0, 30_000).unwrap());
    // Adaptive rates follow the request limit the server states, up too.
    assert_eq!(requests.bucket.quota(), Quota::new(1.0, 1).unwrap());

    // Fixed rates keep a shared request quota fixed, as a local one.
    let requests = counted(per_minute(30));
    let fixed = process(&requests, &tokens, Some(per_minute(60_000)), true);
    block_on(fixed.admit(&complete(100)))
        .unwrap()
        .observe(200, &stated());
    block_on(fixed.sync_shared());
    assert_eq!(
        (stored(&requests), requests.bucket.quota()),
        (0, per_minute(30))
    );
    drop(t);
}

#[test]
fn spent_tokens_seen_by_one_process_hold_every_process() {
    let requests = counted(per_minute(6_000));
    let tokens = counted(per_minute(120_000));
    let (a, b) = (learning(&requests, &tokens), learning(&requests, &tokens));
    let ticket = block_on(a.admit(&complete(1_000))).unwrap();
    let spent = ServerHint::from_headers(
        [
            ("ratelimit-policy", r#""tokens";q=120000;w=60"#),
            ("ratelimit", r#""tokens";r=0;t=20"#),
        ],
        SystemTime::now(),
    );
    assert_eq!(ticket.observe(429, &spent), Some(Duration::from_secs(20)));
    // The next admit of A pushes the hold before it reserves: refused for
    // the hold's 20 s, as B is afterwards, though B was told nothing.
    let held = block_on(a.admit(&complete(10))).unwrap_err();
    assert_eq!(held.scope, "quota:tokens");
    let other = block_on(b.admit(&complete(10))).unwrap_err();
    assert_eq!(
        (other.status, other.scope.as_str()),
        (Status::RateLimited, "quota:tokens")
    );
    // The hold, then its 10 tokens at 2,000 a second.
    assert_eq!(other.retry_after_ms, Some(20_005));
    // The request quota is not held: only the tokens are spent.
    assert!(requests.bucket.available() > 0);
    drop(ticket);
}

/// Issue #59 item 5: a resolver that panicked for one credential made
/// `stats()` panic for every caller. Its credential's calls are refused
/// now, and say why; the others go on.
#[test]
fn no_resolver_panic_reaches_other_credentials() {
    let panicking = Admission::builder()
        .shared_quotas(|credential: &str| {
            assert_ne!(credential, "broken", "the resolver's own bug");
            None::<Arc<TokenBucket>>
        })
        .build();
    block_on(async {
        let refused = panicking
            .admit(&CallSpec::new("t", "broken"))
            .await
            .unwrap_err();
        assert_eq!(refused.status, Status::Unavailable);
        assert!(refused.hint.contains("panicked"), "{}", refused.hint);
        assert!(panicking.admit(&CallSpec::new("t", "fine")).await.is_ok());
    });
    // Every credential's stats, the broken one's included.
    assert!(panicking.stats().credentials.len() >= 2);
}
