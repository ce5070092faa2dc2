//! Weighted quotas kept in a shared limiter (issue #43 item 1): a call's
//! tokens reserved in the limiter every process shares, settled there to
//! the reported usage both ways, all or nothing with the request cell, and
//! given back when the call is refused or dropped. Each "process" is an
//! `Admission` of its own; the shared limiter is a `TokenBucket` on a
//! manual clock (a `RedisBucket` behaves alike: `tests/redis_quotas.rs`).

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use backpressure::admission::{Admission, CallSpec};
use backpressure::Status;
use backpressure::{ManualClock, Quota, TokenBucket};
use futures::executor::block_on;

type Shared = Arc<TokenBucket<ManualClock>>;
type Layer = Admission<ManualClock, ManualClock>;

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

/// A process on `tokens` (and on `requests`, if given), on its own clock.
fn process(tokens: &Shared, requests: Option<&Shared>) -> Layer {
    let clock = ManualClock::new();
    let b = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock)
        .fixed_rates()
        .inline_wait(Duration::from_secs(60))
        .shared_resource("key", "tokens", tokens.clone());
    match requests {
        Some(r) => b.shared_quota("key", r.clone()).build(),
        None => b.build(),
    }
}

fn left(limiter: &Shared) -> u32 {
    TokenBucket::available(limiter)
}

fn complete(tokens: u32) -> CallSpec {
    CallSpec::new("complete", "key")
        .cost("tokens", tokens)
        .deadline(Duration::from_secs(600))
}

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    f.poll(&mut Context::from_waker(&waker))
}

#[test]
fn two_processes_reserve_estimates_and_settle_to_the_usage_in_the_shared_quota() {
    let tokens: Shared = Arc::new(TokenBucket::with_clock(
        per_minute(10_000),
        ManualClock::new(),
    ));
    let (a, b) = (process(&tokens, None), process(&tokens, None));

    let mut first = block_on(a.admit(&complete(4_000))).unwrap();
    assert_eq!(
        left(&tokens),
        6_000,
        "the estimate is reserved where B sees it"
    );
    let second = block_on(b.admit(&complete(5_000))).unwrap();
    assert_eq!(left(&tokens), 1_000);
    // B cannot take what A reserved, even though A will use less.
    let refused = block_on(b.admit(&complete(2_000).deadline(Duration::ZERO))).unwrap_err();
    assert_eq!(refused.status, Status::RateLimited);
    assert_eq!(refused.scope, "quota:tokens");
    assert_eq!(left(&tokens), 1_000, "a refusal takes nothing");

    // A's reply used 1,000: 3,000 go back, after the push.
    assert_eq!(first.settle("tokens", 1_000), -3_000);
    assert_eq!(
        left(&tokens),
        1_000,
        "queued, not sent: settle cannot await"
    );
    block_on(a.sync_shared());
    assert_eq!(left(&tokens), 4_000);
    block_on(a.sync_shared());
    assert_eq!(left(&tokens), 4_000, "sent once");

    // A settles again, higher: 1,500 more charged; then lower: given back.
    assert_eq!(first.settle("tokens", 2_500), 1_500);
    assert_eq!(first.settle("tokens", 2_000), -500);
    block_on(a.sync_shared());
    assert_eq!(left(&tokens), 3_000, "the net of the two, 1,000 more");
    // The local bucket of the name is not the quota: the layer says so.
    assert_eq!(a.available("key", "tokens"), None);
    drop((first, second));
}

#[test]
fn a_usage_above_the_estimate_is_charged_before_the_next_call_of_the_process() {
    let tokens: Shared = Arc::new(TokenBucket::with_clock(
        per_minute(10_000),
        ManualClock::new(),
    ));
    let a = process(&tokens, None);
    let mut ticket = block_on(a.admit(&complete(1_000))).unwrap();
    assert_eq!(ticket.settle("tokens", 7_000), 6_000);
    drop(ticket);
    assert_eq!(left(&tokens), 9_000);
    // The next admit on the credential pushes the charge first, so it
    // sees 3,000 left, not 9,000.
    let refused = block_on(a.admit(&complete(4_000).deadline(Duration::ZERO))).unwrap_err();
    assert_eq!(refused.status, Status::RateLimited);
    assert_eq!(left(&tokens), 3_000);
}

#[test]
fn a_call_refused_on_tokens_gives_the_shared_request_cell_back() {
    let tokens: Shared = Arc::new(TokenBucket::with_clock(
        per_minute(1_000),
        ManualClock::new(),
    ));
    let requests: Shared = Arc::new(TokenBucket::with_clock(per_minute(10), ManualClock::new()));
    let a = process(&tokens, Some(&requests));
    drop(block_on(a.admit(&complete(700))).unwrap());
    assert_eq!((left(&requests), left(&tokens)), (9, 300));

    // 500 tokens: 300 left, and no wait allowed.
    let refused = block_on(a.admit(&complete(500).deadline(Duration::ZERO))).unwrap_err();
    assert_eq!(refused.scope, "quota:tokens");
    assert_eq!(
        (left(&requests), left(&tokens)),
        (9, 300),
        "all or nothing: the request cell went back"
    );
    // More than the quota's burst: refused as such, nothing taken.
    let too_big = block_on(a.admit(&complete(1_001))).unwrap_err();
    assert_eq!(too_big.scope, "quota:tokens");
    assert_eq!((left(&requests), left(&tokens)), (9, 300));
}

#[test]
fn an_admit_dropped_while_it_waits_gives_its_shared_tokens_back() {
    // 600 a minute: one token per 100 ms.
    let tokens: Shared = Arc::new(TokenBucket::with_clock(per_minute(600), ManualClock::new()));
    let a = process(&tokens, None);
    drop(block_on(a.admit(&complete(600))).unwrap());
    {
        // 100 more: reserved in the shared quota, then a 10 s wait.
        let spec = complete(100);
        let mut waiting = pin!(a.admit(&spec));
        assert!(poll_once(waiting.as_mut()).is_pending());
        let probe = TokenBucket::reserve(&tokens, 1, Duration::MAX).unwrap();
        assert_eq!(
            probe.wait(),
            Duration::from_millis(10_100),
            "behind its 100"
        );
        assert!(probe.cancel());
    }
    // Dropped: its 100 queued back, sent by the next push.
    block_on(a.sync_shared());
    let probe = TokenBucket::reserve(&tokens, 1, Duration::MAX).unwrap();
    assert_eq!(
        probe.wait(),
        Duration::from_millis(100),
        "nothing of it left"
    );
    assert!(probe.cancel());
}

/// Issue #43: a call's shared quotas are taken as of the instant it goes.
/// Its request cell holds it a second; its tokens, taken now, would count
/// that second's refill of a full bucket as spent (a server's bucket,
/// capped, never has it), and calls of several processes whose request
/// cells and tokens interleave went together and were refused.
#[test]
fn a_calls_tokens_are_taken_as_of_the_instant_its_request_cell_lets_it_go() {
    let clock = ManualClock::new();
    let requests: Shared = Arc::new(TokenBucket::with_clock(
        Quota::per_second(NonZeroU32::MIN),
        clock.clone(),
    ));
    let tokens: Shared = Arc::new(TokenBucket::with_clock(
        Quota::new(1_000.0, 1_000).unwrap(),
        clock.clone(),
    ));
    let layer = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .fixed_rates()
        .inline_wait(Duration::from_secs(60))
        .shared_quota("key", requests.clone())
        .shared_resource("key", "tokens", tokens.clone())
        .build();
    // The request cell of this second.
    drop(block_on(layer.admit(&complete(1))).unwrap());
    assert_eq!(left(&tokens), 999);
    // The next call waits a second for its request cell, and takes its
    // 1,000 tokens as of then: the bucket is full then, and empty after.
    let spec = complete(1_000);
    let mut second = pin!(layer.admit(&spec));
    assert!(poll_once(second.as_mut()).is_pending());
    clock.advance(Duration::from_secs(1));
    let Poll::Ready(Ok(second)) = poll_once(second.as_mut()) else {
        panic!("admitted after its second")
    };
    assert_eq!(left(&tokens), 0, "the tokens were taken as of that second");
    drop(second);
    // A third waits for its request cell (one more second) and takes its
    // tokens as of then: 500 of a full bucket.
    let spec = complete(500);
    let mut third = pin!(layer.admit(&spec));
    assert!(poll_once(third.as_mut()).is_pending());
    clock.advance(Duration::from_secs(1));
    assert!(matches!(poll_once(third.as_mut()), Poll::Ready(Ok(_))));
    assert_eq!(left(&tokens), 500);
}

#[test]
fn a_resolver_keeps_each_tenants_tokens_in_its_own_shared_limiter() {
    let limiter = || -> Shared {
        Arc::new(TokenBucket::with_clock(
            per_minute(10_000),
            ManualClock::new(),
        ))
    };
    let (acme, globex, named) = (limiter(), limiter(), limiter());
    let tenants = [("acme", acme.clone()), ("globex", globex.clone())];
    let layer = || {
        let tenants = tenants.clone();
        let clock = ManualClock::new();
        Admission::builder()
            .sleeper(clock.clone())
            .clock(clock)
            .fixed_rates()
            .inline_wait(Duration::ZERO)
            // A local limit for the credentials the resolver does not know.
            .resource("tokens", per_minute(3_000))
            .shared_resources("tokens", move |credential: &str| {
                tenants
                    .iter()
                    .find(|(t, _)| *t == credential)
                    .map(|(_, l)| l.clone())
            })
            // Named for one credential: wins over the resolver.
            .shared_resource("acme", "tokens", named.clone())
            .build()
    };
    let (a, b) = (layer(), layer());
    let call = |credential: &str, tokens: u32| {
        CallSpec::new("complete", credential)
            .cost("tokens", tokens)
            .deadline(Duration::ZERO)
    };

    // globex: resolved, shared by both processes.
    let mut ticket = block_on(a.admit(&call("globex", 6_000))).unwrap();
    assert_eq!(left(&globex), 4_000);
    let refused = block_on(b.admit(&call("globex", 5_000))).unwrap_err();
    assert_eq!(refused.scope, "quota:tokens", "B sees what A reserved");
    assert_eq!(ticket.settle("tokens", 1_000), -5_000);
    block_on(a.sync_shared());
    assert_eq!(left(&globex), 9_000, "settled in the resolved limiter");
    drop(ticket);
    assert!(block_on(b.admit(&call("globex", 5_000))).is_ok());
    assert_eq!(left(&globex), 4_000);
    assert_eq!(a.available("globex", "tokens"), None, "not a local quota");

    // acme: the limiter named for it, not the resolver's.
    drop(block_on(a.admit(&call("acme", 2_000))).unwrap());
    assert_eq!((left(&named), left(&acme)), (8_000, 10_000));

    // Unknown to the resolver: the local bucket, per process.
    drop(block_on(a.admit(&call("initech", 3_000))).unwrap());
    assert_eq!(a.available("initech", "tokens"), Some(0));
    assert!(block_on(a.admit(&call("initech", 1))).is_err());
    assert!(
        block_on(b.admit(&call("initech", 3_000))).is_ok(),
        "B's own bucket"
    );
    assert_eq!(
        (left(&acme), left(&globex)),
        (10_000, 4_000),
        "nothing shared taken"
    );
}
