//! Issue #15 on a single node: refunds that survive a drop, the rest of
//! the bucket API (`until_ready`, `set_quota`, `reset`), and per-key shared
//! quotas (`RedisScoped`), against a real `redis-server` the tests start.
//!
//! Decisions run on one `ManualClock` sent to Redis, so every count is
//! exact (no refill unless the test moves the clock).
#![cfg(feature = "redis")]

use crate::redis_server;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backpressure::{
    CheckError, FailPolicy, ManualClock, Quota, RedisBucket, RedisScoped, ReserveError, Sleeper,
};
use futures::FutureExt;
use redis_server::RedisServer;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// 100 per second (a 10 ms period), burst 10.
fn quota() -> Quota {
    Quota::per_second(nz(100)).allow_burst(nz(10))
}

fn bucket(server: &RedisServer, key: &str, clock: &ManualClock) -> RedisBucket {
    RedisBucket::builder(&server.url(), key, quota())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

const PERIOD: Duration = Duration::from_millis(10);

// -- 1. refunds that survive a drop ------------------------------------------

/// The bug: a `RedisReservation` dropped without `cancel` kept its cells,
/// so 1,000 abandoned waits (callers that gave up, cancelled futures) held
/// the key ten seconds into the future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_reservations_give_their_cells_back() {
    if !redis_server::available("dropped_reservations_give_their_cells_back") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = bucket(&server, "dropped", &clock);
    b.try_acquire(10).await.unwrap(); // the burst: every reservation waits
    let mut held = Vec::new();
    for i in 1..=1000u32 {
        let r = b.reserve(1, Duration::from_secs(100)).await.unwrap();
        assert_eq!(r.wait(), PERIOD * i);
        held.push(r);
    }
    assert_eq!(b.stats().admitted, 1010);
    // Dropped unused, in no particular order (odd ones first, then the
    // rest backwards): the refunds are queued, not sent.
    let (odd, even): (Vec<_>, Vec<_>) = held.into_iter().enumerate().partition(|(i, _)| i % 2 == 1);
    drop(odd);
    drop(even.into_iter().rev().collect::<Vec<_>>());
    let trips = b.stats().round_trips;
    // The next round trip carries them: the key is back to the burst taken.
    assert_eq!(b.available().await, 0);
    let s = b.stats();
    assert_eq!(s.round_trips, trips + 1);
    assert_eq!((s.refunded, s.admitted), (1000, 10));
    let next = b.reserve(1, Duration::from_secs(100)).await.unwrap();
    assert_eq!(next.wait(), PERIOD, "the 1,000 cells are back");
    // Kept: the call runs after the wait.
    next.keep();
    // Sent once: nothing more is given back.
    assert_eq!(b.available().await, 0);
    assert_eq!(b.stats().refunded, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_dropped_after_its_wait_keeps_its_cells() {
    if !redis_server::available("a_reservation_dropped_after_its_wait_keeps_its_cells") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = bucket(&server, "used", &clock);
    b.try_acquire(10).await.unwrap();
    let r = b.reserve(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(r.wait(), PERIOD);
    clock.advance(PERIOD);
    drop(r); // used
             // Zero-wait reservations are usable at once: dropping them keeps them.
    assert!(b.reserve(1, Duration::ZERO).await.is_err());
    assert_eq!(b.available().await, 0);
    assert_eq!(b.stats().refunded, 0);
    assert!(b.try_acquire(1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refund_queue_is_bounded_and_keeps_the_newest() {
    if !redis_server::available("the_refund_queue_is_bounded_and_keeps_the_newest") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = bucket(&server, "bounded", &clock);
    b.try_acquire(10).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..RedisBucket::MAX_QUEUED_REFUNDS + 100 {
        held.push(b.reserve(1, Duration::from_secs(1000)).await.unwrap());
    }
    // Dropped oldest first: the queue keeps the newest, the top of the
    // stack, which unwinds; the 100 oldest stay taken (the safe side).
    drop(held);
    assert_eq!(b.available().await, 0);
    assert_eq!(b.stats().refunded, RedisBucket::MAX_QUEUED_REFUNDS as u64);
    let next = b.reserve(1, Duration::from_secs(1000)).await.unwrap();
    assert_eq!(next.wait(), PERIOD * 101);
    next.keep();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_under_another_process_take_stays_taken() {
    if !redis_server::available("a_refund_under_another_process_take_stays_taken") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let (a, b) = (
        bucket(&server, "stacked", &clock),
        bucket(&server, "stacked", &clock),
    );
    a.try_acquire(10).await.unwrap();
    let r = a.reserve(1, Duration::from_secs(1)).await.unwrap();
    // B takes on top of it, then A gives up.
    b.reserve(1, Duration::from_secs(1)).await.unwrap().keep();
    drop(r);
    assert_eq!(a.available().await, 0);
    assert_eq!(a.stats().refunded, 0, "B's cell sits on it: not refunded");
}

/// A `ManualClock` that says when someone went to sleep on it.
struct Flagged {
    inner: ManualClock,
    slept: AtomicBool,
}

impl Sleeper for Flagged {
    type Sleep = <ManualClock as Sleeper>::Sleep;

    fn sleep(&self, d: Duration) -> Self::Sleep {
        self.slept.store(true, Ordering::SeqCst);
        self.inner.sleep(d)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_ready_sleeps_the_reserved_wait_and_a_cancelled_wait_gives_back() {
    if !redis_server::available(
        "until_ready_sleeps_the_reserved_wait_and_a_cancelled_wait_gives_back",
    ) {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let sleeper = Flagged {
        inner: clock.clone(),
        slept: Default::default(),
    };
    let b = bucket(&server, "until", &clock);
    b.until_ready(10, Duration::ZERO, &sleeper).await.unwrap();
    // Too long for the budget: refused at once, nothing taken.
    assert!(b
        .until_ready(1, Duration::from_millis(5), &sleeper)
        .await
        .unwrap_err()
        .is_rate_limited());
    // A wait of one period: pending until the clock gets there.
    {
        let mut wait = Box::pin(b.until_ready(1, Duration::from_secs(1), &sleeper));
        // Poll until it sleeps (the reserve is a real round trip).
        let slept = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                if wait.as_mut().now_or_never().is_some() {
                    panic!("ready before the clock moved");
                }
                if sleeper.slept.load(Ordering::SeqCst) {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(slept.is_ok(), "until_ready never slept");
        // Cancelled while it sleeps: the cell goes back.
    }
    sleeper.slept.store(false, Ordering::SeqCst);
    assert_eq!(b.available().await, 0);
    assert_eq!(b.stats().refunded, 1);
    // And one that completes keeps its cell.
    let done = {
        let fut = b.until_ready(1, Duration::from_secs(1), &sleeper);
        let advance = async {
            while !sleeper.slept.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
            sleeper.inner.advance(PERIOD);
        };
        let (r, ()) = tokio::join!(fut, advance);
        r
    };
    assert_eq!(done, Ok(()));
    assert_eq!(b.stats().refunded, 1);
    assert!(b.try_acquire(1).await.is_err());
}

// -- 2. set_quota and reset ----------------------------------------------------

/// `set_quota` from one process: the other adopts the stored quota at its
/// next round trip; the debt is kept in cells, no burst is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_quota_reaches_every_process_and_keeps_the_debt() {
    if !redis_server::available("set_quota_reaches_every_process_and_keeps_the_debt") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let (a, b) = (
        bucket(&server, "requota", &clock),
        bucket(&server, "requota", &clock),
    );
    b.try_acquire(4).await.unwrap(); // 4 cells of debt
                                     // 10/s, burst 10: the 4 cells of debt are now 400 ms of it.
    let slow = Quota::per_second(nz(10)).allow_burst(nz(10));
    a.set_quota(slow).await.unwrap();
    assert_eq!(a.quota(), slow);
    assert_eq!(b.quota(), quota(), "B has not made a round trip yet");
    assert_eq!(b.available().await, 6, "the debt is kept in cells");
    assert_eq!(b.quota(), slow, "adopted with the reply");
    b.try_acquire(6).await.unwrap();
    assert_eq!(
        b.try_acquire(1).await,
        Err(CheckError::NotUntil {
            wait: Duration::from_millis(100)
        })
    );
    // A lower burst: the 10 cells of debt are kept (over-drawn), no burst
    // opened either way.
    let tiny = Quota::per_second(nz(10)).allow_burst(nz(2));
    b.set_quota(tiny).await.unwrap();
    assert_eq!(a.available().await, 0);
    assert_eq!(
        a.try_acquire(3).await,
        Err(CheckError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    );
    // Going back up does not refill: the debt (10 cells) stays 10 cells,
    // nothing forgiven by the trip through a lower burst (issue #21, 7).
    a.set_quota(quota()).await.unwrap();
    assert_eq!(b.available().await, 0);
    clock.advance(Duration::from_millis(10));
    assert_eq!(b.available().await, 1, "refilling at the quota's 100/s");
    // The key holds the quota, and still expires (issue #58 item 7).
    server.assert_every_key_expires();
}

/// `set_quota` keeps a penalty's wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_quota_keeps_a_penalty() {
    if !redis_server::available("set_quota_keeps_a_penalty") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = bucket(&server, "penalized-requota", &clock);
    b.penalize(Duration::from_secs(3)).await;
    b.set_quota(Quota::per_second(nz(1000)).allow_burst(nz(100)))
        .await
        .unwrap();
    match b.try_acquire(1).await {
        Err(CheckError::NotUntil { wait }) => assert_eq!(wait, Duration::from_secs(3)),
        other => panic!("the penalty was lost: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_fills_the_key_for_every_process_and_keeps_a_stored_quota() {
    if !redis_server::available("reset_fills_the_key_for_every_process_and_keeps_a_stored_quota") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let (a, b) = (
        bucket(&server, "reset", &clock),
        bucket(&server, "reset", &clock),
    );
    a.try_acquire(10).await.unwrap();
    b.penalize(Duration::from_secs(60)).await;
    let r = a.reserve(1, Duration::from_secs(100)).await.unwrap();
    b.reset().await.unwrap();
    assert_eq!(a.available().await, 10);
    // A reservation from before the reset no longer refunds (its `after`
    // is gone): dropping it is harmless.
    drop(r);
    let slow = Quota::per_second(nz(10)).allow_burst(nz(5));
    a.set_quota(slow).await.unwrap();
    a.reset().await.unwrap();
    assert_eq!(b.available().await, 5);
    assert_eq!(b.quota(), slow);
    // An unparseable quota is refused, not sent.
    let forever =
        Quota::with_period(Duration::from_secs(u32::MAX as u64 * 1000)).allow_burst(nz(u32::MAX));
    assert!(a.set_quota(forever).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_quota_and_reset_fail_closed_when_redis_is_away() {
    if !redis_server::available("set_quota_and_reset_fail_closed_when_redis_is_away") {
        return;
    }
    let mut server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = RedisBucket::builder(&server.url(), "away", quota())
        .clock(clock.clone())
        .timeout(Duration::from_millis(200))
        .fail_policy(FailPolicy::FailOpen { share: 0.5 })
        .build()
        .unwrap();
    assert_eq!(b.available().await, 10);
    server.stop();
    assert!(b.set_quota(Quota::per_second(nz(1))).await.is_err());
    assert!(b.reset().await.is_err());
    assert_eq!(b.quota(), quota(), "nothing adopted");
    // The fallback answers (its share: 5 of burst).
    assert_eq!(b.try_acquire(5).await, Ok(()));
    assert!(b.try_acquire(1).await.is_err());
}

// -- 3. per-key shared quotas ----------------------------------------------------

fn scoped(server: &RedisServer, clock: &ManualClock) -> RedisScoped<String> {
    RedisScoped::builder(&server.url(), "tenant:", quota())
        .quota_for(
            "vip".to_owned(),
            Quota::per_second(nz(1000)).allow_burst(nz(50)),
        )
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .idle(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_keys_have_their_own_shared_quotas() {
    if !redis_server::available("scoped_keys_have_their_own_shared_quotas") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    // Two processes.
    let (p, q) = (scoped(&server, &clock), scoped(&server, &clock));
    let (acme, vip) = ("acme".to_owned(), "vip".to_owned());
    p.try_acquire(&acme, 6).await.unwrap();
    // The other process shares acme's key: 4 left.
    assert_eq!(q.bucket(&acme).available().await, 4);
    assert!(q.try_acquire(&acme, 5).await.is_err());
    // Another tenant is untouched; the override applies.
    assert_eq!(q.bucket(&"other".to_owned()).available().await, 10);
    q.try_acquire(&vip, 50).await.unwrap();
    assert!(p.try_acquire(&vip, 1).await.is_err());
    // A run-time override is stored with the key: the other process adopts
    // it within its own bounds (issue #58 item 7): the slower rate, but no
    // burst above its own 10.
    let slow = Quota::per_second(nz(10)).allow_burst(nz(20));
    p.set_quota(&acme, slow).await.unwrap();
    assert_eq!(
        p.bucket(&acme).available().await,
        14,
        "6 cells of debt kept"
    );
    assert_eq!(
        q.bucket(&acme).available().await,
        4,
        "the same debt, burst 10"
    );
    assert_eq!(
        q.bucket(&acme).quota(),
        Quota::per_second(nz(10)).allow_burst(nz(10))
    );
    // A 429 for one tenant holds back that tenant only.
    p.penalize(&acme, Duration::from_secs(5)).await;
    assert!(q.try_acquire(&acme, 1).await.is_err());
    assert!(q.try_acquire(&"other".to_owned(), 1).await.is_ok());
    assert_eq!(
        server.command(&["EXISTS", "tenant:acme"]).as_deref(),
        Some(":1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_leases_per_key_and_drops_idle_keys() {
    if !redis_server::available("scoped_leases_per_key_and_drops_idle_keys") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let s: RedisScoped<u32> = RedisScoped::builder(&server.url(), "leased:", quota())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .lease(nz(5), Duration::from_secs(1))
        .idle(Duration::from_secs(5))
        .build()
        .unwrap();
    // Leases are per key: five calls on a key, one round trip.
    for _ in 0..5 {
        s.try_acquire(&1, 1).await.unwrap();
    }
    let one = s.bucket(&1).stats();
    assert_eq!((one.round_trips, one.admitted, one.leased), (2, 5, 4)); // NOSCRIPT + EVAL
    s.try_acquire(&2, 1).await.unwrap();
    assert_eq!(s.bucket(&2).stats().round_trips, 1, "its own lease");
    // 1,000 keys used once, then idle: the map stays bounded.
    let held = s.bucket(&7);
    for k in 0..1000 {
        let _ = s.bucket(&k);
        if k % 100 == 99 {
            clock.advance(Duration::from_secs(1));
        }
    }
    // Keys idle for over 5 s were swept as the map doubled.
    assert!(s.len() < 1000, "{} keys in memory", s.len());
    assert!(s.len() >= 500, "recently used keys stay: {}", s.len());
    // Everything goes idle; new keys come in until the map has doubled:
    // the sweep then drops every idle key a caller does not hold.
    clock.advance(Duration::from_secs(60));
    let before = s.len() as u32;
    let fresh = 2 * before;
    for k in 1000..1000 + fresh {
        let _ = s.bucket(&k);
    }
    assert!(s.len() as u32 <= fresh + 1, "{} keys in memory", s.len());
    // A bucket a caller holds is never dropped.
    assert!(std::sync::Arc::ptr_eq(&held, &s.bucket(&7)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_fails_closed_and_open_with_redis_killed_mid_run() {
    if !redis_server::available("scoped_fails_closed_and_open_with_redis_killed_mid_run") {
        return;
    }
    let mut server = RedisServer::start();
    let build = |policy| {
        RedisScoped::<&str>::builder(&server.url(), "down:", quota())
            .timeout(Duration::from_millis(200))
            .probe_interval(Duration::from_millis(50))
            .fail_policy(policy)
            .build()
            .unwrap()
    };
    let closed = build(FailPolicy::FailClosed {
        retry_after: Duration::from_secs(3),
    });
    let open = build(FailPolicy::FailOpen { share: 0.5 });
    assert!(closed.try_acquire(&"a", 1).await.is_ok());
    assert!(open.try_acquire(&"b", 1).await.is_ok());
    server.stop();
    assert_eq!(
        closed.try_acquire(&"a", 1).await,
        Err(CheckError::Unavailable {
            retry_after: Duration::from_secs(3)
        })
    );
    assert!(matches!(
        closed.bucket(&"a").reserve(1, Duration::from_secs(1)).await,
        Err(ReserveError::Unavailable { .. })
    ));
    // Fail-open: each key falls back to its share (5 of burst 10).
    for _ in 0..5 {
        assert_eq!(open.try_acquire(&"c", 1).await, Ok(()));
    }
    assert!(open.try_acquire(&"c", 1).await.is_err());
    assert!(open.bucket(&"c").stats().fallback >= 5);
    // Back: both recover (a fresh server, the script loaded again).
    server.restart();
    let recovered = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if closed.try_acquire(&"a", 1).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(recovered.is_ok(), "never recovered");
    // Script flushed mid-run: reloaded with EVAL, no failure.
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]).as_deref(), Some("+OK"));
    let before = closed.bucket(&"z").stats().failures;
    assert!(closed.try_acquire(&"z", 1).await.is_ok());
    assert_eq!(closed.bucket(&"z").stats().failures, before);
}

/// `bucket` with a lease of 5 cells.
fn leased(server: &RedisServer, key: &str, clock: &ManualClock) -> RedisBucket {
    RedisBucket::builder(&server.url(), key, quota())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .lease(nz(5), Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A reservation from before a `reset` gives nothing back, not even to the
/// lease it came from (the reset dropped that lease): no phantom cells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_reservation_cancelled_after_reset_adds_no_cells() {
    if !redis_server::available("a_leased_reservation_cancelled_after_reset_adds_no_cells") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = leased(&server, "leased-reset", &clock);
    let r = b.reserve(1, Duration::ZERO).await.unwrap(); // leases 4 more
    assert_eq!(b.available().await, 9); // 5 in Redis + 4 leased
    b.reset().await.unwrap();
    assert!(!r.cancel().await);
    assert_eq!(b.available().await, 10, "a full bucket, nothing more");
}

/// Issue #43: `reserve_after` takes the cells as of the instant the call
/// goes (the script's `not_before`), so the refill of a full bucket before
/// then is not counted as spent; the wait is from now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_after_takes_the_cells_as_of_the_instant_the_call_goes() {
    if !redis_server::available("reserve_after_takes_the_cells_as_of_the_instant_the_call_goes") {
        return;
    }
    use backpressure::RateLimiter;
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = bucket(&server, "after", &clock);
    let second = Duration::from_secs(1);
    // A full burst for a call that goes in a second: taken then.
    assert_eq!(
        b.reserve_after(10, second, 2 * second).await.unwrap(),
        second
    );
    assert_eq!(b.available().await, 0);
    clock.advance(second);
    // Still empty at that second (taken now, it would be full again).
    assert_eq!(b.available().await, 0);
    assert_eq!(
        b.reserve_after(1, Duration::ZERO, second).await.unwrap(),
        PERIOD
    );
    // Past `max_wait`: refused with the wait from now, nothing taken.
    let refused = b.reserve_after(1, second, second / 2).await.unwrap_err();
    assert!(
        matches!(refused, ReserveError::RateLimited { .. }),
        "{refused:?}"
    );
    assert_eq!(b.stats().admitted, 11);
}

/// A wait past `max_wait` is the script's refusal: one round trip, nothing
/// taken. (Sent with a `max_wait` too long, the script would grant the
/// cell and the bucket refuse it after, giving it back with a second round
/// trip: the cargo-mutants survivor `budget / 1000` -> `budget * 1000`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_max_wait_is_refused_in_one_round_trip() {
    if !redis_server::available("a_wait_past_max_wait_is_refused_in_one_round_trip") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = bucket(&server, "one-trip", &clock);
    assert_eq!(
        b.reserve(10, Duration::ZERO).await.unwrap().keep(),
        Duration::ZERO
    );
    let before = b.stats().round_trips;
    let refused = b.reserve(1, PERIOD / 2).await.unwrap_err();
    assert_eq!(
        refused,
        ReserveError::RateLimited {
            retry_after: PERIOD
        }
    );
    assert_eq!(b.stats().round_trips - before, 1, "{:?}", b.stats());
    assert_eq!(b.available().await, 0);
    assert_eq!(b.stats().admitted, 10);
}

/// A reservation served from a lease take (the script granted `n` plus a
/// lease's worth at once) gives its cells back to the lease when
/// cancelled, not to Redis: Redis keeps the lease's cells charged.
/// (Recorded as a Redis refund, the cancel gave the whole take back in
/// Redis while the lease kept its four: 14 cells of a burst of 10; the
/// cargo-mutants survivor `granted > n` -> `granted < n`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_reservation_from_a_lease_take_goes_back_to_the_lease() {
    if !redis_server::available("a_cancelled_reservation_from_a_lease_take_goes_back_to_the_lease")
    {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let b = leased(&server, "lease-cancel", &clock);
    let r = b.reserve(1, Duration::ZERO).await.unwrap(); // leases 4 more
    assert!(format!("{r:?}").contains("lease"), "{r:?}");
    assert_eq!(b.available().await, 9); // 5 in Redis + 4 leased
    assert!(r.cancel().await);
    assert_eq!(b.available().await, 10, "5 in Redis + 5 leased: the burst");
    let trips = b.stats().round_trips;
    for _ in 0..5 {
        assert_eq!(
            b.reserve(1, Duration::ZERO).await.unwrap().keep(),
            Duration::ZERO
        );
    }
    assert_eq!(b.stats().round_trips, trips, "the five from the lease");
}
