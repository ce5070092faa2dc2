//! The CI-sized scale run: P = 4 independent clients (each its own
//! connection, in this process), 2 s, on one key and on 1,000 keys, with
//! and without leases. The GCRA bound is asserted exactly, per key. The
//! full table (P processes, single node and cluster) comes from
//! `cargo run --release --example redis_scale --features redis`.
#![cfg(feature = "redis")]

use crate::redis_server;
#[path = "../support/scale.rs"]
mod scale;

use std::num::NonZeroU32;

use backpressure::Quota;
use redis_server::RedisServer;
use scale::{Report, Scenario};

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

async fn run(server: &RedisServer, name: &str, keys: u32, tasks: u32, lease: u32, quota: Quota) {
    let start_us = scale::now_us() + 300_000;
    let s = Scenario {
        url: server.url(),
        prefix: format!("scale:{name}:"),
        keys,
        tasks,
        lease,
        quota,
        start_us,
        end_us: start_us + 2_000_000,
    };
    let clients: Vec<_> = (0..4u64)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { scale::client(&s, i).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.push(c.await.unwrap());
    }
    let r = Report::new(&s, &outcomes);
    println!("{}", r.row("single, 4 clients", &s));
    assert!(
        r.worst_excess <= 0,
        "{name}: a key admitted {} over burst + rate × t",
        r.worst_excess
    );
    assert_eq!(r.failures, 0, "{name}");
    assert!(
        r.utilisation() > 0.2,
        "{name}: only {:.1}% of the bound",
        100.0 * r.utilisation()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_for_two_seconds_stay_within_the_bound() {
    if !redis_server::available("four_clients_for_two_seconds_stay_within_the_bound") {
        return;
    }
    let server = RedisServer::start();
    println!("{}", Report::header());
    let hot = Quota::per_second(nz(500)).allow_burst(nz(50));
    run(&server, "one", 1, 4, 0, hot).await;
    run(&server, "one-leased", 1, 4, 10, hot).await;
    let many = Quota::per_second(nz(2)).allow_burst(nz(2));
    run(&server, "many", 1000, 16, 0, many).await;
    run(&server, "many-leased", 1000, 16, 2, many).await;
}
