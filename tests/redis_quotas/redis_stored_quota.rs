//! Issue #58 item 7: a quota stored with a key is advice within the
//! bounds a process holds, not an order. A hand-written quota in the key
//! neither opens nor locks a fleet of two processes (two buckets with
//! connections of their own), a process goes back to its own quota when
//! the stored one is gone, and every key expires.
//!
//! Decisions run on one `ManualClock` sent to Redis, so every count is
//! exact (no refill unless the test moves the clock).
#![cfg(feature = "redis")]

use crate::redis_server;

use std::num::NonZeroU32;
use std::time::Duration;

use backpressure::{CheckError, FailPolicy, ManualClock, Quota, RedisBucket, RedisScoped};
use redis_server::RedisServer;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// 5 per second (a 200 ms period), burst 5: the quota of the bug report.
fn quota() -> Quota {
    Quota::per_second(nz(5))
}

/// The slowest a stored quota may make a process: 1/1000 of its own rate.
const FLOOR: u32 = 1000;

fn process(
    server: &RedisServer,
    key: &str,
    clock: &ManualClock,
    policy: FailPolicy,
) -> RedisBucket {
    RedisBucket::builder(&server.url(), key, quota())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .fail_policy(policy)
        .build()
        .unwrap()
}

const CLOSED: FailPolicy = FailPolicy::FailClosed {
    retry_after: Duration::from_secs(1),
};

/// `try_acquire(1)` `calls` times, alternating between the processes;
/// returns how many were admitted.
async fn admitted(fleet: &[&RedisBucket], calls: usize) -> usize {
    let mut n = 0;
    for i in 0..calls {
        if fleet[i % fleet.len()].try_acquire(1).await.is_ok() {
            n += 1;
        }
    }
    n
}

/// The bug: with `qt=1 qb=4294967295` written into the key by hand, 200
/// of 200 calls were admitted against a 5/s quota, and the fail-open
/// fallback adopted the stored quota too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_stored_quota_does_not_open_the_fleet() {
    if !redis_server::available("a_poisoned_stored_quota_does_not_open_the_fleet") {
        return;
    }
    let mut server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let hset = ["HSET", "org", "qt", "1", "qb", "4294967295"];
    assert_eq!(server.command(&hset).as_deref(), Some(":2"));
    let a = process(&server, "org", &clock, CLOSED);
    let b = process(&server, "org", &clock, FailPolicy::FailOpen { share: 0.5 });
    assert_eq!(admitted(&[&a, &b], 200).await, 5, "the 5/s quota's burst");
    // Never faster than the process's own quota: the stored one is capped.
    assert_eq!((a.quota(), b.quota()), (quota(), quota()));
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted(&[&a, &b], 200).await, 5, "a second's worth");
    server.assert_every_key_expires();
    // Redis away: B's fallback runs at half of B's own quota (burst 2),
    // not half of the stored one.
    server.stop();
    assert_eq!(admitted(&[&b], 200).await, 2, "the fallback's share");
    assert_eq!(b.stats().fallback, 200);
}

/// The bug: with `qt=2^51` written into the key by hand, callers were
/// told to retry in about 71 years. Two processes, each a `RedisScoped`
/// with a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_stored_quota_does_not_lock_the_fleet() {
    if !redis_server::available("a_poisoned_stored_quota_does_not_lock_the_fleet") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let hset = ["HSET", "tenant:acme", "qt", "2251799813685248", "qb", "1"];
    assert_eq!(server.command(&hset).as_deref(), Some(":2"));
    let scoped = || {
        RedisScoped::<&str>::builder(&server.url(), "tenant:", quota())
            .clock(clock.clone())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let (p, q) = (scoped(), scoped());
    let floor = quota().period() * FLOOR;
    // A full bucket at first (the key has no state): one call goes.
    assert_eq!(p.try_acquire(&"acme", 1).await, Ok(()));
    let wait = match q.try_acquire(&"acme", 1).await {
        Err(CheckError::NotUntil { wait }) => wait,
        other => panic!("expected a wait, got {other:?}"),
    };
    assert!(
        wait <= floor,
        "told to wait {wait:?}, past the floor {floor:?}"
    );
    for s in [&p, &q] {
        let in_force = s.bucket(&"acme").quota();
        assert!(in_force.period() <= floor, "adopted {in_force:?}");
    }
    // The wait is real: then the fleet goes on.
    clock.advance(wait);
    assert_eq!(q.try_acquire(&"acme", 1).await, Ok(()));
    // Another tenant is untouched.
    assert_eq!(p.bucket(&"other").available().await, 5);
    server.assert_every_key_expires();
}

/// The bug: a process adopted the stored quota as its own and kept
/// sending it: after a `DEL` of the key it stayed on the stored quota
/// (its fallback too); only a fresh process got its own again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_returns_to_its_own_quota_when_the_stored_one_is_gone() {
    if !redis_server::available("a_process_returns_to_its_own_quota_when_the_stored_one_is_gone") {
        return;
    }
    let mut server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    // A plausible stored quota (1/s, burst 1: slower than 5/s, faster
    // than the floor) is adopted by processes that know nothing better.
    let hset = ["HSET", "org", "qt", "1000000", "qb", "1"];
    assert_eq!(server.command(&hset).as_deref(), Some(":2"));
    let a = process(&server, "org", &clock, CLOSED);
    let b = process(&server, "org", &clock, FailPolicy::FailOpen { share: 1.0 });
    let stored = Quota::per_second(nz(1));
    assert_eq!(admitted(&[&a, &b], 10).await, 1, "the stored burst");
    assert_eq!((a.quota(), b.quota()), (stored, stored));
    // The stored quota is gone: each process is back on its own with
    // its next reply.
    assert_eq!(server.command(&["DEL", "org"]).as_deref(), Some(":1"));
    assert_eq!(admitted(&[&a, &b], 10).await, 5, "the own burst");
    assert_eq!((a.quota(), b.quota()), (quota(), quota()));
    server.assert_every_key_expires();
    // The fallback followed: B's own quota, whole (share 1).
    server.stop();
    assert_eq!(admitted(&[&b], 10).await, 5, "the fallback's own burst");
}

/// The bug: once a quota was stored the key was `PERSIST`ed, so a key
/// stayed for every tenant ever seen; and a key decided on an explicit
/// clock never expired. Every operation leaves an expiry, on Redis's time
/// and on an explicit one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_the_tests_leave_has_a_positive_ttl() {
    if !redis_server::available("every_key_the_tests_leave_has_a_positive_ttl") {
        return;
    }
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let slow = Quota::per_second(nz(2)).allow_burst(nz(2));

    // On Redis's time: a stated quota is kept for its window (1 s here)
    // plus a minute's margin past the bucket's refill, never forever.
    let timed = RedisBucket::builder(&server.url(), "timed", quota())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    timed.try_acquire(2).await.unwrap();
    timed.set_quota(slow).await.unwrap();
    let pttl = server.pttl("timed");
    assert!(pttl > 60_000 && pttl <= 2 * 1_000 + 60_000, "pttl {pttl}");
    timed.reset().await.unwrap();
    assert!(server.pttl("timed") > 0);
    // Without a stored quota: gone once full again (1 cell, 200 ms).
    let plain = RedisBucket::builder(&server.url(), "plain", quota())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    plain.try_acquire(1).await.unwrap();
    let pttl = server.pttl("plain");
    assert!(pttl > 0 && pttl <= 200, "pttl {pttl}");

    // On an explicit clock, every operation of two processes.
    let a = process(&server, "explicit", &clock, CLOSED);
    let b = process(&server, "explicit", &clock, CLOSED);
    a.try_acquire(3).await.unwrap();
    b.set_quota(slow).await.unwrap();
    a.penalize(Duration::from_secs(3)).await;
    b.charge(2).await;
    a.refund(1).await;
    let _ = b.reserve(1, Duration::from_secs(10)).await;
    b.reset().await.unwrap();
    assert_eq!(a.available().await, 2);

    // Per tenant, with and without a quota stored.
    let s = RedisScoped::<&str>::builder(&server.url(), "tenant:", quota())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    s.try_acquire(&"t1", 1).await.unwrap();
    s.set_quota(&"t2", slow).await.unwrap();
    s.penalize(&"t3", Duration::from_secs(1)).await;

    // A key written by hand (or by a version that persisted it) gets an
    // expiry with the first call that reads it.
    let hset = ["HSET", "tenant:t4", "qt", "400000", "qb", "2"];
    assert_eq!(server.command(&hset).as_deref(), Some(":2"));
    assert_eq!(server.pttl("tenant:t4"), -1);
    assert_eq!(s.bucket(&"t4").available().await, 2);

    let keys = server.keys();
    for key in [
        "timed",
        "explicit",
        "tenant:t1",
        "tenant:t2",
        "tenant:t3",
        "tenant:t4",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key} missing from {keys:?}");
    }
    server.assert_every_key_expires();
}
