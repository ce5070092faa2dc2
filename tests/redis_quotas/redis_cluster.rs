//! `RedisBucket` and `RedisScoped` over a Redis Cluster: three masters on
//! loopback that the tests start (`redis-server --cluster-enabled yes` ×3,
//! `redis-cli --cluster create`) and stop by pid; one test moves the slot
//! of a live quota to another master while two clients admit through it.
#![cfg(feature = "redis")]

#[path = "../support/redis_cluster.rs"]
mod cluster;

use std::num::NonZeroU32;
use std::time::Duration;

use backpressure::{
    CheckError, FailPolicy, ManualClock, Quota, RedisBucket, RedisScoped, RedisStats,
};
use cluster::RedisCluster;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// 50 per second, burst 5.
fn quota() -> Quota {
    Quota::per_second(nz(50)).allow_burst(nz(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_bucket_decides_as_on_one_node() {
    if !cluster::available("a_cluster_bucket_decides_as_on_one_node") {
        return;
    }
    let cluster = RedisCluster::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let build = || {
        RedisBucket::builder(&cluster.urls(), "rl:org", quota())
            .clock(clock.clone())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    // Hash-tagged: one quota, one slot.
    assert_eq!(a.key(), "{rl:org}");
    assert_eq!(a.available().await, 5);
    a.try_acquire(3).await.unwrap();
    assert_eq!(b.available().await, 2);
    assert!(b.try_acquire(3).await.is_err());
    // Refunds of dropped reservations, set_quota and reset work the same.
    b.try_acquire(2).await.unwrap();
    let r = b.reserve(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(r.wait(), Duration::from_millis(20));
    drop(r);
    assert_eq!(b.available().await, 0);
    assert_eq!(b.stats().refunded, 1);
    a.set_quota(Quota::per_second(nz(10)).allow_burst(nz(10)))
        .await
        .unwrap();
    assert_eq!(a.available().await, 5, "5 cells of debt kept");
    // B takes the stored quota within its bounds: burst 5, its own.
    assert_eq!(b.available().await, 0, "the same debt, burst 5");
    b.reset().await.unwrap();
    assert_eq!((a.available().await, b.available().await), (10, 5));
    // The key lives on its slot's master only.
    let owner = cluster.owner("{rl:org}");
    for port in cluster.ports() {
        assert_eq!(cluster.dbsize(port), (port == owner) as u64, "node {port}");
    }
    assert_eq!(a.stats().failures + b.stats().failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_keys_spread_over_the_masters() {
    if !cluster::available("scoped_keys_spread_over_the_masters") {
        return;
    }
    let cluster = RedisCluster::start();
    let scoped: RedisScoped<u32> = RedisScoped::builder(&cluster.urls(), "tenant:", quota())
        // Manual time: the keys do not expire while they are counted.
        .clock(ManualClock::starting_at(1_000_000_000))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for k in 0..300 {
        scoped.try_acquire(&k, 1).await.unwrap();
    }
    let sizes: Vec<u64> = cluster.ports().iter().map(|&p| cluster.dbsize(p)).collect();
    assert_eq!(sizes.iter().sum::<u64>(), 300);
    assert!(sizes.iter().all(|&n| n > 50), "keys per master: {sizes:?}");
}

/// Calls `try_acquire(1)` until refused; returns (admitted, unavailable).
/// Only the answers the failure policy allows are accepted.
async fn take_all(bucket: &RedisBucket) -> (u64, u64) {
    let mut admitted = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), bucket.try_acquire(1))
            .await
            .expect("a decision never hangs")
        {
            Ok(()) => admitted += 1,
            Err(CheckError::NotUntil { .. }) => return (admitted, 0),
            Err(CheckError::Unavailable { .. }) => return (admitted, 1),
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

/// The slot of a live quota moves to another master (`redis-cli --cluster
/// reshard`, keys migrating live) while two clients admit through it: the
/// bound holds, and the only failures are the policy's `Unavailable`.
/// The clients share a `ManualClock` (sent with each call instead of
/// Redis's `TIME`): every millisecond of it both ask at once, each until
/// refused, from before the reshard until 300 ms of the clock after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_under_load_keeps_the_bound() {
    if !cluster::available("a_reshard_under_load_keeps_the_bound") {
        return;
    }
    let cluster = RedisCluster::start();
    let clock = ManualClock::starting_at(1_000_000_000);
    let build = || {
        RedisBucket::builder(&cluster.urls(), "live", quota())
            .clock(clock.clone())
            .timeout(Duration::from_millis(500))
            .fail_policy(FailPolicy::FailClosed {
                retry_after: Duration::from_millis(50),
            })
            .probe_interval(Duration::from_millis(50))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    assert_eq!(a.available().await, 5);
    assert_eq!(b.available().await, 5);
    let from = cluster.owner("{live}");
    let to = *cluster.ports().iter().find(|&&p| p != from).unwrap();
    let mut cmd = cluster.reshard_all(from, to);
    let mut reshard = tokio::task::spawn_blocking(move || cmd.output().expect("run redis-cli"));
    let (mut admitted, mut unavailable) = (0, 0);
    let (mut steps, mut after) = (0u64, 0u64);
    // Admitted in the 300 ms after the reshard, when the slot has moved.
    let mut moved = 0;
    let mut out = None;
    while after < 300 {
        let ((x, ux), (y, uy)) = if steps / 20 % 2 == 0 {
            tokio::join!(take_all(&a), take_all(&b))
        } else {
            let (b, a) = tokio::join!(take_all(&b), take_all(&a));
            (a, b)
        };
        admitted += x + y;
        unavailable += ux + uy;
        if out.is_some() {
            moved += x + y;
            after += 1;
        } else if reshard.is_finished() {
            out = Some((&mut reshard).await.unwrap());
        }
        clock.advance(Duration::from_millis(1));
        steps += 1;
    }
    let out = out.unwrap();
    assert!(
        out.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(cluster.owner("{live}"), to, "the slot moved");
    assert_eq!(cluster.dbsize(from), 0);
    // burst + rate * the clock's span (its last millisecond not reached).
    let bound = 5 + steps / 20;
    let stats = |s: RedisStats| (s.round_trips, s.failures);
    println!(
        "cluster reshard under load: {admitted} admitted in {steps} ms (bound {bound}), \
         {moved} in the 300 ms after; unavailable {unavailable}; (round trips, failures) \
         {:?} {:?}",
        stats(a.stats()),
        stats(b.stats())
    );
    assert!(admitted <= bound, "{admitted} > {bound}");
    // Not starved: at least half the key's cells through the move, and
    // after it at least 80% of the 15 cells of 300 ms.
    assert!(admitted >= bound / 2, "only {admitted}");
    assert!(moved >= 12, "only {moved} after the move");
    // Every failure the callers saw is the policy's answer, counted.
    assert_eq!(unavailable, a.stats().failures + b.stats().failures);
}
