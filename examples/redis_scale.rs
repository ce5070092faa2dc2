//! The fleet-scale run of issue #15: P **processes** (this binary
//! re-executed with `--child`), each with T tasks and its own connection,
//! admit through shared quotas in Redis on one hot key and on 1,000 keys,
//! single node and a 3-master cluster, with and without leases, for a few
//! seconds each; it prints one Markdown table row per run (the README's
//! table).
//!
//! ```text
//! cargo run --release --example redis_scale --features redis -- [secs] [P,P,...]
//! ```
//!
//! It starts its own `redis-server` and cluster on loopback (see
//! tests/support) and kills them at the end. The bound each row is
//! checked against is explained in tests/support/scale.rs.

#[path = "../tests/support/redis_cluster.rs"]
mod redis_cluster;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;
#[path = "../tests/support/scale.rs"]
mod scale;

use std::num::NonZeroU32;
use std::process::{Command, Stdio};

use backpressure::Quota;
use scale::{Outcome, Report, Scenario};

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn quota_of(rate: u32, burst: u32) -> Quota {
    Quota::per_second(nz(rate)).allow_burst(nz(burst))
}

/// `--child url prefix keys tasks lease rate burst start_us end_us seed`
fn child(args: &[String]) {
    let n = |i: usize| args[i].parse::<u64>().expect("a number");
    let s = Scenario {
        url: args[0].clone(),
        prefix: args[1].clone(),
        keys: n(2) as u32,
        tasks: n(3) as u32,
        lease: n(4) as u32,
        quota: quota_of(n(5) as u32, n(6) as u32),
        start_us: n(7),
        end_us: n(8),
    };
    let seed = n(9);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let o = rt.block_on(scale::client(&s, seed));
    let admitted: Vec<String> = o.admitted.iter().map(u64::to_string).collect();
    println!(
        "OUTCOME {} {} {} {} {}",
        o.calls,
        o.round_trips,
        o.failures,
        o.leased,
        admitted.join(",")
    );
}

fn parse(line: &str) -> Outcome {
    let f: Vec<&str> = line.split_whitespace().collect();
    Outcome {
        calls: f[1].parse().unwrap(),
        round_trips: f[2].parse().unwrap(),
        failures: f[3].parse().unwrap(),
        leased: f[4].parse().unwrap(),
        admitted: f[5].split(',').map(|a| a.parse().unwrap()).collect(),
    }
}

/// Runs `p` child processes on `s` and reports.
fn run(p: u32, s: &Scenario, rate: u32, burst: u32) -> Report {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..p)
        .map(|i| {
            Command::new(&exe)
                .arg("--child")
                .args([
                    s.url.clone(),
                    s.prefix.clone(),
                    s.keys.to_string(),
                    s.tasks.to_string(),
                    s.lease.to_string(),
                    rate.to_string(),
                    burst.to_string(),
                    s.start_us.to_string(),
                    s.end_us.to_string(),
                    i.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a child")
        })
        .collect();
    let outcomes: Vec<Outcome> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("a child's result");
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find(|l| l.starts_with("OUTCOME"))
                .unwrap_or_else(|| panic!("a child failed: {text}"));
            parse(line)
        })
        .collect();
    Report::new(s, &outcomes)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    let secs: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(5.0);
    let procs: Vec<u32> = args
        .get(1)
        .map(|a| a.split(',').map(|p| p.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![2, 4, 8]);
    if !redis_server::available("the scale run") || !redis_cluster::available("the scale run") {
        return;
    }
    let single = redis_server::RedisServer::start();
    let cluster = redis_cluster::RedisCluster::start();
    println!("{}", Report::header());
    let mut violations = 0;
    let mut n = 0;
    // (keys, tasks per process, rate, burst, lease size)
    let shapes = [(1, 4, 1000, 100, 20), (1000, 32, 4, 4, 2)];
    for (topology, url) in [("single", single.url()), ("cluster", cluster.urls())] {
        for &(keys, tasks, rate, burst, lease_size) in &shapes {
            for lease in [0, lease_size] {
                for &p in &procs {
                    n += 1;
                    let start_us = scale::now_us() + 1_000_000;
                    let s = Scenario {
                        url: url.clone(),
                        prefix: format!("scale{n}:"),
                        keys,
                        tasks,
                        lease,
                        quota: quota_of(rate, burst),
                        start_us,
                        end_us: start_us + (secs * 1e6) as u64,
                    };
                    let r = run(p, &s, rate, burst);
                    violations += (r.worst_excess > 0) as u32;
                    println!("{}", r.row(topology, &s));
                }
            }
        }
    }
    println!();
    println!("runs over the bound: {violations}");
}
