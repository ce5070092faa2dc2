//! `RedisBucket` and `RedisScoped` over a Redis Cluster: three masters on
//! loopback that the tests start (`redis-server --cluster-enabled yes` ×3,
//! `redis-cli --cluster create`) and stop by pid; one test moves the slot
//! of a live quota to another master while two clients admit through it.
#![cfg(feature = "redis")]

#[path = "../support/redis_cluster.rs"]
mod cluster;

use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// Calls `try_acquire(1)` until `until`; returns (admitted, unavailable).
/// Only the answers the failure policy allows are accepted.
async fn hammer(bucket: &RedisBucket, until: &OnceLock<Instant>) -> (u64, u64) {
    let (mut admitted, mut unavailable) = (0, 0);
    while until.get().is_none_or(|&t| Instant::now() < t) {
        match tokio::time::timeout(Duration::from_secs(5), bucket.try_acquire(1))
            .await
            .expect("a decision never hangs")
        {
            Ok(()) => admitted += 1,
            Err(CheckError::NotUntil { wait }) => {
                tokio::time::sleep(wait.min(Duration::from_millis(5))).await
            }
            Err(CheckError::Unavailable { .. }) => {
                unavailable += 1;
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    (admitted, unavailable)
}

/// The slot of a live quota moves to another master (`redis-cli --cluster
/// reshard`, keys migrating live) while two clients admit through it: the
/// bound holds, and the only failures are the policy's `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_under_load_keeps_the_bound() {
    if !cluster::available("a_reshard_under_load_keeps_the_bound") {
        return;
    }
    let cluster = RedisCluster::start();
    let build = || {
        RedisBucket::builder(&cluster.urls(), "live", quota())
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
    // The clients admit from before the reshard until 300 ms after it.
    let until = OnceLock::new();
    let start = Instant::now();
    let mut cmd = cluster.reshard_all(from, to);
    let reshard = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let out = tokio::task::spawn_blocking(move || cmd.output().expect("run redis-cli"))
            .await
            .unwrap();
        until
            .set(Instant::now() + Duration::from_millis(300))
            .unwrap();
        out
    };
    let clients = async {
        let r = tokio::join!(hammer(&a, &until), hammer(&b, &until));
        (r, start.elapsed().as_secs_f64())
    };
    let ((((x, ux), (y, uy)), elapsed), out) = tokio::join!(clients, reshard);
    assert!(
        out.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(cluster.owner("{live}"), to, "the slot moved");
    assert_eq!(cluster.dbsize(from), 0);
    let admitted = x + y;
    let bound = 5.0 + 50.0 * elapsed + 1.0;
    let stats = |s: RedisStats| (s.round_trips, s.failures);
    println!(
        "cluster reshard under load: {admitted} admitted in {elapsed:.2} s (bound {bound:.0}); \
         unavailable {}; (round trips, failures) {:?} {:?}",
        ux + uy,
        stats(a.stats()),
        stats(b.stats())
    );
    assert!(admitted as f64 <= bound, "{admitted} > {bound}");
    assert!(admitted as f64 >= 0.5 * 50.0 * elapsed, "only {admitted}");
    // Every failure the callers saw is the policy's answer, counted.
    assert_eq!(ux + uy, a.stats().failures + b.stats().failures);
}
